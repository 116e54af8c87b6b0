"""Method ``best`` (the default): local search from the better of ``lp`` and ``dp``.

NOTE [ local improvement ]
--------------------------
The search works on two levels, and the simulator scores every candidate:

1. **Which units.** Starting points are the unit sets of ``lp`` and ``dp`` and of every
   baseline (keep-all, offload-all, first-k, largest-first): starting from the baselines'
   sets is what makes ``best`` never worse than any of them, since the search only ever
   accepts a strictly better candidate. From the best start it applies first-improvement
   moves: add a unit, remove one, or move one to a neighbouring stage; then change what a unit
   moves (its a_i alone instead of the whole unit, or back; or offload a kept unit's a_i
   alone: moving fewer bytes is what wins where little memory must be freed and a whole
   unit's transfer would make compute wait, docs/model.md's ``moves: "act"``); and once none
   of those helps, swap any offloaded unit for any kept one (O(L^2) candidates); each set is
   planned by :func:`chainoffload.planner.plan_transfers` and simulated.
2. **When.** On the best set found, every trigger is moved one boundary earlier or later or
   to the other end of its op, each offload's ``before`` wait is dropped or moved by one
   op, neighbouring transfers of one kind swap their queue order, and then triggers move by
   up to four ops, also to the back of the queue they now tie with; again only strict
   improvements are accepted. This reaches what the planner's fixed rules (offloads in
   stage order at the end of their forward) cannot, e.g. a large unit sent ahead of a
   smaller earlier one.
3. **Restarts.** Where the budget is not spent, levels 1 and 2 run again from two more
   points, and the best of the three walks is kept: the set found with every unit that can
   move a_i alone doing so, and every such unit's a_i alone. A first-improvement walk never
   crosses a worse candidate, and the schedules that move a_i alone are often a few moves
   beyond one: resnet18 at 80 % of its keep-all peak over a half-duplex 12 GB/s link, where
   a_1, a_4 and a_5 alone (CP-SAT's optimum, 21.96 ms) beat unit 4 whole (34.79 ms), but each
   of them added alone to {4} is worse or does not fit. From all a_i alone the walk drops
   what is not needed and reaches 27.29 ms. On long chains the first walk spends the budget
   and nothing changes.

A candidate is better when it is feasible and the other is not, or both are feasible and its
makespan is shorter (by more than a relative 1e-12, so float noise does not make the search
walk), or neither is feasible and its peak is lower (which steers an infeasible start
towards feasibility). The search stops when no move improves, after ``max_evals``
simulations, or after ``time_limit`` seconds (reported in ``info["stopped"]``).

NOTE [ best's work budget ]
---------------------------
**By default ``best`` never reads the clock to decide anything**: every starting point runs
without a time limit (each by its own rules, which depend on the instance only), and the search
stops by convergence or after :func:`default_max_evals` evaluations, a work budget of
``EVAL_WORK`` stage-evaluations (an evaluation plans and simulates the whole chain, so its cost
grows with L). So the same call returns the same schedule on any machine and at any load, as
CP-SAT does with a deterministic time. The exact improver that follows (``cpsat_work``, NOTE
[ large neighbourhood search ] in ``lns.py``) is stopped the same way: CP-SAT's deterministic
time, one worker, a fixed seed. A ``time_limit`` (``--time-limit``) brings the clock in:
starting points get shares of it and the search stops at it, so the result may then depend on
the machine.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Iterable, Iterator

import numpy as np

from .._cost import build_seconds, eval_seconds
from .._progress import progress
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from . import baselines
from ._options import OptionError
from ._search import Candidate, Evaluator

__all__ = ["EVAL_WORK", "best", "default_max_evals", "default_time_limit"]

_EPS = 1e-12

#: Share of the starting points' time left that first-k may take under a time limit.
FIRST_K_SHARE = 0.6

#: Share of the time limit ``joint`` gets with ``remat=True`` (the pure-offloading part the rest).
REMAT_SHARE = 0.5

#: Share of the time limit the starting points may take together (the search gets the rest,
#: and whatever they leave).
START_SHARE = 0.7

# Starting points in the order they run, with their share of the starting time (one that
# finishes early leaves its time to the next ones); ties between equal starts go to the
# first of ``_PREFERENCE``.
_STARTS = (
    ("keep-all", 0.25),
    # One plan, and the set most likely to fit: a schedule in hand early when time is short
    # (at L = 100,000 on a loaded machine the other starts may not finish in time).
    ("offload-all", 0.25),
    # The baselines' bisections (O(log L) plans) before the relaxations: under a short limit
    # at 10^4-10^5 stages dp used its share, first-k's was too small to end, and best
    # returned 2.19x where first-k alone gave 2.00x (benchmarks/results/time_limits_large.md);
    # first-k gets FIRST_K_SHARE of what is left, and a bisection cut short keeps the best
    # prefix it saw fit.
    ("first-k", 1.0),
    ("largest-first", 0.5),
    ("dp", 1.0),
    ("lp", 1.0),
)
_PREFERENCE = ("lp", "dp", "keep-all", "offload-all", "first-k", "largest-first")
_TARGETS = {
    "keep-all": baselines.keep_all,
    "offload-all": baselines.offload_all,
    "first-k": baselines.first_k,
    "largest-first": baselines.largest_first,
    "lp": "chainoffload.solvers.lp:lp",
    "dp": "chainoffload.solvers.dp:dp",
}


def _moves(c: Candidate) -> frozenset[int]:
    """What ``c`` offloads: +u for unit u moved whole, -u for a_u moved alone."""
    alone = set(c.alone)
    return frozenset(-u if u in alone else u for u in c.units)


def _key(c: Candidate) -> tuple[int, float]:
    return (0, c.makespan) if c.feasible else (1, float(c.peak))


def _beats(a: Candidate, b: Candidate | None) -> bool:
    """Feasible beats infeasible; a shorter makespan (by more than a relative 1e-12) beats a
    longer one; between infeasible ones, the lower peak."""
    if b is None:
        return True
    (fa, va), (fb, vb) = _key(a), _key(b)
    if fa != fb:
        return fa < fb
    return va < vb * (1 - _EPS) if fa == 0 else va < vb


class _Search:
    """The two levels of ``NOTE [ local improvement ]`` over :class:`Evaluator` candidates."""

    def __init__(self, search: Evaluator, bar, first_fit: bool = False) -> None:
        self.search = search
        self.bar = bar
        self.t0 = time.perf_counter()
        self.first_fit = first_fit

    def _done(self, current: Candidate) -> bool:
        return self.search.at_bound(current) or (self.first_fit and current.feasible)

    def _tick(self, current: Candidate) -> None:
        self.bar.set(time.perf_counter() - self.t0)
        if current.feasible:
            self.bar.note(evals=self.search.evals, makespan=f"{current.makespan:.6g}")

    # -- level 1: which units ----------------------------------------------------------------

    def _plan(self, moves: frozenset[int]) -> Candidate:
        return self.search.units([abs(u) for u in moves], [-u for u in moves if u < 0])

    def improve_units(self, current: Candidate, candidates: list[int]) -> Candidate:
        chain = self.search.chain
        by_size = sorted(candidates, key=lambda u: (-int(chain.saved[u - 1]), u))
        # Units whose a_i alone is a move of its own (less than the unit, more than nothing).
        act_able = [u for u in by_size if 0 < int(chain.act[u]) < int(chain.saved[u - 1])]
        while not self._done(current):
            for moves in (self._local_moves, lambda units, _: self._act_moves(units, act_able), self._swaps):
                found = None
                for move in moves(_moves(current), by_size):
                    if self.search.exhausted:
                        return current
                    trial = self._plan(move)
                    if _beats(trial, current):
                        found = trial
                        break
                if found is not None:
                    current = found
                    self._tick(current)
                    break  # back to the cheap moves from the new point
            else:
                return current
        return current

    @staticmethod
    def _local_moves(units: frozenset[int], by_size: list[int]) -> Iterator[frozenset[int]]:
        """Toggle one unit (kept: offload it whole; offloaded: keep it), or move a unit offloaded
        whole to a neighbouring stage (``units``: +u whole, -u a_u alone)."""
        allowed = set(by_size)
        offloaded = {abs(u) for u in units}
        for u in by_size:
            yield units - {u, -u} if u in offloaded else units | {u}
            if u in units:
                for v in (u - 1, u + 1):
                    if v in allowed and v not in offloaded:
                        yield (units - {u}) | {v}

    @staticmethod
    def _act_moves(units: frozenset[int], act_able: list[int]) -> Iterator[frozenset[int]]:
        """Change what one unit moves: whole to a_u alone or back, or offload a kept unit's a_u alone."""
        for u in act_able:
            if u in units:
                yield (units - {u}) | {-u}
            elif -u in units:
                yield (units - {-u}) | {u}
            else:
                yield units | {-u}

    @staticmethod
    def _swaps(units: frozenset[int], by_size: list[int]) -> Iterator[frozenset[int]]:
        """Swap any unit offloaded whole for any kept one (tried once the local moves are exhausted)."""
        offloaded = {abs(u) for u in units}
        for u in by_size:
            if u in units:
                for v in by_size:
                    if v not in offloaded:
                        yield (units - {u}) | {v}

    # -- level 3: restarts -------------------------------------------------------------------

    def walk(self, current: Candidate, candidates: list[int]) -> Candidate:
        """Levels 1 and 2 from ``current``."""
        current = self.improve_units(current, candidates)
        if current.feasible and current.units and not self.first_fit:
            current = self.improve_triggers(current)
        return current

    def restart(self, current: Candidate, candidates: list[int]) -> tuple[Candidate, str | None]:
        """Walk again from the restart points of ``NOTE [ local improvement ]`` while the budget
        lasts; the best candidate and the restart that found it (``None``: the first walk's)."""
        chain = self.search.chain
        act_able = [u for u in candidates if 0 < int(chain.act[u]) < int(chain.saved[u - 1])]
        if not act_able:
            return current, None
        found = set(current.units)
        points = []
        if found & set(act_able):
            points.append(("alone", sorted(found), sorted(found & set(act_able))))
        points.append(("all alone", act_able, act_able))
        by = None
        for name, units, alone in points:
            if self.search.exhausted or self._done(current):
                break
            trial = self.walk(self.search.units(units, alone), candidates)
            if _beats(trial, current):
                current, by = trial, name
        return current, by

    # -- level 2: when -----------------------------------------------------------------------

    def improve_triggers(self, current: Candidate) -> Candidate:
        n_ops = 2 * self.search.chain.length
        improved = True
        while improved and not self.search.at_bound(current):
            improved = False
            for transfers in _neighbours(current.transfers, n_ops):
                if self.search.exhausted:
                    return current
                trial = self.search.transfers(current.units, transfers, current.alone)
                if trial is not None and _beats(trial, current):
                    current = trial
                    improved = True
                    self._tick(current)
                    break
        return current


def _with(transfers: tuple[np.ndarray, ...], idx: int, op: int, at: int, before: int) -> tuple[np.ndarray, ...]:
    """``transfers`` with transfer ``idx`` moved to trigger ``(op, at)`` and wait ``before``."""
    kind, unit, ops, ats, befores = transfers
    ops, ats, befores = ops.copy(), ats.copy(), befores.copy()
    ops[idx], ats[idx], befores[idx] = op, at, before
    return kind, unit, ops, ats, befores


def _to_end(transfers: tuple[np.ndarray, ...], idx: int) -> tuple[np.ndarray, ...]:
    """``transfers`` with transfer ``idx`` sent to the end of the list (the back of its queue)."""
    m = transfers[0].shape[0]
    order = np.concatenate([np.arange(idx), np.arange(idx + 1, m), [idx]])
    return tuple(a[order] for a in transfers)


def _neighbours(transfers: tuple[np.ndarray, ...], n_ops: int) -> Iterator[tuple[np.ndarray, ...]]:
    """Transfer lists one move away, nearest moves first: a trigger moved by one op (or to the
    other end of its op) or a wait changed; two neighbours of one kind swapped; then a trigger
    moved by 2..4 ops, kept in place in the list or sent to its end (so that it queues behind
    the transfers it now ties with)."""
    kind, _unit, ops, ats, befores = (a.tolist() for a in transfers)
    m = len(kind)
    for idx in range(m):
        op, at, before = ops[idx], ats[idx], befores[idx]
        for new in (op - 1, op + 1):
            if 0 <= new < n_ops:
                yield _with(transfers, idx, new, 1, before if before > new else -1)
        yield _with(transfers, idx, op, 1 - at, before)
        if kind[idx] == 0 and before >= 0:
            yield _with(transfers, idx, op, at, -1)
            for b in (before - 1, before + 1):
                if op < b < n_ops:
                    yield _with(transfers, idx, op, at, b)
    # Same trigger, other queue order: list order breaks the tie on the channel.
    for idx in range(m - 1):
        if kind[idx] == kind[idx + 1]:
            order = np.arange(m)
            order[idx], order[idx + 1] = idx + 1, idx
            yield tuple(a[order] for a in transfers)
    for radius in (2, 3, 4):
        for idx in range(m):
            op, before = ops[idx], befores[idx]
            for new in (op - radius, op + radius):
                if 0 <= new < n_ops:
                    moved = _with(transfers, idx, new, 1, before if before > new else -1)
                    yield moved
                    yield _to_end(moved, idx)


def _start_sets(
    chain: Chain, platform: Platform, use_relaxations: bool, keep: frozenset[int], deadline: float | None
) -> tuple[dict[str, frozenset[int]], dict]:
    """Unit sets to start from: the relaxations' and every baseline's, by name, within ``deadline``
    (``None``: no clock, each start runs to its own end)."""
    starts: dict[str, frozenset[int]] = {}
    info: dict = {"_fallback": None}
    runs = [(name, share) for name, share in _STARTS if use_relaxations or name not in ("lp", "dp")]
    skipped = []
    for i, (name, share) in enumerate(runs):
        left = math.inf if deadline is None else deadline - time.perf_counter()
        if left <= 0:
            skipped.append(name)
            continue
        target = _TARGETS[name]
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
        rest = sum(s for _, s in runs[i:])
        if deadline is None:
            result = target(chain, platform, keep=keep, time_limit=None)
        else:
            # A share too short for one plan and its schedule would end every start empty-handed
            # at 10^5+ stages (NOTE [ clock ]): such a start gets that much, the ones after it less.
            least = 0.05 + 1.1 * (eval_seconds(chain.length) + build_seconds(2 * chain.length))
            allot = max(left * share / rest, min(left, least))
            if name == "first-k":
                # Its bisection, even cut short, ends with a prefix near the least that fits
                # (NOTE [ local improvement ]'s baselines are the floor best must not go
                # below): it gets FIRST_K_SHARE of the starts' time left.
                allot = max(allot, FIRST_K_SHARE * left)
            result = target(chain, platform, keep=keep, time_limit=allot)
        if result.schedule is not None:
            starts[name] = frozenset(result.schedule.offloaded_units)
            info[f"{name}_makespan"] = result.makespan
            # The fastest start's schedule is kept whole: on a long chain under a tight limit,
            # planning it again in the search's evaluator may not fit (NOTE [ clock ]).
            held = info["_fallback"]
            if result.feasible and (held is None or result.makespan < held.makespan):
                info["_fallback"] = result.replace(info={**result.info, "start_method": name})
        if name == "lp" and math.isfinite(result.lower_bound) and math.isfinite(result.info.get("lp_bound", math.nan)):
            info["lp_bound"] = result.lower_bound
    if skipped:
        info["starts_skipped"] = skipped
    return starts, info


def _cut_short(chain: Chain, platform: Platform, fallback: Result | None, info: dict, search: Evaluator, time_limit: float, t0: float) -> Result:
    """``best``'s result when the time ran out before its search held a feasible candidate: the
    fastest start's schedule as it is (``stopped``: ``time``), or status ``timeout``."""
    info.update(evals=search.evals, stopped="time")
    if fallback is not None:
        name = fallback.info.get("start_method")
        info.update(start=name, units=list(fallback.schedule.offloaded_units))
        return Result(
            "best", Status.FEASIBLE, fallback.schedule, makespan=fallback.makespan,
            lower_bound=info.get("lp_bound", math.nan), runtime=time.perf_counter() - t0, info=info,
        )
    return Result(
        "best", Status.TIMEOUT, None, lower_bound=info.get("lp_bound", math.nan), runtime=time.perf_counter() - t0,
        info=info, message=search.timeout_message("best", "a schedule", time_limit),
    )


#: The exact improver runs where the schedule is more than this share above the problem's
#: bound: below it, what CP-SAT could gain is small and its work is not (the README's main job,
#: resnet50 in 4 GiB, is 1.68 % above its bound, and 5 deterministic seconds of CP-SAT, ~35 s
#: here, find nothing shorter). NOTE [ exact improver's gap ] says when it runs below it.
LNS_GAP = 0.02

#: ... or where the bound leaves more than this share of the schedule's stall (makespan less the
#: sum of op times) open, the whole-chain step alone on ``STALL_WORK`` (NOTE [ exact improver's gap ]).
STALL_SHARE = 0.25

#: Deterministic seconds of that whole-chain step (at most ``cpsat_work``).
STALL_WORK = 0.5

# NOTE [ exact improver's gap ]
# -----------------------------
# Measured against the makespan, a gap says little near the keep-all peak: there a schedule
# 0.92 % above its bound may be all stall that the bound says could go. compare.py's vgg19
# point at 4.17 GiB, PCIe 4: best 0.10709 s, the ladder's bound 0.10612 s (the sum of op times),
# and CP-SAT proves 0.10612 s (no stall at all) optimal; within LNS_GAP, the improver was
# skipped. So the improver also runs where the bound leaves more than STALL_SHARE of the stall
# (makespan - sum of op times) open: there the schedule's overhead, not its makespan, is what
# CP-SAT may cut, by up to all of it. It runs then as the whole-chain step only (no windows),
# on at most STALL_WORK deterministic seconds, as does the stronger rung after it: at that
# vgg19 point the whole step proves the optimum in 0.22 of them (3.3 s of CPU, the local
# search included, against 6.2 s with the windows first), and the budget bounds what a point
# that proves nothing costs. The share keeps the README's main job out (1.68 % above its bound,
# 2.94 % of its stall): of compare.py's and best_optimum.py's points on chains of at most 24
# stages within LNS_GAP, the ones above it are vgg19's at 4.17 GiB (100 %); then inception_v3's
# at 5.55 GiB (12.7 %) and gpt2_12's at 6.23 GiB (5.0 %), where best is already CP-SAT's optimum.


def _exact(chain: Chain, platform: Platform, result: Result, work: float, kept: frozenset[int], deadline: float,
           info: dict) -> Result:
    """``result`` improved by CP-SAT (NOTE [ large neighbourhood search ]), with the problem's bound."""
    from ..bounds import problem_bound
    from . import lns

    timed = math.isfinite(deadline)
    left = deadline - time.perf_counter() if timed else None
    if left is not None and left <= 0:
        return result
    # The one bound every command reports (NOTE [ bound ladder ]); solve's own climb reuses it.
    pb = problem_bound(chain, platform, target=result.makespan, time_limit=left)
    bound = max(pb.value, result.lower_bound if math.isfinite(result.lower_bound) else -math.inf)
    windows = result.makespan > bound * (1 + LNS_GAP)
    # NOTE [ exact improver's gap ]
    stall = result.makespan - chain.compute_time
    if not windows and not (result.makespan > bound * (1 + _EPS) and result.makespan - bound > STALL_SHARE * stall):
        info["lns"] = {"mode": "skipped", "why": f"within {LNS_GAP:.0%} of the bound and of {STALL_SHARE:.0%} of the stall",
                       "work": 0.0}
        return result.replace(lower_bound=bound, info=info)
    if not windows:
        work = min(work, STALL_WORK)
    imp = lns.improve(chain, platform, result.schedule, result.makespan, work=work, keep=kept, lower_bound=bound,
                      deadline=deadline, windows=windows)
    info["lns"] = imp.info
    bound = max(bound, imp.lower_bound)
    optimal = imp.optimal
    schedule, makespan, improved_by = imp.schedule, imp.makespan, "cpsat"
    if not optimal and makespan > bound * (1 + 1e-12):
        # The gap left: the ladder's stronger rungs (NOTE [ cpsat bound rung ]: CP-SAT proves, on a
        # work limit, that nothing ends before this makespan). Cached rungs cost nothing again.
        left = deadline - time.perf_counter() if timed else None
        if left is None or left > 0:
            from ..bounds.cpsat_bound import found_schedules

            # The proof gets the improver's budget again (``cpsat_work``: 0.05 in the tests).
            with found_schedules() as found:
                strong = problem_bound(chain, platform, target=makespan, time_limit=left, stronger=work)
            if strong.value > bound:
                bound = strong.value
                # The cpsat rung proves the makespan optimal as ``cpsat`` does: within 3 R / scale.
                if strong.rung == "cpsat":
                    from .cpsat.grid import TimeGrid

                    grid = TimeGrid.build(chain, platform)
                    optimal = bound >= makespan - 3 * grid.slack / grid.scale
            info["lns"] = {**imp.info, "stronger": strong.rung, **({"stronger_note": "; ".join(strong.notes)} if strong.notes else {})}
            # NOTE [ cpsat bound rung ], its schedule: what its search found under the cap (replayed
            # by the simulator) replaces the improver's schedule; its proof, when CP-SAT gave one,
            # makes it optimal. One that offloads a kept unit is not taken (the rung has no keep).
            for got in found:
                if got.makespan < makespan * (1 - _EPS) and not kept & set(got.schedule.offloaded_units):
                    schedule, makespan, improved_by = got.schedule, got.makespan, "cpsat rung"
                    bound = max(bound, got.value)
                    # Proven by CP-SAT, or (as above) the bound within 3 R / scale of it.
                    optimal = got.optimal or bound >= makespan - 3 * got.tolerance
    bound = min(bound, makespan)
    if schedule is result.schedule:
        return result.replace(lower_bound=bound, info=info, status=Status.OPTIMAL if optimal else result.status)
    info.update(units=list(schedule.offloaded_units),
                alone=[t.unit for t in schedule.transfers if t.kind == "offload" and t.moves == "act"], improved_by=improved_by)
    return result.replace(schedule=schedule, makespan=makespan, lower_bound=bound, info=info,
                          status=Status.OPTIMAL if optimal else Status.FEASIBLE)


# NOTE [ best when the search finds nothing ]
# -------------------------------------------
# The local search only ever holds schedules the planner writes (NOTE [ transfer planner ]) and
# their trigger moves, and those start only from a feasible candidate. Where no unit set the
# planner tries fits, schedules may still exist that hinge on a timing its rules never write:
# issue 33's chains with zero-length ops, where a copy must be queued behind another so that it
# starts just after an instant. On chains CP-SAT solves whole (at most ``WHOLE_MAX_STAGES``
# stages), ``best`` then asks it, on the same deterministic work budget as the exact improver,
# first fit or not: a schedule it finds (replayed by the simulator) is the answer, and when it
# proves that none fits, the answer is ``infeasible``, proven. So on those chains ``best`` finds a
# schedule wherever CP-SAT does within that work, and ``--min-memory``'s bisection with it.


def _find(chain: Chain, platform: Platform, result: Result, work: float, kept: frozenset[int], deadline: float,
          info: dict, t0: float) -> Result:
    """``result`` (infeasible) replaced by CP-SAT's schedule when it finds one (NOTE [ best when
    the search finds nothing ]), or marked proven when CP-SAT proves that nothing fits."""
    from . import lns

    found = lns.find(chain, platform, work=work, keep=kept, deadline=deadline)
    if found is None:
        return result
    info = {**result.info, "lns": found.info}
    if found.schedule is None:
        return result.replace(info=info, message=f"{result.message}; CP-SAT proved that no schedule fits",
                              runtime=time.perf_counter() - t0)
    info.pop("least_peak", None)
    info.update(units=list(found.schedule.offloaded_units),
                alone=[t.unit for t in found.schedule.transfers if t.kind == "offload" and t.moves == "act"],
                found_by="cpsat")
    bound = max(found.lower_bound, info.get("lp_bound", -math.inf))
    return Result("best", Status.OPTIMAL if found.optimal else Status.FEASIBLE, found.schedule,
                  makespan=found.makespan, lower_bound=bound if math.isfinite(bound) else math.nan,
                  runtime=time.perf_counter() - t0, info=info)


def default_time_limit(length: int) -> float:
    """5 s plus 0.5 ms per stage: a wall-clock cap for callers that run ``best`` under a clock
    of their own (``cpsat``'s warm start); ``best`` itself has no default time limit."""
    return 5.0 + 5e-4 * length


#: The default work budget of the search, in stage-evaluations (NOTE [ best's work budget ]).
EVAL_WORK = 2_000_000

#: Evaluations the search may make when a time limit is given and ``max_evals`` is not.
TIMED_MAX_EVALS = 4000


def default_max_evals(length: int) -> int:
    """The search's evaluations without a time limit: ``EVAL_WORK / L``, between 20 and 4000
    (4000 up to L = 500, 200 at L = 10,000, 20 from L = 100,000)."""
    return int(min(TIMED_MAX_EVALS, max(20, EVAL_WORK // max(length, 1))))


def best(
    chain: Chain,
    platform: Platform,
    *,
    time_limit: float | None = None,
    max_evals: int | None = None,
    relaxations: bool = True,
    remat: bool = False,
    keep: Iterable[int] = (),
    first_fit: bool = False,
    cpsat_work: float | None = None,
) -> Result:
    """Local search over offload sets and triggers from the better of ``lp`` and ``dp``.

    See NOTE [ local improvement ]. Never worse than any baseline when the time limit lets
    every starting point run: their unit sets are starting points and only strict
    improvements are accepted.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds the whole method may take, starting points included (> 0; they get at most
        ``START_SHARE`` of it). Past it the best schedule found so far is returned
        (``info["stopped"]`` is ``"time"``; status ``timeout`` when none fits yet); the result
        may then depend on the machine. ``None`` (default): no clock at all (NOTE [ best's
        work budget ]): the starts run to their end and ``max_evals`` stops the search.
    max_evals
        Evaluations the search may make (>= 1): unit sets planned or transfer lists scored.
        ``None`` (default): :func:`default_max_evals` without a time limit, 4000 with one.
    relaxations
        Start from ``lp`` and ``dp`` too (false: baselines only; for comparisons).
    remat
        Also run ``joint`` (rematerialization + offloading) and keep it when it is faster;
        its schedules recompute, which the torch executor does not run.
    keep
        Units (stages 1..L) that must stay resident: no start or move offloads one (``joint``,
        with ``remat``, is given the same ``keep``).
    first_fit
        Stop at the first schedule that fits, the makespan not searched further (what a memory
        search asks: :func:`chainoffload.minimum_memory` passes it). Fits exactly when the full
        search would: the walk is the same up to that schedule.
    cpsat_work
        Deterministic seconds (CP-SAT's own count of work) of the exact improver after the
        local search (NOTE [ large neighbourhood search ] in ``lns.py``): windows of stages
        re-solved by CP-SAT, then the whole chain when it is short; ``None`` (default):
        :func:`chainoffload.solvers.lns.default_work` (``CPSAT_WORK``, 2.0, or the environment
        variable ``CHAINOFFLOAD_CPSAT_WORK``); ``0``: no exact improver. It runs on
        chains of at most ``WINDOW_MAX_STAGES`` stages whose schedule is more than
        ``LNS_GAP`` above the problem's bound, or (the whole-chain step alone, on at most
        ``STALL_WORK``) whose bound leaves more than ``STALL_SHARE`` of its stall open (NOTE
        [ exact improver's gap ]); not with ``first_fit``.

    Returns
    -------
    Result
        ``info`` holds ``start`` (the name of the starting point the search improved),
        ``restart`` (the restart point whose walk won, or ``None``: ``NOTE [ local improvement ]``),
        ``evals``, ``evals_per_s`` (of the search), ``stopped`` (``converged``, ``evals``,
        ``time`` or ``first fit``), ``units``, ``alone`` (those of them that move a_i alone), each start's makespan, ``starts_skipped`` (those the time
        limit left out), ``lns`` (what the exact improver did: ``Improvement.info``), and
        ``found_by`` (``"cpsat"`` when the search found nothing and CP-SAT found the schedule:
        NOTE [ best when the search finds nothing ]), ``improved_by`` (``"cpsat"``: the exact
        improver's schedule; ``"cpsat rung"``: the one the bound ladder's ``cpsat`` rung found
        below the improver's, NOTE [ cpsat bound rung ]).
        Status ``optimal`` when CP-SAT proved the schedule optimal.
    """
    timed = time_limit is not None
    if timed and (isinstance(time_limit, bool) or not (isinstance(time_limit, (int, float)) and time_limit > 0 and math.isfinite(time_limit))):
        raise OptionError(f"time_limit: {time_limit!r} must be a number of seconds > 0")
    if max_evals is None:
        max_evals = TIMED_MAX_EVALS if timed else default_max_evals(chain.length)
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise OptionError(f"max_evals: expected an integer >= 1, got {max_evals!r}")
    if not isinstance(first_fit, bool):
        raise OptionError(f"first_fit: expected true or false, got {first_fit!r}")
    from . import lns

    if cpsat_work is None:
        try:
            cpsat_work = lns.default_work()
        except ValueError as exc:
            raise OptionError(str(exc)) from None
    if isinstance(cpsat_work, bool) or not isinstance(cpsat_work, (int, float)) or not (0 <= cpsat_work < math.inf):
        raise OptionError(f"cpsat_work: {cpsat_work!r} must be a number of deterministic seconds >= 0")
    from ._options import check_keep

    kept = check_keep(chain, keep)
    t0 = time.perf_counter()
    deadline = t0 + time_limit if timed else math.inf
    if timed and remat:
        time_limit = (1 - REMAT_SHARE) * time_limit  # the pure-offloading part's own limit
    with progress("best", total=time_limit if timed else None, unit="s") as bar:
        starts, info = _start_sets(chain, platform, relaxations, kept, t0 + START_SHARE * time_limit if timed else None)
        fallback = info.pop("_fallback")
        bar.set(time.perf_counter() - t0)
        bound = max(chain.compute_time, info.get("lp_bound", 0.0))
        search = Evaluator(chain, platform, deadline=t0 + time_limit if timed else math.inf, max_evals=max_evals, bound=bound)
        walk = _Search(search, bar, first_fit)
        walk.t0 = t0
        current: Candidate | None = None
        start_name = None
        for name in sorted(starts, key=_PREFERENCE.index):
            if search.exhausted or not search.fits(len(starts[name])):
                break
            s = search.units(starts[name])
            if _beats(s, current):
                start_name, current = name, s
        if current is None and not search.exhausted:  # no start had a schedule: begin from nothing offloaded
            start_name, current = "keep-all", search.units(())
        if current is None or (timed and fallback is not None and not current.feasible):
            # Out of time before the search could hold a candidate of its own (NOTE [ clock ]):
            # the fastest start's schedule, or none.
            return _cut_short(chain, platform, fallback, info, search, time_limit, t0)
        t_search, evals0 = time.perf_counter(), search.evals
        candidates = [u for u in range(1, chain.length) if u not in kept] if platform.can_transfer else []
        current = walk.walk(current, candidates)
        current, restart = walk.restart(current, candidates)
        spent = time.perf_counter() - t_search
    info.update(
        start=start_name,
        restart=restart,
        evals=search.evals,
        evals_per_s=(search.evals - evals0) / spent if spent > 0 else math.nan,
        stopped=search.stopped or ("time" if info.get("starts_skipped") else "first fit" if first_fit and current.feasible else "converged"),
        units=list(current.units),
        alone=list(current.alone),
    )
    result: Result
    if fallback is not None and (not current.feasible or fallback.makespan < current.makespan * (1 - _EPS)):
        # A start's own schedule beats what the search holds (the search could not plan every
        # start again before its deadline, or planned one differently): never worse than a
        # start that produced a schedule.
        info.update(start=fallback.info.get("start_method"), units=list(fallback.schedule.offloaded_units),
                    alone=[t.unit for t in fallback.schedule.transfers if t.kind == "offload" and t.moves == "act"],
                    kept_start_schedule=True)
        result = Result(
            "best", Status.FEASIBLE, fallback.schedule, makespan=fallback.makespan,
            lower_bound=info.get("lp_bound", math.nan), runtime=time.perf_counter() - t0, info=info,
        )
    elif current.feasible:
        result = Result(
            "best",
            Status.FEASIBLE,
            current.schedule(),
            makespan=current.makespan,
            lower_bound=info.get("lp_bound", math.nan),
            runtime=time.perf_counter() - t0,
            info=info,
        )
    else:
        timed_out = info["stopped"] == "time"
        result = Result(
            "best",
            Status.TIMEOUT if timed_out else Status.INFEASIBLE,
            None,
            lower_bound=info.get("lp_bound", math.nan),
            runtime=time.perf_counter() - t0,
            info={**info, "least_peak": int(current.peak)},
            message=(
                search.timeout_message("best", "a schedule", time_limit)
                if timed_out
                else f"best: no schedule found fits in {platform.memory} B (least peak seen {current.peak} B)"
            ),
        )
    if cpsat_work > 0 and result.status == Status.INFEASIBLE and chain.length <= lns.WHOLE_MAX_STAGES and platform.can_transfer:
        # NOTE [ best when the search finds nothing ]
        result = _find(chain, platform, result, float(cpsat_work), kept, deadline, info, t0)
    elif cpsat_work > 0 and result.feasible and not first_fit and chain.length <= lns.WINDOW_MAX_STAGES:
        result = _exact(chain, platform, result, float(cpsat_work), kept, deadline, info)
    # The whole call's time, the exact improver and the ladder's bound included (the result of the
    # local search carried its own: compare.py's runtimes left CP-SAT's seconds out).
    result = result.replace(runtime=time.perf_counter() - t0)
    if remat:
        from .joint import joint

        # joint compares with a pure-offloading result: this one, not a second search; under a
        # clock it gets what the pure-offloading part left (REMAT_SHARE of the limit at least).
        # joint takes keep as this search does (NOTE [ joint: keep ] in joint.py).
        other = joint(chain, platform, offload=result, keep=kept,
                      time_limit=max(deadline - time.perf_counter(), 1e-3) if timed else None)
        if other.status.has_schedule and (not result.status.has_schedule or other.makespan < result.makespan):
            # The pure-offloading bound does not bind a schedule that recomputes.
            result = other.replace(method="best", runtime=time.perf_counter() - t0, info={**info, "remat": other.info})
    return result
