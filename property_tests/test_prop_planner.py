"""The transfer planner against the simulator, the one judge: its memory checks are never optimistic.

The planner's safe sweep counts memory as the simulator does (NOTE [ transfer planner ] in
``chainoffload/planner.py``), so when every one of its checks passes the simulator must accept
the plan. Issue 33 found two places where the count differed: originals counted at B_{V+1},
which starts after every one is released (pessimistic), and unit L's original released last at
a zero-length F_L's instant, counted freed before B_L allocated (optimistic: a plan the sweep
passed and the simulator rejected). That a method's makespan never grows with the fix is not
guaranteed (the sweep is greedy: a prefetch sent earlier takes room a later one counted on), so
only the simulator's verdict is held here; ``tests/test_planner.py`` pins the cases.
"""

import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Chain, Platform, simulate, solve
from chainoffload.planner import _kplan, plan_and_simulate, plan_arrays, schedule_from_arrays
from chainoffload.testing import chains, instances

# Small chains with ops of 0 s (on a half-second grid) and without; links down to latency 0 and up
# to infinitely fast, where a copy takes no time and ties at one instant decide the count.
_CHAINS = chains(min_length=1, max_length=7, max_bytes=64, min_time=0.0, max_time=2.0, time_resolution=0.5)
INSTANCES = st.one_of(
    instances(chains=_CHAINS, inf_bandwidth=True, max_latency=0.0),
    instances(chains=_CHAINS, inf_bandwidth=True, max_latency=0.5),
    instances(chains=chains(max_length=7, max_bytes=4096, min_time=1e-3)),
)

# Unit 4's original is released last at F_4's instant (both links infinitely fast, F_4 of 0 s).
LAST = (
    Chain(fwd=[2.0, 0.0, 1.5, 0.0], bwd=[2.0, 0.5, 1.0, 2.0], act=[14, 21, 33, 7, 15], saved=[26, 54, 21, 41]),
    Platform(memory=174, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf, latency=0.0, duplex=False),
)
# Chain 74 of benchmarks/zero_length.py (seed 33): B_4 waits for P_3, so no original is left then.
CHAIN_74 = (
    Chain(fwd=[0, 0.375, 1.375, 1.625], bwd=[0, 0.625, 0.375, 0], act=[8, 14, 2, 32, 28], saved=[33, 45, 65, 57]),
    Platform(memory=229, bandwidth_d2h=40.0, bandwidth_h2d=10.0, latency=0.25),
)


def _fits(chain, platform, units, optimistic):
    """The kernel's own verdict: whether every memory check of the sweep passed."""
    offload = np.zeros(chain.length + 1, dtype=np.int64)
    offload[units] = 1
    d_time = platform.latency + chain.saved / platform.bandwidth_d2h
    h_time = platform.latency + chain.saved / platform.bandwidth_h2d
    return bool(_kplan.plan_kernel(chain.fwd, chain.bwd, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp,
                                   platform.memory, d_time, h_time, platform.duplex, offload, optimistic,
                                   chain.saved.copy())[3])


@settings(max_examples=examples(8))
@given(INSTANCES, st.data())
@example(LAST, None)
@example(CHAIN_74, None)
def test_a_plan_whose_checks_all_pass_is_one_the_simulator_accepts(instance, data):
    chain, platform = instance
    if data is None:  # the pinned examples: every unit set
        sets = [[u for u in range(1, chain.length + 1) if mask >> (u - 1) & 1] for mask in range(1, 1 << chain.length)]
    else:
        sets = [sorted(data.draw(st.sets(st.integers(1, chain.length), min_size=1), label="units"))]
    for units in sets:
        chosen = np.asarray(units, dtype=np.int64)
        safe = plan_arrays(chain, platform, chosen)[0]
        if _fits(chain, platform, chosen, optimistic=False):
            tl = simulate(chain, platform, schedule_from_arrays(chain.length, safe))
            assert tl.feasible, (units, tl.violation)
        # The plan kept (the best of the planner's three) is the simulator's to judge, and its
        # timeline is the simulator's own.
        schedule, timeline = plan_and_simulate(chain, platform, units)
        again = simulate(chain, platform, schedule)
        assert (timeline.feasible, timeline.makespan, timeline.peak_memory) == (again.feasible, again.makespan, again.peak_memory)


@settings(max_examples=examples(1))
@given(INSTANCES)
@example(CHAIN_74)
def test_every_schedule_a_planning_method_returns_replays(instance):
    # The methods that choose units and time them with the planner: what they report is the
    # simulator's verdict on the schedule they return.
    chain, platform = instance
    for method in ("offload-all", "first-k", "largest-first", "lp", "dp"):
        result = solve(chain, platform, method)
        if result.feasible:
            tl = simulate(chain, platform, result.schedule)
            assert tl.feasible and tl.makespan == result.makespan and tl.peak_memory == result.peak_memory <= platform.memory
