"""LayerDrop models of the recomputing fuzz (benchmarks/torch_fuzz.py --recompute-only --models
8500 --seed 43) that plain PyTorch trained and the offloaded one raised mid-step: each shrunk
spec now trains bitwise equal (differential_check compares with torch.equal) or is refused by
offload(), before any step."""

import warnings

import pytest

pytest.importorskip("torch")

from chainoffload_torch.testing import BlockSpec, HookSpec, ModelCase, ModelSpec, differential_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _check(spec, memory, method):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return differential_check(ModelCase(spec), memory=memory, method=method, steps=3)


def test_a_dropout_block_run_in_place_of_a_skipped_one_leaves_the_calls_later_skips_as_drawn():
    # NOTE [ the draws of a block run in place ] in _instrument.py: the measuring forward of a new
    # shape ran the skipped dropout blocks in place, which moved torch's generator, so LayerDrop's
    # later draws ran the batch-norm block the call skips, on a batch of one (model 8093).
    spec = ModelSpec(
        blocks=(
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("dropout",)),
            BlockSpec(("dropout",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("batchnorm",)),
        ),
        seed=33094,
        width=6,
        batch=1,
        batches=(3, 2, 1, 5),
        layerdrop=0.1,
    )
    out = _check(spec, 0.5956498951781971, "recompute-all")
    assert out.kind == "equal", out.detail
    assert out.recomputations > 0


def test_a_profiling_backward_that_raises_replays_the_calls_own_draws():
    # NOTE [ a profiling backward that raises ] in _recorder.py: relu_ (block 3) saves its
    # result and mul_ (block 4) writes it; plain PyTorch skips one of them in every step it
    # trains, the profile of a new draw ran both and its backward raised (model 4999).
    spec = ModelSpec(
        blocks=(
            BlockSpec(("tanh", "tanh")),
            BlockSpec(("linear",)),
            BlockSpec(("index",)),
            BlockSpec(("relu_",)),
            BlockSpec(("mul_", "index")),
            BlockSpec(("residual",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("add_",)),
        ),
        seed=41774,
        width=6,
        batch=1,
        draws=((8, "counter"), (9, "counter")),
        layerdrop=0.5,
    )
    out = _check(spec, 0.8732993197278912, "recompute-all")
    assert out.kind == "equal", out.detail


def test_a_view_output_that_a_later_in_place_block_writes_when_the_blocks_between_are_skipped():
    # NOTE [ a carried view written in place ] in _instrument.py: block 2's output is a view (the
    # transpose block's reshape); block 4's mul_ writes it in a step that skips block 3, its
    # hook never fired, and the recomputation had not run when its backward read (model 6084).
    spec = ModelSpec(
        blocks=(
            BlockSpec(("linear",)),
            BlockSpec(("residual", "transpose")),
            BlockSpec(("linear",)),
            BlockSpec(("mul_",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
            BlockSpec(("linear",)),
        ),
        seed=20617,
        batch=1,
        layerdrop=0.1,
    )
    out = _check(spec, 0.9244150246305419, "rotor")
    assert out.kind == "equal", out.detail
    assert out.recomputations > 0


def test_recompute_all_recomputes_a_view_block_that_a_skipping_step_writes_and_trains_equal():
    # The same (model 5870): block 9's output is a view, block 11 starts with relu_ on its
    # input, and a step that skips block 10 writes block 9's output.
    spec = ModelSpec(
        blocks=(BlockSpec(("linear",)),) * 8
        + (BlockSpec(("transpose",)), BlockSpec(("linear",)), BlockSpec(("relu_", "transpose"))),
        seed=45205,
        width=2,
        batch=1,
        layerdrop=0.5,
    )
    out = _check(spec, 0.6033442982456141, "recompute-all")
    assert out.kind == "equal", out.detail
    assert out.recomputations > 0


def test_a_carried_view_that_is_also_its_blocks_tails_output_marks_the_blocks_backward():
    # Model 5870 as drawn (not shrunk): the code after blocks.8 is a stage (a tail) that hands on
    # the block's own output, a view; a step that skips blocks.9 has blocks.10's add_ write it.
    # Both the block's and the tail's hooks are lost; the mark before the base's node is the
    # block's (NOTE [ a carried view written in place ] in _instrument.py).
    spec = ModelSpec(
        blocks=(
            BlockSpec(("stride",)),
            BlockSpec(("conj", "transpose", "gain", "stride")),
            BlockSpec(("transpose", "gelu", "expand", "batchnorm")),
            BlockSpec(("gain", "gelu", "narrow")),
            BlockSpec(("gain",)),
            BlockSpec(("conj",)),
            BlockSpec(("narrow", "mul_", "tanh", "narrow")),
            BlockSpec(("expand", "linear")),
            BlockSpec(("narrow", "transpose")),
            BlockSpec(("expand",)),
            BlockSpec(("add_", "relu_", "gelu", "transpose")),
        ),
        seed=45205,
        width=2,
        batch=1,
        dtype="float64",
        between=((1, "scale"),),
        hooks=(HookSpec(9, "pre_new", "before"), HookSpec(4, "pre_new", "before")),
        draws=((1, "python"), (2, "python")),
        optimizer="adamw_in_hooks",
        batches=(4, 3, 4, 3),
        layerdrop=0.5,
    )
    out = _check(spec, 0.6033442982456141, "recompute-all")
    assert out.kind == "equal", out.detail
    assert out.recomputations > 0
