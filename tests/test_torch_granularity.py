"""The executor carries out transfers that move a_i alone (``moves="act"``): only the storage of
block i's output goes to the host and back, the rest of the unit stays; training is bitwise equal
to an untouched deep copy. (That the backward reads a_i from the host copy is
``test_torch_executor.py::test_the_backward_really_reads_the_host_copy``.)"""

import copy
import dataclasses
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import chainoffload_torch as ct  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_torch_executor import build, loss_of, offload_all_schedule, train_pair  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def act_alone(schedule):
    """The same schedule, every transfer moving a_i alone."""
    return dataclasses.replace(schedule, transfers=tuple(dataclasses.replace(t, moves="act") for t in schedule.transfers))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_act_alone_trains_exactly_and_moves_only_the_outputs(name):
    model, x = build(name)
    prof, whole, plat = offload_all_schedule(model, x)
    schedule = act_alone(whole)
    chain = prof.chain
    # the blocks of cnn and transformer keep more than their output: moving a_i alone differs
    assert name == "mlp" or any(chain.saved[u - 1] > chain.act[u] for u in schedule.offloaded_units)
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, chain, schedule, platform=plat)
    for loss_eq, grads_eq, buffers_eq in train_pair(ref, x, model, steps=3):
        assert loss_eq and grads_eq and buffers_eq
    stats = off.last_step
    assert stats.unit_offloaded == {u: int(chain.act[u]) for u in schedule.offloaded_units}
    assert stats.offloaded_bytes == schedule.offloaded_bytes(chain) == stats.prefetched_bytes == stats.released_bytes
    assert stats.offloaded_bytes < whole.offloaded_bytes(chain) or name == "mlp"
    assert stats.restored_reads > 0
    rows = {r["stage"]: r for r in off.decisions()}
    assert all(rows[u]["decision"] == "offload a_i alone" and rows[u]["moved"] == chain.act[u] for u in schedule.offloaded_units)


def test_the_rest_of_the_unit_stays_on_the_device_between_forward_and_backward():
    model, x = build("transformer")
    prof, whole, plat = offload_all_schedule(model, x)
    schedule = act_alone(whole)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    seen = {}

    def look(_module, _grad_in, _grad_out):
        # the first backward hook (B_L): every offloaded unit's a_i is on the host or coming back,
        # every other storage of it is still the original on the device
        if not seen:
            seen.update(off.unit_states())

    handle = model[-1].register_full_backward_hook(look)
    loss_of(model(x)).backward()
    handle.remove()
    assert seen
    moved_somewhere = False
    for unit in schedule.offloaded_units:
        states = [str(s) for s in seen.get(unit, [])]
        if len(states) > 1:
            assert states.count("device") == len(states) - 1  # only a_i left
            moved_somewhere = True
    assert moved_somewhere
