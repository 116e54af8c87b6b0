"""rotor and joint never lose to a schedule of their own family at the memory that schedule needs.

A fixed policy users know (keep every activation, checkpoint every block, sqrt checkpointing,
recompute everything; for ``joint`` also offload every unit) needs some peak P. At exactly P the
policy fits with no byte to spare, and so the method whose family holds it must return a plan at
least as fast: slot rounding (NOTE [ never lose to the family ] in
``chainoffload/solvers/rotor.py``) must not hide the policy. Compared exactly, no tolerance.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Platform, Schedule, Status, simulate, solve
from chainoffload.generators import transformer_chain
from chainoffload.solvers.remat_baselines import family_schedules
from chainoffload.testing import assert_feasible, chains, instances

UNLIMITED = 2**62
REMAT_POLICIES = ("keep-all", "checkpoint-all", "sqrt-checkpoint", "recompute-all")
# Sizes with no common divisor to speak of, as a profile gives them: slots round every one.
CHAINS = chains(min_length=1, max_length=9, max_bytes=1 << 24, min_time=1e-3, nosave=True)


def policy_peak(chain, name):
    """(peak, makespan) of a fixed policy's sequence, simulated with no memory limit."""
    if name == "keep-all":
        schedule = Schedule.keep_all(chain.length)
    else:
        schedule = family_schedules(chain.length)[name][1]()
    tl = simulate(chain, Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0), schedule)
    return tl.peak_memory, tl.makespan


@settings(max_examples=examples(2.0))
@given(chain=CHAINS, policy=st.sampled_from(REMAT_POLICIES), slots=st.sampled_from([None, 7, 40, 500]))
def test_rotor_is_never_slower_than_a_fixed_policy_at_its_peak(chain, policy, slots):
    peak, makespan = policy_peak(chain, policy)
    platform = Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    result = solve(chain, platform, "rotor", **({} if slots is None else {"slots": slots}))
    assert result.feasible, (policy, peak, result.message)
    assert_feasible(result, chain, platform)
    assert result.makespan <= makespan, (policy, result.makespan, makespan, result.info.get("source"))


@settings(max_examples=examples(0.3))
@given(
    instance=instances(chains=chains(min_length=1, max_length=6, max_bytes=1 << 20, min_time=1e-3), inf_bandwidth=True),
    policy=st.sampled_from(REMAT_POLICIES + ("offload-all",)),
)
def test_joint_is_never_slower_than_a_fixed_policy_at_its_peak(instance, policy):
    chain, platform = instance
    if policy == "offload-all":
        # The policy's own schedule at the drawn memory, then the policy again at its exact peak.
        first = solve(chain, platform, "offload-all")
        if not first.feasible:
            return
        at = platform.with_memory(first.peak_memory)
        member = solve(chain, at, "offload-all")
        if not member.feasible:
            return
        makespan = member.makespan
    else:
        peak, makespan = policy_peak(chain, policy)
        at = platform.with_memory(peak)
    result = solve(chain, at, "joint")
    assert result.status in (Status.FEASIBLE, Status.OPTIMAL), (policy, result.message)
    assert_feasible(result, chain, at)
    assert result.makespan <= makespan, (policy, result.makespan, makespan, result.info.get("source"))


@pytest.mark.parametrize("kind", ["llama", "bert", "t5"])
def test_rotor_is_no_slower_than_checkpoint_all_on_transformer_chains(kind):
    # The issue's case: profiles' sizes, at exactly the memory checkpointing every block holds.
    rng = np.random.default_rng({"llama": 1, "bert": 2, "t5": 3}[kind])
    for _ in range(4):
        base = transformer_chain(kind, 8, hidden=int(rng.choice([768, 1024, 2048])), seq=int(rng.choice([256, 512])))
        # Jitter every size by up to 10 %, on the 512-byte grid of an allocator: no common slot.
        def jitter(a):
            return (np.asarray(a) * (1 + rng.uniform(-0.1, 0.1, len(a))) // 512 * 512).astype(np.int64)

        act = jitter(base.act)
        chain = base.replace(act=act, saved=np.maximum(jitter(base.saved), act[1:]), fwd_tmp=jitter(base.fwd_tmp),
                             bwd_tmp=jitter(base.bwd_tmp))
        peak, makespan = policy_peak(chain, "checkpoint-all")
        result = solve(chain, Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0), "rotor")
        assert result.feasible and result.makespan <= makespan, (result.makespan, makespan, result.info)
