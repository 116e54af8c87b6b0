"""The simulator on arbitrary schedules: valid ones replay, broken ones are rejected by the right rule."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Schedule, ScheduleError, simulate
from chainoffload.testing import BROKEN_KINDS, assert_feasible, broken_schedules, chains, instances, schedules
from chainoffload.testing.strategies import READ, STRUCTURE

# Any platform on which transfers are possible (0 bandwidth is misuse with transfers, tested apart).
INSTANCES = instances(chains=chains(max_length=7), inf_bandwidth=True)


@settings(max_examples=examples(2))
@given(INSTANCES, st.data())
def test_valid_schedules_break_no_rule_with_ample_memory(instance, data):
    chain, platform = instance
    schedule = data.draw(schedules(chain))
    tl = simulate(chain, platform.with_memory(2**62), schedule)
    assert tl.violation is None, tl.violation
    # every op and transfer has finite times, in compute order, and nothing starts before its trigger
    assert np.all(np.isfinite(tl.op_start)) and np.all(np.isfinite(tl.transfer_end))
    assert np.all(tl.op_end >= tl.op_start) and np.all(tl.op_start[1:] >= tl.op_end[:-1])
    for k, t in enumerate(schedule.transfers):
        trig = tl.op_start[t.op] if t.at == "start" else tl.op_end[t.op]
        assert tl.transfer_start[k] >= trig
        if t.before is not None:
            assert tl.op_start[t.before] >= tl.transfer_end[k]
    # no waiting can make the makespan shorter than the compute alone
    assert tl.makespan >= chain.compute_time * (1 - 1e-12)
    assert tl.offloaded_bytes == sum(int(chain.saved[u - 1]) for u in schedule.offloaded_units)
    assert_feasible(tl)


@settings(max_examples=examples(2))
@given(INSTANCES, st.data())
def test_memory_limit_is_a_verdict_not_a_cause(instance, data):
    """The limit does not change the timeline; feasible exactly when the peak fits."""
    chain, platform = instance
    schedule = data.draw(schedules(chain))
    free = simulate(chain, platform.with_memory(2**62), schedule)
    tl = simulate(chain, platform, schedule)
    np.testing.assert_array_equal(tl.op_start, free.op_start)
    np.testing.assert_array_equal(tl.memory_bytes, free.memory_bytes)
    assert tl.peak_memory == free.peak_memory == int(np.max(free.memory_bytes))
    assert tl.feasible == (free.peak_memory <= platform.memory)
    if free.peak_memory > 0:
        tight = simulate(chain, platform.with_memory(free.peak_memory - 1), schedule)
        v = tight.violation
        assert v is not None and v.rule == "memory", v
        assert v.bytes > free.peak_memory - 1
        # the first instant over the limit is when the peak is first reached
        assert v.time == free.peak_time
        assert simulate(chain, platform.with_memory(free.peak_memory), schedule).feasible


@settings(max_examples=examples(4))
@given(INSTANCES, st.data())
def test_broken_schedules_are_rejected_by_the_right_rule(instance, data):
    chain, platform = instance
    broken = data.draw(broken_schedules(chain))
    ample = platform.with_memory(2**62)
    if broken.error == STRUCTURE:
        with pytest.raises(ScheduleError) as info:
            simulate(chain, ample, broken.schedule)
        assert broken.where in str(info.value), (broken.kind, str(info.value))
    else:
        assert broken.error == READ
        tl = simulate(chain, ample, broken.schedule)
        assert tl.violation is not None, broken.kind
        assert (tl.violation.rule, tl.violation.op) == ("read", broken.where), (broken.kind, tl.violation)


@pytest.mark.parametrize("kind", sorted(BROKEN_KINDS))
def test_each_kind_of_breakage_is_rejected(kind):
    """Each kind on its own, so that a rule the simulator stops checking shows by name."""

    @settings(max_examples=examples(0.4))
    @given(INSTANCES, st.data())
    def check(instance, data):
        chain, platform = instance
        broken = data.draw(broken_schedules(chain, kinds=[kind]))
        ample = platform.with_memory(2**62)
        if broken.error == STRUCTURE:
            with pytest.raises(ScheduleError) as info:
                simulate(chain, ample, broken.schedule)
            assert broken.where in str(info.value)
        else:
            v = simulate(chain, ample, broken.schedule).violation
            assert v is not None and v.rule == "read" and v.op == broken.where, v

    check()


@settings(max_examples=examples(1))
@given(instances(chains=chains(max_length=5), zero_bandwidth=True), st.data())
def test_zero_bandwidth_with_a_transfer_is_misuse(instance, data):
    from chainoffload.platform import PlatformError

    chain, platform = instance
    schedule = data.draw(schedules(chain, min_offloads=1))
    if platform.can_transfer:
        simulate(chain, platform, schedule)
    else:
        with pytest.raises(PlatformError, match=r"platform\.bandwidth_(d2h|h2d): 0"):
            simulate(chain, platform, schedule)
    # without transfers, zero bandwidth is fine
    simulate(chain, platform, Schedule.keep_all(chain.length))


@settings(max_examples=examples(1))
@given(INSTANCES, st.data())
def test_the_order_of_offloaded_units_costs_only_transfer_time(instance, data):
    """A schedule whose transfers never delay compute has exactly the compute makespan."""
    chain, platform = instance
    schedule = data.draw(schedules(chain, waits=False))
    tl = simulate(chain, platform.with_memory(2**62), schedule)
    waited = any(tl.op_start[k] > tl.op_end[k - 1] for k in range(1, len(schedule.compute)))
    if not waited:
        assert tl.makespan == chain.compute_time
    else:
        # rounding is monotone, not strictly: a wait of an ulp may vanish in later sums
        assert tl.makespan >= chain.compute_time
