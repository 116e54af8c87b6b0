"""Method ``lp``: the fluid LP relaxation, rounded into whole units and planned.

The LP of :mod:`chainoffload.bounds` gives a proven lower bound on the makespan and a
fractional plan ``x`` (how much of each unit it offloads). This module turns ``x`` into whole
offload sets, plans each with the shared transfer planner, replays it in the simulator and keeps
the best schedule that fits (``NOTE [ rounding the fluid LP ]``).
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

import numpy as np

from ..bounds import LP_SOLVERS, fluid_lp
from ..chain import Chain
from ..planner import plan_and_simulate
from ..platform import Platform
from ..result import Result, Status
from ..simulate import Timeline
from . import OptionError

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
#     makespan may be lower when the planner hides the extra transfers);
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

    Returns
    -------
    Result
        ``feasible`` with the best schedule found, its simulated makespan and the LP bound as
        ``lower_bound`` (:func:`chainoffload.solve` promotes it to ``optimal`` when the two
        meet); ``infeasible`` when no candidate fits (the LP may prove that none can: then
        ``info["lp_feasible"]`` is false). ``info`` holds ``lp_bound``, ``lp_objective``,
        ``lp_time``, ``x`` (per stage), ``roundings_tried``, ``units`` and ``source`` (which
        rounding gave the schedule).

    Raises
    ------
    ValueError
        If ``roundings`` is not an integer >= 1, ``solver`` is unknown or ``keep`` names a
        unit that is not a stage.
    """
    from . import check_keep

    t0 = time.perf_counter()
    kept = check_keep(chain, keep)
    if isinstance(roundings, bool) or not isinstance(roundings, (int, np.integer)) or roundings < 1:
        raise OptionError(f"roundings: expected an integer >= 1, got {roundings!r}")
    if not isinstance(solver, str) or solver.lower() not in LP_SOLVERS:
        raise OptionError(f"solver: unknown LP solver {solver!r}; known: {', '.join(LP_SOLVERS)}")
    sol = fluid_lp(chain, platform, solver=solver)
    bound = max(chain.compute_time, sol.bound) if sol.feasible else math.inf
    x = sol.x
    saved = chain.saved
    units = [u for u in range(1, chain.length) if u not in kept] if platform.can_transfer else []
    search = _Search(chain, platform, int(roundings), bound)

    if not sol.feasible:
        # Proven: nothing fits. Offload-all's plan is still judged, for ``min_memory``.
        search.consider((), "keep-all")
        search.budget = 2
        search.consider(units, "offload-all")
        units = []
    search.consider((), "keep-all")
    for t in _thresholds(x, units, int(roundings)):
        if search.done:
            break
        search.consider([u for u in units if x[u - 1] >= t], f"threshold {t:.3g}")
    by_x = sorted(units, key=lambda u: (-x[u - 1], -int(saved[u - 1]), u))
    search.prefixes(by_x, "greedy by x")
    support = [u for u in units if x[u - 1] > _EPS]
    rest = [u for u in units if x[u - 1] <= _EPS]
    by_size = sorted(support, key=lambda u: (-int(saved[u - 1]), u)) + sorted(rest, key=lambda u: (-int(saved[u - 1]), u))
    search.prefixes(by_size, "support by size")
    # Orders that do not follow x: the LP pools bytes, so a set of the same volume made of
    # units that move faster or later can fit where rounding x up does not.
    search.prefixes(sorted(units, key=lambda u: (int(saved[u - 1]), u)), "smallest first")
    search.prefixes(units[::-1], "last first")
    search.prefixes(units, "first-k")
    search.improve(x)
    if search.best is None:
        search.budget = max(search.budget, search.tried + 2 * (1 + int(math.log2(len(units) + 1))) + 1)
        search.prefixes(sorted(units, key=lambda u: (-int(saved[u - 1]), u)), "repair: largest-first")
        search.consider(units, "repair: offload-all")

    info = {
        "lp_bound": sol.bound,
        "lp_objective": sol.objective,
        "lp_feasible": sol.feasible,
        "lp_solver": sol.solver,
        "lp_time": sol.solve_time,
        "lp_size": [sol.variables, sol.constraints],
        "x": [float(v) for v in x],
        "roundings_tried": search.tried,
    }
    runtime = time.perf_counter() - t0
    if search.best is not None:
        tl, chosen, source = search.best
        info.update(units=list(chosen), source=source)
        return Result(
            "lp",
            Status.FEASIBLE,
            tl.schedule,
            makespan=tl.makespan,
            lower_bound=bound,
            runtime=runtime,
            info=info,
        )
    why = (
        "the fluid LP is infeasible, so no pure-offloading schedule fits"
        if not sol.feasible
        else "no rounding of the fluid LP that it tried fits"
    )
    return Result(
        "lp",
        Status.INFEASIBLE,
        None,
        lower_bound=bound if sol.feasible else math.nan,
        runtime=runtime,
        min_memory=search.min_memory(),
        info=info,
        message=f"lp: {why} in {platform.memory} B",
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


class _Search:
    """Plans and simulates offload sets within a budget; remembers the best that fits."""

    def __init__(self, chain: Chain, platform: Platform, budget: int, bound: float) -> None:
        self.chain = chain
        self.platform = platform
        self.budget = budget
        self.bound = bound
        self.tried = 0
        self.seen: dict[tuple[int, ...], Timeline] = {}
        self.best: tuple[Timeline, tuple[int, ...], str] | None = None
        self.order = 0

    @property
    def done(self) -> bool:
        """Budget spent, or a schedule at the lower bound found (nothing can beat it)."""
        if self.tried >= self.budget:
            return True
        return self.best is not None and self.best[0].makespan <= self.bound * (1 + 1e-12)

    def _run(self, units: tuple[int, ...]) -> Timeline:
        return plan_and_simulate(self.chain, self.platform, units)[1]

    def consider(self, units: Iterable[int], source: str) -> bool | None:
        """Plan and judge one set; ``None`` when the budget is spent, else whether it fits."""
        key = tuple(sorted(int(u) for u in units))
        if key in self.seen:
            return self.seen[key].feasible
        if self.done:
            return None
        tl = self._run(key)
        self.tried += 1
        self.seen[key] = tl
        if tl.feasible:
            rank = (tl.makespan, tl.offloaded_bytes)
            if self.best is None or rank < (self.best[0].makespan, self.best[0].offloaded_bytes):
                self.best = (tl, key, source)
        return tl.feasible

    def prefixes(self, order: Sequence[int], source: str) -> None:
        """Bisection for the shortest prefix of ``order`` that fits, then the next two."""
        if not order or self.done:
            return
        lo, hi = 0, len(order)  # invariant: prefix hi fits (checked first), prefix lo does not
        fits = self.consider(order, f"{source} (all {len(order)})")
        if not fits:
            return
        if self.consider((), "keep-all"):
            return
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = self.consider(order[:mid], f"{source} (first {mid})")
            if ok is None:
                return
            if ok:
                hi = mid
            else:
                lo = mid
        for extra in (1, 2):
            if hi + extra <= len(order):
                self.consider(order[: hi + extra], f"{source} (first {hi + extra})")

    def improve(self, x: np.ndarray) -> None:
        """Drop one unit at a time from the best set while that keeps it feasible and faster.

        Units are tried in order of increasing x (the ones the LP wanted least), then larger
        first; each accepted drop restarts the pass. Stops when the budget is spent.
        """
        while self.best is not None and not self.done:
            _, key, source = self.best
            before = self.best
            for u in sorted(key, key=lambda u: (x[u - 1], -int(self.chain.saved[u - 1]), u)):
                self.consider([v for v in key if v != u], f"{source}, then drop {u}")
                if self.best is not before or self.done:
                    break
            if self.best is before:
                return

    def min_memory(self) -> int | None:
        """A memory at which the least-peak candidate tried fits, or ``None``.

        The candidate with the lowest simulated peak (its only fault being memory) is planned
        again with that peak as the limit; if the simulator accepts it there, that peak is a
        memory at which ``lp``'s rounding succeeds (not proven the least).
        """
        over = [(tl.peak_memory, key) for key, tl in self.seen.items() if tl.violation is not None and tl.violation.rule == "memory"]
        if not over:
            return None
        peak, key = min(over)
        wider = self.platform.with_memory(peak)
        return int(peak) if plan_and_simulate(self.chain, wider, key)[1].feasible else None
