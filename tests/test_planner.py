"""The transfer planner: memory-aware triggers, waits where compute must wait, never worse than eager."""

import math

import numpy as np
import pytest

from chainoffload import Chain, Platform, simulate
from chainoffload.generators import random_chain
from chainoffload.planner import eager_plan, plan_transfers
from chainoffload.simulate import keep_all_peak


def _wait_chain() -> Chain:
    # Unit 1 (100 B) must leave before F_3 (keep-all needs 220 B there, the limit is 150 B) and
    # may only come back once B_3 has freed unit 3: worked out by hand in the test below.
    return Chain(
        fwd=[1.0, 1.0, 1.0, 1.0],
        bwd=[1.0, 1.0, 1.0, 1.0],
        act=[10, 10, 10, 10, 10],
        saved=[100, 10, 100, 10],
        fwd_tmp=[0, 0, 0, 0],
        bwd_tmp=[0, 0, 0, 0],
        name="wait",
    )


def test_forward_waits_for_the_offload_it_needs_and_prefetch_waits_for_room():
    chain = _wait_chain()
    platform = Platform(memory=150, bandwidth_d2h=50.0, bandwidth_h2d=50.0)
    schedule = plan_transfers(chain, platform, [1])
    (off,) = [t for t in schedule.transfers if t.kind == "offload"]
    (pre,) = [t for t in schedule.transfers if t.kind == "prefetch"]
    # O_1 at the end of F_1 (op 0); F_3 (op 2) waits for it: 2 s of copy end at t = 3.
    assert (off.op, off.at, off.before) == (0, "end", 2)
    # B_3 (op 5) must end before 100 B more fit: P_1 at its end, B_2 waits 2 s for it.
    assert (pre.op, pre.at) == (5, "end")
    timeline = simulate(chain, platform, schedule)
    assert timeline.feasible
    assert timeline.peak_memory == 150
    # F: 0-1, 1-2, wait, 3-4, 4-5; B_4 5-6, B_3 6-7, P_1 7-9, B_2 9-10, B_1 10-11.
    assert timeline.makespan == pytest.approx(11.0)
    # The eager vDNN timing does not wait and breaks the limit at F_3.
    eager = simulate(chain, platform, eager_plan(chain, [1]))
    assert not eager.feasible and eager.violation.rule == "memory"


def _instances(count, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        length = int(rng.integers(4, 30))
        chain = random_chain(int(rng.integers(1 << 30)), length)
        lo, hi = chain.stage_memory_floor(), keep_all_peak(chain)
        memory = int(lo + (hi - lo) * rng.uniform(0.2, 0.9))
        bw = float(chain.saved.sum() / chain.compute_time * rng.uniform(0.3, 2.0))
        platform = Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-6, duplex=bool(rng.integers(2)))
        units = sorted(rng.choice(np.arange(1, length), size=int(rng.integers(1, length)), replace=False).tolist())
        yield chain, platform, units


def test_never_worse_than_the_eager_timing_and_feasible_more_often():
    planned_feasible = eager_feasible = 0
    for chain, platform, units in _instances(40):
        planned = simulate(chain, platform, plan_transfers(chain, platform, units))
        eager = simulate(chain, platform, eager_plan(chain, units))
        planned_feasible += planned.feasible
        eager_feasible += eager.feasible
        if eager.feasible:
            assert planned.feasible
            assert planned.makespan <= eager.makespan * (1 + 1e-12)
    assert planned_feasible > eager_feasible


def test_every_unit_once_offloads_at_the_end_of_their_forward_prefetches_in_need_order():
    for chain, platform, units in _instances(15, seed=3):
        schedule = plan_transfers(chain, platform, units)
        offloads = [t for t in schedule.transfers if t.kind == "offload"]
        prefetches = [t for t in schedule.transfers if t.kind == "prefetch"]
        assert sorted(t.unit for t in offloads) == units == sorted(t.unit for t in prefetches)
        for t in offloads:
            assert schedule.compute[t.op] == ("F", t.unit) and t.at == "end"
        # Queue order on the H2D channel is trigger order: it must be decreasing stage order.
        queue = sorted(prefetches, key=lambda t: (t.event, prefetches.index(t)))
        assert [t.unit for t in queue] == sorted(units, reverse=True)


def test_deterministic():
    for chain, platform, units in _instances(5, seed=7):
        assert plan_transfers(chain, platform, units) == plan_transfers(chain, platform, units)


def test_infinite_bandwidth_hides_every_transfer():
    chain = random_chain(11, 20)
    memory = keep_all_peak(chain)
    platform = Platform(memory=memory, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    timeline = simulate(chain, platform, plan_transfers(chain, platform, range(1, 20)))
    assert timeline.feasible
    assert timeline.makespan == pytest.approx(chain.compute_time)
    assert timeline.peak_memory < memory


def test_empty_set_is_keep_all(chain3):
    platform = Platform(memory=10**6, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    assert plan_transfers(chain3, platform, []).transfers == ()


@pytest.mark.parametrize("units", [[0], [4], [-1]])
def test_rejects_units_outside_the_chain(chain3, units):
    platform = Platform(memory=10**6, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    with pytest.raises(ValueError, match=f"units: {units[0]} is not a stage in 1..3"):
        plan_transfers(chain3, platform, units)


def test_rejects_moving_data_over_a_dead_link(chain3):
    platform = Platform(memory=10**6, bandwidth_d2h=0.0, bandwidth_h2d=1.0)
    with pytest.raises(ValueError, match="bandwidth 0.0 B/s"):
        plan_transfers(chain3, platform, [1])


def test_backward_waits_for_an_offload_still_in_flight():
    # Unit 2 (80 B) is still on its way out when the forward ends; B_4 needs its room
    # (keep-all peak 140 B at B_4, the limit is 130 B), so B_4 waits for O_2 to end.
    chain = Chain(
        fwd=[1.0] * 4, bwd=[1.0] * 4, act=[10] * 5, saved=[10, 80, 10, 10], fwd_tmp=[0] * 4, bwd_tmp=[0] * 4, name="late"
    )
    platform = Platform(memory=130, bandwidth_d2h=20.0, bandwidth_h2d=20.0)
    schedule = plan_transfers(chain, platform, [2])
    (off,) = [t for t in schedule.transfers if t.kind == "offload"]
    (pre,) = [t for t in schedule.transfers if t.kind == "prefetch"]
    assert (off.op, off.before) == (1, schedule.index("B", 4))
    assert pre.op == schedule.index("B", 4) and pre.at == "end"
    timeline = simulate(chain, platform, schedule)
    assert timeline.feasible and timeline.peak_memory == 130
    # O_2 2-6; F_3, F_4 run 2-4; B_4 waits, 6-7; P_2 7-11; B_3 11-12, B_2, B_1: 14.
    assert timeline.makespan == pytest.approx(14.0)


def test_plan_and_simulate_returns_the_plan_and_its_own_timeline():
    from chainoffload.planner import plan_and_simulate

    for chain, platform, units in _instances(5, seed=9):
        schedule, timeline = plan_and_simulate(chain, platform, units)
        assert schedule == plan_transfers(chain, platform, units)
        again = simulate(chain, platform, schedule)
        assert (timeline.feasible, timeline.makespan, timeline.peak_memory) == (again.feasible, again.makespan, again.peak_memory)


def test_no_original_counts_once_the_backward_waits_for_the_last_offload():
    # B_4 reads a_3 through P_3, which starts after O_3 ends, and O_3 ends after O_1 and O_2 (one
    # D2H queue): every original is released before B_4 allocates (NOTE [ the original is gone
    # when B_{v+1} starts ] in the kernel). Counting units 2 and 3's originals at B_4 and B_3
    # held P_1 and P_2 back, 23.25 s; without them the plan takes 22.75 s.
    chain = Chain(fwd=[1.5, 2.0, 1.5, 0.5], bwd=[1.5, 2.0, 0.5, 0.5], act=[31, 11, 38, 12, 3], saved=[33, 60, 12, 13])
    platform = Platform(memory=176, bandwidth_d2h=10.0, bandwidth_h2d=20.0, latency=0.25, duplex=False)
    timeline = simulate(chain, platform, plan_transfers(chain, platform, [1, 2, 3]))
    assert timeline.feasible and timeline.peak_memory <= 176
    assert timeline.makespan == 22.75


def test_unit_l_released_at_f_ls_own_instant_counts_in_the_backward_starting_then():
    # F_4 takes no time and both links are infinitely fast: O_4 ends at F_4's start, so unit 4's
    # original is released last at that instant (docs/model.md, "One instant": order 2n + 2),
    # after B_4 (0 s of P_4, P_3 kept) allocates. The safe sweep counted it freed and sent P_2
    # beside B_4 (193 B of 174) while saying every check passed; each sweep's verdict must be
    # the simulator's there, and the plan kept fits.
    from chainoffload.planner import _kplan, plan_arrays, schedule_from_arrays

    chain = Chain(fwd=[2.0, 0.0, 1.5, 0.0], bwd=[2.0, 0.5, 1.0, 2.0], act=[14, 21, 33, 7, 15], saved=[26, 54, 21, 41])
    platform = Platform(memory=174, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf, latency=0.0, duplex=False)
    units = np.array([1, 2, 4], dtype=np.int64)
    offload = np.zeros(5, dtype=np.int64)
    offload[units] = 1
    times = platform.latency + chain.saved / platform.bandwidth_d2h
    for optimistic, transfers in zip((False, True), plan_arrays(chain, platform, units)[:2], strict=True):
        fits = _kplan.plan_kernel(chain.fwd, chain.bwd, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp,
                                  platform.memory, times, times, platform.duplex, offload, optimistic, chain.saved.copy())[3]
        if fits:
            assert simulate(chain, platform, schedule_from_arrays(4, transfers)).feasible, optimistic
    timeline = simulate(chain, platform, plan_transfers(chain, platform, units))
    assert timeline.feasible and timeline.makespan == 9.0
