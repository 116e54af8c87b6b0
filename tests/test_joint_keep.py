"""``joint`` with ``keep=`` (NOTE [ joint: keep ] in chainoffload/solvers/joint.py): no candidate
offloads a kept unit, whole or as its lone a_i; recomputing one stays allowed; ``keep=()`` is the
method as it was."""

import math

import numpy as np
import pytest

from chainoffload import Platform, keep_all_peak, simulate, solve
from chainoffload.solvers import OptionError
from chainoffload.solvers.best import best
from chainoffload.solvers.joint import joint, joint_dp, joint_table
from chainoffload.solvers.joint_cpsat import _items, improve
from chainoffload.solvers.joint_exact import joint_exact
from chainoffload.solvers.rotor import rotor, slots_for
from naive_joint import plan_cost, plans
from remat_cases import instances, unit_heavy_instances


def _keeps(rng, length, count=3):
    """``count`` random non-empty keep sets of units 1..L-1 (unit L never moves anyway)."""
    units = np.arange(1, length)
    for _ in range(count):
        if units.size == 0:
            return
        k = int(rng.integers(1, units.size + 1))
        yield frozenset(int(u) for u in rng.choice(units, size=k, replace=False))


def _moved(result):
    return set(result.schedule.offloaded_units) if result.schedule is not None else set()


def test_the_table_with_keep_is_the_optimum_over_the_plans_that_keep():
    # The oracle (tests/naive_joint.py) walks every spine plan through the *unkept* table's model;
    # the kept table's value is the least over the plans that never offload a kept unit's item.
    rng = np.random.default_rng(5)
    checked = restricted = 0
    cases = list(instances(31, 25, lengths=(3, 7))) + list(unit_heavy_instances(3, 10))
    for chain, platform in cases:
        sl = slots_for(chain, platform.memory, 50)
        free = joint_table(chain, platform, sl, max_span=chain.length, act_alone=True)
        assert joint_table(chain, platform, sl, max_span=chain.length, act_alone=True, keep=()).value == free.value
        for keep in _keeps(rng, chain.length, 2):
            table = joint_table(chain, platform, sl, max_span=chain.length, act_alone=True, keep=keep)
            want = min(
                (plan_cost(chain, free, plan, sl.budget)
                 for plan in plans(chain.length, chain.length, free.n_b > 0, True)
                 if not any(off and s - 1 in keep for s, _, _, off in plan)),
                default=math.inf,
            )
            got = table.value
            assert (got == pytest.approx(want, rel=1e-12)) if math.isfinite(want) else not math.isfinite(got)
            checked += 1
            restricted += math.isfinite(got) and got > free.value * (1 + 1e-9)
    assert checked >= 40 and restricted >= 3  # keep bites somewhere, or the test checks nothing


def test_the_dps_never_offload_a_kept_unit_and_the_simulator_accepts_them():
    rng = np.random.default_rng(7)
    seen = moved_before = 0
    for chain, platform in list(instances(41, 25, lengths=(3, 10))) + list(unit_heavy_instances(4, 10)):
        free_dp = joint_dp(chain, platform, slots=60)
        free_ex = joint_exact(chain, platform, slots=60)
        # keep=() is the DPs as they were: the same schedules, the same figures.
        for free, again in ((free_dp, joint_dp(chain, platform, slots=60, keep=())),
                            (free_ex, joint_exact(chain, platform, slots=60, keep=()))):
            assert again.status == free.status and again.schedule == free.schedule
            assert again.makespan == free.makespan or (math.isnan(again.makespan) and math.isnan(free.makespan))
        chosen = _moved(free_dp) | _moved(free_ex)
        trials = ([frozenset(chosen)] if chosen else []) + list(_keeps(rng, chain.length, 2))
        for keep in trials:
            for res in (joint_dp(chain, platform, slots=60, keep=keep), joint_exact(chain, platform, slots=60, keep=keep)):
                if not res.status.has_schedule:
                    continue
                assert not keep & _moved(res), (res.method, sorted(keep), res.schedule.transfers)
                tl = simulate(chain, platform, res.schedule)
                assert tl.feasible and tl.makespan == res.makespan
                seen += 1
        moved_before += bool(chosen)
    assert seen >= 60 and moved_before >= 10


def test_joint_with_keep_never_offloads_a_kept_unit():
    rng = np.random.default_rng(11)
    checked = dropped = 0
    for chain, platform in instances(51, 6, lengths=(4, 9)):
        stand_in = rotor(chain, platform, slots=80)  # pure offloading's place: best is run with keep below
        for keep in _keeps(rng, chain.length, 2):
            res = solve(chain, platform, "joint", slots=80, keep=sorted(keep))
            assert res.status.name != "ERROR", res.message
            if res.status.has_schedule:
                assert not keep & _moved(res), (sorted(keep), res.schedule.transfers)
                checked += 1
            # The improver's instances: none of a kept unit.
            if res.schedule is not None and res.schedule.has_remat:
                assert not {it.stage for it in _items(chain.length, res.schedule.compute, keep)} & keep
        # A given pure-offloading result that moves a kept unit is no candidate.
        given = solve(chain, platform, "offload-all")
        if given.status.has_schedule and given.schedule.offloaded_units:
            keep = frozenset(given.schedule.offloaded_units[:1])
            res = joint(chain, platform, slots=80, offload=given, keep=keep, cpsat_work=0)
            assert res.info["offload_dropped"] == sorted(keep) and "offload-all_makespan" not in res.info
            assert not keep & _moved(res)
            dropped += 1
        assert "offload_dropped" not in joint(chain, platform, slots=80, offload=stand_in, cpsat_work=0).info
    assert checked >= 8 and dropped >= 2


def test_keep_empty_is_joint_as_before_and_deterministic():
    for chain, platform in instances(61, 3, lengths=(5, 8)):
        a = joint(chain, platform, slots=80)
        b = joint(chain, platform, slots=80, keep=())
        c = solve(chain, platform, "joint", slots=80, keep=[])
        assert a.status == b.status
        if a.status.has_schedule:
            assert a.schedule == b.schedule == c.schedule and a.makespan == b.makespan == c.makespan


def _a_point_joint_offloads():
    """A chain and platform where joint's plan offloads a unit and recomputes."""
    for chain, platform in instances(71, 40, lengths=(5, 9)):
        if not platform.can_transfer:
            continue
        res = joint(chain, platform, slots=80, cpsat_work=0)
        if res.status.has_schedule and res.schedule.offloaded_units and res.info["source"].startswith("joint"):
            return chain, platform, res
    raise AssertionError("no instance where joint's own DP offloads")


def test_keeping_the_unit_joint_offloads_gives_a_plan_that_keeps_it():
    chain, platform, free = _a_point_joint_offloads()
    u = free.schedule.offloaded_units[0]
    res = solve(chain, platform, "joint", slots=80, cpsat_work=0, keep=[u])
    assert res.feasible and u not in _moved(res)
    tl = simulate(chain, platform, res.schedule)
    assert tl.feasible and tl.makespan == res.makespan and res.peak_memory <= platform.memory
    # Never faster than without keep (the same candidates, fewer choices), and at least as fast
    # as every candidate with that keep.
    assert res.makespan >= free.makespan * (1 - 1e-12)
    for other in (rotor(chain, platform, slots=80), best(chain, platform, keep=[u]),
                  joint_dp(chain, platform, slots=80, keep=[u])):
        if other.status.has_schedule:
            assert res.makespan <= other.makespan * (1 + 1e-12)
    # best with remat hands its keep to joint.
    both = best(chain, platform, remat=True, keep=[u])
    assert both.status.has_schedule and u not in _moved(both)


def test_the_improver_keeps_what_it_is_told():
    chain, platform, free = _a_point_joint_offloads()
    moved = set(free.schedule.offloaded_units)
    assert {it.stage for it in _items(chain.length, free.schedule.compute)} & moved
    assert not {it.stage for it in _items(chain.length, free.schedule.compute, frozenset(moved))} & moved
    kept = joint(chain, platform, slots=80, cpsat_work=0, keep=moved)
    if kept.status.has_schedule:
        got = improve(chain, platform, kept.schedule, kept.makespan, work=0.2, keep=frozenset(moved))
        assert not moved & set(got.schedule.offloaded_units) and got.makespan <= kept.makespan


@pytest.mark.parametrize(
    "keep, message",
    [
        ([0], r"keep: unit 0 is not a stage in 1\.\.\d+"),
        ([99], r"keep: unit 99 is not a stage"),
        ([2, "3"], r"keep: unit '3' is not an integer stage"),
        (3, r"keep: expected a list of stages"),
    ],
)
def test_bad_keep_is_refused_naming_it(keep, message):
    chain, platform = next(instances(9, 1, lengths=(6, 7)))
    with pytest.raises(OptionError, match=message):
        solve(chain, platform, "joint", keep=keep)
    with pytest.raises(OptionError, match=message):
        joint(chain, platform, keep=keep)


def test_keeping_every_unit_is_rotor_or_keep_all():
    chain, platform = next(instances(9, 1, lengths=(6, 7)))
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.5 * (top - floor)), bandwidth_d2h=1e6, bandwidth_h2d=1e6)
    res = solve(chain, platform, "joint", slots=80, keep=range(1, chain.length + 1))
    assert res.feasible and not res.schedule.transfers
    assert res.makespan <= rotor(chain, platform, slots=80).makespan * (1 + 1e-12)
