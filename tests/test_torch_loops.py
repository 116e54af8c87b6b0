"""Training loops people write, offloaded: bitwise equal to the same loop without offload().

offload() and every replan run passes of the model of their own; these tests hold that none of
them shows in training (NOTE [ profiling leaves no trace ] in chainoffload_torch/_state.py), and
that the loops the adapter cannot carry out exactly are refused with a clear message.
"""

import copy
import random
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload_torch as ct  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

D = 16


class Schedule:
    """A plain object a model holds and its forward advances (a warm-up schedule)."""

    def __init__(self) -> None:
        self.t = 0

    def scale(self) -> float:
        self.t += 1
        return 1.0 + 0.05 * (self.t % 4)


class Block(nn.Module):
    """A residual MLP block with whatever randomness or state the test asks for."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.f = nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Linear(2 * D, D))
        self.calls = 0
        self.sched = Schedule()
        self.rng = random.Random(3)

    def forward(self, x):
        y = self.f(x)
        if self.mode == "random":  # stochastic depth drawn with Python's random
            y = y * (0.0 if random.random() < 0.3 else 1.0 / 0.7)
        elif self.mode == "numpy":  # a feature mask from NumPy's global generator
            y = y * torch.from_numpy((np.random.rand(D) > 0.4).astype(np.float32))
        elif self.mode == "counter":  # a call counter and a schedule object driven by it
            self.calls += 1
            y = y * (1.0 + 0.1 * (self.calls % 3)) * self.sched.scale()
        elif self.mode == "own-rng":  # a generator object the module holds
            y = y * (1.0 + self.rng.random())
        elif self.mode == "dropout":
            y = nn.functional.dropout(y, 0.2, self.training)
        return x + y


class Net(nn.Module):
    def __init__(self, mode: str = "plain", n: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.blocks = nn.ModuleList(Block(mode) for _ in range(n))
        self.head = nn.Linear(D, 4)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def batch(t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, t, D, generator=g)


def optimizer_in_backward(model: nn.Module) -> dict:
    """torchtune's optimizer in backward: one AdamW per parameter, stepped from its hook."""
    opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)
    return opts


def run(model, lengths, *, in_hooks=False, opts=None):
    """Train ``model`` one step per length; losses, and the optimizer state at the end.

    The generators are seeded once, before the run (not before each step): a pass that advances
    them shows as a different draw in a later step.
    """
    opt = None if in_hooks else torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for k, t in enumerate(lengths):
        loss = model(batch(t, k)).square().mean()
        loss.backward()
        losses.append(loss.detach())
        if opt is not None:
            opt.step()
            opt.zero_grad()
    return losses


def offloaded_and_plain(mode, lengths, memory=0.6, in_hooks=False, **kw):
    seed_all(1)
    model = Net(mode)
    ref = copy.deepcopy(model)
    if in_hooks:
        opts_a, opts_b = optimizer_in_backward(model), optimizer_in_backward(ref)
    seed_all(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(lengths[0], 0), memory=memory, **kw)
    got = run(model, lengths, in_hooks=in_hooks)
    seed_all(7)
    want = run(ref, lengths, in_hooks=in_hooks)
    assert [float(x) for x in got] == [float(x) for x in want]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), name
    if in_hooks:
        for (p, oa), ob in zip(opts_a.items(), opts_b.values(), strict=True):
            sa, sb = oa.state[p], ob.state[next(iter(ob.state))] if ob.state else {}
            assert sa.keys() == sb.keys()
            assert all(torch.equal(sa[k], sb[k]) for k in sa)
    return handle, model, ref


# -- 1. offload() and replans leave training as it was -----------------------------------------


def test_an_optimizer_stepped_from_gradient_hooks_takes_no_step_while_profiling():
    """The issue's loss 4.26 plain against 18.27 offloaded at step 0: every profiling backward
    stepped AdamW. Three steps, then a new shape (a replan inside the step), then two more."""
    handle, model, _ = offloaded_and_plain("plain", [6, 6, 6, 13, 6, 13], in_hooks=True)  # 13: over twice the volume, profiled
    assert handle.replans == 1
    assert handle.schedule.offloaded_units


def test_an_optimizer_in_hooks_is_restored_with_its_hooks_after_offload():
    seed_all(0)
    model = Net()
    opts = optimizer_in_backward(model)
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.offload(model, batch(6, 0), memory=0.6)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(not o.state for o in opts.values())
    model(batch(6, 0)).square().mean().backward()  # the hooks still run in training
    assert all(o.state for o in opts.values())
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("mode", ["random", "numpy", "counter", "own-rng", "dropout"])
def test_randomness_and_state_of_the_model_are_as_plain_training_has_them(mode):
    """Stochastic depth drawn with random, a NumPy mask, a counter-driven forward, a module's own
    generator, dropout: step 0 and the steps after a replan draw what plain training draws."""
    handle, model, ref = offloaded_and_plain(mode, [6, 6, 9, 6, 9, 5])
    # 9 solved on its measured sizes (within twice the volume of 6: no profile); 5 runs a larger
    # shape's schedule or its own.
    assert handle.replans + handle.reuses + handle.rescaled == 2
    assert model.steps == ref.steps == 6
    assert [b.calls for b in model.blocks] == [b.calls for b in ref.blocks]
    assert [b.sched.t for b in model.blocks] == [b.sched.t for b in ref.blocks]


class LazyHooks(Net):
    """Installs a forward hook on every block at its first forward and marks it with an attribute
    (transformers' output capturing does): the hook doubles each block's output into a list."""

    def forward(self, x):
        if not getattr(self, "_hooks_installed", False):
            for b in self.blocks:
                hook = b.register_forward_hook(lambda m, a, out: self.captured.append(out))
                hook.lazy = True
            self._hooks_installed = True
        self.captured = []
        out = super().forward(x)
        return out + 0.01 * sum(c.sum() for c in self.captured)


def test_forward_hooks_a_model_installs_at_its_first_forward_are_not_left_behind_by_the_passes():
    """The passes' attributes were removed but not the hooks they installed: the first training
    forward installed them again (a SegFormer's decode head got each stage twice)."""
    seed_all(0)
    model = LazyHooks()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The hooks keep every block's output: every unit is held whole, never moved nor
        # recomputed (NOTE [ a held unit is never recomputed ]), so only the keep-all peak fits.
        ct.offload(model, batch(6, 0), memory=1.0)
    assert not hasattr(model, "_hooks_installed")
    assert all(len(a._forward_hooks) == len(b._forward_hooks) + 1 for a, b in zip(model.blocks, ref.blocks, strict=True))  # the instrument's
    for k in range(2):
        outs, seen = [], []
        for m in (model, ref):
            torch.manual_seed(k)
            outs.append(m(batch(6, k)))
            seen.append(len(m.captured))  # after the forward (a recomputation runs the hooks again)
            outs[-1].square().mean().backward()
        assert torch.equal(*outs) and seen == [8, 8]
    assert grads_equal(model, ref)


def test_attributes_the_passes_add_are_removed_and_containers_restored_in_place():
    class Logging(Net):
        def __init__(self):
            super().__init__()
            self.log = []
            self.seen = {}

        def forward(self, x):
            self.log.append(x.shape[1])
            self.seen[x.shape[1]] = self.seen.get(x.shape[1], 0) + 1
            self.last = x.shape[1]
            return super().forward(x)

    seed_all(0)
    model = Logging()
    log, seen = model.log, model.seen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.offload(model, batch(6, 0), memory=0.6)
    assert model.log is log and log == [] and model.seen is seen and seen == {}
    assert not hasattr(model, "last") and model.steps == 0
    model(batch(9, 0)).sum().backward()  # a replan inside this call: only the call shows
    assert log == [9] and seen == {9: 1} and model.last == 9 and model.steps == 1


def test_an_object_every_block_holds_is_restored_once_and_whole():
    """A transformers-style config every block keeps (snapshotted once for all its holders): a
    counter in it and a list it holds are as plain training has them after offload()."""

    class Config:
        def __init__(self):
            self.calls = 0
            self.trace = []

    class Shared(Net):
        def __init__(self):
            super().__init__()
            self.config = Config()
            for b in self.blocks:
                b.config = self.config

        def forward(self, x):
            for b in self.blocks:
                b.config.calls += 1
            self.config.trace.append(x.shape[1])
            return super().forward(x) * (1.0 + 0.01 * (self.config.calls % 5))

    seed_all(0)
    model = Shared()
    ref = copy.deepcopy(model)
    config, trace = model.config, model.config.trace
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.offload(model, batch(6, 0), memory=0.6)
    assert model.config is config and config.calls == 0 and config.trace is trace and trace == []
    assert all(b.config is config for b in model.blocks)
    for k, t in enumerate([6, 9, 6]):
        outs = []
        for m in (model, ref):
            torch.manual_seed(k)
            outs.append(m(batch(t, k)))
            outs[-1].square().mean().backward()
        assert torch.equal(*outs)
    assert config.calls == ref.config.calls == 24 and trace == ref.config.trace == [6, 9, 6]
    assert grads_equal(model, ref)


def test_a_hook_that_writes_the_weights_in_a_forward_is_refused_not_trained_on():
    seed_all(0)
    model = Net()

    def bump(module, args):
        with torch.no_grad():
            module.f[0].bias.add_(1e-3)

    model.blocks[2].register_forward_pre_hook(bump)
    with pytest.raises(ct.ProfilingSideEffect, match=r"profiling changed 1 parameter\(s\) of the model in place \(blocks.2.f.0.bias\)"):
        ct.offload(model, batch(6, 0), memory=0.6)
    assert not model._forward_hooks  # the refused handle took its hooks away


# -- 2. writes no version counter sees ----------------------------------------------------------


class DataWrites(Net):
    """The parent scales some blocks' outputs through ``.data``: no version counter moves."""

    def __init__(self, written=(2, 5)):
        super().__init__()
        self.written = written

    def forward(self, x):
        h = self.inp(x)
        for k, b in enumerate(self.blocks, start=1):
            h = b(h)
            if k in self.written:
                h.data.mul_(0.9)
        return self.head(h)


def train_sgd_equal(model, ref, steps=3):
    """Train both side by side with SGD, the same seed before each forward; gradients equal."""
    opt_a, opt_b = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for k in range(steps):
        for m in (model, ref):
            torch.manual_seed(k)
            m(batch(6, k)).square().mean().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        for opt in (opt_a, opt_b):
            opt.step()
            opt.zero_grad()


def test_a_unit_written_through_data_after_it_was_saved_stays_resident_and_training_is_equal():
    seed_all(0)
    model = DataWrites()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(6, 0), memory=0.6)
    units = {u for u, why in handle.plan.sizes.unmovable.items() if "through .data" in why}
    assert units == {2, 5}
    assert handle.schedule.offloaded_units and not units & set(handle.schedule.offloaded_units)
    rows = {r["stage"]: r["decision"] for r in handle.decisions()}
    assert "through .data" in rows[2] and "through .data" in rows[5]
    train_sgd_equal(model, ref)
    assert handle.last_step.offloaded_bytes > 0


@pytest.mark.parametrize("method", ["rotor", None])
def test_a_unit_written_through_data_is_never_recomputed_and_training_is_equal(method):
    # A recomputation runs the block again and cannot replay a write its caller made through
    # .data after it: the recomputed tensors would hold the unwritten bytes, silently.
    seed_all(0)
    model = DataWrites()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(6, 0), memory=0.6, method=method)
    assert {2, 5} <= set(handle.plan.not_recomputable)
    again = [s for k, (kind, s) in enumerate(handle.schedule.compute) if kind != "B" and (kind != "F" or s in
             {t for kd, t in handle.schedule.compute[:k] if kd != "B"})]
    assert not {2, 5} & set(again)
    train_sgd_equal(model, ref)
    if method == "rotor":
        assert handle.last_step.recomputed_ops > 0  # it recomputes, just not the written stages


# -- 3. one step at a time: threads and remove() ---------------------------------------------


def offloaded_net(memory=0.6):
    seed_all(0)
    model = Net()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(6, 0), memory=memory)
    assert handle.schedule.offloaded_units
    return handle, model, ref


def grads_equal(model, ref):
    return all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def in_thread(fn):
    """Run ``fn`` in a thread; return (thread, box) where box gets its result or exception."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    th = threading.Thread(target=target)
    th.start()
    return th, box


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_forward_from_a_second_thread_while_a_step_runs_is_refused_clearly(where):
    handle, model, ref = offloaded_net()
    entered, go = threading.Event(), threading.Event()
    owner = []

    def wait(*_):
        if threading.get_ident() == owner[0]:
            entered.set()
            assert go.wait(20)

    if where == "forward":
        model.blocks[3].register_forward_pre_hook(wait)
    else:
        model.blocks[2].f[0].weight.register_hook(wait)

    def step():
        owner.append(threading.get_ident())
        model(batch(6, 0)).square().mean().backward()

    th, box = in_thread(step)
    assert entered.wait(20)
    with pytest.raises(RuntimeError, match="called from two threads at once"):
        model(batch(6, 1))
    go.set()
    th.join(20)
    assert "error" not in box, box.get("error")
    owner[0] = None
    ref(batch(6, 0)).square().mean().backward()
    assert grads_equal(model, ref)
    assert handle.last_step.offloaded_bytes > 0
    for m in (model, ref):  # steps one after the other from other threads are fine
        m.zero_grad()
        th, box = in_thread(lambda m=m: m(batch(6, 2)).square().mean().backward())
        th.join(20)
        assert "error" not in box, box.get("error")
    assert grads_equal(model, ref)


def test_remove_between_forward_and_backward_lets_that_backward_finish_under_the_plan():
    handle, model, ref = offloaded_net()
    loss = model(batch(6, 0)).square().mean()
    handle.remove()
    assert handle.hooks_installed == 0
    assert handle.pool.total_bytes > 0  # the step in flight still holds its host copies
    loss.backward()
    ref(batch(6, 0)).square().mean().backward()
    assert grads_equal(model, ref)
    assert handle.last_step.offloaded_bytes > 0
    assert handle.pool.total_bytes == 0
    # the model is plain again: a second handle may offload it, and a forward moves nothing
    model(batch(6, 1)).square().mean().backward()
    assert handle.last_step.offloaded_bytes > 0 and handle.unit_states() == {}


def test_remove_between_steps_still_frees_at_once():
    handle, model, _ = offloaded_net()
    model(batch(6, 0)).square().mean().backward()
    handle.remove()
    assert handle.hooks_installed == 0 and handle.pool.total_bytes == 0


# -- 7. refusals say what would help ---------------------------------------------------------


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(D, 8 * D), nn.Linear(8 * D, D)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Towers(nn.Module):
    """A short stack of wide blocks before the long stack of narrow ones (a vision tower)."""

    def __init__(self):
        super().__init__()
        self.vision = nn.ModuleList(Wide() for _ in range(3))
        self.blocks = nn.ModuleList(Block("plain") for _ in range(8))

    def forward(self, x):
        for b in self.vision:
            x = b(x)
        for b in self.blocks:
            x = b(x)
        return x


def test_a_refusal_gives_the_floor_as_a_share_the_coverage_and_the_blocks_to_paste():
    torch.manual_seed(0)
    model = Towers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as info:
            ct.offload(model, batch(6, 0), memory=0.4)
    msg = str(info.value)
    assert "memory: no schedule fits" in msg
    assert "the pure-offloading floor is 60 % of the keep-all peak" in msg
    assert "of the keep-all peak" in msg.split("floor is")[1] and "the chain can move" in msg
    assert "blocks=['vision', 'blocks'] would add them" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(6, 0), memory=0.4, blocks=["vision", "blocks"])
    assert len(handle.blocks) == 11 and handle.schedule.offloaded_units


# -- 6. one plan for many shapes ---------------------------------------------------------------


def test_dynamic_padding_over_many_lengths_profiles_a_few_times_and_trains_equal():
    lengths = [int(t) for t in np.random.default_rng(5).integers(3, 17, size=30)]
    handle, model, ref = offloaded_and_plain("dropout", lengths)
    distinct = len(set(lengths))
    records = sum(1 for k, t in enumerate(lengths) if t > max(lengths[:k] or [0]))  # new longest lengths
    assert handle.replans <= records - 1 < distinct - 1
    assert handle.reuses >= 1 and handle.replans + handle.reuses <= distinct - 1
    for plan in handle.plans:
        assert plan.predicted_peak <= plan.memory, plan.shapes
    reused = [p for p in handle.plans if p.reused_from is not None]
    assert reused and all(p.schedule.offloaded_units for p in reused)
    assert "running a larger shape's schedule" in handle.table() and "-> schedule of arg0=(4, " in handle.table()


def test_a_longer_shape_close_to_a_profiled_one_is_solved_on_its_measured_sizes_without_a_profile():
    """A new longest length within twice a profiled shape's volume: its sizes measured (one
    forward), the profiled shape's times scaled, a solve; further away, a profile again."""
    handle, model, ref = offloaded_and_plain("dropout", [8, 8, 12, 8, 12, 21, 12])
    assert handle.rescaled == 1 and handle.replans == 1  # 12 solved on 8's times; 21 profiled (12 is no source)
    by_len = {p.key[2][1][0][1][1]: p for p in handle.plans}
    first, solved, far = by_len[8], by_len[12], by_len[21]
    assert solved.times_from == first.key and solved.reused_from is None and far.times_from is None
    assert solved.result is not None and solved.schedule.offloaded_units
    # Its sizes are the shape's own, as a profile of it measures them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = ct.measure_sizes(copy.deepcopy(ref), batch(12, 0))
    assert tuple(solved.sizes.act) == tuple(own.act) and tuple(solved.sizes.saved) == tuple(own.saved)
    assert tuple(solved.chain.saved[:-1]) == tuple(own.saved[:-1]) and solved.sizes.act != first.sizes.act
    for plan in handle.plans:
        assert plan.predicted_peak <= plan.memory, plan.shapes
    assert "solved on a close shape's times scaled" in handle.table()
    assert "-> its own, on times of arg0=(4, 8, " in handle.table()


def test_a_new_shapes_step_measures_its_own_sizes_as_the_measuring_forward_does():
    """A step of new shapes that a known plan may serve trains with every saved tensor kept and
    measures its sizes with its own forward: the same sizes as the measuring forward finds, the
    plan made at its forward's end, the next step of those shapes under it."""
    from chainoffload_torch.api import _same_sizes

    seed_all(1)
    model = Net("dropout")
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(12, 0), memory=0.6)
    first = handle.plan
    # What the measuring forward finds for length 7 (it leaves no trace in training).
    want = handle._planner.measure(handle._instrument, (batch(7, 1),), {}, like=first)
    losses = []
    for k, t in enumerate((7, 7)):
        seed_all(100 + k)
        a = model(batch(t, k)).square().mean()
        a.backward()
        seed_all(100 + k)
        b = ref(batch(t, k)).square().mean()
        b.backward()
        losses.append((a, b))
        assert torch.equal(a, b)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        if k == 0:  # the measuring step: nothing moved, the plan for 7 made at its forward's end
            assert handle.measured == 1 and handle.last_step is None
            assert handle.reuses + handle.rescaled == 1 and "(4, 7, 16)" in handle.plan.shapes
    assert handle.measured == 1 and handle.replans == 0
    assert _same_sizes(handle.plan.sizes, want) and handle.plan.sizes.unmovable == want.unmovable
    assert handle.plan is not first and handle.offloaded_bytes == handle.plan.offloaded_bytes > 0


def test_hf_gpt2_with_dynamic_padding_trains_bitwise_equal_its_new_lengths_measured_by_their_steps():
    """The Trainer-like loop (tiny GPT-2, 8 layers, AdamW, clipping, num_items_in_batch as an
    int): every new length's step measures its sizes; plain and offloaded stay bitwise equal."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from chainoffload_torch.api import _same_sizes

    hf_logging.set_verbosity_error()
    config = GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=8, n_head=2, use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).train()
    ref = copy.deepcopy(model)
    lengths = [24, 13, 20, 13, 9, 24, 20, 17, 9, 17, 30, 13]

    def data(k):
        g = torch.Generator().manual_seed(k)
        t = lengths[k]
        ids = torch.randint(0, 64, (2, t), generator=g)
        real = torch.randint(t // 2, t + 1, (2,), generator=g)
        mask = (torch.arange(t)[None, :] < real[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}, int((labels[:, 1:] != -100).sum())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b, n = data(0)
        handle = ct.offload(model, {**b, "num_items_in_batch": n}, memory=0.6)
    opts = [torch.optim.AdamW(m.parameters(), lr=5e-3) for m in (ref, model)]
    made = []  # (step, plan) of each plan made from the sizes a step measured
    for k in range(len(lengths)):
        losses = []
        measured = handle.measured
        for m, opt in zip((ref, model), opts, strict=True):
            b, n = data(k)
            torch.manual_seed(100 + k)
            loss = m(**b, num_items_in_batch=n).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        assert torch.equal(*losses), k
        if handle.measured > measured and f"(2, {lengths[k]})" in handle.plan.shapes:
            made.append((k, handle.plan))
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    assert handle.measured >= 3 and len(made) >= 2 and handle.reuses + handle.rescaled >= 2
    assert "num_items_in_batch" in handle._shapes_line()  # one plan for all its values
    # Each plan made from a step's sizes has the sizes the measuring forward finds for that call.
    for k, plan in made:
        b, n = data(k)
        want = handle._planner.measure(handle._instrument, (), {**b, "num_items_in_batch": n}, like=None)
        assert _same_sizes(plan.sizes, want), k


class SkipsThird(Net):
    """Skips block 3 when ``skip`` is set (LayerDrop's draw, made by hand)."""

    skip = False

    def forward(self, x):
        self.steps += 1
        h = self.inp(x)
        for k, b in enumerate(self.blocks, start=1):
            if not (self.skip and k == 3):
                h = b(h)
        return self.head(h)


def test_a_measuring_step_that_skips_blocks_measures_nothing_and_the_next_call_measures_apart():
    seed_all(1)
    model = SkipsThird()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(12, 0), memory=0.6)
    first = handle.plan
    for k, skip in enumerate((True, False)):
        model.skip = ref.skip = skip
        for m in (model, ref):
            seed_all(k)
            m(batch(7, k)).square().mean().backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
        if k == 0:  # its sizes are not the shape's (block 3 was not called): no plan from them
            assert handle.measured == 1 and handle.plan is first and handle.reuses + handle.rescaled == 0
    # The second call of length 7 measured it with the measuring forward (its blocks all run).
    assert handle.measured == 1 and handle.reuses + handle.rescaled == 1 and "(4, 7, 16)" in handle.plan.shapes


class Scaled(Net):
    """HF Trainer's ``num_items_in_batch``: a number that scales the loss and changes no size;
    ``keep`` (how many positions the head sees) changes sizes."""

    def forward(self, x, num_items_in_batch=None, keep=None):
        out = super().forward(x)
        if keep is not None:
            out = out[:, :keep].tanh()
        return out / (num_items_in_batch or 1)


def test_a_number_that_changes_no_size_does_not_split_plans_and_one_that_does_still_does():
    seed_all(0)
    model = Scaled()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, {"x": batch(6, 0), "num_items_in_batch": 24}, memory=0.6)
    calls = [dict(num_items_in_batch=n) for n in (24, 17, 30, 11, 24)] + [dict(num_items_in_batch=9, keep=k) for k in (3, 5, 3, 5)]
    for k, kw in enumerate(calls):
        for m in (model, ref):
            torch.manual_seed(k)
            m(x=batch(6, k), **kw).square().mean().backward()
        assert grads_equal(model, ref)
        if k == 6:  # keep=5's first step measured its sizes (no plan serves them): no profile yet
            assert handle.replans == 1 and len(handle._measured) == 1
    assert handle.replans == 2  # keep=3 and keep=5: their sizes differ (keep=5 profiled at its second call)
    assert not handle._measured
    assert len({id(p.schedule) for p in handle.plans}) == 3
    assert "arguments that change no size (one plan for all their values): num_items_in_batch" in handle.table()


# -- 8. the fuzz draws these loops -------------------------------------------------------------

from chainoffload_torch import testing  # noqa: E402
from chainoffload_torch.testing import (  # noqa: E402
    BlockSpec,
    ModelCase,
    ModelSpec,
    differential_check,
)

LOOP_SPECS = {  # name: (the spec's loop fields, the feature they are)
    "python": (dict(draws=((1, "python"), (4, "python"))), "python_random"),
    "numpy": (dict(draws=((2, "numpy"), (5, "numpy"))), "numpy_random"),
    "counter": (dict(draws=((3, "counter"),)), "counter"),
    "data_write": (dict(data_writes=(2, 5)), "data_write"),
    "optimizer_in_hooks": (dict(optimizer="adamw_in_hooks"), "optimizer_in_hooks"),
    "varying_shapes": (dict(batches=(3, 2, 4, 1)), "varying_shapes"),
    "several_forwards": (dict(forwards=3), "several_forwards"),
}


def loop_case(**loop):
    blocks = (BlockSpec(("residual", "gain")),) * 8
    return ModelCase(ModelSpec(blocks=blocks, width=8, batch=3, seed=5, **loop))


@pytest.mark.parametrize("name", list(LOOP_SPECS))
def test_each_loop_the_fuzz_draws_trains_equal(name):
    fields, feature = LOOP_SPECS[name]
    case = loop_case(**fields)
    assert case.features == {feature}
    result = differential_check(case, memory=0.6, method="largest-first", steps=4)
    assert result.kind == "equal", result
    assert result.offloaded_units


@pytest.mark.parametrize("name", ["optimizer_in_hooks", "python", "counter"])
def test_the_fuzz_sees_what_profiling_did_before_it_left_no_trace(monkeypatch, name):
    """With the passes of offload() restoring only what they restored before issue 32 (buffers,
    grads, torch's generators), the loop differs: the differential check catches it."""
    from chainoffload_torch import _discovery, _recorder, _stages

    monkeypatch.setattr(_recorder, "training_state", _stages.model_state)
    monkeypatch.setattr(_discovery, "training_state", _stages.model_state)
    result = differential_check(loop_case(**LOOP_SPECS[name][0]), memory=0.6, method="largest-first", steps=3)
    assert result.kind == "silent_difference", result


def test_drawn_loops_use_each_loop_feature_and_bad_loop_fields_are_refused():
    seen = set()
    for k in range(200):
        seen |= testing.draw_model(k).features & set(testing.LOOP_FEATURES)
    assert seen == set(testing.LOOP_FEATURES)
    blocks = (BlockSpec(),) * 3
    for bad, match in (
        (dict(draws=((0, "dice"),)), "draws"),
        (dict(data_writes=(3,)), "data_writes"),
        (dict(optimizer="lion"), "optimizer"),
        (dict(batches=(0,)), "batches"),
        (dict(forwards=0), "forwards"),
    ):
        with pytest.raises(ValueError, match=match):
            ModelSpec(blocks=blocks, **bad)


# -- 4. LayerDrop: blocks a forward skipped ----------------------------------------------------


class LayerDrop(nn.Module):
    """Each block skipped with probability ``p`` in training (Python's random, as in HF)."""

    def __init__(self, p=0.3, n=8):
        super().__init__()
        self.p = p
        self.layers = nn.ModuleList(Block("plain") for _ in range(n))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        for layer in self.layers:
            if self.training and random.random() < self.p:
                continue
            x = layer(x)
        return self.head(x)


def test_discovery_finds_the_whole_list_whichever_blocks_one_forward_skipped():
    torch.manual_seed(0)
    model = LayerDrop()
    skipped_first = skipped_last = 0
    for seed in range(16):
        random.seed(seed)
        draws = [random.random() < model.p for _ in model.layers]
        if sum(draws) > len(draws) // 2:
            continue  # more skipped than run: taken for a list the forward picks from (the NOTE)
        skipped_first += draws[0]
        skipped_last += draws[-1]
        random.seed(seed)
        blocks = ct.find_blocks(model, (batch(6, 0),), {})
        assert blocks.names == tuple(f"layers.{k}" for k in range(8)), (seed, blocks.names)
        assert random.random() == (random.seed(seed), random.random())[1]  # the trace drew nothing that stays
    assert skipped_first and skipped_last  # the seeds covered both ends


def test_steps_that_skip_blocks_drawn_with_python_random_train_equal_the_profile_included():
    """The profile's own forwards skip blocks (seed 4), and so do training steps: nothing is
    refused, every step's gradients equal plain PyTorch's (NOTE [ skipped stages ] in
    chainoffload_torch/executor.py), and the profile leaves Python's generator as it was."""
    torch.manual_seed(0)
    model = LayerDrop()
    ref = copy.deepcopy(model)
    random.seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch(6, 0), memory=0.6)
    assert len(handle.blocks) == 8
    skipping = 0
    for k in range(12):
        state = random.getstate()
        skipping += any(random.random() < model.p for _ in model.layers)
        for m in (model, ref):
            random.setstate(state)
            m.zero_grad()
            m(batch(6, k)).square().mean().backward()
        pairs = list(zip(model.parameters(), ref.parameters(), strict=True))
        assert all((p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad) for p, q in pairs), k
        assert handle.last_step.offloaded_bytes <= handle.plan.offloaded_bytes
    assert skipping >= 3


def hf_audio(kind, layerdrop):
    transformers = pytest.importorskip("transformers")
    cfg_cls, model_cls = {
        "wav2vec2": (transformers.Wav2Vec2Config, transformers.Wav2Vec2ForCTC),
        "hubert": (transformers.HubertConfig, transformers.HubertForCTC),
    }[kind]
    cfg = cfg_cls(
        hidden_size=32, num_hidden_layers=8, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16, 16),
        conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_feat_extract_layers=3, vocab_size=16, layerdrop=layerdrop,
    )
    model = model_cls(cfg)
    model.train()
    g = torch.Generator().manual_seed(0)
    return model, {"input_values": torch.randn(2, 1600, generator=g), "labels": torch.randint(1, 16, (2, 10), generator=g)}


@pytest.mark.parametrize("layerdrop", [0.1, 0.5])
@pytest.mark.parametrize("kind", ["wav2vec2", "hubert"])
def test_hf_wav2vec2_and_hubert_with_layerdrop_find_their_encoder_layers_for_every_seed(kind, layerdrop):
    """0.1 is the models' default; at 0.5 a third of the draws skip more layers than they run,
    and discovery traces again under other draws (its generators put back after)."""
    for seed in range(4):
        torch.manual_seed(seed)
        model, sample = hf_audio(kind, layerdrop)
        state = torch.get_rng_state()
        blocks = ct.find_blocks(model, (), sample)
        assert blocks.names == tuple(f"{kind}.encoder.layers.{k}" for k in range(8)), (seed, blocks.names)
        assert torch.equal(torch.get_rng_state(), state)


# -- 5. several forwards per backward --------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3])
def test_several_forwards_before_one_backward_train_equal_the_extra_ones_resident(k):
    handle, model, ref = offloaded_net()
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref)]
    for step in range(3):
        for m, _opt in zip((model, ref), opts, strict=True):
            torch.manual_seed(step)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs = [m(batch(6 + j, 10 * step + j)) for j in range(k)]  # a contrastive k-tuple, lengths differ
            extra = [w for w in caught if "another forward before the backward" in str(w.message)]
            assert len(extra) == (m is model and step == 0)  # said once
            loss = sum((o.mean(1) - outs[0].mean(1)).square().mean() for o in outs[1:]) + outs[0].square().mean()
            loss.backward()
        assert grads_equal(model, ref)
        assert handle.last_step.offloaded_bytes > 0  # the first forward ran under its plan
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert handle.replans == 0  # the extra forwards' shapes made no plan
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def test_a_forward_whose_outputs_were_dropped_without_a_backward_is_abandoned_as_before():
    handle, model, ref = offloaded_net()
    model(batch(6, 0))  # an evaluation under grad mode: output dropped, no backward
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not taken for an extra forward: no warning
        model(batch(6, 1)).square().mean().backward()
    ref(batch(6, 1)).square().mean().backward()
    assert grads_equal(model, ref) and handle.last_step.offloaded_bytes > 0
