"""CP-SAT's proof that no schedule beats a target: the ``cpsat`` rung of the bound ladder.

NOTE [ cpsat bound rung ]
-------------------------
Where ``best`` stops above the ladder's bound, the bound was the weak side at the worst point
of issue 33: vgg19 at half memory, PCIe 3, had ``best`` at 1.5016 x the compute time and the
unit MILP's bound at 1.3124 x; ``cpsat`` with 300 s (one worker) proved 1.5016 optimal in 126 s
(benchmarks/results/best_optimum.md). CP-SAT with one worker and a small work budget hardly
moves its own dual bound from scratch (vgg19 there: 1.0001 x after 5 deterministic seconds with
no incumbent, 1.1279 x with ``linearization_level`` 2), but given a target it proves quickly
that *no schedule is shorter*: 1.5 deterministic seconds there. So this rung takes the ladder's
``target`` (the makespan of the schedule the caller holds) and the ladder's bound so far, and
solves the exact model (:class:`chainoffload.solvers.cpsat.model.CPModel`, the space ``cpsat``'s
``optimal`` ranges over) restricted to solutions that end before the target:

* the integer model gets ``makespan <= U`` with ``U = ceil(target * scale - R) - 1`` (R the
  grid's rounding slack, NOTE [ cpsat: time scale ]), the ladder's bound stated as
  ``makespan >= floor(bound * scale - R)``, and minimises the makespan;
* ``INFEASIBLE`` proves every integer solution ends at ``U + 1`` or later, so every schedule the
  simulator accepts ends at ``(U + 1 - R) / scale`` or later (at most 2 R / scale below the
  target: ``cpsat``'s own ``optimal`` is within 3 R / scale, :func:`proves_optimal`);
* otherwise a shorter solution exists (the target is not optimal: ``best`` stopped above the
  optimum, as at resnet50 and inception_v3 at half memory), and the value is CP-SAT's proven
  ``best_objective_bound`` less R, over the whole model's space (a solution ending at U or
  later is no better than the one found), when it has stopped: optimal, or the work ran out
  (``"work limit"``, the value is what it had proven then). The caveat of NOTE [ cpsat: time
  scale ] applies as to every CP-SAT bound here.

**Its schedule.** A solution found under the cap is a schedule shorter than the target, so it is
not thrown away (inception_v3 at half memory, PCIe 4 and 3: CP-SAT found and proved one ~0.06 %
shorter than ``best``'s). It is replayed by the simulator through the one path every CP-SAT
solution ``best`` takes goes through (``CPModel.checked``), and :class:`CpsatBound` carries it
(``schedule``, its simulated ``makespan``, ``optimal`` when CP-SAT proved it: status
``"OPTIMAL"`` and within 3 R / scale of its objective, as ``cpsat``'s ``optimal``). The ladder
still returns bounds only: the rung hands the whole answer to a :func:`found_schedules` block
(a context variable, seen only by the caller that opened it), and ``best`` opens one around its
climb and returns the schedule (``info["improved_by"]`` ``"cpsat rung"``), ``optimal`` with
that bound when CP-SAT proved it. The search that finds it is the same deterministic one, so
the same work limit still gives the same schedule.

**Work, not time.** One worker (``num_workers = 1``: CP-SAT's sequential loop), a fixed
``random_seed`` and ``max_deterministic_time``, CP-SAT's own count of work done
(:data:`CPSAT_BOUND_WORK` by default; ``best`` gives it its own ``cpsat_work``, 2 by default), so the same instance and target give the same answer on any machine and at any
load (checked by tests/test_cpsat_bound.py; CP-SAT documents the limit, not the determinism
of its single-worker search, so the test is what holds it). A caller's time limit also caps
it as a wall-clock limit (then the answer may depend on the machine and the note says it
stopped early); without one a guard of :data:`GUARD_SECONDS` stands. A Ctrl-C stops the
search through CP-SAT's API (``chainoffload/_interrupt.py``) and is raised, never read as a
"no": the value never depends on when a signal came.

**Where it runs.** Not in the default ladder: building the model and the search cost seconds
(vgg19 above: 1.6 deterministic s, ~7 s of CPU on the shared 2 cores) on chains whose ladder
costs ~1 s, and ``solve``, ``plot`` and ``verify`` climb that ladder on the README's main job,
whose cold run must stay under 15 s (benchmarks/results/cold_start.md: 13.05 s). It is the
rung of :data:`chainoffload.bounds.ladder.STRONGER`, climbed with ``stronger=True``, on chains
of at most :data:`CPSAT_BOUND_MAX_STAGES` stages (the model grows as L^2): by ``best`` when its
exact improver leaves a gap (NOTE [ large neighbourhood search ]; ``best`` skips the improver
within ``LNS_GAP`` of the ladder's bound unless the bound leaves more than ``STALL_SHARE`` of the
stall open, NOTE [ exact improver's gap ]; the README's main job is skipped, and the rung with it),
and by ``benchmarks/best_optimum.py --stronger``. ``cpsat`` does not climb it: it has no
target before its search, and its search proves the same thing with the whole time limit.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import time
from collections.abc import Iterator

from ..chain import Chain
from ..platform import Platform
from ..schedule import Schedule

__all__ = ["CPSAT_BOUND_MAX_STAGES", "CPSAT_BOUND_WORK", "GUARD_SECONDS", "SEED", "CpsatBound", "cpsat_bound",
           "cpsat_bound_seconds", "found_schedules", "proves_optimal"]

#: Longest chain the rung runs on (the same as ``best``'s whole-chain CP-SAT solve).
CPSAT_BOUND_MAX_STAGES = 24

#: CP-SAT's deterministic seconds per proof.
CPSAT_BOUND_WORK = 5.0

#: The seed of CP-SAT's own randomness.
SEED = 0

#: Wall seconds of one proof without a caller's time limit: a guard that should never fire.
GUARD_SECONDS = 600.0

#: CPU seconds per deterministic second of CP-SAT on this model, for the rung's estimate
#: (measured on the shared 2-core machine: vgg19 at half memory, 1.53 deterministic s in 7.1 s
#: of CPU; resnet50 5.54 in 23.4 s; inception_v3 1.25 in 4.3 s; wall 4-6 x that at load 5-11).
SECONDS_PER_WORK = 4.5


@dataclasses.dataclass(frozen=True)
class CpsatBound:
    """What :func:`cpsat_bound` proved.

    Attributes
    ----------
    value
        Seconds: a proven lower bound on every schedule's makespan (``-inf``: nothing proven).
    status
        ``"proven"`` (no schedule ends before the target, less 2 R / scale), ``"beaten"``
        (CP-SAT found a solution ending before the target and proved the model's optimum:
        ``value``), ``"work limit"`` (its deterministic work ran out first; ``value`` is what it
        had proven), ``"time limit"`` (the caller's wall-clock limit came first) or ``"guard"``.
    work
        Deterministic seconds CP-SAT used.
    tolerance
        R / scale, seconds (NOTE [ cpsat: time scale ]).
    schedule, makespan
        The shortest solution CP-SAT found under the cap, replayed by the simulator, and its
        simulated makespan; ``None`` and ``inf`` when it found none (always with ``"proven"``)
        or the simulator rejected it (NOTE [ cpsat bound rung ], its schedule).
    optimal
        CP-SAT proved ``schedule`` optimal over the model's space (``"beaten"``, within its
        rounding slack, as ``cpsat``'s ``optimal``).
    """

    value: float
    status: str
    work: float
    tolerance: float
    schedule: Schedule | None = None
    makespan: float = math.inf
    optimal: bool = False


def cpsat_bound_seconds(chain: Chain, work: float = CPSAT_BOUND_WORK) -> float:
    """Estimated wall seconds of one :func:`cpsat_bound` call: building the model and ``work``."""
    from ..solvers.cpsat.model import model_estimate

    return model_estimate(chain.length)["seconds"] + SECONDS_PER_WORK * work


def cpsat_bound(
    chain: Chain,
    platform: Platform,
    target: float,
    *,
    floor: float | None = None,
    work: float = CPSAT_BOUND_WORK,
    time_limit: float | None = None,
) -> CpsatBound:
    """Prove with CP-SAT that no schedule ends before ``target`` (NOTE [ cpsat bound rung ]).

    Parameters
    ----------
    chain, platform
        The instance.
    target
        Seconds: the makespan to prove optimal (a schedule's; must be finite).
    floor
        A proven lower bound (seconds) to state in the model, or ``None``.
    work
        CP-SAT's deterministic seconds (> 0).
    time_limit
        Wall seconds (``None``: the work alone stops it, under :data:`GUARD_SECONDS`).

    Returns
    -------
    CpsatBound
        ``value`` within ``2 R / scale`` below ``target`` when proven; else what CP-SAT proved
        (``-inf`` when nothing).

    Raises
    ------
    ValueError
        If ``target`` is not finite and positive or ``work`` is not a number > 0.
    KeyboardInterrupt
        On Ctrl-C (the search is stopped through CP-SAT's API first).
    """
    from .._interrupt import run_stoppable
    from ..solvers.cpsat.grid import TimeGrid
    from ..solvers.cpsat.model import CPModel

    if not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise ValueError(f"target: {target!r} must be a finite number of seconds > 0")
    if isinstance(work, bool) or not isinstance(work, (int, float)) or not (0 < work < math.inf):
        raise ValueError(f"work: {work!r} must be a number of deterministic seconds > 0")
    t0 = time.perf_counter()
    grid = TimeGrid.build(chain, platform)
    model = CPModel(chain, platform, grid, lower_bound=floor)
    top = math.ceil(target * grid.scale - grid.slack) - 1
    md = model.model
    md.add(model.objective.makespan <= top)
    cp_model = model.cp_model
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = 1
    p.random_seed = SEED
    p.max_deterministic_time = float(work)
    p.absolute_gap_limit = max(1.0, float(grid.slack))  # below R the integer model resolves nothing
    wall = GUARD_SECONDS if time_limit is None else float(time_limit) - (time.perf_counter() - t0)
    p.max_time_in_seconds = max(1e-3, wall)
    # SIGINT stays Python's; a Ctrl-C ends the search through stop_search (chainoffload/_interrupt.py).
    p.catch_sigint_signal = False
    code = run_stoppable(lambda: solver.solve(md), solver.stop_search)
    from .._interrupt import interrupted

    if interrupted():
        # stop_all() ended the search (the command line's Ctrl-C): its answer depends on the
        # moment of the signal, so it is never used (NOTE [ cpsat bound rung ]).
        raise KeyboardInterrupt
    status = solver.status_name(code)
    used = float(solver.deterministic_time)
    tolerance = grid.slack / grid.scale
    if status == "INFEASIBLE":
        return CpsatBound(min(target, (top + 1 - grid.slack) / grid.scale), "proven", used, tolerance)
    units = float(solver.best_objective_bound) if status in ("OPTIMAL", "FEASIBLE", "UNKNOWN") else -math.inf
    value = min(target, (units - grid.slack) / grid.scale) if math.isfinite(units) else -math.inf
    found: dict = {}
    if status in ("OPTIMAL", "FEASIBLE"):
        # The schedule under the cap, through the one path every CP-SAT solution best takes
        # goes through (CPModel.checked: replayed by the simulator, or not taken).
        got = model.checked(solver)
        if got is not None:
            optimal = status == "OPTIMAL" and got[1] <= (float(solver.objective_value) + 3 * grid.slack) / grid.scale
            found = {"schedule": got[0], "makespan": got[1], "optimal": optimal}
            value = min(value, got[1])
    if status == "OPTIMAL":
        return CpsatBound(value, "beaten", used, tolerance, **found)
    if used < 0.99 * work:
        return CpsatBound(value, "guard" if time_limit is None else "time limit", used, tolerance, **found)
    return CpsatBound(value, "work limit", used, tolerance, **found)


# The side channel of found_schedules(): None outside it.
_FOUND: contextvars.ContextVar[list[CpsatBound] | None] = contextvars.ContextVar("cpsat_bound_found", default=None)


@contextlib.contextmanager
def found_schedules() -> Iterator[list[CpsatBound]]:
    """Collect what the ladder's ``cpsat`` rung finds while this block runs (NOTE [ cpsat bound
    rung ], its schedule).

    The ladder (:func:`chainoffload.bounds.problem_bound`, :func:`chainoffload.bounds.ladder.climb`)
    returns bounds only; inside this block, each climb of the rung whose search found a schedule
    under the target appends its :class:`CpsatBound` (schedule included) to the list yielded.
    ``best`` uses it to return that schedule. The channel is a context variable: other threads
    and callers outside the block see nothing.
    """
    box: list[CpsatBound] = []
    token = _FOUND.set(box)
    try:
        yield box
    finally:
        _FOUND.reset(token)


def _report(got: CpsatBound) -> None:
    """Hand ``got`` to the enclosing :func:`found_schedules` block, if any and if it holds a schedule."""
    box = _FOUND.get()
    if box is not None and got.schedule is not None:
        box.append(got)


def proves_optimal(got: CpsatBound, makespan: float) -> bool:
    """Whether ``got`` proves a schedule of ``makespan`` optimal as ``cpsat`` does (within 3 R / scale)."""
    return got.status == "proven" and got.value >= makespan - 3 * got.tolerance
