"""Method ``lp``: the fluid LP relaxation rounded into whole units, planned and simulated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chainoffload import Platform, Status, simulate, solve
from chainoffload.bounds import fluid_lower_bound, lower_bound, offload_memory_floor
from chainoffload.examples import tiny
from chainoffload.generators import random_chain
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers.lp import lp

INF = math.inf


def _instance(seed: int, length: int, frac: float, *, bw_factor: float = 0.5, **platform):
    """A random chain and a platform whose memory sits ``frac`` of the way from the offloading
    floor to the keep-all peak, with a link ``bw_factor`` times as fast as compute eats bytes."""
    chain = random_chain(seed, length)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / length)
    memory = int(floor + frac * (peak - floor))
    bw = scale * bw_factor
    return chain, Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, **platform)


@pytest.mark.parametrize(
    "seed,length,frac,extra",
    [
        (1, 4, 0.3, {}),
        (2, 8, 0.1, {"latency": 1e-4}),
        (3, 12, 0.5, {"duplex": False}),
        (4, 25, 0.2, {}),
        (5, 60, 0.4, {"latency": 2e-5, "duplex": False}),
    ],
)
def test_schedule_passes_simulator(seed, length, frac, extra):
    chain, platform = _instance(seed, length, frac, **extra)
    result = lp(chain, platform)
    assert result.method == "lp"
    assert result.status == Status.FEASIBLE
    tl = simulate(chain, platform, result.schedule)
    assert tl.feasible
    assert result.makespan == tl.makespan
    assert result.lower_bound == lower_bound(chain, platform)
    assert result.lower_bound <= result.makespan * (1 + 1e-9)
    assert result.info["roundings_tried"] >= 1
    assert len(result.info["x"]) == length
    assert sorted(result.info["units"]) == list(result.schedule.offloaded_units)
    judged = solve(chain, platform, method="lp")
    assert judged.status in (Status.FEASIBLE, Status.OPTIMAL)
    assert judged.makespan == result.makespan


def test_keep_all_memory_gives_compute_time():
    for seed, length in [(1, 3), (2, 10), (3, 40)]:
        chain = random_chain(seed, length)
        for memory in (keep_all_peak(chain), 2 * keep_all_peak(chain)):
            platform = Platform(memory=memory, bandwidth_d2h=1e6, bandwidth_h2d=1e6, latency=1e-3)
            result = solve(chain, platform, method="lp")
            assert result.makespan == chain.compute_time
            assert result.status == Status.OPTIMAL
            assert result.offloaded_bytes == 0


def test_free_transfers_at_the_floor_give_compute_time():
    chains = [tiny()] + [random_chain(seed, length) for seed, length in [(1, 2), (2, 4), (3, 7), (4, 12), (5, 30)]]
    for chain in chains:
        floor = offload_memory_floor(chain)
        for memory in (floor, (floor + keep_all_peak(chain)) // 2):
            platform = Platform(memory=memory, bandwidth_d2h=INF, bandwidth_h2d=INF)
            result = solve(chain, platform, method="lp")
            assert result.status == Status.OPTIMAL, (chain.name, memory, result.message)
            assert result.makespan == chain.compute_time
            assert result.lower_bound == chain.compute_time


def test_deterministic():
    chain, platform = _instance(9, 30, 0.25, latency=1e-5)
    a, b = lp(chain, platform), lp(chain, platform)
    assert a.schedule == b.schedule
    assert a.makespan == b.makespan
    assert a.info["x"] == b.info["x"]
    assert a.info["roundings_tried"] == b.info["roundings_tried"]


def test_at_least_as_good_as_offload_all_when_it_fits():
    # Repair falls back to offload-all's set, so lp fits whenever offload-all does, and the
    # rounding should do better than offloading everything on average.
    wins = 0
    for seed in range(8):
        chain, platform = _instance(seed, 15, 0.05 * seed)
        mine = solve(chain, platform, method="lp")
        base = solve(chain, platform, method="offload-all")
        if base.feasible:
            assert mine.feasible
            assert mine.makespan <= base.makespan * (1 + 1e-12)
            wins += mine.makespan < base.makespan
    assert wins >= 4


def test_infeasible_below_the_floor():
    chain = random_chain(4, 10)
    floor = offload_memory_floor(chain)
    memory = max(chain.stage_memory_floor(), floor - floor // 100)
    assert memory < floor
    platform = Platform(memory=memory, bandwidth_d2h=1e9, bandwidth_h2d=1e9)
    result = lp(chain, platform)
    assert result.status == Status.INFEASIBLE
    assert result.schedule is None
    assert result.info["lp_feasible"] is False
    assert fluid_lower_bound(chain, platform) == INF
    assert "infeasible" in result.message


def test_no_bandwidth():
    chain = random_chain(6, 6)
    peak = keep_all_peak(chain)
    ok = lp(chain, Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0))
    assert ok.status == Status.FEASIBLE and ok.makespan == chain.compute_time
    assert ok.schedule.transfers == ()
    short = lp(chain, Platform(memory=peak - 1, bandwidth_d2h=0.0, bandwidth_h2d=0.0))
    assert short.status == Status.INFEASIBLE


def test_roundings_budget_is_respected():
    chain, platform = _instance(12, 40, 0.3)
    few = lp(chain, platform, roundings=3)
    assert few.info["roundings_tried"] <= 3 or few.info["source"].startswith("repair")
    many = lp(chain, platform, roundings=200)
    if few.feasible:
        assert many.makespan <= few.makespan


def test_bad_options():
    chain, platform = _instance(1, 5, 0.5)
    with pytest.raises(ValueError, match="'cplex'"):
        lp(chain, platform, solver="cplex")
    with pytest.raises(ValueError, match="roundings"):
        lp(chain, platform, roundings=0)
    with pytest.raises(ValueError, match="roundings"):
        lp(chain, platform, roundings=2.5)
    with pytest.raises(ValueError, match="'simplex'"):
        solve(chain, platform, method="lp", solver="simplex")


def test_lp_bound_reported_in_info():
    chain, platform = _instance(3, 20, 0.1, bw_factor=0.2)
    result = solve(chain, platform, method="lp")
    info = result.info
    assert info["lp_bound"] <= info["lp_objective"]
    # solve() keeps the larger of lp's own LP bound and the ladder's (NOTE [ bound ladder ]).
    from chainoffload.bounds import volume_lower_bound

    expected = max(chain.compute_time, info["lp_bound"], volume_lower_bound(chain, platform))
    if info["bound"] == "unit-milp":  # the whole-unit relaxation, stronger here when affordable
        assert expected <= result.lower_bound <= result.makespan
    else:
        assert result.lower_bound == pytest.approx(expected, rel=1e-12)
    assert np.all((np.array(info["x"]) >= 0) & (np.array(info["x"]) <= 1))
    assert result.to_dict()["info"]["lp_bound"] == info["lp_bound"]
