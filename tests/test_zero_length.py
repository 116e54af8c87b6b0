"""Issue 33: chains whose forward or backward ops take 0 s.

The pure-offloading methods said "no schedule" on the issue's chain, where CP-SAT finds a
6.625 s schedule: the planner counted a prefetch that starts at a zero-length op's instant
after that op's allocation (docs/model.md orders it before), counted the loss gradient twice at
B_L, and kept counting copies whose offload a wait in the backward had already seen end
(NOTE [ prefetch at a zero-length instant ] and NOTE [ a wait frees the copies before it ] in
the planner's kernel), and counted originals at B_{V+1}, which starts after every one is released
(NOTE [ the original is gone when B_{v+1} starts ]). Every schedule here is replayed by the
simulator.
"""

import itertools
import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from chainoffload import Chain, Platform, Status, simulate, solve
from chainoffload.cli import main
from chainoffload.planner import plan_arrays, plan_transfers
from chainoffload.solvers import _search
from chainoffload.solvers.dp import fluid_plan
from chainoffload.testing import assert_feasible
from chainoffload.testing.strategies import chains, instances

CHAIN = Chain(name="issue33", fwd=[0, 0, 0, 1], bwd=[1, 0, 2, 0], act=[0, 8, 21, 29, 12], saved=[8, 55, 43, 34])
PLATFORM = Platform(memory=167, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.5)
PURE = ("offload-all", "first-k", "largest-first", "lp", "dp", "best")


def replayed(result, chain, platform):
    """The result's schedule fits, and the simulator gives the makespan and peak it reports."""
    assert result.feasible, result.message
    assert_feasible(result, chain, platform)
    tl = simulate(chain, platform, result.schedule)
    assert tl.feasible and tl.makespan == result.makespan and tl.peak_memory == result.peak_memory
    return tl


@pytest.mark.parametrize("method", PURE)
def test_every_pure_offloading_method_finds_a_schedule(method):
    replayed(solve(CHAIN, PLATFORM, method), CHAIN, PLATFORM)


def test_keep_all_still_does_not_fit():
    result = solve(CHAIN, PLATFORM, "keep-all")
    assert result.status == Status.INFEASIBLE and result.min_memory == 181


def test_best_reaches_the_cpsat_optimum():
    # CP-SAT proves 6.625 s optimal here; best's search alone ends at 7.175 s (P_1 sent behind
    # B_4 as P_2's lead) and its exact improver (the default work) closes the gap.
    alone = solve(CHAIN, PLATFORM, "best", cpsat_work=0)
    replayed(alone, CHAIN, PLATFORM)
    result = solve(CHAIN, PLATFORM, "best", cpsat_work=2.0)
    replayed(result, CHAIN, PLATFORM)
    assert result.makespan == 6.625 and result.makespan <= alone.makespan


def test_prefetch_starting_at_a_zero_length_instant_is_queued_behind_a_lead():
    # O_2 ends as the zero-length B_4 starts (B_4 waits for it); P_2, which B_3 needs, cannot
    # start earlier, so starting at once it would allocate with B_4 (173 B). Queued behind
    # P_1 it starts 0.7 s later and the plan fits.
    schedule = plan_transfers(CHAIN, PLATFORM, [1, 2])
    tl = simulate(CHAIN, PLATFORM, schedule)
    assert tl.feasible and tl.peak_memory <= 167
    prefetches = [t for t in schedule.transfers if t.kind == "prefetch"]
    # both at the end of B_4, P_1 first in the list: the H2D queue serves it first
    assert [(t.unit, t.op, t.at) for t in prefetches] == [(1, 4, "end"), (2, 4, "end")]


def test_a_wait_in_the_backward_frees_the_copies_counted_before_it():
    # B_4 waits for O_3, which ends after O_2: unit 2's copy is gone by then, and P_2 fits.
    tl = simulate(CHAIN, PLATFORM, plan_transfers(CHAIN, PLATFORM, [1, 2, 3]))
    assert tl.feasible and tl.peak_memory <= 167


def test_the_loss_gradient_counts_once_at_b_l():
    # At 110 B, P_1 fits beside B_3 (units 2 and 3: 50 B, g_3 = 30 B, g_2 = 10 B, unit 1: 20 B):
    # the safe sweep sends it at the end of F_3 (op 2). Counting g_3 twice (140 B) held it back
    # to the end of B_3 (op 3). (The eager timing hid this from the plan kept: P_1 at B_3's start.)
    chain = Chain(fwd=[1, 1, 1], bwd=[1, 1, 1], act=[0, 10, 10, 30], saved=[20, 20, 30])
    platform = Platform(memory=110, bandwidth_d2h=20.0, bandwidth_h2d=20.0)
    kind, unit, op, at, before = plan_arrays(chain, platform, np.array([1], dtype=np.int64))[0]
    assert op[kind == 1].tolist() == [2]
    tl = simulate(chain, platform, plan_transfers(chain, platform, [1]))
    assert tl.feasible and tl.makespan == 6.0


def test_min_memory_is_the_least_memory_any_schedule_needs(capsys, tmp_path):
    # The brute force over every fixed-order schedule of this chain (3,728,037 of them, ~8 min)
    # finds none with a peak below 156 B: the bisection's 156 B is exact. (The 160 B is
    # the peak of CP-SAT's fastest schedule at 167 B, not the least memory.)
    path = tmp_path / "issue33.json"
    CHAIN.save(str(path))
    code = main(["solve", str(path), "--memory", "167", "--bandwidth-d2h", "20", "--bandwidth-h2d", "40",
                 "--latency", "0.5", "--min-memory", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and res["status"] in ("optimal", "feasible")
    assert res["min_memory"] == 156
    at = Platform(memory=156, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.5)
    replayed(solve(CHAIN, at, "best"), CHAIN, at)
    below = Platform(memory=155, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.5)
    assert solve(CHAIN, below, "cpsat", time_limit=60.0, workers=1).status == Status.INFEASIBLE


def test_best_asks_cpsat_where_its_search_finds_nothing():
    # A half-duplex chain of the zero-length benchmark (benchmarks/zero_length.py, instance 242 of
    # seed 33) where no unit set the planner writes fits, but CP-SAT finds a 7.95 s schedule.
    chain = Chain(fwd=[0.0, 0.75, 0.875, 1.625], bwd=[0.0, 2.0, 0.5, 0.0], act=[3, 10, 31, 15, 9], saved=[18, 71, 41, 35])
    platform = Platform(memory=162, bandwidth_d2h=40.0, bandwidth_h2d=40.0, latency=0.25, duplex=False)
    assert solve(chain, platform, "best", cpsat_work=0).status == Status.INFEASIBLE
    result = solve(chain, platform, "best", cpsat_work=2.0)
    replayed(result, chain, platform)
    assert result.info["found_by"] == "cpsat" and result.info["lns"]["mode"] == "find"


def test_best_says_when_cpsat_proves_that_nothing_fits():
    # 155 B: above the offload memory floor (148 B), below the least peak of any schedule (156 B).
    below = Platform(memory=155, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.5)
    result = solve(CHAIN, below, "best", cpsat_work=2.0)
    assert result.status == Status.INFEASIBLE and "CP-SAT proved that no schedule fits" in result.message
    assert result.info["lns"]["whole"] == "INFEASIBLE"


# Chains of the zero-length benchmark (benchmarks/zero_length.py --instances 400 --seed 33; the
# first number is the instance) as (fwd, bwd, act, saved, memory, d2h, h2d, latency, duplex).
BENCH = {
    37: ([0.625, 0, 0, 1.625], [0, 0, 0, 0], [18, 16, 7, 13, 8], [54, 36, 13, 15], 152, 10.0, 20.0, 0.0, True),
    43: ([0, 0.125, 0, 0], [0, 1.75, 0, 0], [6, 23, 31, 4, 29], [57, 44, 14, 64], 176, 80.0, 20.0, 0.5, True),
    100: ([1.375, 0.625, 0, 1.125], [0.75, 1.0, 0, 0], [8, 18, 8, 3, 7], [24, 47, 17, 7], 110, 10.0, 80.0, 0.25, False),
    115: ([0.125, 0.25, 0, 0], [0, 0.125, 0, 0], [25, 27, 0, 2, 27], [32, 0, 50, 67], 172, 80.0, 40.0, 0.25, True),
    269: ([1.5, 1.375, 0.25, 1.5], [1.875, 1.75, 0, 0], [1, 20, 30, 6, 2], [41, 39, 38, 44], 167, 20.0, 10.0, 0.25, False),
    310: ([1.75, 0, 1.25, 0], [0.625, 0, 0, 0], [8, 14, 12, 9, 1], [34, 23, 9, 28], 110, 10.0, 40.0, 0.0, True),
    364: ([1.125, 0, 2.0, 0], [1.25, 1.125, 0, 0], [30, 32, 25, 12, 1], [50, 61, 32, 47], 220, 20.0, 10.0, 0.25, True),
    25: ([0, 1.0, 0, 0], [0.75, 2.0, 1.0, 0], [26, 5, 7, 13, 23], [13, 53, 34, 35], 168, 20.0, 10.0, 0.5, True),
    42: ([0.75, 0, 0, 0.25], [0, 0, 0.125, 0], [25, 8, 15, 1, 31], [12, 40, 37, 41], 159, 80.0, 40.0, 0.0, True),
    65: ([1.75, 1.375, 0, 1.25], [0, 1.25, 0.5, 0], [12, 1, 31, 25, 16], [5, 67, 28, 56], 203, 10.0, 80.0, 0.0, True),
    355: ([0.625, 0, 0.25, 0], [0, 0, 1.125, 0], [27, 10, 32, 11, 16], [20, 68, 52, 48], 220, 40.0, 80.0, 0.0, True),
    360: ([1.5, 0, 0, 2.0], [0.25, 0.25, 1.375, 0], [22, 20, 20, 6, 27], [32, 48, 51, 38], 189, 10.0, 80.0, 0.25, True),
    383: ([0.25, 1.625, 0, 0.5], [0, 1.0, 1.125, 0], [17, 26, 28, 8, 32], [55, 72, 44, 72], 230, 20.0, 80.0, 0.0, False),
    74: ([0, 0.375, 1.375, 1.625], [0, 0.625, 0.375, 0], [8, 14, 2, 32, 28], [33, 45, 65, 57], 229, 40.0, 10.0, 0.25, True),
    242: ([0, 0.75, 0.875, 1.625], [0, 2.0, 0.5, 0], [3, 10, 31, 15, 9], [18, 71, 41, 35], 162, 40.0, 40.0, 0.25, False),
}


def bench(i):
    fwd, bwd, act, saved, memory, d2h, h2d, latency, duplex = BENCH[i]
    chain = Chain(name=f"z{i}", fwd=fwd, bwd=bwd, act=act, saved=saved)
    return chain, Platform(memory=memory, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=latency, duplex=duplex)


# 37, 43, 100, 115, 269, 310, 364: dp found nothing (each of its plans offloaded one unit whose prefetch
# must start at the instant of a zero-length B op, which the fluid DP counted as free: NOTE
# [ prefetch at a zero-length B ] in its kernel). 25, 42, 65, 355, 360, 383: dp found nothing
# when that first prefetch had to be one of the units popped at the wait (the plans that fit send
# unit 1, brought in later by the DP, first). 74: dp was the only pure-offloading method that fit.
@pytest.mark.parametrize("instance", [37, 43, 100, 115, 269, 310, 364, 25, 42, 65, 355, 360, 383, 74])
def test_dp_solves_the_zero_length_benchmark_chains(instance):
    chain, platform = bench(instance)
    result = solve(chain, platform, "dp")
    replayed(result, chain, platform)
    # The DP's own plan at the memory fits: no repair was needed to find it.
    assert result.info["repairs"] == 0 and result.info["units"] == [1, 2]


def test_fluid_dp_counts_a_prefetch_starting_at_a_zero_length_b():
    # Every op of the backward takes 0 s. Offloading unit 2 alone frees B_4's 5 B excess only if
    # P_2 starts after B_4's instant; but its trigger is B_4's end at the earliest (B_3 needs
    # it), where it allocates before B_4 does: 157 B. The DP chose [2] at every budget.
    chain, platform = bench(37)
    units, _ = fluid_plan(chain, platform)
    assert units == [1, 2]
    assert not simulate(chain, platform, plan_transfers(chain, platform, [2])).feasible
    assert simulate(chain, platform, plan_transfers(chain, platform, units)).feasible


def test_a_unit_of_zero_bytes_is_the_lead():
    # Unit 2 holds 0 B: offloaded, its prefetch (0.25 s of latency) goes first at B_4's end and
    # P_1 after it, past the instant. Kept, it ties with offloaded (same bytes, same time); the
    # DP keeps the plan with the smaller lead.
    chain, platform = bench(115)
    assert fluid_plan(chain, platform)[0] == [1, 2]


def test_no_unit_set_holds_a_plan_that_fits_on_242():
    # Where every method but best misses chain 242, the planner's plan of every unit set is
    # rejected: CP-SAT's 7.95 s schedule moves a_2 and a_3 alone, which no unit set does.
    chain, platform = bench(242)
    sets = [s for k in range(chain.length) for s in itertools.combinations(range(1, chain.length), k)]
    for units in sets:
        assert not simulate(chain, platform, plan_transfers(chain, platform, list(units))).feasible, units


@pytest.mark.parametrize("method", ["offload-all", "largest-first"])
def test_every_unit_offloaded_fits_on_74(method):
    # B_4 waits for P_3, which cannot start before O_3 ends, so unit 3's original (and, O_3 being
    # last in the D2H queue, every other) is gone when B_4 allocates: P_1 and P_2 fit beside it
    # (223 B of 229). The planner counted unit 3's original there, held P_1 and P_2 back to B_3's
    # end and broke the limit at B_3 (235 B), so offload-all and largest-first found nothing
    # (NOTE [ the original is gone when B_{v+1} starts ] in the planner's kernel).
    chain, platform = bench(74)
    planned = plan_transfers(chain, platform, [1, 2, 3])
    prefetch = {t.unit: (t.op, t.at) for t in planned.transfers if t.kind == "prefetch"}
    assert prefetch == {3: (3, "end"), 1: (4, "end"), 2: (4, "end")}
    tl = simulate(chain, platform, planned)
    assert tl.feasible and tl.peak_memory == 223 and tl.makespan == 20.375
    result = solve(chain, platform, method)
    replayed(result, chain, platform)
    assert result.makespan == 20.375 and result.info["units"] == [1, 2, 3]


# A random chain with zero-length ops where the planner's plan of the whole stage order
# {1, 2, 3, 4} is rejected and that of {1, 2, 3} fits (fitting is not monotone in the prefix).
# Chain 74 of the zero-length benchmark was the example until the planner stopped counting
# originals at B_{V+1} (the test above).
SCAN_CHAIN = Chain(name="scan", fwd=[0.5, 2.0, 0.0, 0.0, 1.5], bwd=[1.0, 2.0, 0.0, 0.0, 2.0], act=[14, 35, 4, 37, 8, 11],
                   saved=[70, 26, 45, 31, 24], fwd_tmp=[0, 1, 3, 6, 9], bwd_tmp=[9, 7, 6, 2, 5])
SCAN_PLATFORM = Platform(memory=210, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.0, duplex=False)


@pytest.mark.parametrize("method", ["first-k", "lp"])
def test_first_k_and_lp_find_the_prefix_that_fits_below_the_whole_order(method):
    # {1, 2, 3, 4} is rejected and {1, 2, 3} fits: the bisection alone (no scan) gave up once the
    # whole order was rejected.
    chain, platform = SCAN_CHAIN, SCAN_PLATFORM
    assert not simulate(chain, platform, plan_transfers(chain, platform, [1, 2, 3, 4])).feasible
    result = solve(chain, platform, method)
    replayed(result, chain, platform)
    assert result.info["units"] == [1, 2, 3]
    with mock.patch.object(_search, "SCAN_STAGES", 0):
        assert solve(chain, platform, method).status == Status.INFEASIBLE


def test_the_scan_of_shorter_prefixes_stays_within_its_work_limit():
    # 5 stages per plan: a limit of 5 stages allows one plan ({1, 2, 3}, the longest proper
    # prefix), 4 allows none.
    chain, platform = SCAN_CHAIN, SCAN_PLATFORM
    for stages, fits in ((5, True), (4, False)):
        with mock.patch.object(_search, "SCAN_STAGES", stages):
            search = _search.Evaluator(chain, platform)
            assert (search.prefixes([1, 2, 3, 4], "first-k", scan=True) is not None) == fits
            # the whole order, then {1, 2, 3} if allowed; once it fits, three plans of the
            # bisection below it
            assert search.evals == (5 if fits else 1)


def _same(new, old):
    assert new.status == old.status
    if old.feasible:
        assert new.makespan == old.makespan and new.info["units"] == old.info["units"]
        assert new.schedule.transfers == old.schedule.transfers


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(chains=chains(max_length=8, max_bytes=64, min_time=0.125, max_time=2.0, time_resolution=0.125), memory_slack=0.0))
def test_chains_without_zero_length_ops_get_the_old_results(instance):
    # The scan (NOTE [ prefixes that fit below one that does not ]) runs only where the whole order
    # is rejected: wherever the old search (no scan) found a schedule, the new one returns the
    # same; where it found none, a schedule the new one finds must replay.
    chain, platform = instance
    for method in ("first-k", "lp"):
        new = solve(chain, platform, method)
        with mock.patch.object(_search, "SCAN_STAGES", 0):
            old = solve(chain, platform, method)
        if old.feasible or not new.feasible:
            _same(new, old)
        else:
            replayed(new, chain, platform)
