"""The bound ladder of solve() and the closed-form volume bound."""

import math

import pytest

import chainoffload as co
from chainoffload import Platform, keep_all_peak, solve
from chainoffload.bounds import lower_bound, offload_memory_floor, volume_lower_bound
from chainoffload.exact import brute_force
from chainoffload.generators import random_chain
from chainoffload.bounds import ladder as _ladder


# One chain per case (four brute forces each): two in the fast profile, two in the thorough one.
@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(seed, marks=pytest.mark.thorough) for seed in (2, 3))])
def test_volume_bound_is_below_the_optimum_of_tiny_chains(seed):
    chain = random_chain(seed, 3)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    for level in (0.0, 0.5):
        for duplex in (True, False):
            bw = 0.3 * float(chain.saved.sum()) / chain.compute_time
            platform = Platform(memory=int(lo + level * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=0.7 * bw,
                                latency=0.01 * chain.compute_time, duplex=duplex)
            best = brute_force(chain, platform)
            bound = volume_lower_bound(chain, platform)
            assert bound >= chain.compute_time
            if best.feasible:
                assert bound <= best.makespan * (1 + 1e-9)


def test_volume_bound_edges(chain3):
    roomy = Platform(memory=keep_all_peak(chain3), bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    assert volume_lower_bound(chain3, roomy) == chain3.compute_time
    stuck = Platform(memory=keep_all_peak(chain3) - 1, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    assert volume_lower_bound(chain3, stuck) == math.inf


def test_solve_names_the_rung_and_keeps_the_largest():
    chain = random_chain(3, 20)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    platform = Platform(memory=int(lo + 0.2 * (hi - lo)), bandwidth_d2h=1e8, bandwidth_h2d=1e8, latency=1e-5)
    r = solve(chain, platform, "dp")
    assert r.info["bound"] in ("trivial", "volume", "fluid-lp", "unit-milp")
    expected = max(chain.compute_time, volume_lower_bound(chain, platform), lower_bound(chain, platform))
    if r.info["bound"] == "unit-milp":  # the whole-unit relaxation, when the budget afforded it
        assert min(expected, r.makespan) <= r.lower_bound <= r.makespan
    else:
        assert r.lower_bound == pytest.approx(min(expected, r.makespan), rel=1e-12)


def test_keep_all_never_pays_for_a_bound(chain3, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the LP was solved")

    monkeypatch.setattr("chainoffload.bounds.fluid.lower_bound", boom)
    fits = solve(chain3, Platform(memory=keep_all_peak(chain3), bandwidth_d2h=1.0, bandwidth_h2d=1.0), "keep-all")
    assert fits.status == co.Status.OPTIMAL and fits.info["bound"] == "trivial"
    short = solve(chain3, Platform(memory=keep_all_peak(chain3) - 1, bandwidth_d2h=1.0, bandwidth_h2d=1.0), "keep-all")
    assert short.status == co.Status.INFEASIBLE


def test_an_unaffordable_rung_is_skipped_and_a_new_rung_slots_in(monkeypatch):
    chain = random_chain(6, 12)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    platform = Platform(memory=int(lo + 0.3 * (hi - lo)), bandwidth_d2h=1e8, bandwidth_h2d=1e8)
    # Under a time limit of 0 s only the first rung and free ones run.
    value, name, tried = _ladder.climb(chain, platform, 0.0)
    assert "fluid-lp" not in tried and name in ("trivial", "volume")
    rung = _ladder.Rung("test-rung", lambda c, p, limit: value * 1.0000001, lambda c, p: True, lambda c, p: 0.0)
    monkeypatch.setattr(_ladder, "LADDER", list(_ladder.LADDER))
    _ladder.add_rung(rung, after="fluid-lp")
    names = [r.name for r in _ladder.LADDER]
    assert names[names.index("fluid-lp") + 1] == "test-rung"
    got, name, _ = _ladder.climb(chain, platform, 0.0)
    assert name == "test-rung" and got > value
    with pytest.raises(ValueError, match="exists already"):
        _ladder.add_rung(rung)


def _tight(seed, length, level, rate):
    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = rate * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(lo + level * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


def test_unit_milp_rung_when_affordable():
    # A 6-stage chain where memory moves by whole moves: the whole-move relaxation is 1.43x the
    # fluid LP (tests/test_bounds.py); solve() says so.
    chain, platform = _tight(0, 6, 0.25, 0.5)
    fluid = lower_bound(chain, platform)
    r = solve(chain, platform, "dp")
    assert r.info["bound"] == "unit-milp" and r.lower_bound > 1.4 * fluid
    assert r.lower_bound <= r.makespan
    from chainoffload.bounds import unit_milp_seconds

    assert unit_milp_seconds(chain, platform) > 0.0  # the ladder's node-limited MILP is not the untimed one's cache
    found = _ladder.problem_bound(chain, platform)
    assert found.rung == "unit-milp" and found.tried[-1] == "unit-milp" and found.value == r.lower_bound


def test_unit_milp_rung_skipped_when_it_does_not_fit():
    from chainoffload.bounds import unit_milp_seconds

    chain, platform = _tight(5, 60, 0.25, 0.5)
    cost = unit_milp_seconds(chain, platform)
    assert cost > 5.0  # tight memory at L = 60: seconds before SCIP has a useful bound
    _, _, tried = _ladder.climb(chain, platform, 2.0)
    assert "unit-milp" not in tried
    # Without a time limit the rule is the model's size, which this one exceeds.
    from chainoffload.bounds.milp import _unit_milp_size

    assert _unit_milp_size(chain, platform) > _ladder.UNIT_MILP_WORK_SIZE
    assert "unit-milp" not in _ladder.problem_bound(chain, platform).tried
    roomy = platform.with_memory(keep_all_peak(chain))
    assert unit_milp_seconds(chain, roomy) == 0.0  # no check binds: free
