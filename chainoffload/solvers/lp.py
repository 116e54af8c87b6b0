"""Method ``lp``: the fluid LP relaxation, rounded into whole units and planned.

The LP of :mod:`chainoffload.bounds` gives a proven lower bound on the makespan and a
fractional plan ``x`` (how much of each unit it offloads). This module turns ``x`` into whole
offload sets, plans each with the shared transfer planner, replays it in the simulator and keeps
the best schedule that fits (``NOTE [ rounding the fluid LP ]``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Sequence

import numpy as np

from ..bounds import LP_SOLVERS, FluidLP, fluid_lp
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ._options import OptionError
from ._search import Evaluator

__all__ = ["lp", "DEFAULT_ROUNDINGS"]

#: Default cap on the offload sets ``lp`` plans and simulates.
DEFAULT_ROUNDINGS = 64

# x above this counts as "offloaded a little" (GLOP returns exact zeros, PDLP near-zeros).
_EPS = 1e-6

# NOTE [ rounding the fluid LP ]
# -------------------------------
# The LP offloads unit i by a fraction x_i. Whole offload sets are drawn from x in this order,
# each planned by ``plan_transfers`` and judged by the simulator, within a budget of
# ``roundings`` plans (a set seen before costs nothing):
#  1. nothing (keep-all): when it fits, no offload beats it;
#  2. threshold sweep: {i : x_i >= t} for t in a fixed grid (1, 0.9, 0.75, 0.5, 0.25, 0.1, eps)
#     and then for every distinct value of x (spread evenly when there are too many);
#  3. greedy by fraction: units ordered by x (then by saved size, larger first); the shortest
#     prefix of that order that fits, found by bisection (whether a set fits is close to
#     monotone in its size: offloading more frees more), then the next two prefixes (their
#     makespan may be lower when the planner hides the extra transfers); while nothing fits
#     yet and the whole order does not, shorter prefixes are tried first, longest first
#     (NOTE [ prefixes that fit below one that does not ] in ``_search``);
#  4. the same along the LP's support ordered by saved size (largest first), then the rest;
#  5. orders that do not follow x, by bisection as in 3: smallest units first, last stages
#     first, first stages first (first-k);
#  6. improvement: drop units one at a time from the best set (least x first) while it stays
#     feasible and gets faster;
#  7. repair, when nothing fits yet: largest-first, and all units 1..L-1 (offload-all).
# The best feasible schedule wins (least makespan, then fewest offloaded bytes, then the first
# found); the search stops early once a schedule reaches the LP bound (it is optimal).


def lp(
    chain: Chain,
    platform: Platform,
    *,
    roundings: int = DEFAULT_ROUNDINGS,
    solver: str = "glop",
    keep: Iterable[int] = (),
    time_limit: float | None = None,
) -> Result:
    """Solve the fluid LP, round its fractions into whole offload sets, keep the best that fits.

    Parameters
    ----------
    chain, platform
        The instance.
    roundings
        Most offload sets to plan and simulate (>= 1); see ``NOTE [ rounding the fluid LP ]``.
    solver
        LP back end: ``"glop"`` (default) or ``"pdlp"`` (see :data:`chainoffload.bounds.LP_SOLVERS`).
    keep
        Units (stages 1..L) that must stay resident: no set that offloads one is tried. The
        LP itself is not constrained, so its bound (a bound of the problem without ``keep``)
        still holds.
    time_limit
        Seconds (> 0) the method may take; past it the best set found so far is returned
        (status ``timeout`` when none fits yet). ``None``: no limit.

    Returns
    -------
    Result
        ``feasible`` with the best schedule found, its simulated makespan and the LP bound as
        ``lower_bound`` (:func:`chainoffload.solve` promotes it to ``optimal`` when the two
        meet); ``infeasible`` when no candidate fits (the LP may prove that none can: then
        ``info["lp_feasible"]`` is false). ``info`` holds ``lp_bound``, ``lp_objective``,
        ``lp_time``, ``x`` (per stage), ``roundings_tried``, ``units``, ``source`` (which
        rounding gave the schedule) and ``lp_stages`` (the stages of the LP solved: fewer than
        L when the chain was coarsened, ``NOTE [ coarse LP ]``; its value is then no bound).

    Raises
    ------
    ValueError
        If ``roundings`` is not an integer >= 1, ``solver`` is unknown, ``time_limit`` is not a
        number > 0 or ``keep`` names a unit that is not a stage.
    """
    from ._options import check_keep, check_time_limit

    t0 = time.perf_counter()
    kept = check_keep(chain, keep)
    time_limit = check_time_limit(time_limit)
    if isinstance(roundings, bool) or not isinstance(roundings, (int, np.integer)) or roundings < 1:
        raise OptionError(f"roundings: expected an integer >= 1, got {roundings!r}")
    if not isinstance(solver, str) or solver.lower() not in LP_SOLVERS:
        raise OptionError(f"solver: unknown LP solver {solver!r}; known: {', '.join(LP_SOLVERS)}")
    deadline = t0 + time_limit if time_limit is not None else math.inf
    sol, stages = _relaxation(chain, platform, solver, deadline)
    exact_lp = stages == chain.length
    bound = max(chain.compute_time, sol.bound) if (sol.feasible and exact_lp) else (math.inf if exact_lp else chain.compute_time)
    x = sol.x if sol.feasible else np.ones(chain.length)
    saved = chain.saved
    units = [u for u in range(1, chain.length) if u not in kept] if platform.can_transfer else []
    search = Evaluator(chain, platform, deadline=deadline, max_evals=int(roundings), bound=bound)

    if exact_lp and not sol.feasible:
        # Proven: nothing fits. Offload-all's plan is still judged, for ``min_memory``.
        search.consider((), "keep-all")
        search.max_evals = 2
        search.consider(units, "offload-all")
        units = []
    search.consider((), "keep-all")
    for t in _thresholds(x, units, int(roundings)):
        if search.done:
            break
        search.consider([u for u in units if x[u - 1] >= t], f"threshold {t:.3g}")
    # Each order is made only while the search may still use it: sorting 10^6 units in Python
    # takes seconds, past a deadline that has already stopped the search (NOTE [ clock ]).
    orders = (
        ("greedy by x", lambda: sorted(units, key=lambda u: (-x[u - 1], -int(saved[u - 1]), u))),
        (
            "support by size",
            lambda: sorted((u for u in units if x[u - 1] > _EPS), key=lambda u: (-int(saved[u - 1]), u))
            + sorted((u for u in units if x[u - 1] <= _EPS), key=lambda u: (-int(saved[u - 1]), u)),
        ),
        # Orders that do not follow x: the LP pools bytes, so a set of the same volume made of
        # units that move faster or later can fit where rounding x up does not.
        ("smallest first", lambda: sorted(units, key=lambda u: (int(saved[u - 1]), u))),
        ("last first", lambda: units[::-1]),
        ("first-k", lambda: units),
    )
    for source, order in orders:
        if not search.done:
            # With nothing that fits yet, a prefix shorter than the whole order may still fit
            # (NOTE [ prefixes that fit below one that does not ] in ``_search``).
            search.prefixes(order(), source, extra=2, scan=search.best is None)
    _improve(search, x)
    if search.best is None and search.stopped != "time":
        search.max_evals = max(search.max_evals, search.evals + 2 * (1 + int(math.log2(len(units) + 1))) + 1)
        search.prefixes(sorted(units, key=lambda u: (-int(saved[u - 1]), u)), "repair: largest-first", scan=True)
        search.consider(units, "repair: offload-all")

    info = {
        "lp_bound": sol.bound if exact_lp else math.nan,
        "lp_objective": sol.objective,
        "lp_feasible": sol.feasible if exact_lp else None,
        "lp_solver": sol.solver,
        "lp_time": sol.solve_time,
        "lp_size": [sol.variables, sol.constraints],
        "lp_stages": stages,
        "x": [float(v) for v in x],
        "roundings_tried": search.evals,
    }
    if search.stopped == "time":
        info["stopped"] = "time"
    runtime = time.perf_counter() - t0
    if search.best is not None:
        best = search.best
        info.update(units=list(best.units), source=best.source)
        return Result(
            "lp",
            Status.FEASIBLE,
            best.schedule(),
            makespan=best.makespan,
            lower_bound=bound,
            runtime=runtime,
            info=info,
        )
    if search.stopped == "time":
        return Result(
            "lp",
            Status.TIMEOUT,
            None,
            lower_bound=bound if math.isfinite(bound) else math.nan,
            runtime=runtime,
            info=info,
            message=search.timeout_message("lp", "a rounding", time_limit),
        )
    why = (
        "the fluid LP is infeasible, so no pure-offloading schedule fits"
        if exact_lp and not sol.feasible
        else "no rounding of the fluid LP that it tried fits"
    )
    return Result(
        "lp",
        Status.INFEASIBLE,
        None,
        lower_bound=bound if (exact_lp and sol.feasible) else math.nan,
        runtime=runtime,
        min_memory=search.min_memory(),
        info=info,
        message=f"lp: {why} in {platform.memory} B",
    )


# NOTE [ coarse LP ]
# ------------------
# GLOP's time grows faster than linearly in the LP's size (measured in
# ``benchmarks/results/scaling.md``), so past ``MAX_LP_STAGES`` stages, or when the LP's
# estimated time does not fit the time limit, ``lp`` solves the LP of a coarser chain: runs of
# consecutive stages merged into one (times and unit bytes summed, transients the largest of
# the run, the output that of the run's last stage) and each stage takes its run's fraction.
# The fractions only guide the roundings; the coarse optimum is no bound on the real chain, so
# ``lp`` then reports no LP bound (``info["lp_bound"]`` nan) and an infeasible coarse LP proves
# nothing (every unit then gets x = 1, and the orders that do not follow x still run).

#: Most stages of the LP ``lp`` solves as it is (see ``NOTE [ coarse LP ]``).
MAX_LP_STAGES = 2000


def _relaxation(chain: Chain, platform: Platform, solver: str, deadline: float) -> tuple:
    """The fluid LP of ``chain``, or of a coarser chain when the real one would not fit the
    time (``NOTE [ coarse LP ]``). Returns ``(FluidLP, stages of the LP)`` with ``x`` per stage;
    stages 0 when even the coarsest LP ran out of time (then ``x`` is all ones)."""
    from ..bounds.ladder import fluid_lp_cost

    length = chain.length
    left = deadline - time.perf_counter()
    limit = None if not math.isfinite(deadline) else max(0.4 * left, 1e-3)
    stages = length
    # Leave most of the time to planning the roundings.
    while stages > 1 and (stages > MAX_LP_STAGES or (limit is not None and fluid_lp_cost(stages) > limit)):
        stages = max(1, stages // 2)
    runs = None
    target = chain
    if stages < length:
        runs = np.array_split(np.arange(length), stages)
        target = _coarsen(chain, runs)
    try:
        sol = fluid_lp(target, platform, solver=solver, time_limit=limit)
    except TimeoutError:
        sol = FluidLP(math.nan, math.nan, np.ones(length), np.zeros(0), "timeout", solver, 0.0, 0, 0)
        return sol, 0
    if runs is None:
        return sol, length
    x = np.empty(length)
    for g, run in enumerate(runs):
        x[run] = sol.x[g]
    x[-1] = 0.0
    return dataclasses.replace(sol, x=x), stages


def _coarsen(chain: Chain, runs: list) -> Chain:
    """``chain`` with each run of stages merged into one (``NOTE [ coarse LP ]``)."""
    last = np.array([r[-1] for r in runs])
    act = np.concatenate([[chain.act[0]], chain.act[last + 1]])
    return Chain(
        fwd=[float(chain.fwd[r].sum()) for r in runs],
        bwd=[float(chain.bwd[r].sum()) for r in runs],
        act=act.tolist(),
        saved=[int(chain.saved[r].sum()) for r in runs],
        fwd_tmp=[int(chain.fwd_tmp[r].max()) for r in runs],
        bwd_tmp=[int(chain.bwd_tmp[r].max()) for r in runs],
        name=f"{chain.name} (coarse, {len(runs)} stages)",
    )


def _thresholds(x: np.ndarray, units: Sequence[int], budget: int) -> list[float]:
    """Thresholds of the sweep: a fixed grid, then the distinct values of x (spread evenly)."""
    grid = [1.0 - _EPS, 0.9, 0.75, 0.5, 0.25, 0.1, _EPS]
    values = sorted({float(x[u - 1]) for u in units if x[u - 1] > _EPS}, reverse=True)
    room = max(budget // 2 - len(grid), 0)
    if len(values) > room:
        pick = np.linspace(0, len(values) - 1, room).round().astype(int) if room else []
        values = [values[i] for i in sorted(set(int(i) for i in pick))]
    return grid + values


def _improve(search: Evaluator, x: np.ndarray) -> None:
    """Drop one unit at a time from the best set while that keeps it feasible and faster.

    Units are tried in order of increasing x (the ones the LP wanted least), then larger
    first; each accepted drop restarts the pass. Stops when the search is done.
    """
    saved = search.chain.saved
    while search.best is not None and not search.done:
        before = search.best
        key, source = before.units, before.source
        for u in sorted(key, key=lambda u: (x[u - 1], -int(saved[u - 1]), u)):
            search.consider([v for v in key if v != u], f"{source}, then drop {u}")
            if search.best is not before or search.done:
                break
        if search.best is before:
            return
