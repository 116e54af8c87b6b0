"""Every registered method on arbitrary instances: feasible as claimed, bounded, and never below the optimum.

The methods are whatever :func:`chainoffload.solvers.methods` lists when this module is
collected, so a method registered later is tested without a change here. A method whose module
fails to import fails these tests (it is registered, so it must work); nothing is skipped.

CP-SAT tests use chains of at most three stages (two against brute force) and a 3 s limit; they compare
only what CP-SAT proves (its optimum when the status is optimal, else its lower bound). The
rematerialization methods solve a larger problem (they may recompute), so they are held to the
feasibility and bound properties but not compared with the pure-offloading optimum.
"""

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Chain, Platform, Status, keep_all_peak, methods, solve
from chainoffload.solvers import spec
from chainoffload.testing import assert_feasible, assert_no_better_than_optimal, chains, instances

METHODS = list(methods())
PURE = [m for m in METHODS if not spec(m).remat]
BASELINES = ("keep-all", "offload-all", "first-k", "largest-first")

CPSAT_LIMIT = 3.0  # seconds; tiny chains solve in well under a second
# CP-SAT's optimum is exact on its integer time grid; its info["tolerance"] says by how much the
# simulated makespan may differ. Times on a grid of 1/8 s keep that slack from mattering.
# Times on CP-SAT's grid; zero-length ops are pinned by the two regression tests at the end of
# this module (the simulator once ordered a zero-length B_i's frees before its own allocation).
TINY = chains(min_length=1, max_length=3, max_bytes=256, min_time=0.125, max_time=4.0, time_resolution=0.125)
SMALL = chains(min_length=1, max_length=6, max_bytes=4096, min_time=1e-3)
# Deterministic budgets (no wall-clock cut) so that comparisons between two runs are fair.
OPTIONS = {"cpsat": {"time_limit": CPSAT_LIMIT}, "best": {"time_limit": 60.0, "max_evals": 300}}


def run(chain, platform, method):
    return solve(chain, platform, method, **OPTIONS.get(method, {}))


def check_result(result, chain, platform):
    """The properties every result of every method has."""
    assert result.status != Status.ERROR, f"{result.method}: {result.message}"
    if result.feasible:
        assert_feasible(result, chain, platform)  # re-simulated; compute_time <= bound <= makespan
        assert result.peak_memory <= platform.memory
        assert result.makespan >= result.lower_bound * (1 - 1e-12) >= chain.compute_time * (1 - 1e-9)
    else:
        assert result.status in (Status.INFEASIBLE, Status.TIMEOUT), result.status
        assert math.isinf(result.makespan)
        if result.min_memory is not None:
            assert result.min_memory > platform.memory, (result.min_memory, platform.memory)
        if not math.isnan(result.lower_bound):
            assert result.lower_bound >= chain.compute_time * (1 - 1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_method_loads(method):
    # A registered method whose module is missing or broken fails here with the import error.
    assert callable(spec(method).load())


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=examples(0.5))
@given(data=st.data())
def test_results_are_feasible_at_the_stated_memory(method, data):
    strategy = TINY if method == "cpsat" else SMALL
    chain, platform = data.draw(instances(chains=strategy, zero_bandwidth=True, inf_bandwidth=True), label="instance")
    result = run(chain, platform, method)
    assert result.method == method
    check_result(result, chain, platform)
    if method == "keep-all":
        # keep-all fits exactly when the keep-all peak does, and is then optimal
        fits = platform.memory >= keep_all_peak(chain)
        assert result.feasible == fits and (not fits or result.status == Status.OPTIMAL)


_EXACT: dict = {}


def exact(chain, platform):
    """CP-SAT's result, memoised: Hypothesis replays an example several times while shrinking."""
    key = (chain.to_json(), platform.to_json())
    if key not in _EXACT:
        _EXACT[key] = run(chain, platform, "cpsat")
    return _EXACT[key]


@pytest.mark.parametrize("method", [m for m in PURE if m != "cpsat"])
@settings(max_examples=examples(0.4))
@given(instance=instances(chains=TINY, inf_bandwidth=True))
def test_cpsat_is_no_worse_than(method, instance):
    chain, platform = instance
    ref = exact(chain, platform)
    check_result(ref, chain, platform)
    tol = float(ref.info.get("tolerance", 0.0) or 0.0)
    other = run(chain, platform, method)
    check_result(other, chain, platform)
    if ref.status == Status.INFEASIBLE:
        # no schedule fits: nobody may find one
        assert not other.feasible, f"cpsat says infeasible but {method} finds makespan {other.makespan!r}"
    else:
        # the optimum when proven, else CP-SAT's lower bound
        assert_no_better_than_optimal(other, ref, rel_tol=1e-9, abs_tol=tol)
    if other.feasible and ref.feasible:
        # the other way round too: a method's proven lower bound is below CP-SAT's schedule
        assert_no_better_than_optimal(ref, other.lower_bound, abs_tol=tol)


@settings(max_examples=examples(0.3))
@given(instances(chains=chains(min_length=1, max_length=2, max_bytes=64, min_time=0.25, max_time=4.0, time_resolution=0.25), inf_bandwidth=True))
def test_brute_force_equals_cpsat(instance):
    from chainoffload.exact import brute_force  # written alongside; a missing module fails the test

    chain, platform = instance
    exact_result = exact(chain, platform)
    brute = brute_force(chain, platform)
    # a Result (status, makespan, schedule) or a bare makespan (inf: no schedule fits)
    b_makespan = float(getattr(brute, "makespan", brute))
    b_schedule = getattr(brute, "schedule", None)
    tol = float(exact_result.info.get("tolerance", 0.0) or 0.0) + 1e-9 * max(1.0, chain.compute_time)
    if exact_result.status == Status.OPTIMAL:
        assert math.isfinite(b_makespan), f"cpsat finds {exact_result.makespan!r}, brute force nothing"
        assert abs(b_makespan - exact_result.makespan) <= tol, f"brute force {b_makespan!r} != cpsat {exact_result.makespan!r}"
    elif exact_result.status == Status.INFEASIBLE:
        assert math.isinf(b_makespan), f"cpsat says infeasible, brute force finds {b_makespan!r}"
    elif exact_result.feasible:
        # cpsat stopped early: its schedule cannot beat the enumerated optimum
        assert_no_better_than_optimal(exact_result, b_makespan, abs_tol=tol)
    if b_schedule is not None:
        tl = assert_feasible(b_schedule, chain, platform)
        assert tl.makespan == b_makespan


@settings(max_examples=examples(0.3))
@given(instances(chains=SMALL, inf_bandwidth=True), st.integers(0, 1 << 14), st.sampled_from([1.0, 1.5, 2.0, 8.0, math.inf]))
def test_best_is_monotone_in_memory_and_bandwidth(instance, more_memory, faster):
    """More memory, or a faster link, never makes ``best`` worse."""
    chain, platform = instance
    base = run(chain, platform, "best")
    check_result(base, chain, platform)
    roomier = platform.with_memory(platform.memory + more_memory)
    quicker = platform.replace(
        bandwidth_d2h=platform.bandwidth_d2h * faster, bandwidth_h2d=platform.bandwidth_h2d * faster
    )
    for label, changed in (("memory", roomier), ("bandwidth", quicker)):
        result = run(chain, changed, "best")
        check_result(result, chain, changed)
        if base.feasible:
            assert result.feasible, f"more {label} made best infeasible (was {base.makespan!r})"
            assert result.makespan <= base.makespan * (1 + 1e-9), (
                f"more {label}: best's makespan went from {base.makespan!r} to {result.makespan!r}"
            )


@settings(max_examples=examples(0.3))
@given(instances(chains=SMALL, inf_bandwidth=True))
def test_best_is_never_worse_than_a_baseline(instance):
    chain, platform = instance
    result = run(chain, platform, "best")
    check_result(result, chain, platform)
    for method in BASELINES:
        other = run(chain, platform, method)
        if other.feasible:
            assert result.feasible, f"{method} fits ({other.makespan!r}) but best does not"
            assert result.makespan <= other.makespan * (1 + 1e-12), (method, other.makespan, result.makespan)


def test_zero_length_backward_counts_its_unit_and_its_transient():
    chain = Chain(fwd=[0.0, 0.125], bwd=[0.0, 0.0], act=[0, 0, 0], saved=[1, 1], fwd_tmp=[0, 0], bwd_tmp=[0, 2])
    assert keep_all_peak(chain) >= chain.stage_memory_floor()
    # B_2 reads unit 2 while its transient is alive, with unit 1 still kept for B_1
    assert keep_all_peak(chain) == 1 + 1 + 2


def test_vanishing_backward_does_not_put_the_bound_above_the_makespan():
    chain = Chain(
        fwd=[0.0, 0.0, 0.0, 1.0], bwd=[0.0, 0.0, 0.0, 1.175494351e-38], act=[0, 0, 0, 0, 0], saved=[0, 1, 0, 0],
        fwd_tmp=[0, 0, 0, 0], bwd_tmp=[0, 0, 0, 1],
    )
    platform = Platform(memory=1, bandwidth_d2h=1.0, bandwidth_h2d=1.0, duplex=False)
    result = run(chain, platform, "first-k")
    assert result.status != Status.ERROR, result.message


@settings(max_examples=examples(0.2), deadline=None)
@given(instances(chains=chains(min_length=2, max_length=3, max_bytes=64, min_time=0.0, max_time=2.0, time_resolution=0.5),
                 inf_bandwidth=False))
def test_cpsat_equals_brute_force_with_zero_length_ops(instance):
    """Issue 33: with ops that take no time CP-SAT's schedules were rejected by the simulator
    (a prefetch that starts as a zero-length op ends allocates before the op's frees) and it
    said ``timeout``, whether a schedule existed or none did. Now its status is the brute
    force's, ``infeasible`` included, and so is its optimum."""
    from chainoffload.exact import brute_force

    chain, platform = instance
    oracle = brute_force(chain, platform)
    result = solve(chain, platform, "cpsat", time_limit=30.0, workers=1)
    assert result.status == oracle.status, (result.message, oracle.status)
    if oracle.status == Status.OPTIMAL:
        tol = 3 * float(result.info.get("tolerance", 0.0) or 0.0) + 1e-9 * max(1.0, chain.compute_time)
        assert abs(result.makespan - oracle.makespan) <= tol


# Chains of 2-4 stages on a half-second grid, at least one op of 0 s (issue 33).
ZERO_LENGTH = chains(min_length=2, max_length=4, max_bytes=64, min_time=0.0, max_time=2.0, time_resolution=0.5).filter(
    lambda c: min(float(c.fwd.min()), float(c.bwd.min())) == 0.0
)
# The issue's chain: every pure-offloading method said "no schedule" at 167 B.
ISSUE_33 = (
    Chain(fwd=[0, 0, 0, 1], bwd=[1, 0, 2, 0], act=[0, 8, 21, 29, 12], saved=[8, 55, 43, 34]),
    Platform(memory=167, bandwidth_d2h=20.0, bandwidth_h2d=40.0, latency=0.5),
)


@settings(max_examples=examples(0.2), deadline=None)
@given(instances(chains=ZERO_LENGTH, inf_bandwidth=False))
@example(ISSUE_33)
def test_best_finds_a_schedule_wherever_one_exists_with_zero_length_ops(instance):
    """Issue 33: on chains with zero-length ops every pure-offloading method said "no schedule"
    where one existed. Whenever CP-SAT or (up to 3 stages: 4 take minutes) the brute force over
    every fixed-order schedule finds one, ``best`` (its default exact work) finds one too; every
    method's figures are the simulator's."""
    from chainoffload.exact import brute_force

    chain, platform = instance
    exact = solve(chain, platform, "cpsat", time_limit=30.0, workers=1)
    oracle = brute_force(chain, platform) if chain.length <= 3 else exact
    result = solve(chain, platform, "best", cpsat_work=2.0)
    check_result(result, chain, platform)
    if oracle.status.has_schedule or exact.status.has_schedule:
        assert result.feasible, (result.message, oracle.status, exact.status)
    if oracle.status == Status.OPTIMAL:
        assert result.makespan >= oracle.makespan * (1 - 1e-9) - 3 * float(exact.info.get("tolerance", 0.0) or 0.0)
    for method in PURE:
        if method not in ("best", "cpsat"):
            check_result(run(chain, platform, method), chain, platform)
