"""The bound ladder of solve() and the closed-form volume bound."""

import math

import pytest

import chainoffload as co
from chainoffload import Platform, keep_all_peak, solve
from chainoffload.bounds import ladder as _ladder
from chainoffload.bounds import lower_bound, offload_memory_floor, volume_lower_bound
from chainoffload.exact import brute_force
from chainoffload.generators import random_chain


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


# -- time limits, by spies and fake clocks (issue 33: no wall-time assertions) ----------------------


def _mid(length, seed=11):
    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = 0.5 * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(lo + 0.5 * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


def test_solve_climbs_the_ladder_within_what_is_left_of_its_limit(monkeypatch):
    # A mutant that dropped this limit let a solve with time_limit=1 take 5.4 s at L = 1,500 (the
    # fluid LP ran unbounded). The climb must get the time left, less the judging.
    from chainoffload.solvers import _front

    chain, platform = _mid(200)
    seen = []
    real = _ladder.climb

    def spy(chain, platform, time_limit=None, **kwargs):
        seen.append(time_limit)
        return real(chain, platform, time_limit, **kwargs)

    monkeypatch.setattr(_ladder, "climb", spy)
    monkeypatch.setattr(_front, "_judge_cost", lambda chain: 0.25)
    solve(chain, platform, "first-k", time_limit=1.0)
    assert len(seen) == 1 and seen[0] is not None and 0.0 <= seen[0] <= 1.0 - 0.25
    seen.clear()
    solve(chain, platform, "first-k")
    assert seen == [None]  # no limit: the rules alone decide


def test_the_method_gets_the_limit_less_the_judging(monkeypatch):
    # A mutant that reserved no time for judging the schedule survived: with a frozen clock the
    # method must be handed exactly the limit less the judging's estimate.
    import time

    from chainoffload.solvers import _front, baselines

    chain, platform = _mid(40)
    got = []
    real = baselines.first_k

    def spy(*args, **kwargs):
        got.append(kwargs.get("time_limit"))
        return real(*args, **kwargs)

    monkeypatch.setattr(baselines, "first_k", spy)
    monkeypatch.setattr(_front, "_judge_cost", lambda chain: 0.375)
    monkeypatch.setattr(time, "perf_counter", lambda: 1000.0)
    solve(chain, platform, "first-k", time_limit=2.0)
    assert got == [pytest.approx(2.0 - 0.375, abs=1e-9)]


def test_a_rung_skipped_or_stopped_by_the_time_limit_says_so(monkeypatch):
    from chainoffload.bounds import milp

    chain, platform = _mid(12, seed=6)
    notes = []
    _ladder.climb(chain, platform, 0.0, notes=notes)
    assert any("fluid-lp bound was skipped" in n for n in notes), notes
    # SCIP cut by the caller's limit before its node limit: the value stands, with a note.
    stopped = milp.UnitMILP(chain.compute_time * 1.01, "time limit", 0.5, 10, 10)
    monkeypatch.setattr(milp, "unit_milp", lambda *a, **k: stopped)
    value, why = _ladder._unit_milp(chain, platform, 0.5)
    assert value == stopped.bound and "time limit" in why
    monkeypatch.setattr(_ladder, "LADDER", [r for r in _ladder.LADDER if r.name in ("trivial", "unit-milp")])
    notes = []
    got, name, _ = _ladder.climb(chain, platform, 10.0, notes=notes)
    assert name == "unit-milp" and got == stopped.bound and any("unit-milp bound stopped early" in n for n in notes)
    # ... and solve() passes the note on.
    monkeypatch.setattr(_ladder, "_unit_milp_runs", lambda c, p: True)
    r = solve(chain, platform, "first-k", time_limit=30.0)
    if r.info["bound"] == "unit-milp":
        assert "stopped early" in r.info["lower_bound_note"]


def test_one_evaluation_is_not_underestimated(monkeypatch):
    # A mutant that estimated one evaluation 10x too low survived: the model, at pace 1, must stay
    # above the fastest evaluation measured (9 us per stage at load 3 on 2 cores, pace 1.5: NOTE
    # [ clock ] in chainoffload/_cost.py), and the evaluator must not start one that does not fit.
    import time

    from chainoffload import _cost
    from chainoffload.solvers._search import Evaluator

    monkeypatch.setattr(_cost, "pace", lambda: 1.0)
    _cost.forget()
    for length in (10_000, 100_000):
        assert _cost.eval_seconds(length) >= 9e-6 / 1.5 * length
    chain, platform = _mid(1000)
    need = _cost.eval_seconds(1000) + _cost.build_seconds(0)
    monkeypatch.setattr(time, "perf_counter", lambda: 50.0)
    short = Evaluator(chain, platform, deadline=50.0 + 0.9 * need)
    assert short.exhausted and short.stopped == "time"
    roomy = Evaluator(chain, platform, deadline=50.0 + 1.1 * need)
    assert not roomy.exhausted
