"""Units held by a later block's call (issue 31): a U-Net whose up blocks take the down blocks'
skips as their second argument.

The storages alive at every op of rotor's, joint's and best's plans are within the prediction
(the gradient each skip gets from its up block's backward waits for the rest of its gradient:
NOTE [ the gradient a held storage waits for ] in chainoffload_torch/_recorder.py; a held unit is
never recomputed: NOTE [ a held unit is never recomputed ] in plans.py), the stated floor counts
the held units (NOTE [ the floor counts held units ]), and the plans train bitwise equal to an
untouched ``copy.deepcopy`` (AdamW, the same seed before each forward).
"""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import chainoffload_torch as ct  # noqa: E402
from chainoffload_torch.plans import not_recomputable, stage_floor  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

from bench_models import torch_models  # noqa: E402
from test_torch_coverage import _assert_live_within_prediction  # noqa: E402
from test_torch_recompute import train_equal  # noqa: E402


def _unet():
    return torch_models.UNetShapes(depth=8, skips="arg"), torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_the_gradient_each_skip_waits_for_is_measured_and_counted():
    """Each down block's output is held by the up block that takes it; the profile measures the
    gradient that up block's backward hands it (a view of its concatenation's gradient, both
    halves: 16 KiB) and the chain counts it from that backward to the one that sums it."""
    model, x = _unet()
    prof = ct.profile_full(model, x, repeats=1, warmup=0, measure_platform=False)
    sizes, chain = prof.sizes, prof.chain
    n = chain.length
    assert sizes.held == frozenset(range(2, 9))
    pairs = {(i, j): (g, out, whole) for i, j, g, out, whole in sizes.held_grad}
    # downs.k (stage k + 2) is read by ups.(7 - k) (stage 17 - k); downs.7's output, pinned, by ups.0.
    for k in range(7):
        assert pairs[(k + 2, 17 - k)] == (16384, True, True)
    assert pairs[(9, 10)] == (16384, False, False)
    # B_10 .. B_3 all start with the gradient of the skip of stage 2 alive (from B_17 on).
    bwd = [int(b) for b in chain.bwd_tmp]
    assert all(bwd[k - 1] >= 16384 for k in range(3, 17))
    # Held units are never recomputed, and say why.
    banned = not_recomputable(chain, sizes, None)
    for u in range(2, 9):
        assert "held" in banned[u] and "recomputation frees none of it" in banned[u]
    # The floor the adapter states counts the held units, and the gradients at B_10: at least
    # the 7 held units (8 KiB each) and the 8 skip gradients (16 KiB each) alive then.
    floor = stage_floor(chain, sizes)
    assert floor >= 7 * 8192 + 8 * 16384
    assert floor > chain.stage_memory_floor()
    assert n == 17


@pytest.mark.parametrize("method", ["rotor", "joint", "best"])
def test_skips_given_as_arguments_stay_within_the_prediction_and_train_equal(method):
    """At 0.5 of the keep-all peak no plan fits (the skips' gradients and the held units alone
    hold more at B_10): offload() says so, or its plan is within its prediction; at the least memory
    it accepts from the floor up, every op is within the prediction, and 3 AdamW steps are
    bitwise plain PyTorch's."""
    model, x = _unet()
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = stage_floor(probe.chain, probe.plan.sizes) + probe.plan.resident_bytes
    probe.remove()
    try:
        half = ct.offload(model, x, memory=0.5, method=method, repeats=1, warmup=0)
    except ValueError as err:
        assert "no schedule fits" in str(err)
    else:  # before the gradients were counted, a plan was made here, 32 KiB and more above its prediction
        _assert_live_within_prediction(model, x, half)
        half.remove()
    handle = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for share in (1.0, 1.02, 1.05, 1.1, 1.2):
            try:
                handle = ct.offload(model, x, memory=int(floor * share), method=method, repeats=1, warmup=0)
                break
            except ValueError as err:
                assert "no schedule fits" in str(err)
    assert handle is not None, method
    if method == "rotor":
        assert handle.schedule.has_remat  # a recomputing plan is what is checked
    assert handle.plan.memory + handle.plan.resident_bytes >= floor
    _assert_live_within_prediction(model, x, handle)
    handle.remove()
    # Training: a fresh model and its copy, the same plan's memory.
    model, x = _unet()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=int(floor * share), method=method, repeats=1, warmup=0)
    train_equal(model, ref, x, handle)
    handle.remove()


def test_a_forced_joint_keeps_the_held_units_and_trains_equal():
    """method='joint' takes keep= now (NOTE [ joint: keep ] in chainoffload/solvers/joint.py): at
    1.05 x the stated floor its plan used to offload held units 7 and 8 and offload() refused it
    ("its plan offloads unit(s) [8], which must stay resident"); now joint is told to keep them,
    and its plan trains bitwise equal to plain PyTorch."""
    model, x = _unet()
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = stage_floor(probe.chain, probe.plan.sizes) + probe.plan.resident_bytes
    probe.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=int(floor * 1.05), method="joint", repeats=1, warmup=0)
    resident = set(handle.plan.sizes.resident) | {handle.chain.length}
    assert handle.plan.result.method == "joint" and handle.schedule.offloaded_units
    assert not resident & set(handle.schedule.offloaded_units)
    _assert_live_within_prediction(model, x, handle)
    handle.remove()
    model, x = _unet()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, x, memory=int(floor * 1.05), method="joint", repeats=1, warmup=0)
    train_equal(model, ref, x, handle)
    handle.remove()
