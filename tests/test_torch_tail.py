"""The code between an unlinked block and the next one as a stage of its own (issue 31): the
block before it becomes recomputable.

T5's encoder final_layer_norm and dropout before the decoder, BART's encoder-decoder boundary,
a ConvNeXt's downsampling between stages and a parent's ``h = h + block(h)`` make the next
block's input after the block returns; that code was part of the block's stage, so the block was
never recomputed (NOTE [ the code after a block as a stage ] in chainoffload_torch/_instrument.py).
Every model: tiny config or small model, random weights, 8 blocks per stack; training compared
with an untouched ``copy.deepcopy`` with ``torch.equal``, the same seed before each forward.
"""

import copy
import dataclasses
import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.solvers.remat_baselines import checkpoint_all_schedule  # noqa: E402
from chainoffload_torch._discovery import Blocks  # noqa: E402
from chainoffload_torch.plans import _recomputed  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

from bench_models import torch_models  # noqa: E402
from test_torch_coverage import _assert_live_within_prediction, _live_at_every_op  # noqa: E402

#: Per model, a budget as a share of the keep-all peak of the chain with tails: at most the
#: least memory offload() accepted there in benchmarks/results/offload_models_tail.md plus a
#: margin, and below the least the layout without tails accepts (both checked below).
BUDGET = {"t5": 0.16, "convnext": 0.20, "parent-residual": 0.17}


def _build(name):
    if name == "parent-residual":
        model = torch_models.ParentResidual(layers=8)
        batch = (torch.randn(64, 8), torch.randint(0, 3, (64,)))

        def step(m, seed):
            torch.manual_seed(seed)
            loss = nn.functional.cross_entropy(m(batch[0]), batch[1])
            loss.backward()
            return loss

        return model, batch[0], step
    pytest.importorskip("transformers")
    model, batch = torch_models.hf_family(name)

    def step(m, seed):
        torch.manual_seed(seed)  # the same dropout masks for the model and its copy
        loss = m(**batch).loss
        loss.backward()
        return loss

    return model, batch, step


def _train_equal(model, ref, step, handle, steps=3):
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    for s in range(steps):
        for o in opts:
            o.zero_grad()
        la, lb = step(model, s), step(ref, s)
        assert torch.equal(la, lb), f"step {s}"
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), f"step {s}"
        assert handle.offloaded_bytes == handle.plan.offloaded_bytes, f"step {s}"
        for o in opts:
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


@pytest.mark.parametrize("name", ["t5", "convnext", "parent-residual"])
def test_a_block_before_code_that_makes_the_next_input_is_recomputed_below_the_old_least_memory(name, monkeypatch):
    model, sample, step = _build(name)
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # T5 keeps some activations past its forward: said, not tested here
        probe = ct.offload(copy.deepcopy(model), sample, memory=1.0, method="best", repeats=1, warmup=0)
        memory = int(BUDGET[name] * probe.plan.keep_all_peak)
        tails = probe.blocks.tails
        probe.remove()
        assert tails, "the model has code between two blocks that makes the next one's input"
        # Without the tails (the layout before issue 31), nothing fits in that memory.
        with monkeypatch.context() as m:
            m.setattr(Blocks, "with_tails", lambda self: self)
            with pytest.raises(ValueError, match="no schedule fits"):
                ct.offload(copy.deepcopy(model), sample, memory=memory, repeats=1, warmup=0)
        handle = ct.offload(model, sample, memory=memory, repeats=1, warmup=0)
    blocks = handle.blocks
    redone = _recomputed(handle.schedule)
    # A recomputing plan (parent-residual: its smaller units fit by offloading alone); the tails
    # are never recomputed, and the table names them.
    assert redone or name == "parent-residual"
    assert not redone & {blocks.stage_of(b) + 1 for b in blocks.tails}
    table = handle.table()
    b = blocks.tails[0]
    assert f"(after {blocks.names[b - 1]})" in table and "never recomputed: the code after a block" in table
    assert handle.predicted_peak <= memory
    _train_equal(model, ref, step, handle)
    handle.remove()


@pytest.mark.parametrize("name", ["t5", "convnext", "parent-residual"])
def test_checkpointing_every_block_recomputes_the_blocks_before_code_that_makes_the_next_input(name):
    """What gradient_checkpointing_enable() does, on the chain with tails: every block but the
    last run without saving and recomputed before its backward, the tails (and the code before
    the first block) run once. Before tails, the executor refused to recompute those blocks."""
    model, sample, step = _build(name)
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = ct.offload(model, sample, memory=1.0, method="rotor", repeats=1, warmup=0)  # leaves no trace
    chain, blocks, banned = probe.chain, probe.blocks, probe.plan.not_recomputable
    probe.remove()
    tails = {blocks.stage_of(b) + 1 for b in blocks.tails}
    assert tails <= set(banned)
    # T5's decoder blocks are given a cache: never recomputed, as offload() plans.
    whole = tails | {i for i in banned if i < chain.length} | ({1} if blocks.prefix else set())
    schedule = checkpoint_all_schedule(chain.length, whole=whole)
    assert {blocks.stage_of(b) for b in blocks.tails} <= _recomputed(schedule)
    handle = ct.Offloader(model, chain, schedule, blocks=blocks)
    _train_equal(model, ref, step, handle)
    assert handle.last_step.recomputed_ops == len(_recomputed(schedule))
    handle.remove()


def test_bart_s_last_encoder_layer_gets_its_tail_and_only_its_output_stays_resident():
    """Every decoder layer reads the encoder's output (encoder_hidden_states), the last encoder
    layer's a_i once it has a tail: that one storage is pinned, as in the layout without the tail,
    the rest of the unit moves, and the layer is recomputable (before, the tail was dropped and
    the layer never recomputed: BART's least memory 46 % above the floor for any schedule)."""
    model, sample, _ = _build("bart")
    handle = ct.offload(model, sample, memory=1.0, method="rotor", repeats=1, warmup=0)
    blocks, sizes, chain = handle.blocks, handle.plan.sizes, handle.chain
    last = blocks.names.index("model.encoder.layers.7") + 1
    stage = blocks.stage_of(last)
    assert blocks.tails == (last,) and not sizes.held
    assert sizes.pinned.get(stage) and sizes.held_bytes == {"blocks": int(chain.act[stage])}
    assert stage not in handle.plan.not_recomputable and stage + 1 in handle.plan.not_recomputable
    rows = {r["stage"]: r for r in handle.decisions()}
    assert rows[stage + 1]["module"] == "(after model.encoder.layers.7)"
    assert "never recomputed" not in rows[stage]["decision"] and "never recomputed" in rows[stage + 1]["decision"]
    assert "(after model.encoder.layers.7)" in handle.table()
    handle.remove()


def _least_accepted(model, sample, method, lo, hi):
    """The least memory in (``lo``, ``hi``] that ``offload(method=method)`` accepts, to within
    0.5 % (``hi`` is accepted; ``lo`` is tried first: the proven floor for any schedule)."""

    def accepts(memory):
        try:
            ct.offload(copy.deepcopy(model), sample, memory=memory, method=method, repeats=1, warmup=0).remove()
        except ValueError as err:
            assert "no schedule fits" in str(err)
            return False
        return True

    if accepts(lo):
        return lo
    while hi - lo > 0.005 * lo:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if accepts(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("run", range(2))
@pytest.mark.parametrize("budget", ["13 %", "least"])
@pytest.mark.parametrize("method", ["rotor", "joint"])
def test_bart_trains_bitwise_equal_below_the_least_memory_without_its_tail(method, budget, run, monkeypatch):
    """Below the least memory the layout without the tail accepted (269258 B, 15.3 % in
    benchmarks/results/offload_models.md), at 13 % of the keep-all peak and at the least memory
    offload() accepts for the method, a recomputing plan trains torch.equal with a copy, and every
    storage alive at every op's start is within the prediction, the storages no unit owns
    included (BART's encoder's inputs_embeds and position embeddings, its decoder_input_ids, the
    decoder's position embeddings: docs/model.md, "Storages no unit owns") and the gradient of the
    encoder's output, which every decoder layer's backward adds to ("Held storages and their
    gradients"), at every op, forward and backward; twice per method (the plans follow the
    profile's timings, which vary from run to run)."""
    model, sample, step = _build("bart")
    ref = copy.deepcopy(model)
    probe = ct.offload(copy.deepcopy(model), sample, memory=1.0, method="best", repeats=1, warmup=0)
    memory = int(0.13 * probe.plan.keep_all_peak)
    floor = int(probe.chain.stage_memory_floor()) + probe.plan.resident_bytes
    unowned = probe.plan.sizes.unowned_tmp
    probe.remove()
    # The encoder's stages count inputs_embeds, its position embeddings and decoder_input_ids.
    assert unowned and min(unowned[:8]) >= 2 * 8192 + 256
    with monkeypatch.context() as m:
        m.setattr(Blocks, "with_tails", lambda self: self)
        with pytest.raises(ValueError, match="no schedule fits"):
            ct.offload(copy.deepcopy(model), sample, memory=memory, method=method, repeats=1, warmup=0)
    if budget == "least":
        memory = _least_accepted(model, sample, method, floor, memory)
    handle = ct.offload(model, sample, memory=memory, method=method, repeats=1, warmup=0)
    blocks = handle.blocks
    assert handle.predicted_peak <= memory and _recomputed(handle.schedule)
    if method == "rotor":
        assert blocks.stage_of(blocks.names.index("model.encoder.layers.7") + 1) in _recomputed(handle.schedule)
    _train_equal(model, ref, step, handle)

    def loss(m):
        torch.manual_seed(0)
        return m(**sample).loss

    loss(model).backward()  # the .grad of every weight exists, outside the chain
    seen = _live_at_every_op(model, loss, handle)
    assert len(seen) == len(handle.schedule.compute)
    assert max(live / predicted for _, live, predicted in seen if predicted) > 0.5
    over = [(k, op, live - predicted) for k, (op, live, predicted) in enumerate(seen) if live > predicted]
    assert not over, over
    # The encoder output's gradient is counted from the last decoder layer's backward on.
    assert any(i == 8 and bytes_ >= 2 * 8192 for i, _, bytes_, _, _ in handle.plan.sizes.held_grad), handle.plan.sizes.held_grad
    handle.remove()


def test_clip_s_vision_tower_whose_output_the_model_returns_is_recomputed_within_the_prediction():
    """CLIP returns its vision tower's last hidden state: held by the output, that a_i is pinned
    alone now that the code after the tower is a stage, and the tower's last layer is recomputed;
    here every storage alive at every op's start is within the prediction."""
    model, sample, step = _build("clip")
    ref = copy.deepcopy(model)
    probe = ct.offload(copy.deepcopy(model), sample, memory=1.0, method="best", repeats=1, warmup=0)
    memory = int(0.15 * probe.plan.keep_all_peak)
    probe.remove()
    handle = ct.offload(model, sample, memory=memory, method="rotor", repeats=1, warmup=0)
    blocks, sizes = handle.blocks, handle.plan.sizes
    last = blocks.names.index("vision_model.encoder.layers.7") + 1
    stage = blocks.stage_of(last)
    assert last in blocks.tails and stage not in sizes.held and sizes.pinned.get(stage)
    assert stage in _recomputed(handle.schedule)
    _train_equal(model, ref, step, handle)

    def loss(m):
        torch.manual_seed(0)
        return m(**sample).loss

    _assert_live_within_prediction(model, None, handle, loss=loss)
    handle.remove()


def test_blocks_and_their_tails_map_to_stages():
    mods = [nn.Linear(2, 2) for _ in range(4)]
    blocks = Blocks(tuple(mods), ("a", "b", "c", "d"), (("arg", 0),) * 4, linked=(True, False, False, True), prefix=True)
    tailed = blocks.with_tails()
    assert tailed.tails == (2, 3) and tailed.stages == 7 and blocks.stages == 5
    assert tailed.stage_names == ("(before a)", "a", "b", "(after b)", "c", "(after c)", "d")
    assert [tailed.stage_of(b) for b in range(5)] == [1, 2, 3, 5, 7]
    assert [tailed.block_at(s) for s in range(1, 8)] == [0, 1, 2, None, 3, None, 4]


class Gated(nn.Module):
    """The parent multiplies the block before's output into the next input: as a stage of its
    own, that code would save a storage two stages before it (held resident), so it stays in its
    block's stage."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.Tanh()) for _ in range(6)])
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = x
        for k, block in enumerate(self.blocks):
            prev = h
            h = block(h)
            if k == 2:
                h = h * prev  # saves block 2's output (block 3's input)
            if k == 4:
                h = h + prev  # saves nothing: a tail of its own
        return self.head(h)


def test_a_tail_that_would_pin_an_earlier_unit_is_left_in_its_block():
    model = Gated()
    x = torch.randn(32, 16)
    ref = copy.deepcopy(model)
    handle = ct.offload(model, x, memory=1.0, repeats=1, warmup=0)
    assert handle.blocks.tails == (5,)
    assert not handle.plan.sizes.held
    handle.remove()
    handle = ct.offload(model, x, memory=0.7, repeats=1, warmup=0)
    # Block 3 (its a_i made by the code after it, not a stage) is never recomputed; block 5 may be.
    assert handle.plan.not_recomputable[handle.blocks.stage_of(3)] == "its a_i is made by the code after the block"
    assert handle.blocks.stage_of(5) not in handle.plan.not_recomputable

    def step(m, seed):
        torch.manual_seed(seed)
        loss = m(x).square().mean()
        loss.backward()
        return loss

    _train_equal(model, ref, step, handle)


def test_a_hand_given_schedule_that_recomputes_a_tail_is_refused():
    model = torch_models.ParentResidual(layers=4)
    x = torch.randn(16, 8)
    handle = ct.offload(model, x, memory=1.0, repeats=1, warmup=0)
    chain, blocks = handle.chain, handle.blocks
    tail = blocks.stage_of(blocks.tails[0]) + 1
    L = chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    ops = [("Fck", i) if i == tail else ("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, tail, -1)]
    ops += [("F", tail), ("B", tail)] + fixed[L + (L - tail) + 1 :]
    handle.remove()
    with pytest.raises(ValueError, match=f"recomputes stage {tail}, the code after a block"):
        ct.executor.ScheduleRun(chain, co.Schedule(tuple(ops)), blocks=blocks, model=model)


@pytest.mark.parametrize("memory", [0.32, 0.5])
def test_the_prediction_holds_at_every_op_where_blocks_with_tails_are_recomputed(memory):
    """tests/test_torch_coverage.py's check at every op (forward, recomputations, backward): the
    bytes alive are at most the simulated memory plus what stays resident, on the parent-residual
    model whose every block but the last now has a tail."""
    torch.manual_seed(0)
    model = torch_models.ParentResidual(layers=8)
    x = torch.randn(64, 8)
    handle = ct.offload(model, x, memory=memory, method="rotor", repeats=1, warmup=0)
    blocks = handle.blocks
    assert len(blocks.tails) == 7 and _recomputed(handle.schedule) & {blocks.stage_of(b) for b in blocks.tails}
    _assert_live_within_prediction(model, x, handle)
    handle.remove()


def test_the_executor_names_each_stage_by_its_own_block_with_a_prefix_and_tails():
    """The executor's messages index names by stage: with the code before the first block and
    tails as stages, stage k is not block k (a name list of the blocks alone named the wrong one)."""
    model, sample, _ = _build("convnext")
    handle = ct.offload(model, sample, memory=1.0, method="best", repeats=1, warmup=0)
    blocks = handle.blocks
    assert blocks.prefix and blocks.tails
    run = handle._run
    for b, name in enumerate(blocks.names, start=1):
        assert run._name(blocks.stage_of(b)) == f"{blocks.stage_of(b)} ({name})"
    for b in blocks.tails:
        assert run._name(blocks.stage_of(b) + 1) == f"{blocks.stage_of(b) + 1} ((after {blocks.names[b - 1]}))"
    handle.remove()


def test_bart_s_pinned_encoder_output_made_by_an_fck_is_never_owned_nor_moved(monkeypatch):
    """The last encoder layer's output, which the decoder blocks hold, is pinned alone (its next
    stage is its tail). Run as Fck in the forward, the layer saves nothing, yet the ledger must
    count its storages to meet the output at its pinned ordinal: uncounted, the output was owned
    as the lone a_i, forgotten at its offload's release while the decoder held it, taken by the
    tail's unit at the first decoder block's start and moved with it, and copied again
    (16384 bytes a step beyond the plan's: NOTE [ pins in a stage run without saving ] in
    _stages.py). An offload of that a_i alone moves nothing, and the plan says so (NOTE [ a
    pinned a_i never moves ] in plans.py). A fixed schedule: the failing one needed the
    profile's timings to draw it at the least memory."""
    model, sample, step = _build("bart")
    ref = copy.deepcopy(model)
    real = ct.plans.solve_for

    def fixed(chain, *args, **kwargs):
        result = real(chain, *args, **kwargs)
        sizes = args[3]
        (p,) = sizes.pinned_act
        n = chain.length
        ops = [("Fck" if i == p else "F", i) for i in range(1, n + 1)] + [("B", i) for i in range(n, p, -1)]
        ops += [("F", p)] + [("B", i) for i in range(p, 0, -1)]
        before = ops.index(("B", p + 1)) - 1
        transfers = (
            co.Transfer("offload", p, p - 1), co.Transfer("offload", p + 1, p),
            co.Transfer("prefetch", p + 1, before), co.Transfer("prefetch", p, before),
        )
        return dataclasses.replace(result, schedule=co.Schedule(tuple(ops), transfers))

    monkeypatch.setattr(ct.plans, "solve_for", fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "held beyond its backward", no copy made twice
        handle = ct.offload(model, sample, memory=1.0, method="joint", repeats=1, warmup=0)
        p = handle.blocks.stage_of(handle.blocks.names.index("model.encoder.layers.7") + 1)
        assert handle.plan.sizes.pinned_act == {p} and ("Fck", p) in handle.schedule.compute
        # The lone a_p's offload moves nothing; unit p+1's moves its own storages alone.
        assert handle.plan.offloaded_bytes == handle.schedule.offloaded_bytes(handle.chain) - handle.chain.act[p] > 0
        _train_equal(model, ref, step, handle)
        assert handle.last_step.unit_offloaded == {p: 0, p + 1: handle.chain.saved[p]}
    handle.remove()
