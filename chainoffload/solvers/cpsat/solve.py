"""The method ``cpsat``: warm start, solve, replay in the simulator, report.

A thin driver over :class:`.model.CPModel`: it validates the options, picks the warm start,
states the proven lower bound, runs CP-SAT (re-solving on a perturbed time grid when the
simulator rejects a solution, NOTE [ cpsat: time scale ]), and turns each outcome into a
:class:`~chainoffload.result.Result` with a status and a message that say what happened.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..._progress import enabled as progress_enabled
from ..._progress import progress
from ...chain import Chain
from ...platform import Platform
from ...result import Result, Status
from ...schedule import Schedule
from ...simulate import simulate
from .._options import OptionError
from .grid import TimeGrid
from .hint import in_model_space
from .model import CPModel, import_cp_model, model_estimate

__all__ = ["cpsat", "default_workers"]

_RETRIES = 3

#: The most seconds the stated bound may take. The whole-unit relaxation's dual bound stops
#: moving once SCIP's root is done (measured on benchmarks/cpsat.py's chains: within 1 s at
#: L = 20-30 and 3 s at L = 40, the same value at 12 and 40 s), while every second spent on it
#: is a second less for CP-SAT's own search.
BOUND_SECONDS = 5.0

#: The share of ``time_limit`` ``best`` may take for the warm start (at most its own default,
#: 5 s + 0.5 ms per stage), so that a short limit is kept.
WARM_SHARE = 0.25


# NOTE [ cpsat: model size ]
# Building the model is Python work no time limit can cut, and it grows as L^2 in size and
# L^2.5 in time: measured (benchmarks/time_limits.py's instance, load 3.9 on the shared 2
# cores) 0.47 s at L = 30, 1.76 s at 50, 4.15 s at 70, 10.1 s at 100, with 12.1 L^2 variables
# and 43.7 L^2 constraints (0.31 GB more resident at L = 100; a colleague measured 1.7 GB at
# L = 200 and 6.4 GB still building after 400 s at L = 1000). So a model whose estimated build
# takes more than BUILD_SHARE of the time limit, or more memory than the machine has free, is
# refused before any work, with the estimate in the message.
BUILD_SHARE = 0.3


def _refusal(length: int, time_limit: float) -> str | None:
    """Why a model of ``length`` stages cannot be built within ``time_limit`` or in memory, or ``None``."""
    est = model_estimate(length)
    from ..._cost import free_bytes

    free = free_bytes()
    size = (f"a CP-SAT model of {length} stages would have ~{est['variables']:.3g} variables and "
            f"~{est['constraints']:.3g} constraints, ~{est['bytes'] / 1e9:.3g} GB, and take ~{est['seconds']:.3g} s to build here")
    if est["bytes"] > 0.8 * free:
        return f"{size}: more than the {free / 1e9:.3g} GB free"
    if est["seconds"] > BUILD_SHARE * time_limit:
        least = est["seconds"] / BUILD_SHARE
        return f"{size}: more than {BUILD_SHARE:.0%} of the time limit ({time_limit:g} s); give at least {least:.3g} s, or use best"
    return None


def default_workers() -> int:
    """The cores this process may run on (CP-SAT's default worker count here)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def _heuristic_schedules(chain: Chain, platform: Platform, keep: frozenset[int], time_limit: float) -> list[tuple[str, Schedule, float]]:
    """Feasible schedules of the baselines and of ``best`` (within ``time_limit``), for the warm start."""
    from .. import baselines
    from ..best import best, default_time_limit

    out = []
    for name, func in (("largest-first", baselines.largest_first), ("first-k", baselines.first_k), ("keep-all", baselines.keep_all)):
        res = func(chain, platform, keep=keep)
        if res.feasible:
            out.append((name, res.schedule, res.makespan))
    res = best(chain, platform, keep=keep, time_limit=max(0.01, min(default_time_limit(chain.length), time_limit)), cpsat_work=0)
    if res.feasible and res.schedule is not None:
        tl = simulate(chain, platform, res.schedule)
        if tl.feasible:
            out.append(("best", res.schedule, tl.makespan))
    return out


def _given_hints(hint: Any) -> list[Schedule]:
    if hint is True or hint is False or hint is None:
        return []
    if isinstance(hint, Schedule):
        return [hint]
    try:
        extra = list(hint)
    except TypeError:
        raise OptionError(f"hint: {hint!r} must be true, false, a Schedule or a list of schedules") from None
    if not all(isinstance(s, Schedule) for s in extra):
        raise OptionError("hint: every item must be a Schedule")
    return extra


def _warm_start(
    chain: Chain, platform: Platform, grid: TimeGrid, hint: Any, kept: frozenset[int], time_limit: float
) -> tuple[str, Schedule, float] | None:
    """The fastest feasible schedule among the hints and heuristics that lies in the model's space."""
    candidates: list[tuple[str, Schedule, float]] = []
    for idx, sched in enumerate(_given_hints(hint)):
        tl = simulate(chain, platform, sched)
        if tl.feasible and not kept & set(sched.offloaded_units):
            candidates.append((f"given[{idx}]", sched, tl.makespan))
    if hint is not False and hint is not None:
        candidates += _heuristic_schedules(chain, platform, kept, time_limit)
    best = None
    for name, sched, makespan in candidates:
        inside = in_model_space(chain, sched)
        if inside is None or (inside.transfers and not grid.can_transfer):
            continue
        if best is None or makespan < best[2]:
            best = (name, inside, makespan)
    return best


def _reporter(bar: Any, scale: float, t0: float):
    """CP-SAT's solution callback: the time spent, the objective and the bound on the progress bar."""

    def on_solution(cb) -> None:
        bar.set(time.perf_counter() - t0)
        bar.note(objective=f"{cb.objective_value / scale:.6g} s", bound=f"{cb.best_objective_bound / scale:.6g} s")

    return on_solution


def cpsat(
    chain: Chain,
    platform: Platform,
    *,
    time_limit: float = 60.0,
    workers: int | None = None,
    hint: bool | Schedule | Sequence[Schedule] = True,
    time_scale: float | None = None,
    keep: Iterable[int] = (),
    bound: bool = True,
) -> Result:
    """Solve the offloading problem exactly with a CP-SAT model of docs/model.md's rules.

    Parameters
    ----------
    chain, platform
        The instance (small chains: tens of stages).
    time_limit
        Seconds the whole call may take, warm start, bound and retries included: ``best``
        gets a quarter of it for the warm start (``WARM_SHARE``, at most its own default),
        the stated bound a fifth of what is left (at most 5 s), CP-SAT the rest. Through
        :func:`chainoffload.solve`, the limit of the whole solve (less the judging).
    workers
        CP-SAT search workers (threads); default: every core this process may use.
    hint
        ``True``: warm-start from the best feasible schedule of the baselines largest-first,
        first-k, keep-all and of ``best``. A :class:`Schedule` or a list of them: use these
        too (chainoffload.verify passes the schedule it checks). ``False``: no warm start.
    time_scale
        Integer time units per second; default puts the compute time at 10^6 units.
    keep
        Units (stages 1..L) that must stay resident: the model has no transfer for them, so
        ``optimal`` means optimal among the schedules that keep them (and a given hint that
        offloads one is ignored).
    bound
        State the proven lower bound of :func:`chainoffload.bounds.stronger_bound` in the
        model (computed within a fifth of ``time_limit``, at most 5 s: ``BOUND_SECONDS``), so
        that CP-SAT stops as soon as a
        solution reaches it.

    Returns
    -------
    Result
        Status and message by outcome:

        * ``optimal``: CP-SAT proved its schedule optimal for the integer model (gap below
          its rounding slack; the simulated makespan is within ``3 * info["tolerance"]``
          seconds of the optimum over the model's space, NOTE [ cpsat: time scale ]): every
          fixed-order schedule, each unit moved whole or as a_i alone, explicit waits on
          offloads (NOTE [ cpsat: expressible timings ]); or the warm start reaches a proven
          bound;
        * ``feasible``: the time limit came first; the schedule is CP-SAT's best or the warm
          start (``info["kept_hint"]``), the message says which and the gap;
        * ``infeasible``: CP-SAT proved that no schedule of the model's space fits, and there
          was no feasible warm start;
        * ``timeout``: no schedule within the time limit (CP-SAT found none, or the simulator
          rejected every one it found, and there was no warm start).

        ``lower_bound`` is the best proven bound: CP-SAT's (rescaled, less the rounding
        slack) or the one stated in the model. ``info`` holds ``time_scale``, ``tolerance``,
        ``objective_units``, ``bound_units``, ``cpsat_status``, ``workers``, ``wall_time``,
        ``hint`` (the warm start's source), ``retries`` and ``bound`` (what was stated).

    Raises
    ------
    OptionError
        Bad ``time_limit``, ``workers``, ``hint``, ``bound`` or ``time_scale``
        (a ``ValueError``; the message names it).
    ValueError
        Memory below the chain's stage floor, or ``keep`` names a unit that is not
        a stage.

    Notes
    -----
    The model: :mod:`chainoffload.solvers.cpsat.constraints` (NOTE [ cpsat: expressible
    timings ]); the time grid: :mod:`chainoffload.solvers.cpsat.grid` (NOTE [ cpsat: time scale ]).
    """
    from .._options import check_keep, check_memory_floor

    t0 = time.perf_counter()
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0 or math.isnan(time_limit):
        raise OptionError(f"time_limit: {time_limit!r} must be a number of seconds > 0")
    if workers is None:
        workers = default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers: {workers!r} must be an integer >= 1")
    if not isinstance(bound, bool):
        raise OptionError(f"bound: {bound!r} must be true or false")
    check_memory_floor(chain, platform)
    kept = check_keep(chain, keep)
    refused = _refusal(chain.length, float(time_limit))
    if refused is not None:  # NOTE [ cpsat: model size ]: before any work
        est = model_estimate(chain.length)
        return Result("cpsat", Status.TIMEOUT, None, runtime=time.perf_counter() - t0,
                      info={"refused": True, "model_estimate": est, "workers": workers},
                      message=f"cpsat: refused up front: {refused}")
    from ...bounds import offload_memory_floor

    floor = offload_memory_floor(chain)
    if floor > platform.memory:
        # Proven without a search: CP-SAT took its whole limit and said UNKNOWN on 2-stage
        # chains below this floor (issue 33: "timeout" where nothing fits).
        return Result("cpsat", Status.INFEASIBLE, None, runtime=time.perf_counter() - t0,
                      info={"workers": workers, "bound": "offload memory floor", "cpsat_status": "SKIPPED"},
                      message=f"cpsat: no schedule fits in {platform.memory} B: every offloading schedule needs at least "
                              f"{floor} B (the offload memory floor, proven)")
    import_cp_model()
    grid = TimeGrid.build(chain, platform, time_scale)
    _given_hints(hint)  # validate before any work
    deadline = t0 + float(time_limit)

    warm = _warm_start(chain, platform, grid, hint, kept, WARM_SHARE * float(time_limit))
    info: dict[str, Any] = {"hint": warm[0] if warm else None, "retries": 0, "workers": workers}
    proven = chain.compute_time
    info["bound"] = "compute time"
    if bound and (warm is None or warm[2] > proven * (1 + 1e-12)):
        from ...bounds import stronger_bound

        budget = min(BOUND_SECONDS, (deadline - time.perf_counter()) / 5)
        sb = stronger_bound(chain, platform, time_limit=max(0.05, budget))
        if sb.value > proven:
            proven, info["bound"] = sb.value, sb.kind
    if warm is not None and warm[2] <= proven * (1 + 1e-12):
        # The warm start already reaches a proven lower bound: nothing is left to prove.
        info.update(time_scale=grid.scale, tolerance=grid.slack / grid.scale, cpsat_status="SKIPPED", kept_hint=True,
                    objective_units=math.nan, bound_units=math.nan, wall_time=time.perf_counter() - t0)
        return Result("cpsat", Status.OPTIMAL, warm[1], makespan=warm[2], lower_bound=min(proven, warm[2]),
                      runtime=time.perf_counter() - t0, info=info,
                      message=f"cpsat: the warm start ({warm[0]}) reaches the proven lower bound ({info['bound']}); no search needed")
    if not math.isfinite(proven):
        # The bound proves that nothing fits (an infeasible relaxation).
        info.update(time_scale=grid.scale, tolerance=grid.slack / grid.scale, cpsat_status="SKIPPED",
                    objective_units=math.nan, bound_units=math.nan, wall_time=time.perf_counter() - t0)
        return Result("cpsat", Status.INFEASIBLE, None, runtime=time.perf_counter() - t0, info=info,
                      message=f"cpsat: no schedule fits in {platform.memory} B (proven by the {info['bound']})")

    found: tuple[Schedule, float] | None = None  # CP-SAT's schedule the simulator accepted
    rejected = 0
    status_name = "UNKNOWN"
    bound_units = objective_units = math.nan
    lb = math.nan
    last_hint = warm[1] if warm else None
    scale_used, tolerance = grid.scale, grid.slack / grid.scale
    # Progress (on a terminal, or with --progress): seconds of the limit, objective and bound.
    with progress("cpsat", total=round(float(time_limit), 1), unit="s") as bar:
        for attempt in range(_RETRIES + 1):
            if attempt and time.perf_counter() + model_estimate(chain.length)["seconds"] > deadline:
                break  # another model would not be built in time (NOTE [ cpsat: model size ])
            model = CPModel(chain, platform, grid, kept, lower_bound=proven)
            if last_hint is not None:
                model.hint(last_hint)
                info["hint_complete"] = model.complete_hint(min(5.0, max(0.05, (deadline - time.perf_counter()) / 4)))
            on_solution = _reporter(bar, grid.scale, t0) if progress_enabled() else None
            # A gap below the rounding slack R is below what the integer model can resolve.
            solver, status_name = model.solve(time_limit=deadline - time.perf_counter(), workers=workers,
                                              gap_units=grid.slack, on_solution=on_solution)
            if status_name == "MODEL_INVALID":  # pragma: no cover - a bug in this package
                raise RuntimeError(f"cpsat: CP-SAT rejects the model: {model.model.validate()}")
            info["retries"] = attempt
            scale_used, tolerance = grid.scale, grid.slack / grid.scale
            if status_name in ("OPTIMAL", "FEASIBLE", "UNKNOWN"):
                bound_units = float(solver.best_objective_bound)
                if math.isfinite(bound_units):
                    lb = (bound_units - grid.slack) / grid.scale
            if status_name not in ("OPTIMAL", "FEASIBLE"):
                break
            objective_units = float(solver.objective_value)
            schedule = model.schedule_from(solver)
            tl = simulate(chain, platform, schedule)
            if tl.feasible:
                found = (schedule, tl.makespan)
                break
            rejected += 1
            if time.perf_counter() >= deadline:
                break
            # NOTE [ cpsat: time scale ]: a coincidence in integers fell the other way in floats.
            last_hint = schedule
            wider = grid.scale * 1.6180339887
            grid = TimeGrid.build(chain, platform, wider if grid.fits(chain, platform, wider) else grid.scale / 1.6180339887)
        bar.set(time.perf_counter() - t0)
    info.update(time_scale=scale_used, tolerance=tolerance, objective_units=objective_units, bound_units=bound_units,
                cpsat_status=status_name, rejected=rejected, wall_time=time.perf_counter() - t0)
    return _outcome(chain, platform, status_name, found, warm, max(lb, proven) if math.isfinite(lb) else proven,
                    rejected, time_limit, info, time.perf_counter() - t0)


def _outcome(chain, platform, status_name, found, warm, lb, rejected, time_limit, info, runtime) -> Result:
    """One Result per outcome, with a message that says what happened."""
    limit = f"{time_limit:g} s"
    if status_name == "INFEASIBLE" and warm is None:
        return Result("cpsat", Status.INFEASIBLE, None, runtime=runtime, info=info,
                      message=f"cpsat: no schedule of the model's space fits in {platform.memory} B (proven)")
    candidates = []
    if found is not None:
        candidates.append(("cpsat", found[0], found[1]))
    if warm is not None:
        # A warm start may beat CP-SAT's schedule by rounding (at most 2 * tolerance): keep the better.
        candidates.append((warm[0], warm[1], warm[2]))
    if not candidates:
        # What ended the search, in the seconds it took: the message claimed the whole limit
        # ("within 19.98 s") after 0.4 s when the retries, not the clock, ran out (issue 33).
        spent = f"{runtime:.3g} s"
        if rejected and runtime < 0.95 * time_limit:
            why = (f"the simulator rejected each of the {rejected} schedule(s) CP-SAT found, on {info.get('retries', 0) + 1} "
                   f"time grid(s), in {spent} of the {limit} limit: CP-SAT's integer model and the simulator disagree on "
                   "this instance (a rounding coincidence, or ops that take no time), so nothing it found can be reported")
        elif rejected:
            why = f"the simulator rejected the {rejected} schedule(s) CP-SAT found before the {limit} limit ran out ({spent})"
        else:
            why = f"CP-SAT found none (status {status_name}) in {spent} of the {limit} limit"
        return Result("cpsat", Status.TIMEOUT, None, lower_bound=lb, runtime=runtime, info=info,
                      message=f"cpsat: no schedule found: {why}; there is no warm start")
    source, schedule, makespan = min(candidates, key=lambda c: c[2])
    info["kept_hint"] = source != "cpsat"
    lb = min(lb, makespan) if math.isfinite(lb) else lb
    gap = f"{100 * (makespan / lb - 1):.3g}% above the proven bound" if math.isfinite(lb) and lb > 0 else "no bound"
    if status_name == "OPTIMAL" and found is not None:
        return Result("cpsat", Status.OPTIMAL, schedule, makespan=makespan, lower_bound=lb, runtime=runtime, info=info)
    if status_name == "INFEASIBLE":
        message = (f"cpsat: CP-SAT's integer model has no solution, yet the warm start ({source}) fits in the "
                   "simulator: its integer times round the instance's, and two events fell the other way; kept the warm start, "
                   "optimality unproven")
    elif found is None and rejected:
        message = (f"cpsat: the simulator rejected the {rejected} schedule(s) CP-SAT found (its integer times round "
                   f"the instance's); kept the warm start ({source}), {gap}")
    elif found is None:
        message = f"cpsat: CP-SAT found no schedule within {limit}; kept the warm start ({source}), {gap}"
    else:
        message = f"cpsat: time limit {limit} reached; best schedule ({source}) {gap}"
    return Result("cpsat", Status.FEASIBLE, schedule, makespan=makespan, lower_bound=lb, runtime=runtime, info=info,
                  message=message)
