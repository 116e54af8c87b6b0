"""The one unit-set search of the pure-offloading methods: score offload sets on arrays.

Private. Every method that chooses units (the baselines, ``lp``, ``dp``, ``best``) and
:func:`chainoffload.planner.plan_and_simulate` go through :class:`Evaluator`:

* :meth:`Evaluator.units` plans a set of units (the planner's safe and optimistic sweeps and
  the eager timing, :func:`chainoffload.planner.plan_arrays`), resolves and replays each plan
  with the simulator's own kernels (``chainoffload.schedule.resolve`` and
  ``chainoffload.simulate.replay``: the same code :func:`chainoffload.simulate` runs, minus
  building and validating a :class:`~chainoffload.Schedule`, which ``NOTE [ search without
  objects ]`` argues is safe) and keeps the best as a :class:`Candidate`, cached per set;
* :meth:`Evaluator.transfers` scores a changed transfer list (``best``'s trigger moves);
* :meth:`Evaluator.consider` and :meth:`Evaluator.prefixes` keep the best feasible candidate
  seen, and :func:`boundary` is the one bisection (prefixes of an order, the DP's budget, the
  least memory);
* every one of them stops at the evaluator's deadline and evaluation budget.

Only the winner becomes a :class:`~chainoffload.Schedule` (:meth:`Candidate.schedule`), and
:func:`chainoffload.solve` then replays it through :func:`chainoffload.simulate`, the one judge.

NOTE [ search without objects ]
-------------------------------
A candidate here is five int64 arrays (kind, unit, op, at, before of each transfer) on the
fixed order. The planner writes them well formed by construction (units in 1..L, one offload
and one prefetch each, triggers and ``before`` in range, prefetch after its offload), and
``best``'s moves are checked by :func:`well_formed` (the same field rules as
:meth:`Schedule.validate`, vectorised) before they are scored. So the validation a
:class:`Schedule` would run finds nothing to say, and skipping it changes no verdict: a
candidate's figures are the kernel's, the same numbers :func:`chainoffload.simulate` returns for
its schedule (a test replays winners both ways). Building the objects was 55-68 % of ``best``'s
time at L = 100..1000.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..chain import Chain
from ..planner import Candidate, check_units, fixed_arrays, plan_units, saved_table, score
from ..platform import Platform
from ..units import format_seconds

__all__ = ["Candidate", "Evaluator", "boundary", "well_formed", "fixed_arrays"]

_EPS = 1e-12

# NOTE [ prefixes that fit below one that does not ]
# ---------------------------------------------------
# Offloading a longer prefix frees more memory, so the bisection of :meth:`Evaluator.prefixes`
# takes fitting as monotone in the prefix's length and gives up when the whole order does not
# fit. With zero-length ops it is not always monotone: on ``SCAN_CHAIN`` of
# ``tests/test_zero_length.py`` the planner's plan of {1, 2, 3} fits and that of {1, 2, 3, 4}
# does not (chain 74 of issue 33's benchmark was such a case until the planner stopped counting
# originals at B_{V+1}: NOTE [ the original is gone when B_{v+1} starts ]). So a caller that
# has nothing that fits (``scan=True``: first-k; ``lp`` while it has no schedule) tries the
# shorter prefixes, longest first (the likeliest to fit), and bisects below the first that
# fits. A search that finds a fitting prefix today never scans, so its result and time are
# unchanged. The scan costs at most ``SCAN_STAGES`` stages of planning (a plan of L stages
# counts L): every prefix up to L = 100, one at L = 10^4, none past it. Measured on first-k
# (random chains, memory one byte below the offload floor, best of 3 on a loaded 2-core
# machine): 3 ms -> 27 ms at L = 10^3 (10 more plans), 30 -> 58 ms at L = 10^4, 0.37 s both
# at L = 10^5; at the floor, where the whole order fits, the same plans and time as before.
#: Stages of planning (a plan of L stages counts L) the scan of shorter prefixes may spend.
SCAN_STAGES = 10_000


def well_formed(n_ops: int, transfers: tuple[np.ndarray, ...]) -> bool:
    """Whether transfer arrays on ``n_ops`` fixed-order ops keep :meth:`Schedule.validate`'s field rules.

    Units are taken as given (a move never changes one); checked: triggers and ``before`` in
    range and ``before`` after the trigger op; each prefetch not triggered before its offload
    (list order at one event).
    """
    kind, unit, op, at, before = transfers
    if op.shape[0] == 0:
        return True
    if op.min() < 0 or op.max() >= n_ops:
        return False
    waits = before >= 0
    if np.any(before[waits] <= op[waits]) or np.any(before[waits] >= n_ops):
        return False
    # (event, list index) of each unit's offload must come before its prefetch's.
    key = (2 * op + at) * op.shape[0] + np.arange(op.shape[0])
    off = kind == 0
    length = int(unit.max()) + 1
    off_key = np.empty(length, dtype=np.int64)
    off_key[unit[off]] = key[off]
    return bool(np.all(key[~off] > off_key[unit[~off]]))


def _observe(length: int, seconds: float) -> None:
    from .._cost import observe

    observe(length, seconds)


class Evaluator:
    """Scores offload sets and transfer lists within a deadline and an evaluation budget.

    Parameters
    ----------
    chain, platform
        The instance.
    deadline
        ``time.perf_counter()`` value by which the method must be done (``inf``: none):
        :attr:`exhausted` is true once the next evaluation and building the best candidate's
        schedule would not end before it (:meth:`reserve`).
    max_evals
        Evaluations (unit sets planned, or transfer lists scored) after which it is exhausted.
    bound
        A lower bound on the makespan: a candidate that reaches it ends the search (:attr:`done`).
    """

    def __init__(
        self,
        chain: Chain,
        platform: Platform,
        *,
        deadline: float = math.inf,
        max_evals: float = math.inf,
        bound: float = 0.0,
    ) -> None:
        self.chain = chain
        self.platform = platform
        self.deadline = deadline
        self.max_evals = max_evals
        self.bound = bound
        self.evals = 0
        self.stopped = ""
        #: Seconds the first evaluation was estimated to need when the deadline refused it
        #: before any evaluation ran (``None`` otherwise): :meth:`timeout_message`.
        self.short: float | None = None
        self.cache: dict[tuple[int, ...], Candidate] = {}
        self.best: Candidate | None = None
        self.order = 0
        self._ops = fixed_arrays(chain.length)
        self._saved = saved_table(chain)

    # -- budget ------------------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """Out of evaluations or past the deadline (``stopped`` says which)."""
        if self.evals >= self.max_evals:
            self.stopped = self.stopped or "evals"
            return True
        need = self.reserve()
        if time.perf_counter() + need > self.deadline:
            self.refused(need)
            return True
        return False

    def reserve(self, units: int | None = None) -> float:
        """Seconds the next evaluation and building the schedule of the best candidate, or of
        the next one (``units`` units, two transfers each) when that is larger, are expected to
        take (``NOTE [ clock ]``): neither can be cut once started, and at 10^6 stages each takes
        seconds, so an evaluation that could not end with its schedule built by the deadline is
        not started."""
        if self.deadline == math.inf:
            return 0.0
        from .._cost import build_seconds, eval_seconds

        held = self.best.transfers[0].shape[0] if self.best is not None else 0
        return eval_seconds(self.chain.length) + build_seconds(max(held, 2 * (units or 0)))

    def fits(self, units: int) -> bool:
        """Whether an evaluation of a set of ``units`` units may start (:meth:`reserve`); sets
        ``stopped`` when not."""
        need = self.reserve(units)
        if time.perf_counter() + need > self.deadline:
            self.refused(need)
            return False
        return True

    def refused(self, need: float) -> None:
        """Note that work estimated at ``need`` seconds was not started for the deadline."""
        self.stopped = self.stopped or "time"
        if self.evals == 0 and self.short is None:
            self.short = need

    def timeout_message(self, method: str, what: str, time_limit: float | None) -> str:
        """Why ``method`` ends with no ``what`` that fits under ``time_limit`` (its share of the
        user's limit): the time ran out, or, nothing evaluated, one evaluation was estimated not
        to end within it (NOTE [ clock ]), which a longer limit cures and a retry does not."""
        left = "" if time_limit is None else f" ({format_seconds(time_limit)} of it left for the search)"
        if self.evals == 0 and self.short is not None:
            return (
                f"{method}: the time limit{left} is shorter than one evaluation of {self.chain.length:,} stages "
                f"with its schedule built, estimated at {format_seconds(self.short)} at this load: nothing was tried; "
                "give a longer time limit or none"
            )
        return f"{method}: the time limit{left} ran out before {what} that fits was found"

    def at_bound(self, candidate: Candidate | None) -> bool:
        """Whether ``candidate`` is feasible and reaches the lower bound (nothing can beat it)."""
        return candidate is not None and candidate.feasible and candidate.makespan <= self.bound * (1 + _EPS)

    @property
    def done(self) -> bool:
        """Exhausted, or the best candidate reaches the bound."""
        return self.at_bound(self.best) or self.exhausted

    # -- scoring -----------------------------------------------------------------------------

    def _score(self, units: tuple[int, ...], transfers: tuple[np.ndarray, ...], alone: tuple[int, ...] = ()) -> Candidate:
        return score(self.chain, self.platform, units, transfers, self._ops, self._saved, alone)

    def units(self, units: Iterable[int], alone: Iterable[int] = ()) -> Candidate:
        """Plan ``units`` and score the planner's best plan (cached per set; one evaluation).

        The units in ``alone`` (a subset of ``units``) move a_i alone (``moves: "act"``).
        Raises ``ValueError`` for a unit outside 1..L or units over a link of bandwidth 0.
        """
        chosen = check_units(self.chain, self.platform, units)
        act = tuple(sorted({int(u) for u in alone} & set(chosen.tolist())))
        key = tuple(chosen.tolist()) + tuple(-u for u in act)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        self.evals += 1
        t0 = time.perf_counter()
        best = plan_units(self.chain, self.platform, chosen, self._ops, self._saved, act)
        if chosen.shape[0]:  # the empty set is not planned: its time would understate the next one
            _observe(self.chain.length, time.perf_counter() - t0)
        self.cache[key] = best
        return best

    def transfers(
        self, units: tuple[int, ...], transfers: tuple[np.ndarray, ...], alone: tuple[int, ...] = ()
    ) -> Candidate | None:
        """Score a changed transfer list of the same units (and moves); ``None`` when it is not well formed."""
        self.evals += 1
        if not well_formed(2 * self.chain.length, transfers):
            return None
        return self._score(units, transfers, alone)

    # -- keeping the best --------------------------------------------------------------------

    def offer(self, candidate: Candidate, source: str) -> None:
        """Keep ``candidate`` if it is feasible and ranks before the best so far."""
        if candidate.feasible and (self.best is None or candidate.rank < self.best.rank):
            candidate.source = candidate.source or source
            self.best = candidate

    def consider(self, units: Iterable[int], source: str) -> bool | None:
        """Plan and judge one set; ``None`` when the search is done, else whether it fits."""
        key = tuple(sorted({int(u) for u in units}))
        hit = self.cache.get(key)
        if hit is not None:
            return hit.feasible
        if self.done or not self.fits(len(key)):
            return None
        cand = self.units(key)
        self.offer(cand, source)
        return cand.feasible

    def prefixes(self, order: Sequence[int], source: str, extra: int = 0, scan: bool = False) -> int | None:
        """The shortest prefix of ``order`` that fits, by bisection; then ``extra`` longer ones.

        Fitting is taken as monotone in the prefix (offloading more frees more). When the whole
        order does not fit and ``scan`` is set, shorter prefixes are tried longest first within
        :data:`SCAN_STAGES` (``NOTE [ prefixes that fit below one that does not ]``), and the
        bisection runs below the first that fits. Returns the length of the shortest prefix
        found to fit, or ``None`` (none found, or the search ran out before it was known).
        """
        if not order:
            return 0 if self.consider((), source) else None
        full = order
        whole = self.consider(order, f"{source} (all {len(order)})")
        if whole is None:
            return None
        if not whole:
            top = self._scan(order, source) if scan else None
            if top is None:
                return None
            if top == 0:
                return 0
            order = order[:top]
        if self.consider((), "keep-all"):
            return 0
        found = boundary(len(order), 0, lambda k: self.consider(order[:k], f"{source} (first {k})"))
        if found is None:
            return None
        for more in range(1, extra + 1):
            if found + more <= len(full):
                self.consider(full[: found + more], f"{source} (first {found + more})")
        return found

    def _scan(self, order: Sequence[int], source: str) -> int | None:
        """The longest proper prefix of ``order`` that fits, tried longest first, at most
        :data:`SCAN_STAGES` stages of planning in all; ``None`` when none tried fits."""
        tries = min(len(order), SCAN_STAGES // max(self.chain.length, 1))
        for k in range(len(order) - 1, len(order) - 1 - tries, -1):
            ok = self.consider(order[:k], f"{source} (first {k})" if k else "keep-all")
            if ok is None:
                return None
            if ok:
                return k
        return None

    def min_memory(self) -> int | None:
        """A memory at which the least-peak candidate tried fits, or ``None``.

        The candidate with the lowest peak whose only fault is memory is planned again with that
        peak as the limit; if the simulator accepts it there, that peak is a memory at which the
        method succeeds (not proven the least).
        """
        over = [(c.peak, key) for key, c in self.cache.items() if c.rule == 1]
        if not over:
            return None
        peak, key = min(over)
        wider = Evaluator(self.chain, self.platform.with_memory(peak))
        return int(peak) if wider.units(key).feasible else None


def boundary(
    good: int,
    bad: int,
    test: Callable[[int], bool | None],
    *,
    width: int | Callable[[int], int] = 1,
    steps: int | None = None,
) -> int | None:
    """Bisection between an integer where ``test`` holds (``good``) and one where it fails (``bad``).

    The one bisection of the package: the shortest prefix that fits (good = the whole order,
    bad = 0), the least memory (good = high, bad = low) and the largest DP budget that works
    (good = low, bad = high). ``test`` returning ``None`` means the search is out of budget.

    Parameters
    ----------
    good, bad
        Ends of the bracket (either may be the larger); ``test`` is not called on them.
    test
        Whether a point is good; ``None`` stops the bisection.
    width
        Stop when the bracket is this narrow (or a function of the good end giving it).
    steps
        Stop after this many tests (``None``: no limit).

    Returns
    -------
    int or None
        The good end of the final bracket (the point closest to ``bad`` known to be good);
        ``None`` when ``test`` stopped the bisection.
    """
    done = 0
    narrow = width if callable(width) else (lambda _good: width)
    while abs(good - bad) > narrow(good) and (steps is None or done < steps):
        mid = (good + bad) // 2
        ok = test(mid)
        done += 1
        if ok is None:
            return None
        if ok:
            good = mid
        else:
            bad = mid
    return good
