"""chainoffload.testing by example: the assertions' verdicts and messages, the strategies' guarantees.

The three-stage chain (tests/conftest.py): keep-all peak 192 B, makespan 12 s, floor 162 B.
"""

import math

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import chainoffload.testing as cot
from chainoffload import Platform, Result, Schedule, ScheduleError, Status, Transfer, simulate, solve
from chainoffload.testing import (
    BROKEN_KINDS,
    assert_feasible,
    assert_no_better_than_optimal,
    broken_schedules,
    chains,
    instances,
    platforms,
    schedules,
    well_formed_schedules,
)

F1, F2, F3, B3, B2, B1 = range(6)


def plat(memory=10**9, bw=25.0):
    return Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw)


def offload_1():
    # O_1 at the end of F_1, P_1 at the end of B_3 with B_2 waiting: makespan 13, peak 167
    return Schedule.from_units(3, [Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2)])


# -- assert_feasible --------------------------------------------------------------------------


def test_assert_feasible_accepts_a_solved_result_and_returns_the_timeline(chain3):
    result = solve(chain3, plat(192), "keep-all")
    tl = assert_feasible(result)  # chain and platform come from the result's timeline
    assert tl.makespan == 12.0 and tl.peak_memory == 192
    assert assert_feasible(result, chain3, plat(192)).makespan == 12.0


def test_assert_feasible_on_a_timeline_and_a_schedule(chain3):
    tl = simulate(chain3, plat(167), offload_1())
    assert assert_feasible(tl).makespan == 13.0
    assert assert_feasible(offload_1(), chain3, plat(167)).peak_memory == 167
    with pytest.raises(TypeError, match="pass chain= and platform="):
        assert_feasible(offload_1())
    with pytest.raises(TypeError, match="expected a Result, Timeline or Schedule, got int"):
        assert_feasible(3, chain3, plat())


def test_assert_feasible_rejects_memory_over_the_limit(chain3):
    with pytest.raises(AssertionError, match=r"rule 'memory' .*192 B exceeds the limit 191 B"):
        assert_feasible(Schedule.keep_all(3), chain3, plat(191))
    # a timeline computed at ample memory, checked against a tighter platform
    tl = simulate(chain3, plat(), Schedule.keep_all(3))
    with pytest.raises(AssertionError, match="rule 'memory'"):
        assert_feasible(tl, platform=plat(191))


def test_assert_feasible_rejects_a_read_violation(chain3):
    late = Schedule.from_units(3, [Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B2, "start")])
    with pytest.raises(AssertionError, match=r"rule 'read' at B_2"):
        assert_feasible(late, chain3, plat())


def test_assert_feasible_catches_figures_that_are_not_the_simulators(chain3):
    good = solve(chain3, plat(192), "keep-all")
    with pytest.raises(AssertionError, match=r"reports makespan 11\.0 but the simulator gives 12\.0"):
        assert_feasible(good.replace(makespan=11.0))
    with pytest.raises(AssertionError, match=r"reports peak memory 100 B but the simulator gives 192 B"):
        assert_feasible(good.replace(peak_memory=100))
    with pytest.raises(AssertionError, match=r"reports 5 offloaded bytes but the schedule moves 0"):
        assert_feasible(good.replace(offloaded_bytes=5))
    with pytest.raises(AssertionError, match=r"lower bound 13\.0 is above the simulated makespan 12\.0"):
        assert_feasible(good.replace(lower_bound=13.0))
    with pytest.raises(AssertionError, match=r"lower bound 1\.0 is below the trivial bound .* = 12\.0"):
        assert_feasible(good.replace(lower_bound=1.0))
    with pytest.raises(AssertionError, match="needs a finite lower bound, got nan"):
        assert_feasible(good.replace(lower_bound=math.nan))


def test_assert_feasible_rejects_a_result_without_a_schedule(chain3):
    result = solve(chain3, plat(191), "keep-all")
    assert result.status == Status.INFEASIBLE
    with pytest.raises(AssertionError, match=r"method 'keep-all': expected a feasible result, got status 'infeasible'"):
        assert_feasible(result, chain3, plat(191))


def test_assert_feasible_on_a_hand_built_result_needs_the_instance(chain3):
    result = Result("mine", Status.FEASIBLE, offload_1(), makespan=13.0, lower_bound=12.0, peak_memory=167, offloaded_bytes=25)
    assert assert_feasible(result, chain3, plat(167)).makespan == 13.0
    with pytest.raises(TypeError, match="pass chain= and platform="):
        assert_feasible(result)


# -- assert_no_better_than_optimal ------------------------------------------------------------


def test_no_better_than_a_number(chain3):
    result = solve(chain3, plat(192), "keep-all")
    assert_no_better_than_optimal(result, 12.0)
    assert_no_better_than_optimal(result, 12.0 * (1 + 1e-12))  # ulps are tolerated
    with pytest.raises(AssertionError, match=r"method 'keep-all': makespan 12\.0 is below the optimum or bound, 12\.5"):
        assert_no_better_than_optimal(result, 12.5)
    assert_no_better_than_optimal(result, 12.5, abs_tol=0.5)


def test_no_better_than_a_reference_result(chain3):
    result = solve(chain3, plat(192), "keep-all")
    optimal = Result("ref", Status.OPTIMAL, offload_1(), makespan=13.0, lower_bound=12.0)
    with pytest.raises(AssertionError, match=r"below the optimum of method 'ref', 13\.0"):
        assert_no_better_than_optimal(result, optimal)
    # a reference that is not optimal offers only its lower bound
    feasible = Result("ref", Status.FEASIBLE, offload_1(), makespan=13.0, lower_bound=12.0)
    assert_no_better_than_optimal(result, feasible)
    with pytest.raises(AssertionError, match=r"lower bound of method 'ref' \(status feasible\), 12\.5"):
        assert_no_better_than_optimal(result, feasible.replace(lower_bound=12.5))


def test_no_better_than_nothing_known(chain3):
    result = solve(chain3, plat(192), "keep-all")
    assert_no_better_than_optimal(result, math.nan)  # no bound: nothing to check
    with pytest.raises(AssertionError, match="is inf"):
        assert_no_better_than_optimal(result, math.inf)
    # an infeasible result claims nothing
    assert_no_better_than_optimal(solve(chain3, plat(191), "keep-all"), 100.0)
    with pytest.raises(TypeError, match="must be a Result or a number"):
        assert_no_better_than_optimal(result, "12")


# -- strategies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: chains(min_length=0), r"min_length: expected an integer >= 1, got 0"),
        (lambda: chains(min_length=4, max_length=3), r"max_length: 3 is below min_length=4"),
        (lambda: chains(max_bytes=-1), r"max_bytes: expected an integer >= 0, got -1"),
        (lambda: chains(max_length=10, max_bytes=2**56), r"max_bytes: 72057594037927936 is too large for max_length=10"),
        (lambda: chains(max_length=10, max_time=1e307), r"max_time: 1e\+307 is too large for max_length=10"),
        (lambda: chains(max_time=math.inf), r"max_time: expected a finite number, got inf"),
        (lambda: chains(min_time=0.3, max_time=0.4, time_resolution=0.25), r"time_resolution: no multiple of 0.25"),
        (lambda: chains(time_resolution=0.0), r"time_resolution: expected a time > 0"),
        (lambda: platforms(min_bandwidth=0.0), r"min_bandwidth: expected a bandwidth > 0.*zero_bandwidth=True"),
        (lambda: platforms(min_memory=10, max_memory=5), r"max_memory: 5 is below min_memory=10"),
        (lambda: platforms(max_latency=-1.0), r"max_latency: expected a number >= 0"),
        (lambda: platforms(duplex="yes"), r"duplex: expected True, False or None"),
        (lambda: platforms(chain=[1, 2]), r"chain: expected a Chain or a strategy of chains, got list"),
        (lambda: instances(chain=None), r"chain: instances\(\) draws the chain itself"),
        (lambda: instances(max_latency=-2.0), r"max_latency"),
    ],
)
def test_bad_bounds_name_the_field(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_platform_memory_range_that_cannot_fit_the_chain(chain3):
    with pytest.raises(ValueError, match=r"max_memory: the memory range is empty \(162 B .. 100 B; the chain needs at least 162 B\)"):
        platforms(chain=chain3, max_memory=100)


def test_schedules_bad_arguments(chain3):
    with pytest.raises(ValueError, match=r"min_offloads: 4 is above the chain's 3 units"):
        schedules(chain3, min_offloads=4)
    with pytest.raises(ValueError, match=r"kinds: only for valid=False"):
        schedules(chain3, kinds=["duplicate_offload"])
    with pytest.raises(ValueError, match=r"kinds: unknown kind\(s\) \['nope'\]; known: prefetch_before_offload"):
        broken_schedules(chain3, kinds=["nope"])
    with pytest.raises(ValueError, match=r"chain: expected a Chain, got int"):
        schedules(3)


def test_platform_memory_for_the_three_stage_chain(chain3):
    # floor 162, keep-all peak 192, slack 0.25 -> up to 240
    @settings(max_examples=100, database=None)
    @given(platforms(chain=chain3))
    def check(p):
        assert 162 <= p.memory <= 240

    check()
    # the edges are reachable: the floor, the peak, one byte under it, the top
    for target in (162, 191, 192, 240):
        assert find(platforms(chain=chain3), lambda p, t=target: p.memory == t).memory == target


def test_fixed_platform_options(chain3):
    p = find(
        platforms(chain=chain3, min_bandwidth=8.0, max_bandwidth=8.0, duplex=False, max_latency=0.0, symmetric=True),
        lambda p: True,
    )
    assert (p.bandwidth_d2h, p.bandwidth_h2d, p.duplex, p.latency) == (8.0, 8.0, False, 0.0)
    assert find(platforms(inf_bandwidth=True), lambda p: math.isinf(p.bandwidth_h2d)).bandwidth_h2d == math.inf
    assert find(platforms(zero_bandwidth=True), lambda p: p.bandwidth_d2h == 0).bandwidth_d2h == 0.0


def test_chains_shrink_to_a_readable_minimum():
    # the smallest chain with two stages and a nonzero unit is as plain as it gets
    c = find(chains(), lambda c: c.length >= 2 and int(c.saved.sum()) > 0)
    assert c.length == 2 and int(c.saved.sum()) == 1 and c.compute_time == 0.0


def test_instances_unpack_as_chain_and_platform():
    chain, platform = find(instances(chains=chains(max_length=2)), lambda i: True)
    assert platform.memory >= chain.stage_memory_floor()


def test_valid_schedules_of_the_three_stage_chain(chain3):
    seen_units, seen_waits = set(), False

    @settings(max_examples=100, database=None)
    @given(schedules(chain3))
    def check(s):
        nonlocal seen_waits
        s.validate(chain3)
        tl = simulate(chain3, plat(), s)
        assert tl.violation is None
        seen_units.update(s.offloaded_units)
        seen_waits = seen_waits or any(t.before is not None for t in s.transfers)

    check()
    assert seen_units == {1, 2, 3} and seen_waits


def test_valid_schedules_shrink_to_the_eager_plan(chain3):
    # one unit: offloaded as soon as it exists, prefetched as late as allowed, no wait
    s = find(schedules(chain3, waits=False), lambda s: s.offloaded_units == (1,))
    assert s.transfers == (Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end"))
    # unit 3 can only go out and back at the end of F_3 (B_3 reads it right after)
    s = find(schedules(chain3, waits=False), lambda s: s.offloaded_units == (3,))
    assert [(t.kind, t.op, t.at) for t in s.transfers] == [("offload", F3, "end"), ("prefetch", F3, "end")]


def test_offload_bounds(chain3):
    s = find(schedules(chain3, min_offloads=2, max_offloads=2), lambda s: True)
    assert len(s.offloaded_units) == 2
    assert find(schedules(chain3, max_offloads=0), lambda s: True).transfers == ()


@pytest.mark.parametrize("kind", sorted(BROKEN_KINDS))
def test_every_broken_kind_is_drawn_and_rejected_as_documented(chain3, kind):
    @settings(max_examples=20, database=None)
    @given(broken_schedules(chain3, kinds=[kind]))
    def check(b):
        assert b.kind == kind and b.error == BROKEN_KINDS[kind]
        if b.error == "structure":
            with pytest.raises(ScheduleError) as info:
                simulate(chain3, plat(), b.schedule)
            assert b.where in str(info.value)
        else:
            v = simulate(chain3, plat(), b.schedule).violation
            assert v is not None and (v.rule, v.op) == ("read", b.where)

    check()


def test_broken_schedules_via_schedules_valid_false(chain3):
    s = find(schedules(chain3, valid=False, kinds=["prefetch_too_late"]), lambda s: True)
    assert isinstance(s, Schedule)
    assert simulate(chain3, plat(), s).violation.rule == "read"


def test_prefetch_too_late_blames_the_first_reader(chain3):
    # unit 3: B_3 reads it (there is no B_4); unit 1: B_2 reads a_1 before B_1 reads the rest
    for unit, reader in ((3, "B_3"), (1, "B_2")):
        b = find(broken_schedules(chain3, kinds=["prefetch_too_late"]), lambda b, u=unit: b.schedule.offloaded_units == (u,))
        assert b.where == reader
        assert simulate(chain3, plat(), b.schedule).violation.op == reader


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_well_formed_schedules_validate_and_keep_their_kind(data):
    from chainoffload.examples import tiny

    chain3 = tiny()
    remat = data.draw(st.sampled_from([False, True, None]))
    schedule = data.draw(well_formed_schedules(chain3, remat=remat, min_offloads=1, max_offloads=2))
    schedule.validate(chain3)  # well formed: no ScheduleError
    assert 1 <= len(schedule.offloaded_units) <= 2
    if remat is False:
        assert not schedule.has_remat
    if remat is True:
        assert schedule.has_remat
    simulate(chain3, plat(), schedule)  # a verdict, never an exception


def test_well_formed_schedules_shrink_to_the_fixed_order_and_reach_rematerialization(chain3):
    assert find(well_formed_schedules(chain3), lambda s: True) == Schedule.keep_all(3)
    # each rematerialization shape is drawn: a checkpoint with Fn, and F over a lone a_i
    assert ("Fn", 2) in find(well_formed_schedules(chain3, remat=True), lambda s: ("Fn", 2) in s.compute).compute
    over = find(well_formed_schedules(chain3, remat=True), lambda s: s.compute[:2] == (("Fck", 1), ("F", 1)))
    assert simulate(chain3, plat(), over).feasible


def test_well_formed_schedules_bad_arguments(chain3):
    with pytest.raises(ValueError, match=r"remat: expected True, False or None, got 'yes'"):
        well_formed_schedules(chain3, remat="yes")
    with pytest.raises(ValueError, match=r"max_offloads: 0 is below min_offloads=1"):
        well_formed_schedules(chain3, min_offloads=1, max_offloads=0)
    with pytest.raises(ValueError, match=r"chain: expected a Chain, got int"):
        well_formed_schedules(3)


def test_module_exports():
    assert set(cot.__all__) <= set(dir(cot))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = cot.nope


def test_tolerances_are_checked(chain3):
    result = solve(chain3, plat(192), "keep-all")
    with pytest.raises(ValueError, match=r"abs_tol: expected a finite tolerance >= 0, got -1"):
        assert_no_better_than_optimal(result, 12.0, abs_tol=-1)
    with pytest.raises(ValueError, match=r"rel_tol: expected a finite tolerance >= 0, got nan"):
        assert_feasible(result, rel_tol=math.nan)


def test_the_module_docstring_example_runs():
    """The example people copy must work as written (with fewer examples, to stay quick)."""
    import textwrap

    from chainoffload.solvers._registry import _REGISTRY
    from chainoffload.solvers.baselines import largest_first

    doc = cot.__doc__
    code = textwrap.dedent(doc[doc.index("    from hypothesis import given") : doc.index("The strategies shrink")])
    assert "max_examples=50" in code
    code = code.replace("max_examples=50", "max_examples=3")
    namespace = {"my_solver": largest_first}
    try:
        exec(compile(code, "chainoffload.testing docstring", "exec"), namespace)
        namespace["test_mine"]()
    finally:
        _REGISTRY.pop("mine", None)
    assert "mine" not in _REGISTRY
