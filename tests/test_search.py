"""The shared unit-set search on arrays (solvers/_search.py): same verdicts as the simulator."""

import numpy as np
import pytest

from chainoffload import Platform, Status, keep_all_peak, simulate, solve
from chainoffload.bounds import offload_memory_floor
from chainoffload.generators import random_chain
from chainoffload.planner import plan_and_simulate
from chainoffload.solvers._search import Evaluator, boundary, well_formed


def _instance(seed, length, level=0.4, rate=0.6):
    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = rate * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(lo + level * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-6)


def test_candidates_agree_with_the_simulator():
    # NOTE [ search without objects ]: a candidate's figures are the simulator's for its schedule.
    rng = np.random.default_rng(3)
    for seed in range(12):
        chain, platform = _instance(seed, int(rng.integers(3, 30)))
        search = Evaluator(chain, platform)
        for _ in range(5):
            units = [u for u in range(1, chain.length) if rng.random() < 0.4]
            cand = search.units(units)
            timeline = simulate(chain, platform, cand.schedule())
            assert cand.feasible == timeline.feasible
            assert cand.makespan == timeline.makespan and cand.peak == timeline.peak_memory
            assert cand.offloaded == timeline.offloaded_bytes
            assert plan_and_simulate(chain, platform, units)[0] == cand.schedule()


def test_cache_and_budget():
    chain, platform = _instance(1, 12)
    search = Evaluator(chain, platform, max_evals=2)
    a = search.units([1, 3])
    assert search.units([3, 1]) is a and search.evals == 1
    search.units([2])
    assert search.exhausted and search.stopped == "evals"
    assert search.consider([4], "x") is None  # done: nothing more is evaluated
    past = Evaluator(chain, platform, deadline=0.0)
    assert past.exhausted and past.stopped == "time"


def test_well_formed_rejects_what_validate_rejects():
    chain, platform = _instance(2, 8, level=0.2)
    cand = Evaluator(chain, platform).units([1, 2, 3])
    n_ops = 2 * chain.length
    kind, unit, op, at, before = (a.copy() for a in cand.transfers)
    assert well_formed(n_ops, (kind, unit, op, at, before))
    bad_op = op.copy()
    bad_op[0] = n_ops
    assert not well_formed(n_ops, (kind, unit, bad_op, at, before))
    # a prefetch triggered before its offload
    early = op.copy()
    p = int(np.flatnonzero((kind == 1) & (unit == unit[0]))[0])
    early[p] = 0
    at2 = at.copy()
    at2[p] = 0
    assert not well_formed(n_ops, (kind, unit, early, at2, before))
    # a wait on an op at or before the trigger
    wait = before.copy()
    wait[0] = op[0]
    assert not well_formed(n_ops, (kind, unit, op, at, wait))


def test_boundary_is_one_bisection_both_ways():
    assert boundary(100, 0, lambda k: k >= 37) == 37  # least that holds
    assert boundary(0, 100, lambda k: k <= 62) == 62  # largest that holds
    assert boundary(100, 0, lambda k: k >= 37, width=10) - 37 <= 10
    assert boundary(100, 0, lambda k: None) is None
    calls = []
    boundary(1000, 0, lambda k: calls.append(k) or True, steps=3)
    assert len(calls) == 3


def test_prefixes_find_the_shortest_fitting_prefix():
    chain, platform = _instance(5, 20, level=0.3)
    order = list(range(1, chain.length))
    search = Evaluator(chain, platform)
    k = search.prefixes(order, "first-k")
    assert k is not None and search.units(order[:k]).feasible
    if k > 0:
        assert not search.units(order[: k - 1]).feasible
    assert solve(chain, platform, "first-k").info["units"] == order[:k]


def test_a_time_limit_returns_the_best_so_far():
    chain, platform = _instance(11, 300, level=0.3)
    r = solve(chain, platform, "best", time_limit=0.05)
    assert r.status in (Status.FEASIBLE, Status.TIMEOUT)
    assert r.info["stopped"] == "time"
    if r.status == Status.TIMEOUT:
        assert r.schedule is None
    for method in ("first-k", "lp", "dp"):
        r = solve(chain, platform, method, time_limit=0.01)
        assert r.status in (Status.FEASIBLE, Status.TIMEOUT, Status.OPTIMAL)


@pytest.mark.parametrize("method", ["lp", "dp", "best"])
def test_interpreted_kernels_give_the_same_answers(method):
    # A cold start may run interpreted copies of the kernel modules (NOTE [ lazy kernels ]).
    from chainoffload._kernels import INTERPRETED

    chain, platform = _instance(4, 9)
    # No time limit to bite (an interpreted run is slower; the answers must not depend on speed).
    options = {"time_limit": 3600.0} if method == "best" else {}
    jitted = solve(chain, platform, method, **options)
    INTERPRETED[0] = True
    try:
        interpreted = solve(chain, platform, method, **options)
    finally:
        INTERPRETED[0] = False
    assert interpreted.schedule == jitted.schedule and interpreted.makespan == jitted.makespan
