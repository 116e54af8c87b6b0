"""The brute-force oracle, and CP-SAT held to it on tiny chains."""

import math

import pytest

from chainoffload import Platform, Schedule, Status, keep_all_peak, simulate, solve
from chainoffload.exact import brute_force, enumerate_schedules
from chainoffload.generators import random_chain

# (seed, memory fraction between the stage floor and keep-all, bandwidth / (saved per fwd second), duplex)
CASES = [
    (1, 0.2, 0.1, True),
    (1, 0.5, 0.05, False),
    (1, 0.1, 0.2, True),
    (6, 0.5, 0.05, False),
    (8, 0.2, 0.1, True),
    (8, 0.5, 0.05, False),
    (8, 0.1, 0.2, True),
    (0, 0.5, 0.1, True),
    (2, 0.9, 0.1, True),
    (3, 0.8, 0.3, False),
    (5, 0.3, 0.05, True),
    (9, 0.9, 0.02, True),
]


def instance(seed, frac, ratio, duplex, length=3):
    chain = random_chain(seed, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    bw = float(chain.saved.sum()) / float(chain.fwd.sum()) * ratio
    return chain, Platform(memory=int(floor + (top - floor) * frac), bandwidth_d2h=bw, bandwidth_h2d=bw, duplex=duplex)


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}-m{c[1]}-bw{c[2]}-{'duplex' if c[3] else 'half'}" for c in CASES])
def test_cpsat_equals_brute_force(case):
    chain, platform = instance(*case)
    oracle = brute_force(chain, platform)
    exact = solve(chain, platform, "cpsat", time_limit=20.0)
    if oracle.status == Status.INFEASIBLE:
        assert exact.status == Status.INFEASIBLE
        return
    assert oracle.status == Status.OPTIMAL
    assert exact.status == Status.OPTIMAL
    # Within 3 R / scale (NOTE [ cpsat: time scale ]): gap limit R plus rounding both ways.
    tol = exact.info["tolerance"] * 3 + 1e-12 * chain.compute_time
    assert abs(exact.makespan - oracle.makespan) <= tol, (exact.makespan, oracle.makespan, tol)
    assert exact.lower_bound <= oracle.makespan + 1e-12


def test_the_cases_are_not_all_trivial():
    # The oracle test means something only if some optima offload and wait.
    waits = 0
    slower = 0
    for case in CASES[:3]:
        chain, platform = instance(*case)
        res = brute_force(chain, platform)
        assert res.feasible and res.schedule.offloaded_units
        slower += res.makespan > chain.compute_time * 1.01
        waits += any(t.before is not None for t in res.schedule.transfers)
    assert slower == 3 and waits >= 1


def test_tiny_example_by_hand(chain3):
    # keep-all fits at 192 B: the optimum is the compute time, 12 s, with no transfer.
    res = brute_force(chain3, Platform(memory=192, bandwidth_d2h=25.0, bandwidth_h2d=25.0))
    assert res.status == Status.OPTIMAL and res.makespan == 12.0 and res.schedule.transfers == ()
    # At 180 B something must go out; the oracle's answer is feasible and no faster than compute.
    res = brute_force(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0))
    assert res.feasible and res.makespan >= 12.0 and res.schedule.offloaded_units
    assert simulate(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), res.schedule).feasible


def test_tiny_example_matches_cpsat_at_every_memory(chain3):
    for memory in (162, 166, 170, 175, 180, 186, 192):
        platform = Platform(memory=memory, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
        oracle = brute_force(chain3, platform)
        exact = solve(chain3, platform, "cpsat", time_limit=10.0)
        assert oracle.status == exact.status, memory
        if oracle.feasible:
            assert math.isclose(oracle.makespan, exact.makespan, rel_tol=0, abs_tol=3 * exact.info["tolerance"] + 1e-12)


def test_every_candidate_is_well_formed_and_distinct(chain3):
    platform = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0, duplex=False)
    seen = set()
    for schedule in enumerate_schedules(chain3, platform):
        simulate(chain3, platform, schedule)  # raises ScheduleError if malformed
        key = schedule.to_json()
        assert key not in seen
        seen.add(key)
    assert len(seen) > 100


def test_no_bandwidth_means_keep_all_only(chain3):
    platform = Platform(memory=192, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    assert list(enumerate_schedules(chain3, platform)) == [Schedule.keep_all(3)]
    res = brute_force(chain3, platform.with_memory(180))
    assert res.status == Status.INFEASIBLE and res.min_memory == 192


def test_refuses_long_chains():
    chain = random_chain(0, 7)
    platform = Platform(memory=keep_all_peak(chain), bandwidth_d2h=1e9, bandwidth_h2d=1e9)
    with pytest.raises(ValueError, match=r"chain.length: 7 stages is above max_length=6"):
        brute_force(chain, platform)
    with pytest.raises(ValueError, match=r"max_length: 0"):
        brute_force(chain, platform, max_length=0)
