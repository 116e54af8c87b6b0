"""Method ``best``: local search that never loses to a baseline, and the memory bisection."""

import itertools
import math

import numpy as np
import pytest

from chainoffload import Platform, keep_all_peak, minimum_memory, simulate, solve
from chainoffload.bounds import lower_bound, offload_memory_floor
from chainoffload.generators import random_chain
from chainoffload.solvers import DEFAULT_METHOD

BASELINES = ["keep-all", "offload-all", "first-k", "largest-first"]


def _instances(count, seed=0, max_length=25):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        length = int(rng.integers(4, max_length))
        chain = random_chain(int(rng.integers(1 << 30)), length)
        lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
        memory = int(lo + (hi - lo) * rng.uniform(0.1, 0.9))
        bw = float(chain.saved.sum() / chain.compute_time * rng.uniform(0.3, 2.0))
        yield chain, Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-6, duplex=bool(rng.integers(2)))


def test_best_is_the_default():
    assert DEFAULT_METHOD == "best"


# The first four of the twelve instances in the fast profile, the other eight in the thorough one.
@pytest.mark.parametrize("part", [slice(0, 4), pytest.param(slice(4, 12), marks=pytest.mark.thorough)], ids=["0-3", "4-11"])
def test_feasible_and_never_worse_than_any_baseline(part):
    for chain, platform in itertools.islice(_instances(12), part.start, part.stop):
        result = solve(chain, platform, "best")
        for name in BASELINES:
            other = solve(chain, platform, name)
            if other.feasible:
                assert result.feasible, (name, chain.name)
                assert result.makespan <= other.makespan * (1 + 1e-12), (name, chain.name)
        if result.feasible:
            timeline = simulate(chain, platform, result.schedule)
            assert timeline.feasible and timeline.peak_memory <= platform.memory
            assert timeline.makespan == result.makespan
            assert result.makespan >= result.lower_bound >= chain.compute_time
            assert result.lower_bound >= lower_bound(chain, platform) * (1 - 1e-9)


def test_search_improves_on_its_start_somewhere():
    # The local search must do something beyond picking the best start.
    gains = 0
    for chain, platform in _instances(12, seed=5):
        result = solve(chain, platform, "best")
        start = result.info["start"]
        if result.feasible and result.makespan < result.info[f"{start}_makespan"] * (1 - 1e-9):
            gains += 1
    assert gains > 0


def test_keep_all_memory_gives_the_compute_time():
    chain = random_chain(4, 15)
    platform = Platform(memory=keep_all_peak(chain), bandwidth_d2h=1e9, bandwidth_h2d=1e9)
    result = solve(chain, platform)
    assert result.status.value == "optimal"
    assert result.makespan == pytest.approx(chain.compute_time)
    assert result.schedule.transfers == ()


def test_infinite_bandwidth_gives_no_overhead_down_to_the_offload_floor():
    chain = random_chain(9, 12)
    platform = Platform(memory=offload_memory_floor(chain), bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    result = solve(chain, platform, "best")
    assert result.feasible
    assert result.makespan == pytest.approx(chain.compute_time)


# One chain per case: the first in the fast profile, the other three in the thorough one.
@pytest.mark.parametrize("seed", [0, *(pytest.param(seed, marks=pytest.mark.thorough) for seed in (1, 2, 3))])
def test_more_memory_never_worse(seed):
    chain = random_chain(100 + seed, 14)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = 0.7 * float(chain.saved.sum()) / chain.compute_time
    previous = math.inf
    for memory in np.linspace(lo, hi, 8).astype(int):
        platform = Platform(memory=int(memory), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-6)
        result = solve(chain, platform, "best")
        assert result.makespan <= previous * (1 + 1e-12), (seed, int(memory))
        previous = result.makespan


def test_deterministic():
    chain, platform = next(_instances(1, seed=2))
    a, b = solve(chain, platform, "best"), solve(chain, platform, "best")
    assert a.schedule == b.schedule and a.makespan == b.makespan


@pytest.mark.parametrize(("option", "value"), [("time_limit", 0), ("time_limit", -1.0), ("max_evals", 0), ("max_evals", 2.5)])
def test_rejects_bad_limits(chain3, option, value):
    platform = Platform(memory=keep_all_peak(chain3), bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    with pytest.raises(ValueError, match=f"{option}: "):
        solve(chain3, platform, "best", **{option: value})


def test_remat_option_is_never_worse_than_joint():
    chain = random_chain(21, 10)
    lo, hi = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(lo + 0.3 * (hi - lo)), bandwidth_d2h=1e8, bandwidth_h2d=1e8, latency=1e-6)
    result = solve(chain, platform, "best", remat=True)
    joint = solve(chain, platform, "joint")
    assert result.feasible
    if joint.feasible:
        assert result.makespan <= joint.makespan * (1 + 1e-12)


def test_minimum_memory_brackets_feasibility():
    chain = random_chain(8, 10)
    platform = Platform(memory=1, bandwidth_d2h=2e8, bandwidth_h2d=2e8, latency=1e-6)
    for method in ("largest-first", "best"):
        least = minimum_memory(chain, platform, method, rel_tol=1e-3)
        assert least is not None
        assert offload_memory_floor(chain) <= least <= keep_all_peak(chain)
        assert solve(chain, platform.with_memory(least), method).feasible
        below = int(least * (1 - 2e-3))
        if below >= offload_memory_floor(chain):
            assert not solve(chain, platform.with_memory(below), method).feasible
    assert minimum_memory(chain, platform, "keep-all") == keep_all_peak(chain)


@pytest.mark.parametrize("seed", range(4))
def test_first_fit_fits_exactly_where_the_full_search_does(seed):
    # minimum_memory passes first_fit (the registry's fits_option): whether a schedule fits must
    # not change, only the work spent on its makespan.
    chain = random_chain(seed, 12)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    bw = 0.5 * float(chain.saved.sum()) / chain.compute_time
    for level in (0.0, 0.02, 0.1, 0.3, 0.6):
        platform = Platform(memory=int(floor + level * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)
        full, first = solve(chain, platform, "best"), solve(chain, platform, "best", first_fit=True)
        assert full.feasible == first.feasible, (seed, level)
        assert first.info["evals"] <= full.info["evals"]
        if first.feasible:
            assert first.makespan >= full.makespan and first.info["restart"] is None
            assert simulate(chain, platform, first.schedule).makespan == first.makespan


def test_minimum_memory_rejects_bad_tolerance(chain3):
    platform = Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    with pytest.raises(ValueError, match="rel_tol"):
        minimum_memory(chain3, platform, "best", rel_tol=0)


@pytest.mark.parametrize("name,memory", [("resnet18", 1438209368), ("resnet50", 5574966783)])
def test_moves_a_i_alone_where_that_wins(name, memory):
    # Issue 21: only a few MB must leave here; a whole unit's transfer makes the backward wait
    # (best's whole-unit schedules took 17.698 ms and 50.629 ms), while a_i alone hides behind
    # compute: the makespan is the compute time, proven optimal.
    from chainoffload.examples import example

    chain = example(name)
    platform = Platform(memory=memory, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=10e-6)
    result = solve(chain, platform, "best")
    assert result.feasible and result.info["alone"]
    assert any(t.moves == "act" for t in result.schedule.transfers)
    assert result.makespan == pytest.approx(chain.compute_time, rel=1e-12)
    assert result.status.value == "optimal"


def _resnet18_80_pcie3():
    from chainoffload.examples import example

    chain = example("resnet18")
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.8 * (peak - floor)), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=10e-6, duplex=False)
    return chain, platform


def test_a_restart_from_every_a_i_alone_crosses_what_one_move_cannot():
    # NOTE [ local improvement ], restarts: from unit 4 whole (34.79 ms, where the first walk
    # stops: each a_i added alone is worse or does not fit) to a_3, a_5, a_6 and a_7 alone;
    # CP-SAT proves 21.959 ms (benchmarks/results/act_alone.md).
    # The local search alone (cpsat_work=0): CP-SAT after it is tests/test_lns.py's.
    chain, platform = _resnet18_80_pcie3()
    result = solve(chain, platform, "best", cpsat_work=0)
    assert result.feasible and result.info["restart"] == "all alone"
    assert result.makespan == pytest.approx(0.027291, abs=1e-6)
    assert sorted(result.info["alone"]) == sorted(result.info["units"]) == [3, 5, 6, 7]
    assert simulate(chain, platform, result.schedule).makespan == result.makespan
    # The restarts only spend what the first walk left of the budget.
    short = solve(chain, platform, "best", max_evals=100, cpsat_work=0)
    assert short.info["restart"] is None and short.info["evals"] == 100
    assert short.makespan == pytest.approx(0.0347895, abs=1e-6)


# -- NOTE [ best's work budget ]: no clock by default ---------------------------------------------


def _mid_instance(length):
    # benchmarks/_common.py's scaling instance: memory halfway from the floor to the keep-all
    # peak, links at half the balance rate.
    chain = random_chain(1000 + length, length)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    bw = 0.5 * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(floor + 0.5 * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


def _fingerprint(result):
    return result.status, result.makespan, result.lower_bound, result.schedule.to_dict(), result.info["evals"], result.info["stopped"]


def test_best_by_default_does_not_read_the_clock(monkeypatch):
    # A clock that runs 10^4 s per reading spends any wall-clock budget at once: by default best
    # (and the bound, and solve) must return the same schedule all the same.
    import time

    chain, platform = _mid_instance(400)
    normal = solve(chain, platform)
    assert normal.feasible and normal.info["stopped"] in ("converged", "evals")
    ticks = itertools.count()
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + 1e4 * next(ticks))
    slowed = solve(_copy(chain), platform)
    assert _fingerprint(slowed) == _fingerprint(normal)
    # A time limit the user sets is wall-clock: under that clock it stops the search at once.
    timed = solve(_copy(chain), platform, time_limit=60.0)
    assert timed.info["stopped"] == "time"


def _copy(chain):
    from chainoffload import Chain

    return Chain.from_dict(chain.to_dict())


@pytest.mark.thorough(seconds=60)
def test_best_at_ten_thousand_stages_is_the_same_under_load():
    # Issue 21: with default options best's result does not depend on the machine's load. A
    # busy thread takes the GIL half the time (the run takes longer in wall time).
    import threading

    chain, platform = _mid_instance(10_000)
    quiet = solve(chain, platform)
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        loaded = solve(_copy(chain), platform)
    finally:
        stop.set()
        worker.join()
    assert _fingerprint(loaded) == _fingerprint(quiet)
