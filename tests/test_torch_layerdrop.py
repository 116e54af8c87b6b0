"""Steps that run a subset of the blocks (LayerDrop, an early exit), offloaded: bitwise equal to
plain PyTorch, a skipped block never called (not even recomputed), nothing moved for it, and the
plan's memory bound kept (NOTE [ skipped stages ] in chainoffload_torch/executor.py).

Every comparison is against an untouched ``copy.deepcopy`` trained by the same loop, with
``torch.manual_seed`` (and NumPy's, which Wav2Vec2's time masking draws from) set before each
forward of both: the skip draws come from torch's generator, so both sides skip the same blocks.
"""

import copy
import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.bounds import offload_memory_floor  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

D = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(D, 2 * D)
        self.b = nn.Linear(2 * D, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return self.norm(x + self.b(torch.tanh(self.a(x))))


class Drop(nn.Module):
    """A stem, ``n`` blocks each skipped with probability ``p`` in training (drawn with torch's
    generator, as Hugging Face's LayerDrop), and a head; ``exit_after`` stops the loop early."""

    def __init__(self, p=0.3, n=10, exit_after=None):
        super().__init__()
        self.p = p
        self.exit_after = exit_after
        self.stem = nn.Linear(8, D)
        self.layers = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        h = self.stem(x)
        for k, layer in enumerate(self.layers):
            if self.training and torch.rand([]) < self.p:
                continue
            h = layer(h)
            if self.exit_after is not None and k + 1 >= self.exit_after:
                break  # an early exit: the last blocks are not run
        return self.head(h)


def count_calls(layers):
    """Per layer, how often it was called since the last ``clear()`` (forward hooks: a pre-hook
    of its own would keep a block from being recomputed)."""
    calls = {}
    for k, layer in enumerate(layers):
        layer.register_forward_hook(lambda m, a, o, k=k: calls.__setitem__(k, calls.get(k, 0) + 1))
    return calls


def train_side_by_side(model, ref, handle, batches, loss_of, layers, ref_layers, steps=10):
    """``steps`` AdamW steps of both, the same seeds before each forward; every loss and weight
    ``torch.equal``. Returns, per step, the layers the plain model skipped and the bytes the
    offloaded one moved."""
    calls, ref_calls = count_calls(layers), count_calls(ref_layers)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    seen = []
    for s in range(steps):
        calls.clear()
        ref_calls.clear()
        losses = []
        for m, opt in zip((model, ref), opts, strict=True):
            opt.zero_grad()
            torch.manual_seed(s)
            np.random.seed(s)
            loss = loss_of(m, batches[s % len(batches)])
            loss.backward()
            opt.step()
            losses.append(loss)
        assert torch.equal(*losses), f"step {s}"
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), f"step {s}"
        skipped = [k for k in range(len(ref_layers)) if not ref_calls.get(k)]
        # A skipped block is never called in the offloaded step, not even by a recomputation.
        assert all(not calls.get(k) for k in skipped), (s, skipped, calls)
        seen.append((skipped, handle.last_step.offloaded_bytes))
    return seen


def drop_loss(m, x):
    return m(x).square().mean()


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("method", ["best", "rotor", "joint"])
def test_a_hand_written_layerdrop_model_trains_bitwise_equal_and_moves_nothing_for_a_skipped_block(p, method):
    torch.manual_seed(0)
    model = Drop(p=p)
    ref = copy.deepcopy(model)
    x = torch.randn(64, 8)
    batches = [torch.randn(64, 8, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "best":
            handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
        else:  # below the pure-offloading floor: the plan must recompute
            probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
            below = offload_memory_floor(probe.chain) + probe.plan.resident_bytes - 1
            probe.remove()
            handle = ct.offload(model, x, memory=below, method=method, repeats=1, warmup=0)
    assert len(handle.blocks) == 10
    assert handle.schedule.has_remat == (method != "best")
    assert handle.plan.offloaded_bytes > 0 or handle.schedule.has_remat
    seen = train_side_by_side(model, ref, handle, batches, drop_loss, model.layers, ref.layers)
    skipping = [(sk, moved) for sk, moved in seen if sk]
    assert len(skipping) >= 3, seen  # steps with skipped blocks did occur
    assert all(moved <= handle.plan.offloaded_bytes for _, moved in seen), seen
    if method == "best" and p == 0.5:
        # Skipped offloaded units move nothing: some skipping step moved less than the plan.
        assert any(moved < handle.plan.offloaded_bytes for _, moved in skipping), seen
    handle.remove()


def test_an_early_exit_trains_equal_and_its_head_is_never_moved():
    """The forward stops after block 3 of 10 in training: the head's saved tensors are the last
    stage's, which the plan never moves, and the stages after the exit collapse."""
    torch.manual_seed(1)
    model = Drop(p=0.0, exit_after=None)
    ref = copy.deepcopy(model)
    x = torch.randn(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    full = handle.plan.offloaded_bytes
    model.exit_after = ref.exit_after = 3
    seen = train_side_by_side(model, ref, handle, [x], drop_loss, model.layers, ref.layers, steps=4)
    assert all(sk == [3, 4, 5, 6, 7, 8, 9] for sk, _ in seen), seen
    # Only the units of the blocks that ran move (block k is stage k + 1 when the stem is a stage).
    off = int(handle.blocks.prefix)
    assert handle.schedule.offloaded_units[-1] - off > 3  # the plan moves units after the exit
    ran = sum(int(handle.plan.chain.saved[u - 1]) for u in handle.schedule.offloaded_units if u - off <= 3)
    assert all(0 < moved <= ran < full for _, moved in seen), (seen, ran, full)
    handle.remove()


def test_a_skipped_block_whose_input_is_larger_than_its_output_is_refused():
    """Block 3 halves the width; when it is skipped, the next block gets the wider hidden state,
    which the plan (made with block 3 run) does not bound."""

    class Halve(nn.Module):
        def forward(self, x):
            return x[:, : x.shape[1] // 2] * 2.0

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return torch.tanh(x * self.w) + x

    class Narrowing(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Scale(), Scale(), Halve(), Scale(), Scale(), Scale()])
            self.skip = False

        def forward(self, x):
            for k, layer in enumerate(self.layers):
                if self.skip and k == 2:
                    continue
                x = layer(x)
            return x.sum(1)

    model = Narrowing()
    x = torch.randn(256, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=0.85, repeats=1, warmup=0)
    assert handle.schedule.offloaded_units
    model.skip = True
    with pytest.raises(RuntimeError, match=r"skipped block .*larger than its output.*turn the skipping off"):
        model(x).square().mean().backward()
    model.skip = False
    model(x).square().mean().backward()  # the next step runs as planned
    handle.remove()


# -- the memory bound ----------------------------------------------------------------------------


# What a step holds, measured as test_torch_coverage measures it.
from test_torch_coverage import _memory_at, _Storages  # noqa: E402


def _live_at_every_op(model, x, handle, seed):
    """At the start of every op of the plan's schedule in one step seeded ``seed``: (op, bytes
    alive, the plan's simulated memory then plus what stays resident outside the chain)."""
    plan = handle.plan
    tl = co.simulate(plan.chain, plan.platform, plan.schedule)
    run = handle._run
    track = _Storages()
    seen = []
    fire = run._fire

    def spy(step, event):
        k, end = divmod(event, 2)
        if not end:
            seen.append((plan.schedule.op_name(k), track.live(), _memory_at(tl, float(tl.op_start[k])) + plan.resident_bytes))
        fire(step, event)

    run._fire = spy
    try:
        torch.manual_seed(seed)
        with track:
            loss = model(x).square().mean()
            loss.backward()
            del loss
    finally:
        del run._fire
    return seen


@pytest.mark.parametrize("method", ["best", "rotor", "joint"])
def test_a_step_that_skips_blocks_never_holds_more_than_the_plan_at_any_op(method):
    """CPU has no allocator to read: every storage an op allocates is followed by weak reference.
    In steps that skip blocks (the first, the last, runs of them), the bytes alive at the start of
    every op are at most the plan's simulated memory there plus what stays resident."""
    torch.manual_seed(0)
    model = Drop(p=0.4)
    x = torch.randn(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "best":
            handle = ct.offload(model, x, memory=0.5, repeats=1, warmup=0)
        else:
            probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
            below = offload_memory_floor(probe.chain) + probe.plan.resident_bytes - 1
            probe.remove()
            handle = ct.offload(model, x, memory=below, method=method, repeats=1, warmup=0)
    model.p = 0.0  # every block runs once: every weight's .grad exists from here on (weights and
    model(x).square().mean().backward()  # their gradients are outside the chain)
    model.p = 0.4
    draws = {}
    for seed in range(40):
        torch.manual_seed(seed)
        skipped = tuple(k for k in range(10) if torch.rand([]) < model.p)
        draws.setdefault(("first" if 0 in skipped else "") + ("last" if 9 in skipped else ""), seed)
    checked = 0
    for seed in draws.values():
        seen = _live_at_every_op(model, x, handle, seed)
        assert len(seen) == len(handle.schedule.compute)
        over = [(op, live, predicted) for op, live, predicted in seen if live > predicted]
        assert not over, (seed, over)
        checked += 1
    assert set(draws) >= {"first", "last", "firstlast"} and checked >= 3
    handle.remove()


# -- Hugging Face's LayerDrop --------------------------------------------------------------------


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
    torch.manual_seed(0)
    model = model_cls(cfg)
    model.train()
    g = torch.Generator().manual_seed(0)
    return model, {"input_values": torch.randn(2, 1600, generator=g), "labels": torch.randint(1, 16, (2, 10), generator=g)}


def hf_loss(m, batch):
    return m(**batch).loss


@pytest.mark.parametrize(
    "kind, layerdrop, recompute",
    [("wav2vec2", 0.1, False), ("wav2vec2", 0.5, False), ("hubert", 0.1, False), ("hubert", 0.5, False),
     ("wav2vec2", 0.5, True), ("hubert", 0.5, True)],
)
def test_hf_wav2vec2_and_hubert_train_bitwise_equal_with_layerdrop(kind, layerdrop, recompute):
    model, batch = hf_audio(kind, layerdrop)
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if recompute:  # below the pure-offloading floor
            probe = ct.offload(model, batch, memory=1.0, method="best", repeats=1, warmup=0)
            below = offload_memory_floor(probe.chain) + probe.plan.resident_bytes - 1
            probe.remove()
            handle = ct.offload(model, batch, memory=below, repeats=1, warmup=0)
        else:
            handle = ct.offload(model, batch, memory=0.6, repeats=1, warmup=0)
    layers = model.base_model.encoder.layers
    assert handle.blocks.names == tuple(f"{kind}.encoder.layers.{k}" for k in range(8))
    assert handle.schedule.has_remat == recompute
    seen = train_side_by_side(model, ref, handle, [batch], hf_loss, layers, ref.base_model.encoder.layers)
    assert sum(1 for sk, _ in seen if sk) >= 3, seen  # steps with skipped layers did occur
    assert all(moved <= handle.plan.offloaded_bytes for _, moved in seen), seen
    handle.remove()


# -- a shape where a skipped block cannot be profiled --------------------------------------------


class NormDrop(nn.Module):
    """Blocks 0..4, block 2 with batch norm (it cannot run on a batch of one in training), each
    of blocks 1..4 skipped with probability 0.5 (one draw of torch's generator per forward)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, D)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(D, D), nn.BatchNorm1d(D), nn.Tanh()) if k == 2 else Block() for k in range(5)
        )
        self.head = nn.Linear(D, 4)

    @staticmethod
    def skips():
        return (torch.rand(5) < 0.5) & (torch.arange(5) > 0)

    def forward(self, x):
        skip = self.skips() if self.training else torch.zeros(5, dtype=torch.bool)
        h = self.stem(x)
        for k, layer in enumerate(self.layers):
            if not skip[k]:
                h = layer(h)
        return self.head(h)


def _seed_skipping(want):
    """The first seed whose draw skips exactly the blocks ``want``."""
    for s in range(1000):
        torch.manual_seed(s)
        if {k for k, v in enumerate(NormDrop.skips().tolist()) if v} == want:
            return s
    raise AssertionError(want)


def test_a_new_skip_pattern_at_a_shape_a_profile_cannot_run_is_measured_by_one_forward():
    """At a batch of one the batch-norm block cannot run, so the plan of that shape holds only for
    calls that skip it, and each call is measured under its own draws (NOTE [ blocks a profile
    cannot run ] in _recorder.py). A call whose skip pattern gives other sizes (it skips the last
    block too) needs a plan of its own: made from the sizes that measure found, it costs no more
    forwards than a call whose pattern has a plan already (it used to measure again, under
    redraws: a forward per draw tried). Every step bitwise equal to plain PyTorch over AdamW steps."""
    torch.manual_seed(0)
    model = NormDrop()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # 0.8: pattern b's plan is solved on pattern a's profiled times (a lower budget may need a
        # profile of its own, which runs forwards whatever this rule).
        handle = ct.offload(model, torch.randn(4, 8), memory=0.8, repeats=1, warmup=0)
    one = torch.randn(1, 8)
    a, b = _seed_skipping({2}), _seed_skipping({2, 4})
    calls = count_calls(model.layers[:1])  # block 0 always runs: one call per forward of the model
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    per_step = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s, seed in enumerate([a, a, a, a, b, b, a, b]):
            calls.clear()
            losses = []
            for m, opt in zip((model, ref), opts, strict=True):
                opt.zero_grad()
                torch.manual_seed(seed)
                loss = m(one).square().mean()
                if m is model:  # before the backward, whose recomputations (the plan's) call it too
                    per_step.append(calls.get(0, 0))
                loss.backward()
                opt.step()
                losses.append(loss)
            assert torch.equal(*losses), f"step {s}"
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), f"step {s}"
    # Steps 0-1 of the shape measure and plan it (pattern a); steps 2-3 (a) find its plan; step 4
    # (b) makes its plan from its one measuring forward (it measured twice: 38 calls, not 4);
    # steps 5-7 (b, a, b) find their pattern's plan (step 6 planned a again: pattern a's plan
    # had fallen out when b's took its place).
    known = per_step[2]
    assert per_step[4] == known, per_step
    assert per_step[3] == per_step[5] == per_step[6] == per_step[7] == known, per_step
    assert handle.replans == 1 and handle.rescaled == 1, (handle.replans, handle.rescaled)  # a's profile, b's solve
    stage = 2 + 1 + int(handle.blocks.prefix)
    assert handle.plan.sizes.collapsed == {stage, stage + 2}  # pattern b's plan: blocks 2 and 4 collapsed
    assert [p.sizes.collapsed for p in handle._draw_plans[handle._key(handle.plan.key)]] == [{stage}, {stage, stage + 2}]
    handle.remove()


# -- bytes moved against the plan's -----------------------------------------------------------


class Forced(Drop):
    """:class:`Drop` whose training forward skips the blocks in ``skip`` (a set of indices) and,
    with ``p``, draws more as LayerDrop does."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.skip = set()

    def forward(self, x):
        h = self.stem(x)
        for k, layer in enumerate(self.layers):
            drawn = self.training and torch.rand([]) < self.p
            if self.training and (k in self.skip or drawn):
                continue
            h = layer(h)
        return self.head(h)


def test_a_skipping_step_moves_the_plans_bytes_for_its_pattern_and_never_the_chains_input():
    """A step moves, per unit, at most what the plan moves of it; a step that skips the first
    blocks moves exactly the plan's bytes less the skipped units' (they save nothing, and the
    hidden state handed on is a_0, the chain's input, which the plan keeps resident). Before the
    fix, a_0 was first seen by the first block that ran and moved with its unit
    (benchmarks/training_loops.py's LayerDrop row: 10.27 MiB moved against a 10.02 MiB plan)."""
    torch.manual_seed(3)
    model = Forced(p=0.0, n=10)
    ref = copy.deepcopy(model)
    x = torch.randn(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    chain, off = handle.plan.chain, int(handle.blocks.prefix)
    units = handle.schedule.offloaded_units
    saved = {u: int(chain.saved[u - 1]) for u in units}
    # The first offloaded unit after the first block's: skip every block before it, so that it
    # runs first and sees a_0 first.
    later = [u for u in units if u - off >= 2]
    assert later, units
    first = later[0]
    lead = set(range(first - off - 1))  # block k is stage k + 1 + off
    patterns = [set(), lead, lead | {first - off}, {0}, {0, 4}, lead]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    for s in range(len(patterns) + 8):
        pattern = patterns[s] if s < len(patterns) else set()
        model.p = ref.p = 0.0 if s < len(patterns) else 0.3  # then LayerDrop's own draws
        model.skip = ref.skip = pattern
        losses = []
        for m, opt in zip((model, ref), opts, strict=True):
            opt.zero_grad()
            torch.manual_seed(100 + s)
            loss = drop_loss(m, x)
            loss.backward()
            opt.step()
            losses.append(loss)
        assert torch.equal(*losses), f"step {s}"
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), f"step {s}"
        stats = handle.last_step
        per_unit = {u: b for u, b in stats.unit_offloaded.items() if b}
        assert set(per_unit) <= set(units), (s, per_unit, units)
        assert all(b <= saved[u] for u, b in per_unit.items()), (s, pattern, per_unit, saved)
        assert stats.offloaded_bytes <= handle.plan.offloaded_bytes, (s, stats.offloaded_bytes)
        if s < len(patterns) and pattern == set(range(max(pattern, default=-1) + 1)):
            # Only leading blocks skipped: nothing is carried; the plan's bytes for the pattern.
            ran = sum(saved[u] for u in units if u - off - 1 not in pattern)
            assert stats.offloaded_bytes == ran, (s, pattern, per_unit, saved)
    handle.remove()
