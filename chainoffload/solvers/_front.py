"""The front door: :func:`solve`, the judging of every result by the simulator, and
:func:`minimum_memory`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from ..chain import Chain, ChainError
from ..platform import Platform, PlatformError
from ..result import Result, Status
from ..schedule import ScheduleError
from ..simulate import simulate
from ._options import OptionError, check_keep, check_memory_floor, check_options, check_time_limit, takes_any
from ._registry import DEFAULT_METHOD, spec

__all__ = ["solve", "judge", "minimum_memory", "memory_search", "MemorySearch"]


def _judge_cost(chain: Chain) -> float:
    """Estimated seconds to validate and replay one schedule of ``chain`` (the judging); building
    it is the method's to reserve (NOTE [ clock ] in ``chainoffload/_cost.py``)."""
    from .._cost import judge_seconds

    return judge_seconds(chain.length)


def solve(chain: Chain, platform: Platform, method: str | None = None, **options: Any) -> Result:
    """Solve the offloading problem of ``chain`` on ``platform`` with ``method``.

    Parameters
    ----------
    chain, platform
        The instance.
    method
        A registry name (see :func:`methods`); ``None`` means :data:`DEFAULT_METHOD`.
    **options
        Passed to the method (e.g. ``slots``). Every pure-offloading method and ``joint`` take
        ``keep``: units (stages 1..L) that must stay resident (see :func:`check_keep`). Every method
        takes ``time_limit`` (below).

    time_limit
        (An option every method takes.) Seconds of wall time the whole call may take: the
        method, the lower bound and the judging of its schedule, within 10 % + 0.5 s. The
        method gets the limit less an estimate of the judging; when it bites, it returns the
        best schedule found so far (``feasible``, ``info["stopped"] == "time"``) or status
        ``timeout`` when it has none. A one-off compile of the kernels the method needs
        happens before the clock starts and is reported in ``info["compile_time"]``, not in
        ``runtime`` (``NOTE [ lazy kernels ]`` in ``chainoffload/_compile.py``). ``None`` (the
        default): the method's own default: none for every method but ``cpsat`` (60 s);
        ``best`` then stops by its work budget and never reads the clock (NOTE [ best's work
        budget ]).

    Returns
    -------
    Result
        Its makespan, peak memory and offloaded bytes are the simulator's. A method that
        raises, returns something other than a :class:`Result`, returns a schedule that is
        malformed or that the simulator rejects, offloads a unit of ``keep``, or (registered
        without ``remat=True``) returns a schedule that recomputes, gets status ``error`` with
        the reason in ``message`` (never ``feasible``). A pure-offloading result with a
        schedule carries the problem's lower bound, :func:`chainoffload.bounds.problem_bound`
        (the same figure ``plot``, ``verify`` and ``tradeoff`` report): a ladder climbed
        cheapest first, ``trivial`` (sum of op times), ``volume`` (closed form, O(L)),
        ``fluid-lp`` (up to 2,000 stages), ``unit-milp`` (small models, SCIP's root node), then
        any rung added with ``chainoffload.bounds.ladder.add_rung``; which rungs run depends on
        the instance only, unless ``time_limit`` is set (then a rung that does not fit what is
        left is skipped, and the bound may depend on the machine). The method's own bound
        replaces it only when strictly larger (``cpsat``'s). ``info["bound"]`` names the one
        kept (``NOTE [ bound ladder ]`` in ``chainoffload/bounds/ladder.py``); a rung whose
        solver fails is skipped, with the reason in ``info["lower_bound_note"]``. The climb
        stops once the bound meets the makespan, so ``keep-all`` never pays for more than the
        trivial bound.

    Raises
    ------
    ValueError
        Misuse: an unknown method, an unknown or bad option (:class:`OptionError`; a bad
        ``keep`` or ``time_limit`` too), or memory below :meth:`Chain.stage_memory_floor`
        (:class:`~chainoffload.PlatformError`).
    """
    return _solve(chain, platform, method, True, options)


def _solve(chain: Chain, platform: Platform, method: str | None, bound: bool, options: dict[str, Any]) -> Result:
    """:func:`solve`; ``bound`` false leaves the bound ladder out (for :func:`minimum_memory`,
    which only asks whether a schedule fits)."""
    if not isinstance(chain, Chain):
        raise TypeError(f"solve: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"solve: platform must be a Platform, got {type(platform).__name__}")
    entry = spec(method or DEFAULT_METHOD)
    check_memory_floor(chain, platform)
    func = entry.load()
    time_limit = check_time_limit(options.pop("time_limit", None))
    params = check_options(entry.name, func, options)
    keep = check_keep(chain, options["keep"]) if "keep" in options else frozenset()
    from .._compile import compiling, prepare

    # Kernels are made ready before the clock starts: a one-off compile counts in neither
    # the time limit nor the runtime (NOTE [ lazy kernels ]).
    with prepare(entry.name, chain.length) as ready:
        from .._cost import forget

        forget()  # what an earlier solve measured says nothing reliable about this one
        t0 = time.perf_counter()
        deadline = t0 + time_limit if time_limit is not None else math.inf
        if time_limit is not None and ("time_limit" in params or takes_any(func)):
            # The method gets the limit less what judging its schedule is expected to take.
            options["time_limit"] = max(deadline - time.perf_counter() - _judge_cost(chain), 1e-3)
        with compiling() as jit:
            try:
                result = func(chain, platform, **options)
            except (OptionError, ChainError, PlatformError, ImportError):
                raise  # misuse, or a missing optional dependency: the caller's to fix
            except Exception as exc:  # the method failed: an outcome, reported as a status
                message = " ".join(f"{type(exc).__name__}: {exc}".split())
                if len(message) > 300:
                    message = message[:297] + "..."
                result = Result(entry.name, Status.ERROR, message=f"{entry.name}: the method raised {message}")
            elapsed = time.perf_counter() - t0
        if not isinstance(result, Result):
            result = Result(entry.name, Status.ERROR, message=f"{entry.name}: the method returned {type(result).__name__}, not a Result")
        may_recompute = entry.remat or (entry.remat_option is not None and bool(options.get(entry.remat_option)))
        return _finish(chain, platform, entry, result, elapsed, ready, jit.seconds, keep, may_recompute, time_limit, deadline, bound)


def _finish(chain, platform, entry, result, elapsed, ready, compiled, keep, may_recompute, time_limit, deadline, bound=True) -> Result:
    """The rest of :func:`solve`: runtime, the recompute check, the bound ladder, ``keep`` and the judging."""
    info = dict(result.info)
    if ready.seconds + compiled > 0:
        info["compile_time"] = ready.seconds + compiled
    info["kernels"] = ready.kernels
    # The method's time, without any compile it triggered itself (``ready``'s was before it).
    runtime = max((result.runtime or elapsed) - compiled, 0.0)
    result = result.replace(method=entry.name, runtime=runtime, info=info)
    if result.status == Status.ERROR:
        return result.replace(makespan=math.inf)
    if not may_recompute and result.schedule is not None and result.schedule.has_remat:
        return result.replace(
            status=Status.ERROR,
            makespan=math.inf,
            message=f"{entry.name}: its schedule recomputes (Fck/Fn ops or a repeated forward) but the method "
            "is registered without remat=True",
        )
    pure = not entry.remat and (result.schedule is None or not result.schedule.has_remat)
    if pure and result.status.has_schedule and bound:
        # Every pure-offloading result carries the problem's bound (NOTE [ bound ladder ]), the
        # one every command reports; a schedule that recomputes solves another problem.
        from ..bounds.ladder import climb

        limit = None if time_limit is None else max(deadline - time.perf_counter() - _judge_cost(chain), 0.0)
        own = result.lower_bound if math.isfinite(result.lower_bound) else -math.inf
        value, rung = own, f"{entry.name}'s own"
        notes: list[str] = []
        if own < result.makespan * (1 - 1e-12):
            got, name, _ = climb(chain, platform, limit, target=result.makespan, notes=notes)
            if got >= value:
                value, rung = got, name
        info["bound"] = rung
        if notes:
            kept = "sum(fwd) + sum(bwd)" if rung == "trivial" else f"the {rung} bound"
            info["lower_bound_note"] = "; ".join(notes) + f"; the bound is {kept}"
        result = result.replace(lower_bound=value, info=info)
    moved = sorted(keep & set(result.schedule.offloaded_units)) if result.schedule is not None else []
    if moved and result.status.has_schedule:
        # A bound of the unconstrained problem still binds the constrained one; the schedule does not.
        return judge(chain, platform, result).replace(
            status=Status.ERROR,
            makespan=math.inf,
            message=f"{entry.name}: its schedule offloads unit(s) {moved}, which keep says must stay resident",
        )
    return judge(chain, platform, result)


def judge(chain: Chain, platform: Platform, result: Result) -> Result:
    """Replay ``result.schedule`` in the simulator and take every figure from it.

    A schedule that is malformed, that the simulator rejects, whose simulated makespan is not
    finite, or whose claimed makespan differs from the simulated one, turns a feasible/optimal
    status into ``error``.
    """
    trivial = chain.compute_time
    lb = result.lower_bound
    lb = trivial if not (isinstance(lb, float) and math.isfinite(lb)) else max(lb, trivial)
    if result.schedule is None:
        if result.status.has_schedule:
            return result.replace(status=Status.ERROR, message=f"{result.method}: reported {result.status} without a schedule")
        return result.replace(lower_bound=lb if result.status != Status.INFEASIBLE else result.lower_bound)
    try:
        timeline = simulate(chain, platform, result.schedule)
    except (ScheduleError, PlatformError) as exc:
        return result.replace(
            status=Status.ERROR,
            makespan=math.inf,
            message=f"{result.method}: its schedule is malformed: {' '.join(str(exc).split())}",
        )
    changes: dict[str, Any] = {
        "timeline": timeline,
        "peak_memory": timeline.peak_memory,
        "offloaded_bytes": timeline.offloaded_bytes,
    }
    if result.status.has_schedule:
        claimed = result.makespan
        if not timeline.feasible:
            changes.update(
                status=Status.ERROR,
                makespan=math.inf,
                message=f"{result.method}: the simulator rejects its schedule: {timeline.violation.message}",
            )
        elif not math.isfinite(timeline.makespan):
            changes.update(
                status=Status.ERROR,
                makespan=math.inf,
                message=f"{result.method}: the simulated makespan is not finite ({timeline.makespan!r}): "
                "the times or transfer times overflow float64",
            )
        elif math.isfinite(claimed) and not math.isclose(claimed, timeline.makespan, rel_tol=1e-9, abs_tol=1e-12):
            changes.update(
                status=Status.ERROR,
                makespan=timeline.makespan,
                message=f"{result.method}: claimed makespan {claimed!r} but the simulator gives {timeline.makespan!r}",
            )
        else:
            # Float sums in another order may put the bound an ulp above the makespan.
            changes.update(makespan=timeline.makespan, lower_bound=min(lb, timeline.makespan))
            # A schedule that reaches the lower bound is proven optimal, whatever found it.
            if result.status == Status.FEASIBLE and timeline.makespan <= lb * (1 + 1e-12):
                changes.update(status=Status.OPTIMAL)
            if lb > timeline.makespan * (1 + 1e-9):
                changes.update(
                    status=Status.ERROR,
                    message=f"{result.method}: lower bound {lb!r} above the simulated makespan {timeline.makespan!r}",
                )
    else:
        changes.update(makespan=math.inf)
    return result.replace(**changes)


#: A timed bisection gives each solve at least 1 / SHARES of the time left.
SHARES = 4


@dataclasses.dataclass(frozen=True)
class MemorySearch:
    """What :func:`memory_search` found.

    Attributes
    ----------
    memory
        The least memory limit (bytes) at which the method was seen to find a schedule;
        ``None`` when it failed even at the keep-all peak, or no solve ended in time.
    below
        The highest memory known not to be enough for it (the proven floor when every limit
        tried above it fitted); ``memory - below`` is the bracket left.
    converged
        Whether the bracket is within the tolerance asked (false: the time limit stopped it).
    solves
        How many solves the bisection ran.
    stopped
        ``"time"`` when the time limit stopped the bisection, else ``""``.
    """

    memory: int | None
    below: int
    converged: bool
    solves: int
    stopped: str = ""


def minimum_memory(
    chain: Chain,
    platform: Platform,
    method: str | None = None,
    *,
    rel_tol: float = 1e-3,
    time_limit: float | None = None,
    **options: Any,
) -> int | None:
    """The smallest memory limit at which ``method`` finds a feasible schedule, by bisection.

    The search runs between a proven floor (no schedule of the method's kind fits below it:
    :func:`chainoffload.bounds.offload_memory_floor` for pure offloading,
    :meth:`Chain.stage_memory_floor` for methods that recompute) and the keep-all peak, at
    which every method fits. Bisection assumes feasibility is monotone in memory, which holds
    for the baselines and which the search methods aim for; the answer is a limit at which
    the method was seen to succeed, within ``rel_tol`` of the smallest such limit (unless
    ``time_limit`` stopped the bisection: :func:`memory_search` says whether it did).

    Parameters
    ----------
    chain, platform
        The instance; ``platform.memory`` is ignored.
    method
        A registry name; ``None`` means :data:`DEFAULT_METHOD`.
    rel_tol
        Relative width of the final bracket (0 < rel_tol < 1); the bracket is at least 1 B.
    time_limit
        Seconds the whole bisection may take, every solve included (``None``: no limit; each
        solve then runs by the method's own rules). The solves share it: each gets what is
        left over the solves still to go, or over :data:`SHARES` when more are to go. A solve that ends in ``timeout`` settles nothing, so
        the bisection stops there, and so it does once no time is left: the answer is then the
        least memory seen to fit so far.
    **options
        Passed to the method.

    Returns
    -------
    int or None
        Bytes; ``None`` when the method fails even at the keep-all peak (or, with a time limit,
        when no solve found a schedule in time).
    """
    return memory_search(chain, platform, method, rel_tol=rel_tol, time_limit=time_limit, **options).memory


def memory_search(
    chain: Chain,
    platform: Platform,
    method: str | None = None,
    *,
    rel_tol: float = 1e-3,
    time_limit: float | None = None,
    **options: Any,
) -> MemorySearch:
    """:func:`minimum_memory` with what the bisection knows when it stops: the bracket left,
    whether it converged, and the solves it ran (a :class:`MemorySearch`). Same parameters."""
    t0 = time.perf_counter()
    if not (isinstance(rel_tol, (int, float)) and 0 < rel_tol < 1):
        raise ValueError(f"rel_tol: expected a number in (0, 1), got {rel_tol!r}")
    time_limit = check_time_limit(time_limit)
    deadline = t0 + time_limit if time_limit is not None else math.inf
    entry = spec(method or DEFAULT_METHOD)
    from .._compile import prepare

    # The whole search under one decision on the kernels (NOTE [ lazy kernels ]): on a cold
    # cache with cold="interpret", the keep-all replay below would otherwise compile the
    # simulator's kernels in the middle of an interpreted command.
    with prepare(entry.name, chain.length):
        return _memory_search(chain, entry, platform, rel_tol, time_limit, deadline, options)


def _memory_search(
    chain: Chain,
    entry: Any,
    platform: Platform,
    rel_tol: float,
    time_limit: float | None,
    deadline: float,
    options: dict[str, Any],
) -> MemorySearch:
    """The bisection of :func:`memory_search`, its arguments checked."""
    from ..bounds import offload_memory_floor
    from ..simulate import keep_all_peak

    lo = chain.stage_memory_floor() if entry.remat else offload_memory_floor(chain)
    hi = max(keep_all_peak(chain), lo)

    from .._progress import progress
    from ._search import boundary

    width = max(1, int(rel_tol * hi))
    steps = 2 + max(1, math.ceil(math.log2(max(hi - lo, 1) / width)))
    state = {"solves": 0, "good": None, "bad": lo - 1, "stopped": ""}
    with progress("minimum memory", total=steps, unit="solve") as bar:

        def fits(memory: int) -> bool | None:
            step = dict(options)
            if entry.fits_option is not None:
                step.setdefault(entry.fits_option, True)  # whether one fits is all this asks
            if time_limit is not None:
                # The solves share the limit: this one gets a part of what is left, a quarter at
                # most (the first halvings narrow the bracket most; a method may use all it is
                # given, e.g. best at a limit where nothing fits).
                left = deadline - time.perf_counter()
                share = left / max(1, min(SHARES, steps - state["solves"]))
                if left <= 1e-3:
                    state["stopped"] = "time"
                    return None
                step["time_limit"] = max(share, 1e-3)
            res = _solve(chain, platform.with_memory(memory), entry.name, False, step)
            state["solves"] += 1
            bar.update(1)
            if res.status == Status.TIMEOUT:
                state["stopped"] = "time"  # settles nothing: out of time at this limit
                return None
            ok = res.feasible
            bar.note(memory=memory, fits=ok)
            if ok:
                state["good"] = memory if state["good"] is None else min(state["good"], memory)
            else:
                state["bad"] = max(state["bad"], memory)
            return ok

        first = fits(hi)
        if first and fits(lo) is False:
            # fails at lo, fits at hi: the least memory that fits lies in (lo, hi]
            boundary(hi, lo, fits, width=lambda good: max(1, int(rel_tol * good)))
    if first is False:  # fails even at the keep-all peak: that is the answer
        return MemorySearch(None, hi, True, state["solves"])
    return MemorySearch(state["good"], state["bad"], not state["stopped"], state["solves"], state["stopped"])
