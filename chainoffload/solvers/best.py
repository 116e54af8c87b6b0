"""Method ``best`` (the default): local search from the better of ``lp`` and ``dp``.

NOTE [ local improvement ]
--------------------------
The search works on two levels, and the simulator scores every candidate:

1. **Which units.** Starting points are the unit sets of ``lp`` and ``dp`` and of every
   baseline (keep-all, offload-all, first-k, largest-first): starting from the baselines'
   sets is what makes ``best`` never worse than any of them, since the search only ever
   accepts a strictly better candidate. From the best start it applies first-improvement
   moves: add a unit, remove one, or move one to a neighbouring stage, and once none of
   those helps, swap any offloaded unit for any kept one (O(L^2) candidates); each set is
   planned by :func:`chainoffload.planner.plan_transfers` and simulated.
2. **When.** On the best set found, every trigger is moved one boundary earlier or later or
   to the other end of its op, each offload's ``before`` wait is dropped or moved by one
   op, neighbouring transfers of one kind swap their queue order, and then triggers move by
   up to four ops, also to the back of the queue they now tie with; again only strict
   improvements are accepted. This reaches what the planner's fixed rules (offloads in
   stage order at the end of their forward) cannot, e.g. a large unit sent ahead of a
   smaller earlier one.

A candidate is better when it is feasible and the other is not, or both are feasible and its
makespan is shorter (by more than a relative 1e-12, so float noise does not make the search
walk), or neither is feasible and its peak is lower (which steers an infeasible start
towards feasibility). The search stops when no move improves, after ``max_evals``
simulations, or after ``time_limit`` seconds (reported in ``info["stopped"]``); with the
default limits small and medium chains stop by convergence, so the result is deterministic.
"""

from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass
from typing import Iterable

from ..chain import Chain
from ..planner import plan_and_simulate
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule, Transfer
from ..simulate import Timeline, simulate
from . import OptionError, baselines

__all__ = ["best"]

_EPS = 1e-12


@dataclass(frozen=True)
class _Scored:
    units: frozenset[int]
    schedule: Schedule
    timeline: Timeline

    @property
    def key(self) -> tuple[int, float]:
        t = self.timeline
        return (0, t.makespan) if t.feasible else (1, float(t.peak_memory))

    def beats(self, other: "_Scored | None") -> bool:
        if other is None:
            return True
        (fa, va), (fb, vb) = self.key, other.key
        if fa != fb:
            return fa < fb
        return va < vb * (1 - _EPS) if fa == 0 else va < vb


class _Search:
    def __init__(self, chain: Chain, platform: Platform, max_evals: int, deadline: float, bound: float):
        self.chain = chain
        self.bound = bound
        self.platform = platform
        self.max_evals = max_evals
        self.deadline = deadline
        self.evals = 0
        self.cache: dict[frozenset[int], _Scored] = {}
        self.stopped = "converged"

    def at_bound(self, current: _Scored) -> bool:
        """Nothing can beat a schedule that reaches the lower bound."""
        return current.timeline.feasible and current.timeline.makespan <= self.bound * (1 + _EPS)

    def out_of_budget(self) -> bool:
        if self.evals >= self.max_evals:
            self.stopped = "evals"
            return True
        if time.perf_counter() > self.deadline:
            self.stopped = "time"
            return True
        return False

    def score_units(self, units: frozenset[int]) -> _Scored:
        hit = self.cache.get(units)
        if hit is not None:
            return hit
        self.evals += 1
        scored = _Scored(units, *plan_and_simulate(self.chain, self.platform, units))
        self.cache[units] = scored
        return scored

    def score_schedule(self, schedule: Schedule, units: frozenset[int]) -> _Scored | None:
        self.evals += 1
        try:
            timeline = simulate(self.chain, self.platform, schedule)
        except ValueError:
            return None  # a moved trigger broke the schedule's structure: not a candidate
        return _Scored(units, schedule, timeline)

    # -- level 1: which units ----------------------------------------------------------------

    def improve_units(self, current: _Scored, candidates: list[int]) -> _Scored:
        by_size = sorted(candidates, key=lambda u: (-int(self.chain.saved[u - 1]), u))
        while not self.at_bound(current):
            for moves in (self._local_moves, self._swaps):
                found = None
                for move in moves(current.units, by_size):
                    if self.out_of_budget():
                        return current
                    trial = self.score_units(move)
                    if trial.beats(current):
                        found = trial
                        break
                if found is not None:
                    current = found
                    break  # back to the cheap moves from the new point
            else:
                return current
        return current

    @staticmethod
    def _local_moves(units: frozenset[int], by_size: list[int]):
        """Toggle one unit, or move an offloaded unit to a neighbouring stage."""
        allowed = set(by_size)
        for u in by_size:
            yield units ^ {u}
            if u in units:
                for v in (u - 1, u + 1):
                    if v in allowed and v not in units:
                        yield (units - {u}) | {v}

    @staticmethod
    def _swaps(units: frozenset[int], by_size: list[int]):
        """Swap any offloaded unit for any kept one (tried once the local moves are exhausted)."""
        for u in by_size:
            if u in units:
                for v in by_size:
                    if v not in units:
                        yield (units - {u}) | {v}

    # -- level 2: when -----------------------------------------------------------------------

    def improve_triggers(self, current: _Scored) -> _Scored:
        improved = True
        while improved and not self.at_bound(current):
            improved = False
            n_ops = len(current.schedule.compute)
            for transfers in self._neighbours(current.schedule.transfers, n_ops):
                if self.out_of_budget():
                    return current
                trial = self.score_schedule(Schedule(current.schedule.compute, transfers), current.units)
                if trial is not None and trial.beats(current):
                    current = trial
                    improved = True
                    break
        return current

    @classmethod
    def _neighbours(cls, transfers: tuple[Transfer, ...], n_ops: int):
        """Transfer lists one move away, nearest moves first: a trigger moved by one op (or
        to the other end of its op) or a wait changed; two neighbours of one kind swapped;
        then a trigger moved by 2..4 ops, kept in place in the list or sent to its end (so
        that it queues behind the transfers it now ties with)."""
        for idx, tr in enumerate(transfers):
            for moved in cls._trigger_moves(tr, n_ops):
                yield transfers[:idx] + (moved,) + transfers[idx + 1 :]
        # Same trigger, other queue order: list order breaks the tie on the channel.
        for idx in range(len(transfers) - 1):
            a, b = transfers[idx], transfers[idx + 1]
            if a.kind == b.kind:
                yield transfers[:idx] + (b, a) + transfers[idx + 2 :]
        for radius in (2, 3, 4):
            for idx, tr in enumerate(transfers):
                rest = transfers[:idx] + transfers[idx + 1 :]
                for op in (tr.op - radius, tr.op + radius):
                    if 0 <= op < n_ops:
                        before = tr.before if tr.before is None or tr.before > op else None
                        moved = Transfer(tr.kind, tr.unit, op, "end", before)
                        yield transfers[:idx] + (moved,) + transfers[idx + 1 :]
                        yield rest + (moved,)

    @staticmethod
    def _trigger_moves(tr: Transfer, n_ops: int):
        for op in (tr.op - 1, tr.op + 1):
            if 0 <= op < n_ops:
                before = tr.before if tr.before is None or tr.before > op else None
                yield Transfer(tr.kind, tr.unit, op, "end", before)
        yield Transfer(tr.kind, tr.unit, tr.op, "start" if tr.at == "end" else "end", tr.before)
        if tr.kind == "offload" and tr.before is not None:
            yield Transfer(tr.kind, tr.unit, tr.op, tr.at, None)
            for before in (tr.before - 1, tr.before + 1):
                if tr.op < before < n_ops:
                    yield Transfer(tr.kind, tr.unit, tr.op, tr.at, before)


def _start_sets(
    chain: Chain, platform: Platform, use_relaxations: bool, keep: frozenset[int]
) -> tuple[dict[str, frozenset[int]], dict]:
    """Unit sets to start from: the relaxations' and every baseline's, by name."""
    starts: dict[str, frozenset[int]] = {}
    info: dict = {}
    runs = [
        ("keep-all", baselines.keep_all),
        ("offload-all", baselines.offload_all),
        ("first-k", baselines.first_k),
        ("largest-first", baselines.largest_first),
    ]
    if use_relaxations:
        for name, target in (("lp", "chainoffload.solvers.lp:lp"), ("dp", "chainoffload.solvers.dp:dp")):
            module, _, func = target.partition(":")
            runs.insert(0, (name, getattr(importlib.import_module(module), func)))
    for name, func in runs:
        result = func(chain, platform, keep=keep)
        if result.schedule is not None:
            starts[name] = frozenset(result.schedule.offloaded_units)
            info[f"{name}_makespan"] = result.makespan
        if name == "lp" and math.isfinite(result.lower_bound):
            info["lp_bound"] = result.lower_bound
    return starts, info


def best(
    chain: Chain,
    platform: Platform,
    *,
    time_limit: float = 5.0,
    max_evals: int = 4000,
    relaxations: bool = True,
    remat: bool = False,
    keep: Iterable[int] = (),
) -> Result:
    """Local search over offload sets and triggers from the better of ``lp`` and ``dp``.

    See NOTE [ local improvement ]. Never worse than any baseline: their unit sets are
    starting points and only strict improvements are accepted.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds the search may take after its starting points are computed (> 0).
    max_evals
        Simulations the search may run (>= 1).
    relaxations
        Start from ``lp`` and ``dp`` too (false: baselines only; for comparisons).
    remat
        Also run ``joint`` (rematerialization + offloading) and keep it when it is faster;
        its schedules recompute, which the torch executor does not run.
    keep
        Units (stages 1..L) that must stay resident: no start or move offloads one (and a
        ``joint`` schedule that offloads one is not taken).

    Returns
    -------
    Result
        ``info`` holds ``start`` (the name of the starting point the search improved),
        ``evals``, ``stopped`` (``converged``, ``evals`` or ``time``), ``units`` and each
        start's makespan.
    """
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise OptionError(f"time_limit: expected seconds > 0, got {time_limit!r}")
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise OptionError(f"max_evals: expected an integer >= 1, got {max_evals!r}")
    from . import check_keep

    kept = check_keep(chain, keep)
    t0 = time.perf_counter()
    starts, info = _start_sets(chain, platform, relaxations, kept)
    bound = max(chain.compute_time, info.get("lp_bound", 0.0))
    search = _Search(chain, platform, max_evals, time.perf_counter() + time_limit, bound)
    scored = {name: search.score_units(units) for name, units in starts.items()}
    start_name = None
    current: _Scored | None = None
    for name, s in scored.items():
        if s.beats(current):
            start_name, current = name, s
    if current is None:  # no start had a schedule: begin from nothing offloaded
        start_name, current = "keep-all", search.score_units(frozenset())
    candidates = [u for u in range(1, chain.length) if u not in kept] if platform.can_transfer else []
    current = search.improve_units(current, candidates)
    if current.timeline.feasible and current.units:
        current = search.improve_triggers(current)
    info.update(start=start_name, evals=search.evals, stopped=search.stopped, units=sorted(current.units))
    result: Result
    if current.timeline.feasible:
        result = Result(
            "best",
            Status.FEASIBLE,
            current.schedule,
            makespan=current.timeline.makespan,
            lower_bound=info.get("lp_bound", math.nan),
            runtime=time.perf_counter() - t0,
            info=info,
        )
    else:
        result = Result(
            "best",
            Status.INFEASIBLE,
            None,
            lower_bound=info.get("lp_bound", math.nan),
            runtime=time.perf_counter() - t0,
            info={**info, "least_peak": int(current.timeline.peak_memory)},
            message=f"best: no schedule found fits in {platform.memory} B (least peak seen {current.timeline.peak_memory} B)",
        )
    if remat:
        from .joint import joint

        other = joint(chain, platform)
        moves_kept = other.schedule is not None and bool(kept & set(other.schedule.offloaded_units))
        if other.status.has_schedule and not moves_kept and (not result.status.has_schedule or other.makespan < result.makespan):
            # The pure-offloading bound does not bind a schedule that recomputes.
            result = other.replace(method="best", runtime=time.perf_counter() - t0, info={**info, "remat": other.info})
    return result
