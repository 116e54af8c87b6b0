"""The CP-SAT method: its timings are the simulator's, its bound is sound, its options checked."""

import math

import pytest
from ortools.sat.python import cp_model

from chainoffload import Platform, Schedule, Status, Transfer, keep_all_peak, simulate, solve
from chainoffload.generators import random_chain
from chainoffload.solvers.cpsat import TimeGrid, _Model, cpsat, in_model_space, integer_replay


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
    model = _Model(chain, platform, grid)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = 10.0
    solver.parameters.num_search_workers = 2
    status = solver.solve(model.model)
    assert solver.status_name(status) in ("OPTIMAL", "FEASIBLE")
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


def test_timeout_without_schedule_reports_no_schedule():
    chain, platform = instance(2, 24, frac=0.3, ratio=0.1)
    res = cpsat(chain, platform, time_limit=0.01, hint=False, workers=1)
    assert res.status in (Status.TIMEOUT, Status.FEASIBLE, Status.OPTIMAL, Status.INFEASIBLE)
    if res.status == Status.TIMEOUT:
        assert res.schedule is None and "no schedule found" in res.message


def test_progress_goes_to_stderr(chain3, capsys):
    solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", time_limit=5.0, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "cpsat: done, status OPTIMAL" in captured.err
    assert "objective=" in captured.err and "bound=" in captured.err


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
        ({"progress": "yes"}, r"progress: 'yes' must be"),
    ],
)
def test_bad_options_name_the_field(chain3, options, match):
    with pytest.raises(ValueError, match=match):
        solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", **options)


def test_unknown_option_is_rejected(chain3):
    with pytest.raises(ValueError, match=r"does not take slots"):
        solve(chain3, Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0), "cpsat", slots=4)
