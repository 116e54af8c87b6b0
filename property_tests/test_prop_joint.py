"""The joint DP's lifted plans (NOTE [ joint: lifted plans ] in ``chainoffload/solvers/joint.py``).

On any instance the DP with its table lifted above the rounded budget returns a plan no slower
than the DP without the lift (the plans at and below the budget are the same; a lifted one is
kept only when the simulator finds it strictly faster), the makespan it reports is the
simulator's, and the same call gives the same schedule. Compared exactly, no tolerance.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import simulate
from chainoffload.solvers.joint import joint_dp
from chainoffload.testing import chains, instances

# Sizes with no common divisor to speak of, as a profile gives them: slots round every one.
INSTANCES = instances(chains=chains(min_length=3, max_length=10, max_bytes=1 << 24, min_time=1e-3, nosave=True))


@settings(max_examples=examples(0.5))
@given(instance=INSTANCES, slots=st.sampled_from([7, 40, 120]), lift=st.sampled_from([None, 1, 5, 40]))
def test_lifted_plans_are_never_slower_and_the_simulators(instance, slots, lift):
    chain, platform = instance
    before = joint_dp(chain, platform, slots=slots, lift=0)
    after = joint_dp(chain, platform, slots=slots, lift=lift)
    if before.status.has_schedule:
        assert after.status.has_schedule and after.makespan <= before.makespan
    if after.status.has_schedule:
        timeline = simulate(chain, platform, after.schedule)
        assert timeline.feasible and timeline.makespan == after.makespan
        again = joint_dp(chain, platform, slots=slots, lift=lift)
        assert again.schedule == after.schedule and again.makespan == after.makespan


@settings(max_examples=examples(0.5))
@given(instance=INSTANCES, slots=st.sampled_from([7, 40, 120]), data=st.data())
def test_keep_is_never_offloaded_and_empty_keep_changes_nothing(instance, slots, data):
    """NOTE [ joint: keep ]: neither DP offloads a kept unit (whole or its lone a_i), what they
    return is the simulator's, and ``keep=()`` gives the schedule of no keep at all."""
    from chainoffload.solvers.joint_exact import joint_exact

    chain, platform = instance
    keep = frozenset(data.draw(st.sets(st.integers(1, chain.length), max_size=chain.length), label="keep"))
    for dp in (joint_dp, joint_exact):
        free = dp(chain, platform, slots=slots)
        empty = dp(chain, platform, slots=slots, keep=())
        assert empty.status == free.status and empty.schedule == free.schedule
        kept = dp(chain, platform, slots=slots, keep=keep)
        if kept.status.has_schedule:
            assert not keep & set(kept.schedule.offloaded_units)
            timeline = simulate(chain, platform, kept.schedule)
            assert timeline.feasible and timeline.makespan == kept.makespan
