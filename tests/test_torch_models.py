"""Real models offloaded in place, used as their documentation shows, bitwise equal to untouched copies.

Hugging Face GPT-2, Llama, BERT and ViT from tiny configs (random weights, no download), a
ResNet as torchvision builds it, and the training loops people run: batch sizes that change,
gradient accumulation, evaluation, autocast; plus the refusals (torch.compile, a second handle).
"""

import copy
import math
import os
import time
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the Hub: every model is built from a config
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

from bench_models import torch_models  # noqa: E402

# -- Hugging Face models ---------------------------------------------------------------------


def hf(name):
    pytest.importorskip("transformers")
    return torch_models.hf_tiny(name)


def gpt2():
    return hf("gpt2")


def llama():
    return hf("llama")


def hooks_on(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def hf_step(model, batch, seed):
    """One documented step: ``model(**batch).loss.backward()``, dropout masks drawn from ``seed``."""
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return loss


def same_grads(a, b):
    return all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("fraction", [0.5, 0.8])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit"])
def test_hugging_face_model_offloaded_in_place_trains_bitwise_equal(name, fraction):
    path = torch_models.HF_LAYERS[name]
    model, batch = hf(name)
    ref = copy.deepcopy(model)
    keys = list(model.state_dict())
    handle = ct.offload(model, batch, memory=fraction, repeats=1, warmup=0)
    # The blocks were found, and the model is the same object of the same class with the same forward.
    assert handle.blocks.names == tuple(f"{path}.{i}" for i in range(6))
    assert type(model) is type(ref) and "forward" not in vars(model)
    assert list(model.state_dict()) == keys
    # A fraction is of the whole step's keep-all peak, the chain's plus what stays resident
    # outside it; the solver gets the rest (NOTE [ resident outside the chain ]).
    plan = handle.plan
    assert plan.keep_all_peak == co.keep_all_peak(handle.chain) + plan.resident_bytes
    assert plan.memory == int(fraction * plan.keep_all_peak) == handle.platform.memory + plan.resident_bytes
    assert handle.predicted_peak <= plan.memory
    assert handle.schedule.offloaded_units, "a budget below the keep-all peak must offload something"
    opt_a = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_b = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for step in range(3):
        opt_a.zero_grad()
        opt_b.zero_grad()
        la, lb = hf_step(model, batch, step), hf_step(ref, batch, step)
        assert torch.equal(la, lb) and same_grads(model, ref), f"step {step}"
        assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0
        assert handle.last_step.prefetched_bytes == handle.offloaded_bytes
        opt_a.step()
        opt_b.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    assert handle.replans == 0
    table = handle.table()
    assert f"| 1 | {path}.0 |" in table and "offload" in table and "keep-all peak" in table
    handle.remove()
    assert hooks_on(model) == 0 and list(model.state_dict()) == keys
    opt_a.zero_grad()
    opt_b.zero_grad()
    assert torch.equal(hf_step(model, batch, 9), hf_step(ref, batch, 9)) and same_grads(model, ref)


def test_llama_units_do_not_own_the_position_embeddings_the_blocks_share():
    """Llama's layers take (cos, sin) as keyword arguments: made once, held by the caller."""
    model, batch = llama()
    sizes = ct.measure_sizes(model, batch)
    cos_sin = 2 * 32 * 8 * 4  # two (1, 32, head_dim=8) float32 tensors
    assert all(cos_sin not in unit for unit in sizes.storages)
    assert sizes.saved[0] == sizes.saved[1] == sizes.saved[4]  # every layer owns the same


def test_output_hidden_states_keeps_the_units_the_output_holds():
    model, batch = gpt2()
    batch = {**batch, "output_hidden_states": True}
    sizes = ct.measure_sizes(model, batch)
    # Every hidden state but the last block's is in the output: offloading those units frees nothing.
    assert sizes.held == frozenset(range(1, 6))
    with pytest.raises(ValueError, match=r"no schedule fits.*units kept resident: 1 \(held: the model's output returns its output\), 2 \(held"):
        ct.offload(model, batch, memory=0.8, repeats=1, warmup=0, method="largest-first")
    handle = ct.offload(model, batch, repeats=1, warmup=0)  # the keep-all peak: nothing to move
    assert not handle.schedule.offloaded_units
    # ... and never recomputed, which the table says (NOTE [ a held unit is never recomputed ]).
    assert {r["decision"].split(" (never recomputed: ")[0] for r in handle.decisions()[:5]} == {"keep (held)"}
    assert all("held: the model's output returns its output" in r["decision"] for r in handle.decisions()[:5])


# -- a ResNet as torchvision builds it --------------------------------------------------------


def test_torchvision_style_resnet_offloaded_as_is():
    torch.manual_seed(0)
    model = torch_models.ResNet([3, 4, 6, 3], width=4, classes=5)  # ResNet-50's layout, 4 channels wide
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 4])
    ref = copy.deepcopy(model)
    handle = ct.offload(model, x, memory=0.5, repeats=1, warmup=0)
    # The four stages' bottlenecks, joined into one chain; stem and head outside it.
    assert handle.blocks.names == tuple(f"layer{s}.{i}" for s, n in zip((1, 2, 3, 4), (3, 4, 6, 3), strict=True) for i in range(n))
    assert handle.schedule.offloaded_units
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    for _step in range(3):
        opt_a.zero_grad()
        opt_b.zero_grad()
        la = nn.functional.cross_entropy(model(x), y)
        la.backward()
        lb = nn.functional.cross_entropy(ref(x), y)
        lb.backward()
        assert torch.equal(la, lb) and same_grads(model, ref)
        assert all(torch.equal(a, b) for a, b in zip(model.buffers(), ref.buffers(), strict=True))  # batch-norm statistics
        assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0
        opt_a.step()
        opt_b.step()


# -- shapes that change -----------------------------------------------------------------------


Net = torch_models.ResidualMLP


def test_batch_sizes_1_to_64_get_their_own_plans_cached_and_a_bounded_pool():
    model = Net()
    ref = copy.deepcopy(model)
    cap = 64 * 1024
    handle = ct.offload(model, torch.randn(1, 8), memory=0.6, method="largest-first", cache_size=4, host_memory=cap, repeats=1, warmup=0)
    pool = handle.pool
    moved = {}
    for b in range(1, 65):
        x = torch.randn(b, 8)
        measured = handle.measured
        for _ in range(2):  # a size solved on its measured sizes: its first step measured them
            model(x).square().mean().backward()
            ref(x).square().mean().backward()
            assert same_grads(model, ref), b
        plan = handle.plan
        assert "x" not in plan.shapes and f"({b}, 8)" in plan.shapes
        assert handle.measured - measured == (1 if plan.times_from is not None else 0), b
        # Bytes moved are the plan's for this batch size; the pool holds this plan's buffers at most.
        assert handle.offloaded_bytes == plan.offloaded_bytes
        assert pool.total_bytes <= plan.host_bytes <= cap and pool.high_water <= cap
        assert len(handle.plans) <= 4
        moved[b] = plan.offloaded_bytes
    # Each size its own plan: profiled, or solved on its measured sizes and a close size's times.
    assert handle.replans + handle.rescaled == 63 and handle.rescaled > 0
    assert moved[64] > moved[8] > 0  # a plan per size, not the first one's bytes
    made = pool.made
    for b in (64, 63, 62, 61):  # cached: no new profile, buffers of the same classes reused
        model(torch.randn(b, 8)).sum().backward()
    assert handle.replans + handle.rescaled == 63 and pool.made == made
    # Its executor evicted long ago, its plan remembered (NOTE [ one plan for many shapes ]): no profile.
    model(torch.randn(1, 8)).sum().backward()
    assert handle.replans + handle.rescaled == 63 and "(1, 8)" in handle.plan.shapes


def test_new_shapes_can_warn_or_be_refused():
    model = Net()
    x = torch.randn(4, 8)
    handle = ct.offload(model, x, memory=0.6, on_new_shape="error", repeats=1, warmup=0)
    with pytest.raises(ValueError, match=r"on_new_shape: the plan was made for arg0=\(4, 8\) float32, this call has arg0=\(5, 8\)"):
        model(torch.randn(5, 8))
    assert handle.live_entries() == 0 and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    model(x).sum().backward()  # the planned shape still trains
    handle.remove()
    handle = ct.offload(model, x, memory=0.6, on_new_shape="warn", repeats=1, warmup=0)
    with pytest.warns(RuntimeWarning, match=r"plan was made for arg0=\(4, 8\).*this call has arg0=\(6, 8\)"):
        model(torch.randn(6, 8)).sum().backward()
    assert handle.replans == 0 and handle.plan.shapes == "arg0=(4, 8) float32"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        model(torch.randn(6, 8)).sum().backward()
    with pytest.raises(ValueError, match="on_new_shape"):
        ct.offload(Net(), x, on_new_shape="sometimes")


def test_host_memory_caps_the_pool_and_refuses_a_plan_that_needs_more():
    x = torch.randn(16, 8)
    with pytest.raises(ValueError, match=r"host_memory: the plan for arg0=\(16, 8\) float32 offloads .* above host_memory=1.00 KiB"):
        ct.offload(Net(), x, memory=0.6, host_memory="1KiB", repeats=1, warmup=0)
    model = Net()
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    assert handle.pool.limit is None and handle.plan.host_bytes > 0
    model(x).sum().backward()
    assert handle.pool.total_bytes == handle.plan.host_bytes  # kept for the next step, no more


# -- the training loops people run ------------------------------------------------------------


def test_gradient_accumulation():
    model, batch = gpt2()
    ref = copy.deepcopy(model)
    handle = ct.offload(model, batch, memory=0.5, repeats=1, warmup=0)
    halves = [{k: v[i : i + 1] for k, v in batch.items()} for i in (0, 1)]
    for step in range(2):
        for m in (model, ref):
            m.zero_grad()
            for j, half in enumerate(halves):  # two micro-batches, then the optimizer step
                torch.manual_seed(10 * step + j)
                (m(**half).loss / 2).backward()
        assert same_grads(model, ref)
        assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0
    assert len(handle.plans) == 2  # the micro-batch shape got its own plan


def test_eval_no_grad_and_inference_mode_offload_nothing():
    model, batch = gpt2()
    ref = copy.deepcopy(model)
    handle = ct.offload(model, batch, memory=0.5, repeats=1, warmup=0)
    model.eval()
    ref.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, ref(**batch).logits)
    with torch.inference_mode():
        assert torch.equal(model(**batch).logits, ref(**batch).logits)
    assert handle.last_step is None and handle.pool.made == 0 and handle.replans == 0
    model.train()
    ref.train()
    assert torch.equal(hf_step(model, batch, 3), hf_step(ref, batch, 3)) and same_grads(model, ref)
    assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0


def test_autocast_bf16_trains_bitwise_equal_and_never_moves_a_weight_cast():
    model = Net(d=16, layers=4)
    ref = copy.deepcopy(model)
    x = torch.randn(24, 8)
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    from chainoffload_torch._saved import Packed as _Packed
    from chainoffload_torch.executor import ScheduleRun

    packed, real = [], ScheduleRun.pack

    def spy(self, step, t):
        out = real(self, step, t)
        if isinstance(out, _Packed):
            packed.append(t)
        return out

    ScheduleRun.pack = spy
    try:
        for _step in range(2):
            for m in (model, ref):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = m(x).float().square().mean()
                loss.backward()
            assert same_grads(model, ref)
            assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0
    finally:
        ScheduleRun.pack = real
    assert "autocast bfloat16" in handle.plan.shapes and len(handle.plans) == 2
    assert packed and all(t.dtype == torch.bfloat16 or t.dtype == torch.float32 for t in packed)
    assert not any(ct._stages.is_parameter_like(t) for t in packed)


class Shared(nn.Module):
    """A block that uses parameters it does not hold: its parent's weight (held in a list, not
    as a submodule) and a view of the parent's position parameter passed as an argument."""

    def __init__(self, d, parent):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self._parent = [parent]

    def forward(self, x, pos):
        w = self._parent[0].shared
        return torch.tanh(self.lin(x) * pos + x @ w.t())


class Outer(nn.Module):
    def __init__(self, d=8, layers=4):
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Parameter(torch.randn(d, d) / d)
        self.pos = nn.Parameter(torch.randn(1, d))
        self.blocks = nn.ModuleList([Shared(d, self) for _ in range(layers)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.pos[0])
        return x


def test_a_parameter_held_outside_the_blocks_is_never_offloaded():
    model = Outer()
    ref = copy.deepcopy(model)
    x = torch.randn(5, 8)
    sizes = ct.measure_sizes(model, x)
    param_bytes = {p.untyped_storage().nbytes() for p in model.parameters()}
    assert all(not (set(unit) & param_bytes) for unit in sizes.storages), sizes.storages
    chain = co.Chain([1.0] * 4, [1.0] * 4, list(sizes.act), list(sizes.saved))
    schedule = co.planner.plan_transfers(chain, co.Platform(memory=10**9, bandwidth_d2h=1e9, bandwidth_h2d=1e9), [1, 2, 3])
    handle = ct.Offloader(model, chain, schedule, blocks="blocks")
    for _ in range(2):
        model(x).square().mean().backward()
        ref(x).square().mean().backward()
        assert same_grads(model, ref)
    assert handle.offloaded_bytes == schedule.offloaded_bytes(chain)


# -- finding the blocks -------------------------------------------------------------------------


class Parallel(nn.Module):
    """Its ModuleList's members all read the input: no chain."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        return sum(h(x) for h in self.heads)


def test_no_blocks_found_says_what_was_seen_and_how_to_pass_blocks():
    with pytest.raises(ValueError) as err:
        ct.offload(Parallel(), torch.randn(2, 4))
    msg = str(err.value)
    assert "heads (ModuleList of 3 Linear): block 1 does not take block 0's output" in msg
    assert "blocks='path.to.list'" in msg
    with pytest.raises(ValueError, match="blocks: the given blocks are not called in order, each taking its hidden state from the one before"):
        ct.offload(Parallel(), torch.randn(2, 4), blocks="heads")
    with pytest.raises(ValueError, match="has no submodule 'nope'"):
        ct.offload(Net(), torch.randn(2, 8), blocks="nope")


def test_blocks_by_path_or_list_and_the_prefix_and_suffix_sizes():
    model = Net(d=16, layers=3)
    x = torch.randn(5, 8)
    found = ct.find_blocks(model, (x,), {})
    assert found.names == ("blocks.0", "blocks.1", "blocks.2") and found.hidden_in == (("arg", 0),) * 3
    assert ct.find_blocks(model, (x,), {}, "blocks").modules == found.modules
    assert ct.find_blocks(model, (x,), {}, list(model.blocks)).modules == found.modules
    sizes = ct.measure_sizes(model, x)
    f32, n, d = 4, 5, 16
    # Prefix: inp's output a_0 (it saves only x, an input, and its weight). Suffix: head saves a_3
    # (unit 3's already) and nothing else.
    assert sizes.act == (n * d * f32,) * 4
    assert sizes.saved[2] == sizes.saved[0]


# -- refusals ------------------------------------------------------------------------------------


def test_torch_compile_is_refused_up_front_in_one_line():
    model = Net()
    x = torch.randn(4, 8)
    ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        compiled(x)
    elapsed = time.perf_counter() - t0
    assert str(err.value) == ct._instrument.COMPILE_REFUSAL and "\n" not in str(err.value)
    assert elapsed < 20, elapsed  # refused before Inductor compiles anything
    with pytest.raises(ValueError, match="model: is compiled"):
        ct.offload(torch.compile(Net()), x)


def test_a_second_handle_is_refused_and_a_copy_of_the_model_is_plain():
    model = Net()
    x = torch.randn(4, 8)
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    with pytest.raises(ValueError, match="already offloaded by a handle"):
        ct.offload(model, x, memory=0.6)
    with pytest.raises(ValueError, match="already offloaded by a handle"):
        ct.profile(model, x)
    twin = copy.deepcopy(model)  # its hooks do nothing: a plain model
    twin(x).sum().backward()
    assert handle.last_step is None
    model(x).sum().backward()
    assert handle.offloaded_bytes == handle.plan.offloaded_bytes > 0
    handle.remove()
    again = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    again.remove()


# -- choosing a budget ----------------------------------------------------------------------------


def test_budget_curve_shows_what_each_budget_costs_and_its_memories_work_in_offload():
    pytest.importorskip("chainoffload.tradeoff", reason="the core's trade-off sweep (chainoffload.tradeoff)")
    model = Net(d=16, layers=6)
    ref = copy.deepcopy(model)
    x = torch.randn(24, 8)
    curve = ct.budget_curve(model, x, points=4, repeats=1, warmup=0)
    assert hooks_on(model) == 0  # profiled and left as it was
    chain, _ = ct.profile(model, x, repeats=1, warmup=0)
    assert curve.keep_all_peak == co.keep_all_peak(chain)
    assert curve.offload_floor == co.bounds.offload_memory_floor(chain) and curve.stage_floor == chain.stage_memory_floor()
    assert curve.methods == ("offload-all", "first-k", "largest-first", "best")
    best = curve.overheads("best")
    assert best[-1] == 0.0  # the keep-all peak: no overhead
    # Every point keeps the last unit resident, as offload() does; a memory where best fits works there.
    for point in curve.curves["best"]:
        if point.feasible:
            assert chain.length not in point.result.schedule.offloaded_units
            # On CPU copies run inline: the step counts them, as offload() predicts there.
            assert point.makespan == point.result.timeline.serial_makespan
    memory = curve.min_memory("best")
    assert memory is not None and memory < curve.keep_all_peak
    handle = ct.offload(model, x, memory=memory, repeats=1, warmup=0)
    model(x).sum().backward()
    ref(x).sum().backward()
    assert same_grads(model, ref) and handle.offloaded_bytes == handle.plan.offloaded_bytes
    with pytest.raises(ValueError, match="already offloaded by a handle"):
        ct.budget_curve(model, x)
    handle.remove()
    fractions = ct.budget_curve(model, x, memories=[0.6, 1.0], methods=["best"], repeats=1, warmup=0)
    assert fractions.memories == (int(0.6 * fractions.keep_all_peak), fractions.keep_all_peak)
    with pytest.raises(ValueError, match="'nope'"):
        ct.budget_curve(model, x, methods=["nope"])


def test_budget_curve_shows_recomputation_below_the_offload_floor_and_offload_trains_there():
    pytest.importorskip("chainoffload.tradeoff", reason="the core's trade-off sweep (chainoffload.tradeoff)")
    model = Net(d=16, layers=8)
    ref = copy.deepcopy(model)
    x = torch.randn(24, 8)
    curve = ct.budget_curve(model, x, points=6, methods=["best", "rotor", "checkpoint-all"], repeats=1, warmup=0)
    assert curve.methods == ("best", "rotor", "checkpoint-all")
    # The fixed policy's peak is a whole step's memory, as every other figure of the curve.
    assert "checkpoint-all" in curve.policy_peaks and curve.policy_peaks["checkpoint-all"] in curve.memories
    below = curve.min_memory("rotor")
    assert below is not None and below < curve.offload_floor <= curve.min_memory("best")
    with pytest.raises(ValueError, match="no schedule fits"):
        ct.offload(model, x, memory=below, method="best", repeats=1, warmup=0)
    handle = ct.offload(model, x, memory=below, repeats=1, warmup=0)
    assert handle.plan.schedule.has_remat and "recompute" in handle.table()
    torch.manual_seed(0)
    model(x).sum().backward()
    torch.manual_seed(0)
    ref(x).sum().backward()
    assert same_grads(model, ref)
    handle.remove()


def test_where_copies_do_not_overlap_the_curve_counts_them_inline():
    """A slow link: every point that moves data costs its copies on top of compute (the timeline's
    serial_makespan), one that moves nothing is unchanged, and the lower bounds stay below."""
    from chainoffload.tradeoff import tradeoff
    from chainoffload_torch.api import _inline

    chain = co.Chain(fwd=[1.0] * 6, bwd=[2.0] * 6, act=[1] * 7, saved=[100] * 6)
    link = co.Platform(memory=1, bandwidth_d2h=100 / 0.9, bandwidth_h2d=100 / 0.9)
    curve = tradeoff(chain, link, ["best", "rotor"], None, points=4)
    inline = _inline(curve)
    moved = 0
    for name in curve.methods:
        for p, q in zip(curve.curves[name], inline.curves[name], strict=True):
            if not p.feasible:
                assert q is p
                continue
            assert q.makespan == p.result.timeline.serial_makespan >= p.makespan
            assert q.overhead == q.makespan / curve.compute_time - 1.0
            assert math.isnan(q.lower_bound) or q.lower_bound <= q.makespan
            if p.result.schedule.transfers:
                moved += 1
                assert q.makespan > p.makespan
            else:
                assert q.makespan == p.makespan
    assert moved


def test_a_shifted_curve_shifts_the_policy_peaks():
    from chainoffload.tradeoff import policy_peak, tradeoff
    from chainoffload_torch.api import _shifted

    chain, _ = ct.profile(Net(d=16, layers=6), torch.randn(24, 8), repeats=1, warmup=0)
    link = co.Platform(memory=1, bandwidth_d2h=1e9, bandwidth_h2d=1e9)
    curve = tradeoff(chain, link, ["best", "checkpoint-all"], None, points=3)
    moved = _shifted(curve, 1000)
    assert moved.policy_peaks == {"checkpoint-all": policy_peak(chain, "checkpoint-all") + 1000}
    assert moved.memories == tuple(m + 1000 for m in curve.memories)
