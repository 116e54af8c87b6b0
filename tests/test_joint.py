"""The joint rematerialization + offloading DP against its two special cases and the simulator."""

import math

import numpy as np
import pytest

from chainoffload.chain import Chain
from chainoffload.platform import Platform
from chainoffload.result import Status
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers import methods, solve
from chainoffload.solvers.joint import joint_dp
from chainoffload.solvers.rotor import rotor, slots_for


def random_chain(rng, length):
    act = rng.integers(1, 100, length + 1) * 1000
    saved = act[1:] + rng.integers(0, 300, length) * 1000
    fwd = rng.uniform(0.5, 2.0, length)
    return Chain(fwd, fwd * rng.uniform(1, 3, length), act, saved, rng.integers(0, 50, length) * 1000,
                 rng.integers(0, 50, length) * 1000, fwd_nosave=fwd * rng.uniform(0.5, 1.0, length))


def instances(seed, count, lengths=(2, 14)):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        chain = random_chain(rng, int(rng.integers(*lengths)))
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        memory = int(floor + rng.uniform(0.02, 1.0) * (top - floor))
        bw = float(rng.choice([1e4, 1e5, 3e5, 1e6, 1e8]))
        yield chain, Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw,
                              latency=float(rng.choice([0.0, 0.01])), duplex=bool(rng.integers(0, 2)))


def test_dp_value_is_the_simulated_makespan():
    # The recurrence charges exactly the simulator's waits and peaks: no repair, same time.
    for chain, platform in instances(0, 40):
        res = joint_dp(chain, platform, slots=200)
        if res.status.has_schedule:
            assert res.info["shrink"] == 1.0
            assert math.isclose(res.info["dp_makespan"], res.makespan, rel_tol=1e-9)


def test_joint_dp_never_worse_than_rotor_at_the_same_slots():
    for chain, platform in instances(1, 40):
        j, r = joint_dp(chain, platform, slots=200), rotor(chain, platform, slots=200)
        if r.status.has_schedule and r.info.get("source") == "dp":
            assert j.status.has_schedule and j.makespan <= r.makespan * (1 + 1e-9)


def test_joint_never_worse_than_rotor_nor_pure_offload():
    offload = "best" if "best" in methods() else "largest-first"
    for chain, platform in instances(2, 25):
        j = solve(chain, platform, method="joint")
        for other in ("rotor", offload):
            o = solve(chain, platform, method=other)
            if o.status.has_schedule:
                assert j.status.has_schedule and j.makespan <= o.makespan * (1 + 1e-12), (other, j.info)
        if j.status.has_schedule:
            assert j.timeline.feasible and j.peak_memory <= platform.memory


def test_bandwidth_zero_is_rotor():
    compared = 0
    for chain, platform in instances(3, 25):
        platform = platform.replace(bandwidth_d2h=0.0, bandwidth_h2d=0.0)
        j, r = joint_dp(chain, platform, slots=150), rotor(chain, platform, slots=150)
        if r.info.get("source") == "dp":  # not rotor's keep-all / recompute-all fallbacks
            assert j.schedule == r.schedule and j.makespan == r.makespan
            assert not j.schedule.transfers
            compared += 1
    assert compared >= 15


@pytest.mark.parametrize("seed", range(4))
def test_unlimited_bandwidth_reaches_compute_time_where_rotor_cannot(seed):
    rng = np.random.default_rng(100 + seed)
    chain = random_chain(rng, 10)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.5 * (top - floor)), bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    r = rotor(chain, platform)
    j = joint_dp(chain, platform)
    assert r.makespan > chain.compute_time * 1.001  # rotor must recompute here
    assert j.makespan == pytest.approx(chain.compute_time, rel=1e-12)
    assert solve(chain, platform, method="joint").status == Status.OPTIMAL


def test_joint_offloads_checkpoints_when_it_pays():
    # Slow recomputation and a fast link: the DP must move data rather than recompute it all.
    rng = np.random.default_rng(11)
    chain = random_chain(rng, 12)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=1e8, bandwidth_h2d=1e8)
    j = joint_dp(chain, platform)
    assert j.schedule.transfers and j.makespan < rotor(chain, platform).makespan


def test_slot_rounding_is_conservative(chain3):
    sl = slots_for(chain3, 175, 7)
    assert sl.quantum == 24 and sl.budget == 6  # (175 - 10) B in 7 slots of 24 B: 6 whole slots
    assert list(sl.act) == [1, 1, 2, 2] and list(sl.act_down) == [0, 0, 1, 1]


def test_cpsat_cannot_beat_joint_by_more_than_rounding():
    # CP-SAT solves pure offloading exactly; joint's own DP searches a smaller family of offload
    # timings (each offload waited for before the next segment), so joint may trail it, but it
    # includes the pure-offload method of the registry: only where CP-SAT is better than that
    # method can the gap show. We assert joint is never beaten by more than 5%.
    if "cpsat" not in methods():
        pytest.skip("method 'cpsat' is not registered in this checkout")
    for chain, platform in instances(4, 6, lengths=(2, 5)):
        c = solve(chain, platform, method="cpsat", time_limit=10)
        j = solve(chain, platform, method="joint")
        if c.status.has_schedule:
            assert j.status.has_schedule and j.makespan <= c.makespan * 1.05
