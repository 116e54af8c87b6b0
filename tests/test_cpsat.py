"""The CP-SAT method: its timings are the simulator's, its bound is sound, its options checked."""

import dataclasses
import math

import pytest

from chainoffload import Chain, Platform, Schedule, Status, Transfer, keep_all_peak, simulate, solve
from chainoffload.generators import random_chain
from chainoffload.solvers.cpsat import CPModel, TimeGrid, cpsat, default_workers, in_model_space, integer_replay
from chainoffload.solvers.cpsat import model as cpsat_model
from chainoffload.solvers.cpsat.variables import OpVar, TransferVar, UnitVar


def instance(seed, length, frac=0.5, ratio=0.3, duplex=True):
    chain = random_chain(seed, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    bw = float(chain.saved.sum()) / float(chain.fwd.sum()) * ratio
    return chain, Platform(memory=int(floor + (top - floor) * frac), bandwidth_d2h=bw, bandwidth_h2d=bw, duplex=duplex)


@pytest.mark.parametrize("duplex", [True, False])
def test_cpsat_times_are_the_integer_replay_of_its_schedule(duplex):
    # NOTE [ cpsat: expressible timings ]: every CP-SAT time is exactly what the simulator's
    # rules give for the converted schedule (on the integer durations).
    chain, platform = instance(1, 6, frac=0.4, ratio=0.2, duplex=duplex)
    grid = TimeGrid.build(chain, platform)
    model = CPModel(chain, platform, grid)
    solver, status = model.solve(time_limit=10.0, workers=2, gap_units=grid.slack)
    assert status in ("OPTIMAL", "FEASIBLE")
    schedule = model.schedule_from(solver)
    assert schedule.transfers, "the instance should need offloading"
    times = model.solution_times(solver)
    rep = integer_replay(grid, chain.length, schedule, platform.duplex)
    assert rep["op_start"] == times["op_start"]
    assert rep["op_end"] == times["op_end"]
    for idx, t in enumerate(schedule.transfers):
        key = ("O" if t.kind == "offload" else "P", t.unit)
        assert (rep["start"][idx], rep["end"][idx]) == times["transfers"][key]
    # And the float simulator agrees within the documented tolerance.
    tl = simulate(chain, platform, schedule)
    assert tl.feasible
    assert abs(tl.makespan - solver.objective_value / grid.scale) <= grid.slack / grid.scale


@pytest.mark.parametrize("seed,duplex", [(1, True), (4, False), (2, False)])
def test_result_makespan_is_simulated_and_matches_objective(seed, duplex):
    chain, platform = instance(seed, 6, frac=0.5, ratio=0.3, duplex=duplex)
    res = solve(chain, platform, "cpsat", time_limit=20.0)
    assert res.status in (Status.OPTIMAL, Status.FEASIBLE)
    tl = simulate(chain, platform, res.schedule)
    assert tl.feasible and tl.makespan == res.makespan
    info = res.info
    assert info["time_scale"] > 0 and info["tolerance"] > 0
    # Documented tolerance: |simulated - objective / scale| <= slack / scale (= info["tolerance"]).
    if not info.get("kept_hint"):
        assert abs(res.makespan - info["objective_units"] / info["time_scale"]) <= info["tolerance"]
    assert chain.compute_time <= res.lower_bound <= res.makespan
    if res.status == Status.OPTIMAL:
        # Optimal means: gap below the rounding slack (NOTE [ cpsat: time scale ]).
        assert res.makespan - res.lower_bound <= 3 * info["tolerance"] + 1e-12


def test_beats_or_equals_every_baseline():
    chain, platform = instance(3, 8, frac=0.5, ratio=0.3)
    res = solve(chain, platform, "cpsat", time_limit=20.0)
    assert res.status == Status.OPTIMAL
    for method in ("keep-all", "offload-all", "first-k", "largest-first"):
        other = solve(chain, platform, method)
        if other.feasible:
            assert res.makespan <= other.makespan + 3 * res.info["tolerance"]
            assert other.makespan >= res.lower_bound


def test_keep_all_fits_gives_compute_time(chain3):
    res = solve(chain3, Platform(memory=192, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", time_limit=5.0)
    assert res.status == Status.OPTIMAL and res.makespan == 12.0 and res.schedule.transfers == ()
    # The warm start (keep-all) reaches sum(fwd) + sum(bwd): proven without a CP-SAT search.
    assert res.info["cpsat_status"] == "SKIPPED" and res.lower_bound == 12.0


def test_infeasible_is_proven(chain3):
    # No bandwidth and less memory than keep-all needs: nothing can be moved out.
    res = solve(chain3, Platform(memory=180, bandwidth_d2h=0.0, bandwidth_h2d=0.0), "cpsat", time_limit=5.0)
    assert res.status == Status.INFEASIBLE and res.schedule is None and "proven" in res.message


def test_warm_start_and_given_hint(chain3):
    platform = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    res = solve(chain3, platform, "cpsat", time_limit=5.0)
    assert res.feasible
    again = cpsat(chain3, platform, time_limit=5.0, hint=res.schedule)
    assert again.info["hint"] in ("given[0]", "largest-first", "first-k", "keep-all")
    assert math.isclose(again.makespan, res.makespan, abs_tol=3 * res.info["tolerance"])
    plain = cpsat(chain3, platform, time_limit=5.0, hint=False)
    assert plain.info["hint"] is None and plain.feasible


def test_in_model_space_drops_implied_waits_and_rejects_prefetch_waits(chain3):
    # P_1 at the end of F_3 with a wait at B_2 (its implicit reader): implied, dropped.
    o = Transfer("offload", 1, 0, "end", before=5)  # O_1 wait at B_1: implied by P_1's wait
    p = Transfer("prefetch", 1, 2, "end", before=4)  # before = B_2, the reader: implied
    s = in_model_space(chain3, Schedule.from_units(3, [o, p]))
    assert s is not None and all(t.before is None for t in s.transfers)
    p_wait = Transfer("prefetch", 1, 2, "end", before=3)  # a compute op waits on a prefetch
    assert in_model_space(chain3, Schedule.from_units(3, [o, p_wait])) is None


class _FakeSolver:
    """What CPModel.solve returns, for a run that ends with ``status`` and no usable solution."""

    best_objective_bound = 0.0
    objective_value = math.nan


def _outcome(monkeypatch, chain, platform, status, **options):
    monkeypatch.setattr(cpsat_model.CPModel, "solve", lambda self, **kw: (_FakeSolver(), status))
    return cpsat(chain, platform, time_limit=5.0, bound=False, **options)


def test_no_solution_in_time_without_warm_start_is_a_timeout(monkeypatch):
    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    res = _outcome(monkeypatch, chain, platform, "UNKNOWN", hint=False)
    assert res.status == Status.TIMEOUT and res.schedule is None
    # The seconds it took, not the limit as if all of it was spent (issue 33: "within 19.98 s" after 0.4 s).
    assert res.message.startswith("cpsat: no schedule found: CP-SAT found none (status UNKNOWN) in ")
    assert res.message.endswith(" of the 5 s limit; there is no warm start")
    spent = float(res.message.split(" in ")[1].split(" s ")[0])
    assert spent == pytest.approx(res.runtime, rel=0.01, abs=1e-3)


def test_rejected_schedules_say_the_retries_ended_it_not_the_clock(monkeypatch):
    """The simulator rejecting every schedule CP-SAT found ended the search in 0.4 s; the
    message said 'within 19.98 s'."""
    from chainoffload.solvers.cpsat import solve as cpsat_solve

    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    monkeypatch.setattr(cpsat_model.CPModel, "solve", lambda self, **kw: (_FakeSolver(), "FEASIBLE"))
    monkeypatch.setattr(cpsat_model.CPModel, "schedule_from", lambda self, solver: Schedule.keep_all(chain.length))

    class _Rejected:
        feasible = False
        makespan = math.inf

    monkeypatch.setattr(cpsat_solve, "simulate", lambda c, p, s: _Rejected())
    res = cpsat(chain, platform, time_limit=20.0, bound=False, hint=False)
    assert res.status == Status.TIMEOUT and res.runtime < 10.0
    assert "within 20 s" not in res.message and "the simulator rejected each of the 4 schedule(s) CP-SAT found, on 4 time grid(s)" in res.message
    assert "of the 20 s limit" in res.message


def test_no_solution_in_time_keeps_the_warm_start(monkeypatch):
    # Not "the simulator rejected CP-SAT's schedules": CP-SAT found none.
    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    res = _outcome(monkeypatch, chain, platform, "UNKNOWN")
    assert res.status == Status.FEASIBLE and res.info["kept_hint"]
    assert res.message.startswith(f"cpsat: CP-SAT found no schedule within 5 s; kept the warm start ({res.info['hint']})")
    assert simulate(chain, platform, res.schedule).makespan == res.makespan


def test_infeasible_model_with_a_feasible_warm_start_is_not_infeasible(monkeypatch):
    # The integer model can disagree with the float simulator by rounding (NOTE [ cpsat: time
    # scale ]); a schedule the simulator accepts outranks "proven infeasible".
    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    res = _outcome(monkeypatch, chain, platform, "INFEASIBLE")
    assert res.status == Status.FEASIBLE and res.schedule is not None
    assert "integer model has no solution, yet the warm start" in res.message
    plain = _outcome(monkeypatch, chain, platform, "INFEASIBLE", hint=False)
    assert plain.status == Status.INFEASIBLE and "(proven)" in plain.message


def test_simulator_rejection_is_reported_as_such(monkeypatch):
    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    bad = Schedule.keep_all(chain.length)  # over the memory limit at this memory
    assert not simulate(chain, platform, bad).feasible

    class Solver(_FakeSolver):
        objective_value = 1.0

    monkeypatch.setattr(cpsat_model.CPModel, "solve", lambda self, **kw: (Solver(), "FEASIBLE"))
    monkeypatch.setattr(cpsat_model.CPModel, "schedule_from", lambda self, solver: bad)
    res = cpsat(chain, platform, time_limit=5.0, bound=False)
    assert res.status == Status.FEASIBLE and res.info["rejected"] == 4  # the first try and 3 retries
    assert "the simulator rejected the 4 schedule(s) CP-SAT found" in res.message
    none = cpsat(chain, platform, time_limit=5.0, bound=False, hint=False)
    assert none.status == Status.TIMEOUT and "the simulator rejected" in none.message


def test_time_limit_with_a_schedule_says_the_gap(monkeypatch):
    # CP-SAT stops at the limit with a schedule the simulator accepts and no warm start to
    # compare: feasible, CP-SAT's schedule, and the gap to the bound it proved.
    chain, platform = instance(2, 8, frac=0.3, ratio=0.1)
    found = solve(chain, platform, "best").schedule
    makespan = simulate(chain, platform, found).makespan
    grid = TimeGrid.build(chain, platform)

    class Solver(_FakeSolver):
        objective_value = makespan * grid.scale
        best_objective_bound = 0.9 * makespan * grid.scale

    monkeypatch.setattr(cpsat_model.CPModel, "solve", lambda self, **kw: (Solver(), "FEASIBLE"))
    monkeypatch.setattr(cpsat_model.CPModel, "schedule_from", lambda self, solver: found)
    res = cpsat(chain, platform, time_limit=5.0, bound=False, hint=False)
    assert res.status == Status.FEASIBLE and res.schedule is found and not res.info["kept_hint"]
    assert res.makespan == makespan and res.lower_bound < makespan
    gap = 100 * (makespan / res.lower_bound - 1)
    assert res.message == f"cpsat: time limit 5 s reached; best schedule (cpsat) {gap:.3g}% above the proven bound"
    assert 11.0 < gap < 11.2  # 1 / 0.9, less the rounding slack


def test_workers_default_to_every_core(chain3):
    res = solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", time_limit=5.0)
    assert res.info["workers"] == default_workers() >= 1


def test_variables_are_typed_records():
    chain, platform = instance(1, 5)
    grid = TimeGrid.build(chain, platform)
    v = CPModel(chain, platform, grid, keep=frozenset({2})).variables
    assert all(isinstance(op, OpVar) for op in v.ops) and [op.kind for op in v.ops] == ["F"] * 5 + ["B"] * 5
    assert sorted(v.units) == [1, 3, 4, 5]  # unit 2 is kept: no transfer variables at all
    unit = v.units[3]
    assert isinstance(unit, UnitVar) and isinstance(unit.offload, TransferVar)
    assert unit.offload.key == ("O", 3) and unit.prefetch.key == ("P", 3)
    assert unit.offload.events == tuple(range(5, 2 * 10 - 2 * 4 - 1 + 1))  # end of F_3 .. end of B_5
    assert sorted(unit.waits) == list(range(3, 10 - 4))  # after F_3, before B_4
    assert v.before(("O", 3), ("P", 3)) == 1 and dataclasses.is_dataclass(unit)


def test_progress_goes_to_stderr(chain3, capsys):
    # The process-wide progress switch (the CLI's --progress; chainoffload/_progress.py): a bar
    # named cpsat with the objective and bound of each solution, on stderr only.
    from chainoffload import _progress

    platform = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    _progress.configure(True)
    try:
        res = solve(chain3, platform, "cpsat", time_limit=5.0)
    finally:
        _progress.configure(None)
    captured = capsys.readouterr()
    assert res.info["cpsat_status"] == "OPTIMAL" and captured.out == ""
    assert "cpsat:" in captured.err and "/5.0" in captured.err  # the bar counts seconds of the limit
    _progress.configure(False)
    try:
        solve(chain3, platform, "cpsat", time_limit=5.0)
    finally:
        _progress.configure(None)
    assert capsys.readouterr().err == ""


def test_progress_reports_each_solution():
    # What the bar shows at each CP-SAT solution: seconds spent, objective and bound in seconds.
    from chainoffload.solvers.cpsat.solve import _reporter

    class Bar:
        def __init__(self):
            self.position, self.fields = None, None

        def set(self, position):
            self.position = position

        def note(self, **fields):
            self.fields = fields

    class Callback:
        objective_value, best_objective_bound = 2.5e6, 2.0e6

    bar = Bar()
    _reporter(bar, 1e6, 0.0)(Callback())
    assert bar.position > 0 and bar.fields == {"objective": "2.5 s", "bound": "2 s"}


def test_explicit_time_scale_is_reported(chain3):
    platform = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    res = solve(chain3, platform, "cpsat", time_limit=5.0, time_scale=1000.0)
    assert res.info["time_scale"] == 1000.0
    coarse = solve(chain3, platform, "cpsat", time_limit=5.0)
    assert math.isclose(res.makespan, coarse.makespan, abs_tol=res.info["tolerance"] + coarse.info["tolerance"])


@pytest.mark.parametrize(
    "options,match",
    [
        ({"time_limit": 0}, r"time_limit: 0 must be"),
        ({"workers": 0}, r"workers: 0 must be"),
        ({"time_scale": -1.0}, r"time_scale: -1.0 must be"),
        ({"hint": 3}, r"hint: 3 must be"),
    ],
)
def test_bad_options_name_the_field(chain3, options, match):
    with pytest.raises(ValueError, match=match):
        solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", **options)


def test_unknown_option_is_rejected(chain3):
    with pytest.raises(ValueError, match=r"does not take slots"):
        solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", slots=4)


def _tight(seed, length, level, rate):
    """Memory ``level`` of the way from the offloading floor to keep-all (tests/test_bounds.py's family)."""
    from chainoffload.bounds import offload_memory_floor

    chain = random_chain(seed, length)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    bw = rate * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(floor + level * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


def test_moving_a_i_alone_is_in_the_model_and_replays_exactly():
    # Issue 21: the simulator accepts moves="act", so "optimal" must range over it. Here 37 MB
    # must leave; a_4 alone (44 of unit 4's 153 MB) is the cheap way, and the optimum (1.2549 s)
    # is half what the best whole-unit schedule takes (2.507 s, CP-SAT's old "optimum").
    chain, platform = _tight(0, 6, 0.25, 0.5)
    grid = TimeGrid.build(chain, platform)
    model = CPModel(chain, platform, grid)
    solver, status = model.solve(time_limit=30.0, workers=2, gap_units=grid.slack)
    assert status == "OPTIMAL"
    schedule = model.schedule_from(solver)
    assert any(t.moves == "act" for t in schedule.transfers)
    times = model.solution_times(solver)
    rep = integer_replay(grid, chain.length, schedule, platform.duplex)
    assert (rep["op_start"], rep["op_end"]) == (times["op_start"], times["op_end"])
    for idx, t in enumerate(schedule.transfers):
        assert (rep["start"][idx], rep["end"][idx]) == times["transfers"][("O" if t.kind == "offload" else "P", t.unit)]
    tl = simulate(chain, platform, schedule)
    assert tl.feasible and abs(tl.makespan - solver.objective_value / grid.scale) <= grid.slack / grid.scale
    assert tl.makespan < 0.55 * 2.507

    # The same schedule as a warm start: accepted, mapped onto every variable (the hint is
    # complete), and the answer is no worse.
    again = cpsat(chain, platform, time_limit=20.0, hint=[schedule], bound=False)
    assert again.info["hint"] == "given[0]" and again.info["hint_complete"] is True
    assert again.status == Status.OPTIMAL
    assert again.makespan <= tl.makespan + 3 * again.info["tolerance"]


def test_a_unit_whose_output_is_all_it_saves_has_one_move():
    # act[u] = saved[u]: moving a_u alone is moving the unit; the model offers no second literal.
    chain, platform = instance(1, 4)
    saved = list(chain.saved)
    saved[1] = int(chain.act[2])
    same = chain.replace(saved=saved)
    v = CPModel(same, platform, TimeGrid.build(same, platform)).variables
    assert v.units[2].alone is None and v.units[2].whole is v.units[2].offloaded
    assert v.units[1].alone is not None


@pytest.mark.parametrize("seed,level", [(8, 0.1), (3, 0.4)])
def test_cpsat_equals_brute_force_where_a_i_alone_wins(seed, level):
    # Instances where the optimum moves a_1 alone: CP-SAT's whole-unit model called 27.84 s and
    # 0.686 s "optimal" here; the brute force over every move finds 8.824 s and 0.652 s.
    from chainoffload.exact import brute_force

    chain, platform = _tight(seed, 3, level, 0.1)
    oracle = brute_force(chain, platform)
    exact = solve(chain, platform, "cpsat", time_limit=20.0)
    assert oracle.status == exact.status == Status.OPTIMAL
    assert any(t.moves == "act" for t in oracle.schedule.transfers)
    assert abs(exact.makespan - oracle.makespan) <= 3 * exact.info["tolerance"] + 1e-12 * chain.compute_time
    assert exact.lower_bound <= oracle.makespan + 1e-12


def test_a_slow_link_beside_a_fast_compute_is_solved_not_refused():
    """Copies 2*10^10 times the compute time put a copy beyond the default grid's 2^53 units and
    cpsat refused the valid instance as misuse (exit 2), in verify too (issue 33): the default
    grid now fits the instance's horizon."""
    from chainoffload.solvers.cpsat.grid import HORIZON_UNITS, TimeGrid
    from chainoffload.verify import verify

    chain = Chain(fwd=[1e-6] * 3, bwd=[2e-6] * 3, act=[10, 100_000, 100_000, 100_000], saved=[200_000] * 3, name="slowlink")
    keep_all = solve(chain, Platform(memory=10**9, bandwidth_d2h=1.0, bandwidth_h2d=1.0), "keep-all").peak_memory
    platform = Platform(memory=keep_all - 150_000, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    grid = TimeGrid.build(chain, platform)
    assert TimeGrid.horizon(chain, platform) * grid.scale <= HORIZON_UNITS
    r = solve(chain, platform, "cpsat", time_limit=30)
    assert r.status == Status.OPTIMAL and r.makespan == simulate(chain, platform, r.schedule).makespan
    assert r.lower_bound <= r.makespan <= r.lower_bound * (1 + 1e-9)
    report = verify(chain, platform, r.schedule, time_limit=30)
    assert report["feasible"] and report["cpsat_status"] == "optimal"
    # A scale the caller gives that the horizon does not fit is the caller's misuse, named.
    with pytest.raises(ValueError, match="time_scale: .* give at most"):
        TimeGrid.build(chain, platform, 1e12)


# Issue 33's zero-length instance: F_1..F_3 and B_2, B_4 take no time. A 6.625 s schedule peaks
# at 160 B (d2h 20 B/s, h2d 40 B/s); CP-SAT's model counted a prefetch that starts when a
# zero-length op ends after that op's frees, the simulator (docs/model.md, order -1) before
# them, and every schedule it found was rejected: "timeout" after 0.4 s.
ZERO = Chain(fwd=[0, 0, 0, 1], bwd=[1, 0, 2, 0], act=[0, 8, 21, 29, 12], saved=[8, 55, 43, 34], name="zero-length")


@pytest.mark.parametrize("d2h, h2d, optimum", [(20.0, 40.0, 6.625), (40.0, 20.0, 6.45)])
def test_zero_length_ops_are_solved_to_the_optimum(d2h, h2d, optimum):
    platform = Platform(memory=167, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=0.5)
    r = solve(ZERO, platform, "cpsat", time_limit=60, workers=1)
    assert r.status == Status.OPTIMAL and r.makespan == pytest.approx(optimum, abs=3 * r.info["tolerance"])
    tl = simulate(ZERO, platform, r.schedule)
    assert tl.feasible and tl.makespan == r.makespan and tl.peak_memory <= 167
    # The oracle's answer for the schedule the issue names: the simulator accepts it.
    named = Schedule.from_dict({"compute": [["F", 1], ["F", 2], ["F", 3], ["F", 4], ["B", 4], ["B", 3], ["B", 2], ["B", 1]],
                                "transfers": [
                                    {"kind": "offload", "unit": 1, "trigger": {"op": 0, "at": "end"}, "before": 1},
                                    {"kind": "offload", "unit": 2, "trigger": {"op": 1, "at": "end"}, "before": 4, "moves": "act"},
                                    {"kind": "prefetch", "unit": 1, "trigger": {"op": 3, "at": "end"}},
                                    {"kind": "prefetch", "unit": 2, "trigger": {"op": 3, "at": "end"}, "moves": "act"}]})
    if d2h == 20.0:
        tl = simulate(ZERO, platform, named)
        assert tl.feasible and tl.makespan == 6.625 and tl.peak_memory == 160


def _zero_length_chain(seed: int) -> tuple[Chain, Platform]:
    import random

    rng = random.Random(seed)
    fwd = [rng.choice([0.0, 0.0, 1.0, 2.0]) for _ in range(3)]
    bwd = [rng.choice([0.0, 0.0, 1.0, 2.0]) for _ in range(3)]
    act = [rng.randint(0, 30) for _ in range(4)]
    saved = [a + rng.randint(0, 30) for a in act[1:]]
    chain = Chain(fwd=fwd, bwd=bwd, act=act, saved=saved, name=f"zero{seed}")
    top = keep_all_peak(chain)
    from chainoffload.bounds import offload_memory_floor

    floor = offload_memory_floor(chain)
    platform = Platform(memory=floor + (top - floor) * rng.choice([0, 1, 2]) // 4, bandwidth_d2h=rng.choice([10.0, 40.0]),
                        bandwidth_h2d=rng.choice([10.0, 40.0]), latency=rng.choice([0.0, 0.5]))
    return chain, platform


@pytest.mark.parametrize("seed", [s if s in (4, 5) else pytest.param(s, marks=pytest.mark.thorough(seconds=20)) for s in range(12)])
def test_cpsat_equals_brute_force_on_zero_length_ops(seed):
    """Random 3-stage chains where about half the ops take no time: CP-SAT's status and optimum
    are the brute force's (it said timeout where a schedule exists, or where none does)."""
    from chainoffload.exact import brute_force

    chain, platform = _zero_length_chain(seed)
    oracle = brute_force(chain, platform)
    exact = solve(chain, platform, "cpsat", time_limit=60, workers=1)
    assert exact.status == oracle.status, (exact.message, oracle.status)
    if oracle.status == Status.OPTIMAL:
        assert abs(exact.makespan - oracle.makespan) <= 3 * exact.info["tolerance"] + 1e-12 * chain.compute_time
        assert exact.lower_bound <= oracle.makespan + 1e-12
