"""``best``'s exact improver: CP-SAT on windows of stages and on the whole chain.

NOTE [ large neighbourhood search ]
-----------------------------------
The local search of ``best`` (NOTE [ local improvement ] in ``best.py``) stops at a schedule
that no single move improves, and on the networks people run that is often 5-17 % above the
optimum CP-SAT proves (vgg16 at 25 % of the way from the offload floor to the keep-all peak,
PCIe 4: 134.809 ms against 118.578 ms): the better schedules change several units *and* their
triggers at once. This module improves that incumbent with the exact model of
:mod:`chainoffload.solvers.cpsat` (the same rules, the same schedules), in two steps:

1. **Windows** (large neighbourhood search). The model of the whole chain is built once. A
   window is a run of ``WINDOW_STAGES`` consecutive stages; every unit outside it keeps what
   the incumbent decided (offloaded or not, what it moves, the trigger event of its offload
   and of its prefetch: their variables are fixed), and CP-SAT re-solves the units inside it
   exactly (their choice, what they move, their triggers and waits, and every time and channel
   order), starting from the incumbent (a complete solution hint). A window whose solution the
   simulator scores strictly better becomes the incumbent. Windows slide by half their width
   from an offset drawn from a generator seeded with ``SEED``; the sweeps stop after one
   without an improvement, or when the work budget is spent.
2. **The whole chain.** On chains of at most ``WHOLE_MAX_STAGES`` stages, CP-SAT then solves
   the whole model from the incumbent with the work left: it may prove the schedule optimal,
   and the bound it has proven when it stops is a lower bound on every schedule of the model's
   space (every fixed-order schedule, each unit kept, moved whole or as a_i alone: the space
   ``cpsat``'s ``optimal`` ranges over), which ``best`` reports when it is the stronger.

**Work, not time.** Every CP-SAT call runs single-threaded (``num_workers = 1``) with a fixed
``random_seed`` and stops at a *deterministic* time (``max_deterministic_time``, CP-SAT's own
count of the work done), so the same instance gives the same schedule on any machine and at
any load, as the rest of ``best`` does (NOTE [ best's work budget ]). The budget is
``work`` deterministic seconds in all (:data:`CPSAT_WORK` by default), each window at most
:data:`WINDOW_WORK`. A caller's wall-clock ``deadline`` (``best``'s ``time_limit``) caps it as
well; only then may the result depend on the machine. Without one a guard of
:data:`GUARD_SECONDS` of wall time per call stands in case CP-SAT's count of work and the
clock part ways; should it fire, ``info["guard"]`` says so.

Chains longer than :data:`WINDOW_MAX_STAGES` (24, the same as ``WHOLE_MAX_STAGES``: windows alone
were measured to gain nothing on longer chains, see its comment) are left to the local search: the model has
~12 L^2 variables and ~44 L^2 constraints (NOTE [ cpsat: model size ]), whose building alone
(seconds at L = 100) no work limit can cut.

Every schedule this returns has been replayed by the simulator; its makespan is the
simulator's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from .._interrupt import run_stoppable
from ..chain import Chain
from ..platform import Platform
from ..schedule import Schedule

__all__ = [
    "CPSAT_WORK",
    "GUARD_SECONDS",
    "SEED",
    "WHOLE_MAX_STAGES",
    "WINDOW_MAX_STAGES",
    "WINDOW_STAGES",
    "WINDOW_WORK",
    "Improvement",
    "default_work",
    "find",
    "improve",
]

#: CP-SAT's deterministic seconds ``best`` may spend by default, windows and whole chain together
#: (vgg16, inception_v3, vgg19 and resnet18 at the points of issue 33 reach their proven optima
#: with 1.25, 1.82, 1.12 and 0.25 of them). The environment variable ``CHAINOFFLOAD_CPSAT_WORK``
#: replaces it (:func:`default_work`).
CPSAT_WORK = 2.0
#: The most deterministic seconds one window may take.
WINDOW_WORK = 0.5
#: Stages per window.
WINDOW_STAGES = 6
#: Longest chain solved whole after the windows.
WHOLE_MAX_STAGES = 24
#: Longest chain whose model is built at all. Windows alone (chains longer than
#: WHOLE_MAX_STAGES) found nothing on the shipped 34-52-stage networks: 24 points (densenet121,
#: resnet101, gpt2_48, resnet152 at 25/50/75 % on PCIe 3 and 4, benchmarks/results/best_optimum.md),
#: where the 5 that ran windows spent 10-226 s of wall time for the same schedule. Until a better
#: neighbourhood earns its work there, the model is built only where the whole chain is solved.
WINDOW_MAX_STAGES = 24
#: The seed of the window offsets and of CP-SAT's own randomness.
SEED = 0
#: Wall seconds per CP-SAT call without a deadline: a guard that should never fire.
GUARD_SECONDS = 600.0

_EPS = 1e-12


def default_work() -> float:
    """``best``'s default CP-SAT work: ``CHAINOFFLOAD_CPSAT_WORK`` when set (deterministic
    seconds >= 0; 0 turns the exact improver off), else :data:`CPSAT_WORK`.

    Raises
    ------
    ValueError
        If the variable is set to anything but a finite number >= 0 (the message names it).
    """
    import os

    text = os.environ.get("CHAINOFFLOAD_CPSAT_WORK")
    if text is None or text.strip() == "":
        return CPSAT_WORK
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise ValueError(f"CHAINOFFLOAD_CPSAT_WORK: {text!r} must be a number of deterministic seconds >= 0")
    return value


@dataclasses.dataclass(frozen=True)
class Improvement:
    """What :func:`improve` found.

    Attributes
    ----------
    schedule, makespan
        The best schedule (the incumbent when nothing better was found) and its simulated makespan;
        ``None`` and ``inf`` only from :func:`find`, when CP-SAT proved that nothing fits.
    lower_bound
        A lower bound CP-SAT proved for every schedule of the model's space (seconds, less the
        rounding slack of NOTE [ cpsat: time scale ]); ``-inf`` when no whole solve ran.
    optimal
        CP-SAT proved ``schedule`` optimal over the model's space (within its rounding slack).
    info
        ``mode`` (``skipped``, ``windows``, ``windows+whole``), ``work`` (deterministic
        seconds spent), ``windows`` (solved), ``improved`` (windows that improved), ``whole``
        (CP-SAT's status of the whole solve, if any), ``why`` (when skipped), ``guard`` (when
        a guard or the deadline stopped a call).
    """

    schedule: Schedule | None
    makespan: float
    lower_bound: float
    optimal: bool
    info: dict


def _cp_model():
    from ortools.sat.python import cp_model

    return cp_model


class _Runner:
    """CP-SAT calls on one model, charged to one budget of deterministic seconds."""

    def __init__(self, work: float, deadline: float) -> None:
        self.left = float(work)
        self.spent = 0.0
        self.deadline = deadline
        self.stopped: str | None = None

    def wall(self) -> float:
        if math.isfinite(self.deadline):
            return self.deadline - time.perf_counter()
        return GUARD_SECONDS

    def solve(self, proto_model, work: float, gap_units: float = 1.0, fix_hint: bool = False):
        """Solve ``proto_model`` within ``work`` deterministic seconds; ``(solver, status name)``."""
        cp_model = _cp_model()
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.num_workers = 1
        p.random_seed = SEED
        p.max_deterministic_time = max(1e-3, float(work))
        p.max_time_in_seconds = max(1e-3, self.wall())
        p.absolute_gap_limit = max(1.0, float(gap_units))
        # Presolve probing and symmetry detection cost more CPU than they save on these models
        # (resnet18 at 50 %: 12.7 s of CPU for the windows and the whole solve with them, 5.0 s
        # without, the same schedule); the LP relaxation at level 0 as well (vgg16 at 25 %: 23.4 s
        # to the proven optimum at level 1, 14.9 s at 0; load ~7 on 2 cores).
        p.cp_model_probing_level = 0
        p.symmetry_level = 0
        p.linearization_level = 0
        if fix_hint:
            p.fix_variables_to_their_hinted_value = True
        # CP-SAT's own SIGINT handler aborts the process on Ctrl-C and stays installed after the
        # solve: SIGINT stays Python's, and the search is stopped through its API.
        p.catch_sigint_signal = False
        status = solver.status_name(run_stoppable(lambda: solver.solve(proto_model), solver.stop_search))
        used = float(solver.deterministic_time)
        self.spent += used
        self.left -= used
        if status in ("FEASIBLE", "UNKNOWN") and used < 0.99 * p.max_deterministic_time:
            # Stopped by the clock, not by the work: the figure may depend on the machine.
            self.stopped = "deadline" if math.isfinite(self.deadline) else "guard"
        return solver, status


def _values(solver, model) -> list[int]:
    return [int(solver.value(model.get_int_var_from_proto_index(i))) for i in range(len(model.proto.variables))]


def _set_hint(model, values: list[int]) -> None:
    model.clear_hints()
    for i, val in enumerate(values):
        model.add_hint(model.get_int_var_from_proto_index(i), val)


def _window_vars(variables, lo: int, hi: int) -> list[int]:
    """Proto indices of the decisions of the units outside stages ``lo..hi``: which, what, when."""
    out = []
    for u, unit in variables.units.items():
        if lo <= u <= hi:
            continue
        lits = [unit.offloaded, unit.offload.event, unit.prefetch.event]
        if unit.alone is not None:
            lits += [unit.alone, unit.whole]
        out += [lit.index for lit in lits]
    return out


def improve(
    chain: Chain,
    platform: Platform,
    schedule: Schedule,
    makespan: float,
    *,
    work: float = CPSAT_WORK,
    keep: frozenset[int] = frozenset(),
    lower_bound: float | None = None,
    deadline: float = math.inf,
    windows: bool = True,
) -> Improvement:
    """Improve a feasible fixed-order ``schedule`` with CP-SAT (NOTE [ large neighbourhood search ]).

    Parameters
    ----------
    chain, platform
        The instance.
    schedule, makespan
        The incumbent (feasible in the simulator) and its simulated makespan.
    work
        Deterministic seconds of CP-SAT in all (> 0).
    keep
        Units that must stay resident.
    lower_bound
        A proven bound (seconds) to state in the model, so that a solve stops once it is reached.
    deadline
        ``time.perf_counter()`` value past which no CP-SAT call runs (``inf``: none; the calls
        then stop by work alone).
    windows
        Run step 1 (false: the whole-chain step alone, NOTE [ exact improver's gap ] in
        ``best.py``).

    Returns
    -------
    Improvement
        The incumbent or a strictly better schedule, never one the simulator rejects.
    """
    from .cpsat.grid import TimeGrid
    from .cpsat.hint import in_model_space
    from .cpsat.model import CPModel, model_estimate

    if not (isinstance(work, (int, float)) and not isinstance(work, bool) and work > 0 and math.isfinite(work)):
        raise ValueError(f"work: {work!r} must be a number of deterministic seconds > 0")
    same = Improvement(schedule, makespan, -math.inf, False, {"mode": "skipped", "work": 0.0, "windows": 0, "improved": 0})
    length = chain.length
    if length > WINDOW_MAX_STAGES:
        return dataclasses.replace(same, info={**same.info, "why": f"longer than {WINDOW_MAX_STAGES} stages"})
    if lower_bound is not None and makespan <= lower_bound * (1 + _EPS):
        return dataclasses.replace(same, info={**same.info, "why": "at a proven bound"})
    if math.isfinite(deadline) and time.perf_counter() + 2 * model_estimate(length)["seconds"] > deadline:
        return dataclasses.replace(same, info={**same.info, "why": "the model would not be built in time"})
    inside = in_model_space(chain, schedule)
    if inside is None:
        return dataclasses.replace(same, info={**same.info, "why": "the schedule is outside the model's space"})
    try:
        grid = TimeGrid.build(chain, platform)
    except ValueError as exc:  # a time grid CP-SAT cannot hold: the local search's answer stands
        return dataclasses.replace(same, info={**same.info, "why": " ".join(str(exc).split())})
    if not grid.can_transfer:
        return dataclasses.replace(same, info={**same.info, "why": "no transfer is possible"})
    model = CPModel(chain, platform, grid, keep, lower_bound=lower_bound)
    md = model.model
    model.hint(inside)
    runner = _Runner(work, deadline)
    # Complete the hint (CP-SAT drops an incomplete one it cannot repair cheaply).
    solver, status = runner.solve(md, min(WINDOW_WORK, runner.left), fix_hint=True)
    if status not in ("OPTIMAL", "FEASIBLE"):
        return dataclasses.replace(same, info={**same.info, "work": runner.spent, "why": f"the hint was not completed ({status})"})
    hint = _values(solver, md)
    _set_hint(md, hint)
    best_sched, best_span = schedule, makespan
    info: dict[str, Any] = {"mode": "windows", "windows": 0, "improved": 0}

    def accept(solver) -> bool:
        nonlocal best_sched, best_span, hint
        got = model.checked(solver)
        if got is not None and got[1] < best_span * (1 - _EPS):
            best_sched, best_span = got
            hint = _values(solver, md)
            _set_hint(md, hint)
            return True
        return False

    rng = np.random.default_rng(SEED)
    width = min(WINDOW_STAGES, length)
    stride = max(1, width // 2)
    windows_ok = windows and length > width  # a window as long as the chain is the whole solve below
    while windows_ok and runner.left > 0 and runner.stopped is None:
        offset = int(rng.integers(0, stride))
        starts = list(range(1 - offset, length, stride))
        improved = False
        for lo in starts:
            if runner.left <= 0 or runner.stopped is not None:
                break
            hi = lo + width - 1
            sub = md.clone()
            for idx in _window_vars(model.variables, lo, hi):
                domain = sub.proto.variables[idx].domain
                domain.clear()
                domain.extend([hint[idx], hint[idx]])
            solver, status = runner.solve(sub, min(WINDOW_WORK, runner.left), gap_units=grid.slack)
            info["windows"] += 1
            if status in ("OPTIMAL", "FEASIBLE") and accept(solver):
                info["improved"] += 1
                improved = True
        if not improved:
            break
    lb, optimal = -math.inf, False
    if length <= WHOLE_MAX_STAGES and runner.left > 0 and runner.stopped is None:
        info["mode"] = "windows+whole" if info["windows"] else "whole"
        solver, status = runner.solve(md, runner.left, gap_units=grid.slack)
        info["whole"] = status
        if status in ("OPTIMAL", "FEASIBLE", "UNKNOWN"):
            bound_units = float(solver.best_objective_bound)
            if math.isfinite(bound_units):
                lb = (bound_units - grid.slack) / grid.scale
        if status in ("OPTIMAL", "FEASIBLE"):
            accept(solver)
        if status == "INFEASIBLE":
            # The model has no solution below the stated bound or the hint: nothing to add.
            info["whole"] = "INFEASIBLE"
        # Proven only when the schedule kept is CP-SAT's optimum up to the rounding slack (R units
        # either way, NOTE [ cpsat: time scale ]): the simulator may reject CP-SAT's own schedule
        # (a coincidence in integers), and the incumbent kept then need not be optimal.
        optimal = status == "OPTIMAL" and best_span <= (float(solver.objective_value) + 3 * grid.slack) / grid.scale
        if math.isfinite(lb):
            lb = min(lb, best_span)
    info["work"] = runner.spent
    if runner.stopped is not None:
        info["guard"] = runner.stopped
    return Improvement(best_sched, best_span, lb, optimal, info)


def find(
    chain: Chain,
    platform: Platform,
    *,
    work: float = CPSAT_WORK,
    keep: frozenset[int] = frozenset(),
    deadline: float = math.inf,
) -> Improvement | None:
    """A schedule for a chain on which ``best``'s search found none: CP-SAT on the whole model.

    The planner's fixed rules can miss every schedule that fits (issue 33: with zero-length ops,
    the only schedules may hinge on a copy queued so that it starts just after one instant);
    on chains of at most ``WHOLE_MAX_STAGES`` stages CP-SAT searches the model's whole space
    with ``work`` deterministic seconds, one worker and a fixed seed, so the answer is the same
    on any machine. Below the offload memory floor nothing is searched (nothing fits, proven).

    Returns
    -------
    Improvement or None
        The schedule CP-SAT found, replayed by the simulator (``optimal`` when CP-SAT proved
        it, ``lower_bound`` its proven bound); with ``info["whole"]`` ``"INFEASIBLE"`` and no
        schedule when CP-SAT proved that none fits (``schedule`` ``None``); ``None`` when it
        was not run or found nothing within its work.
    """
    from ..bounds import offload_memory_floor
    from .cpsat.grid import TimeGrid
    from .cpsat.model import CPModel, model_estimate

    if not (isinstance(work, (int, float)) and not isinstance(work, bool) and work > 0 and math.isfinite(work)):
        raise ValueError(f"work: {work!r} must be a number of deterministic seconds > 0")
    length = chain.length
    if length > WHOLE_MAX_STAGES or offload_memory_floor(chain) > platform.memory:
        return None
    if math.isfinite(deadline) and time.perf_counter() + 2 * model_estimate(length)["seconds"] > deadline:
        return None
    try:
        grid = TimeGrid.build(chain, platform)
    except ValueError:  # a time grid CP-SAT cannot hold: the local search's answer stands
        return None
    model = CPModel(chain, platform, grid, keep)
    runner = _Runner(work, deadline)
    solver, status = runner.solve(model.model, runner.left, gap_units=grid.slack)
    info: dict[str, Any] = {"mode": "find", "work": runner.spent, "whole": status}
    if runner.stopped is not None:
        info["guard"] = runner.stopped
    if status == "INFEASIBLE":
        return Improvement(None, math.inf, math.inf, False, info)
    if status not in ("OPTIMAL", "FEASIBLE"):
        return None
    got = model.checked(solver)
    if got is None:  # a coincidence in integers (NOTE [ cpsat: time scale ]): not taken
        return None
    cand, span = got
    lb = -math.inf
    bound_units = float(solver.best_objective_bound)
    if math.isfinite(bound_units):
        lb = min((bound_units - grid.slack) / grid.scale, span)
    optimal = status == "OPTIMAL" and span <= (float(solver.objective_value) + 3 * grid.slack) / grid.scale
    return Improvement(cand, span, lb, optimal, info)
