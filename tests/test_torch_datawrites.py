"""Writes through ``.data`` that no version counter sees, found by the differential fuzz.

A model's parent code that writes a block's output through ``.data`` (``h = block(h);
h.data.mul_(0.9)``) moves no version counter; plain PyTorch trains on the written bytes. The
profile must keep such a unit resident and never recompute it (NOTE [ writes no version counter
sees ] in chainoffload_torch/_recorder.py), also when no saved tensor holds the written bytes
(the write is only seen by the next block's input), and also for a new shape whose plan comes
from a measuring forward without a backward.
"""

import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
from chainoffload_torch._recorder import WRITTEN  # noqa: E402
from chainoffload_torch.plans import _recomputed  # noqa: E402
from chainoffload_torch.testing import BlockSpec, ModelCase, ModelSpec, differential_check  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

KEEPS_PROMISE = ("equal", "refused", "both_raised")

# The fuzz's silent differences (benchmarks/torch_fuzz.py, shrunk): the recomputing ones ran a
# written block again from a recomputed input; 1427 offloaded a unit whose output the next block
# read written; 3608's profiled batch of 4 had the written output all zero (so the write changed
# no byte), and the batch of 1 borrowed that plan.
FUZZ_FAILURES = [
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('mask',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=41409,
            batch=1,
            data_writes=(3,),
        ),
        0.56, 'rotor', id="recompute-168",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('mask',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=32326,
            width=10,
            batch=1,
            data_writes=(2,),
        ),
        0.64, 'rotor', id="recompute-2327",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('tanh',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=4204,
            width=4,
            batch=1,
            data_writes=(4,),
        ),
        0.79, 'rotor', id="recompute-2335",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('sigmoid',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=60037,
            width=6,
            batch=1,
            data_writes=(1,),
        ),
        0.56, 'rotor', id="recompute-2602",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('dropout',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('sigmoid', 'gain')),
                BlockSpec(('linear',)),
                BlockSpec(('mul_', 'mul_', 'residual')),
            ),
            seed=45260,
            batch=1,
            data_writes=(6,),
        ),
        0.79, 'rotor', id="recompute-2796",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('batchnorm', 'tanh')),
                BlockSpec(('linear',)),
                BlockSpec(('residual', 'batchnorm')),
                BlockSpec(('mask', 'linear', 'sigmoid')),
                BlockSpec(('residual', 'linear'), share=3),
                BlockSpec(('gain', 'linear', 'gelu'), share=1),
                BlockSpec(('dropout',)),
                BlockSpec(('complex', 'sigmoid')),
            ),
            seed=53422,
            width=6,
            batch=3,
            dtype='float64',
            data_writes=(5,),
        ),
        0.64, 'rotor', id="recompute-2861",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('conj',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('sigmoid', 'tanh', 'linear')),
            ),
            seed=52726,
            width=10,
            dtype='float64',
            data_writes=(1,),
        ),
        0.52, 'rotor', id="recompute-3714",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('tanh', 'transpose')),
                BlockSpec(('detach', 'residual')),
                BlockSpec(('gain', 'expand')),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=22823,
            width=6,
            batch=1,
            data_writes=(3,),
        ),
        0.4, None, id="offload-1427",
    ),
    pytest.param(
        ModelSpec(
            blocks=(
                BlockSpec(('linear',)),
                BlockSpec(('complex',)),
                BlockSpec(('complex',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
                BlockSpec(('linear',)),
            ),
            seed=62374,
            width=12,
            batch=1,
            data_writes=(2,),
            batches=(4, 1, 2, 1),
        ),
        0.69, None, id="offload-3608",
    ),
]


@pytest.mark.parametrize(("spec", "memory", "method"), FUZZ_FAILURES)
def test_fuzz_data_writes_train_as_plain_pytorch_or_are_refused(spec, memory, method):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = differential_check(ModelCase(spec), memory=memory, method=method)
    assert out.kind in KEEPS_PROMISE, out.detail


def test_a_borrowed_schedule_does_not_recompute_a_unit_found_written_at_the_new_shape():
    # 3608's model with a recomputing method: the profiled batch of 4 sees no write (the written
    # output is all zero), so its schedule recomputes stage 4; the batch of 1 must not run it.
    spec = FUZZ_FAILURES[-1].values[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = differential_check(ModelCase(spec), memory=0.6, method="rotor")
    assert out.kind in KEEPS_PROMISE, out.detail


class TanhLinear(nn.Module):
    """``lin(tanh(x))``: saves tanh's output, never its own output or its input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return self.lin(torch.tanh(x))


class Unsaved(nn.Module):
    """Eight blocks; the parent scales block ``written``'s output through ``.data``, and no
    saved tensor holds those bytes (the next block saves tanh of them)."""

    def __init__(self, written: int = 4, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TanhLinear(width) for _ in range(8))
        self.written = written

    def forward(self, x):
        h = x
        for k, b in enumerate(self.blocks, start=1):
            h = b(h)
            if k == self.written:
                h.data.mul_(0.9)
        return h.square().mean()


def _train_both(model, ref, rows, steps=3):
    opt_a, opt_b = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for k in range(steps):
        x = torch.randn(rows[k % len(rows)], 16, generator=torch.Generator().manual_seed(k))
        losses = []
        for m in (model, ref):
            torch.manual_seed(k)
            loss = m(x)
            loss.backward()
            losses.append(loss)
        assert torch.equal(losses[0], losses[1])
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        for opt in (opt_a, opt_b):
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("memory", [0.5, 0.7])
@pytest.mark.parametrize("method", ["rotor", None])
def test_a_written_output_no_saved_tensor_holds_is_found_and_never_recomputed(method, memory):
    import copy

    torch.manual_seed(0)
    model = Unsaved()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, torch.randn(4, 16), memory=memory, method=method)
    # No prefix stage here (the blocks start at the input): block 4 is stage 4.
    assert not handle.blocks.prefix
    written = {u for u, why in handle.plan.sizes.unmovable.items() if WRITTEN in why}
    assert written == {4}
    assert 4 in handle.plan.not_recomputable
    assert 4 not in _recomputed(handle.schedule) and 4 not in handle.schedule.offloaded_units
    _train_both(model, ref, [4])


def test_a_new_shape_measured_without_a_backward_finds_the_write():
    # The measure of a new shape runs a forward only: the check between blocks needs no backward.
    torch.manual_seed(0)
    model = Unsaved(written=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, torch.randn(4, 16), memory=0.6)
    sizes = handle._planner.measure(handle._instrument, (torch.randn(2, 16),), {})
    assert {u for u, why in sizes.unmovable.items() if WRITTEN in why} == {3}



class ZeroAtFour(TanhLinear):
    """``lin(tanh(x))``, all zero at 4 rows: a write of it through ``.data`` changes no byte
    there (the profile at 4 rows cannot see it), and does at 2 rows."""

    def forward(self, x):
        return self.lin(torch.tanh(x)) * float(x.shape[0] < 4)


def test_a_new_shapes_step_that_measures_its_own_sizes_finds_a_write_the_profile_could_not_see():
    # NOTE [ one plan for many shapes ]: the step of a new shape measures its sizes with its own
    # forward, whose checks between blocks find the write as the measuring forward does.
    import copy

    torch.manual_seed(0)
    model = Unsaved(written=3)
    model.blocks[2] = ZeroAtFour(16)
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, torch.randn(4, 16), memory=0.6)
    assert not any(WRITTEN in why for why in handle.plan.sizes.unmovable.values())
    _train_both(model, ref, [4, 2, 2, 4, 2], steps=5)
    assert handle.measured == 1
    small = next(p for p in handle.plans if p.shapes.startswith("arg0=(2, 16)"))
    assert {u for u, why in small.sizes.unmovable.items() if WRITTEN in why} == {3}
    assert 3 not in small.schedule.offloaded_units and 3 not in _recomputed(small.schedule)


def test_a_saved_tensor_dropped_without_a_backward_leaves_no_print_for_a_later_one_at_its_address():
    """HF Mamba computes A = -exp(A_log) and drops it on one path: the Kept of what exp saved is
    freed unread, CPython hands its address to a later Kept (of a weight, never fingerprinted),
    and that one's unpack compared the weight with the dropped tensor's print: a write, a unit
    kept resident on some profiles only. Twelve profiles: no unit is ever found written."""
    pytest.importorskip("transformers")
    from bench_models import torch_models

    torch.manual_seed(0)
    model, batch = torch_models.hf_family("mamba")
    flagged = []
    for _ in range(12):
        prof = ct.profile_full(model, batch, repeats=1, warmup=0, measure_platform=False)
        flagged += [u for u, why in prof.sizes.unmovable.items() if WRITTEN in why]
    assert not flagged
