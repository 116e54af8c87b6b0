"""Every lower bound holds for every schedule the simulator accepts, a_i moved alone included.

The bounds of ``chainoffload.bounds`` are stated for the problem the simulator accepts in the
fixed order (``NOTE [ what a unit moves ]``): a unit may move whole or as a_i alone
(``moves="act"``). Here a random valid schedule that moves some a_i alone is simulated, the memory
is set to its own peak (the tightest limit it fits, where the bounds bind hardest), and no rung of
the ladder may exceed its makespan. On tiny chains the brute-force oracle's optimum (which
enumerates act-alone moves too) and every pure-offloading method's makespan are held to the same.
"""

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Platform, Schedule, Status, methods, simulate, solve
from chainoffload.bounds import fluid_lower_bound, stronger_bound, unit_milp, volume_lower_bound
from chainoffload.bounds.ladder import climb
from chainoffload.generators import random_chain
from chainoffload.solvers import spec
from chainoffload.testing import chains, instances, schedules

SMALL = chains(min_length=2, max_length=5, max_bytes=4096, min_time=1e-3)
# Times on a grid so that CP-SAT's integer model is exact; two stages keep brute force at ~10^2
# schedules.
TINY = chains(min_length=2, max_length=2, max_bytes=256, min_time=0.125, max_time=4.0, time_resolution=0.125)
PURE = [m for m in methods() if not spec(m).remat]
OPTIONS = {"cpsat": {"time_limit": 3.0}, "best": {"time_limit": 60.0, "max_evals": 300}}
REL = 1e-9


def rungs(chain, platform):
    """Every bound the package states, by name."""
    milp = unit_milp(chain, platform, time_limit=20.0)
    return {
        "volume": volume_lower_bound(chain, platform),
        "fluid LP": fluid_lower_bound(chain, platform),
        "unit MILP": milp.bound if not math.isnan(milp.bound) else -math.inf,
        "stronger_bound": stronger_bound(chain, platform, time_limit=20.0).value,
        "ladder": climb(chain, platform, 20.0)[0],
    }


@st.composite
def act_alone_cases(draw):
    """A chain, a valid schedule that moves at least one a_i alone, and a link (memory: its peak)."""
    chain = draw(SMALL)
    schedule = draw(schedules(chain, act_alone=True, min_offloads=1))
    if not any(t.moves == "act" for t in schedule.transfers):
        unit = schedule.transfers[0].unit
        moved = tuple(dataclasses.replace(t, moves="act") if t.unit == unit else t for t in schedule.transfers)
        schedule = Schedule(schedule.compute, moved)
    bw = draw(st.floats(0.05, 20.0)) * max(float(chain.saved.mean()), 1.0) / (chain.compute_time / chain.length)
    link = Platform(
        memory=2**62,
        bandwidth_d2h=bw,
        bandwidth_h2d=bw * draw(st.sampled_from([0.5, 1.0, 2.0])),
        latency=draw(st.sampled_from([0.0, 1e-4])) * chain.compute_time,
        duplex=draw(st.booleans()),
    )
    return chain, schedule, link


@settings(max_examples=examples(2))
@given(act_alone_cases())
def test_no_valid_schedule_is_below_a_bound(case):
    chain, schedule, link = case
    loose = simulate(chain, link, schedule)
    assert loose.feasible, loose.violation  # schedules(valid=True) fit at their peak
    platform = link.with_memory(max(loose.peak_memory, chain.stage_memory_floor()))
    timeline = simulate(chain, platform, schedule)
    assert timeline.feasible
    for name, value in rungs(chain, platform).items():
        assert value <= timeline.makespan * (1 + REL), (name, value, timeline.makespan, schedule.to_dict())


@settings(max_examples=examples(0.4))
@given(instances(chains=TINY))
def test_no_method_nor_the_oracle_is_below_a_bound(instance):
    from chainoffload.exact import brute_force

    chain, platform = instance
    bounds = rungs(chain, platform)
    found = []
    oracle = brute_force(chain, platform)
    if oracle.feasible:
        found.append(("brute force", oracle.makespan))
    for method in PURE:
        result = solve(chain, platform, method, **OPTIONS.get(method, {}))
        if result.feasible:
            found.append((method, result.makespan))
            bounds[f"{method}'s bound"] = result.lower_bound
    if any(math.isinf(v) for v in bounds.values()):
        assert not found, ("a bound says nothing fits", bounds, found)
    for who, makespan in found:
        for name, value in bounds.items():
            assert value <= makespan * (1 + REL), (name, value, who, makespan)


@st.composite
def tiny_act_alone_cases(draw):
    """A chain of 2-4 stages, a valid schedule moving some a_i alone, a link (memory: the schedule's peak)."""
    # Also benchmarks' random chains: their units save several times their output, which is
    # where moving a_i alone pays (on 12 of 96 such instances of 3-4 stages, measured).
    chain = draw(st.one_of(
        chains(min_length=2, max_length=3, max_bytes=256, min_time=0.125, max_time=4.0, time_resolution=0.125),
        st.builds(random_chain, st.integers(0, 10**6), st.integers(3, 4)),
    ))
    schedule = draw(schedules(chain, act_alone=True, min_offloads=1))
    if draw(st.booleans()):
        # Every unit a_i alone: where the link is slow, that is what beats whole units.
        schedule = Schedule(schedule.compute, tuple(dataclasses.replace(t, moves="act") for t in schedule.transfers))
    # Slow links too (a unit's transfer 20x an average op): where moving less is worth it.
    rate = max(float(chain.saved.mean()), 1.0) / (chain.compute_time / chain.length)
    link = Platform(
        memory=2**62,
        bandwidth_d2h=rate * draw(st.sampled_from([0.05, 0.25, 1.0, 4.0])),
        bandwidth_h2d=rate * draw(st.sampled_from([0.05, 0.25, 1.0, 4.0])),
        latency=draw(st.sampled_from([0.0, 0.125])),
        duplex=draw(st.booleans()),
    )
    return chain, schedule, link


@settings(max_examples=examples(0.6))
@given(tiny_act_alone_cases())
def test_cpsat_optimum_is_no_worse_than_an_act_alone_schedule(case):
    # What CP-SAT calls optimal is optimal for the problem the simulator accepts: no valid
    # schedule, one that moves a_i alone included, beats it at the memory that schedule needs.
    chain, schedule, link = case
    loose = simulate(chain, link, schedule)
    platform = link.with_memory(max(loose.peak_memory, chain.stage_memory_floor()))
    timeline = simulate(chain, platform, schedule)
    assert timeline.feasible
    result = solve(chain, platform, "cpsat", time_limit=5.0, hint=False)
    assert result.status in (Status.OPTIMAL, Status.FEASIBLE), result.message
    tol = 3 * float(result.info.get("tolerance", 0.0) or 0.0) + 1e-9 * chain.compute_time
    assert result.lower_bound <= timeline.makespan + tol
    if result.status == Status.OPTIMAL:
        assert result.makespan <= timeline.makespan + tol, (result.makespan, timeline.makespan, schedule.to_dict())
