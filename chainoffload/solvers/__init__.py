"""One front door, :func:`solve`, over an explicit registry of methods.

Every method has the same call shape, ``func(chain, platform, **options) -> Result``, and every
result goes through the one simulator here before it is returned: the makespan, peak and
offloaded bytes a caller sees are the simulator's, and a schedule the simulator rejects is never
reported as feasible.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import time
from typing import Any, Callable

import numpy as np

from ..chain import Chain, ChainError
from ..platform import Platform, PlatformError
from ..result import Result, Status
from ..schedule import ScheduleError
from ..simulate import simulate

__all__ = [
    "solve",
    "methods",
    "register",
    "SolverSpec",
    "DEFAULT_METHOD",
    "OptionError",
    "check_memory_floor",
    "check_keep",
    "minimum_memory",
    "check_time_limit",
]


class OptionError(ValueError):
    """An unknown method, or a method's option that is unknown or out of range: misuse, which
    :func:`solve` raises.

    Methods raise it for a bad option value (``slots=0``) so that :func:`solve` can tell misuse
    from a method that fails, which it reports as a result with status ``error`` instead.
    """


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    """A registered method.

    Attributes
    ----------
    name
        Registry name (``--method NAME``).
    target
        ``"module:function"`` (imported on first use, so optional dependencies stay optional)
        or the callable itself.
    summary
        One line for ``chainoffload methods``.
    remat
        Whether the method may recompute (its schedules may hold Fck / Fn ops).
    remat_option
        For a method that recomputes only when asked: the name of the boolean option that
        allows it (``best``'s ``remat``).
    """

    name: str
    target: str | Callable[..., Result]
    summary: str
    remat: bool = False
    remat_option: str | None = None

    def load(self) -> Callable[..., Result]:
        """The solver function."""
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


_B = "chainoffload.solvers.baselines"

# The registry: explicit, in the order `chainoffload methods` lists it.
_REGISTRY: dict[str, SolverSpec] = {
    spec.name: spec
    for spec in (
        SolverSpec("keep-all", f"{_B}:keep_all", "no offload; infeasible if the activations do not fit"),
        SolverSpec(
            "offload-all",
            f"{_B}:offload_all",
            "vDNN: offload every unit as soon as it is made, prefetch it one stage ahead",
        ),
        SolverSpec("first-k", f"{_B}:first_k", "TransformerEngine: offload the first k units, smallest k that fits"),
        SolverSpec("largest-first", f"{_B}:largest_first", "torchtitan-style: offload the largest units until it fits"),
        SolverSpec("lp", "chainoffload.solvers.lp:lp", "fluid LP relaxation (proven lower bound), rounded into whole units and planned"),
        SolverSpec("dp", "chainoffload.solvers.dp:dp", "fluid DP over stages with memory in slots, planned and repaired by bisection"),
        SolverSpec("best", "chainoffload.solvers.best:best", "local search from lp, dp and every baseline over units and triggers; never worse than a baseline", remat_option="remat"),
        SolverSpec("cpsat", "chainoffload.solvers.cpsat:cpsat", "exact CP-SAT model of the rules (small chains); proven optimum or bound"),
        SolverSpec("rotor", "chainoffload.solvers.rotor:rotor", "rotor DP: optimal persistent checkpointing, no offload", remat=True),
        SolverSpec("sqrt-checkpoint", "chainoffload.solvers.remat_baselines:sqrt_checkpoint", "Chen et al.: keep the input of every sqrt(L)-stage segment, recompute the rest", remat=True),
        SolverSpec("recompute-all", "chainoffload.solvers.remat_baselines:recompute_all", "keep only a_0; recompute up to each stage before its backward (least memory)", remat=True),
        SolverSpec("joint", "chainoffload.solvers.joint:joint", "joint DP of rematerialization and offloading (best of it, rotor, pure offload)", remat=True),
    )
}

#: The method :func:`solve` uses when none is named.
DEFAULT_METHOD = "best"


def methods() -> dict[str, str]:
    """The registered methods, name to one-line summary, in listing order."""
    return {name: spec.summary for name, spec in _REGISTRY.items()}


def register(name: str, func: Callable[..., Result], summary: str, *, remat: bool = False, replace: bool = False) -> None:
    """Add a method to the registry so that :func:`solve` and the CLI can use it.

    Parameters
    ----------
    name
        Registry name; must not clash with an existing one unless ``replace`` is true.
    func
        ``func(chain, platform, **options) -> Result``.
    summary
        One line for ``chainoffload methods``.
    remat
        Whether its schedules may recompute.
    replace
        Allow replacing a registered method of the same name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: name must be a non-empty string, got {name!r}")
    if not callable(func):
        raise TypeError(f"register: func for {name!r} is not callable")
    if name in _REGISTRY and not replace:
        raise ValueError(f"register: method {name!r} already exists (pass replace=True to replace it)")
    _REGISTRY[name] = SolverSpec(name, func, summary, remat)


def spec(name: str) -> SolverSpec:
    """The registry entry of ``name``; unknown names raise with the list of known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(f"method: unknown method {name!r}; known: {', '.join(_REGISTRY)}") from None


def check_memory_floor(chain: Chain, platform: Platform) -> None:
    """Raise :class:`PlatformError` when the memory is below what any schedule needs.

    That floor is :meth:`Chain.stage_memory_floor`: the memory one stage needs to run its own
    forward and backward with nothing else kept. Below it no method can succeed, so it is
    misuse, not an infeasible instance.
    """
    floor = chain.stage_memory_floor()
    if platform.memory < floor:
        raise PlatformError(
            f"platform.memory: {platform.memory} B is below {floor} B, the least any schedule of chain "
            f"{chain.name!r} needs (one stage's own forward and backward)"
        )


def check_keep(chain: Chain, keep: Any) -> frozenset[int]:
    """Validate a ``keep`` option: the units (stages 1..L) that must stay resident.

    Every pure-offloading method takes ``keep=``; none of its schedules offloads a unit in it.

    Parameters
    ----------
    chain
        The instance.
    keep
        An iterable of stages (integers in 1..L); empty means no constraint.

    Returns
    -------
    frozenset of int

    Raises
    ------
    ValueError
        ``keep`` is not an iterable of integers, or one of them is not a stage of ``chain``
        (the message names it).
    """
    if isinstance(keep, (str, bytes)) or not hasattr(keep, "__iter__"):
        raise OptionError(f"keep: expected a list of stages (integers in 1..{chain.length}), got {keep!r}")
    units = []
    for u in keep:
        if isinstance(u, bool) or not isinstance(u, (int, np.integer)):
            raise OptionError(f"keep: unit {u!r} is not an integer stage in 1..{chain.length}")
        if not 1 <= int(u) <= chain.length:
            raise OptionError(f"keep: unit {int(u)} is not a stage in 1..{chain.length} of chain {chain.name!r}")
        units.append(int(u))
    return frozenset(units)


def check_time_limit(time_limit: Any) -> float | None:
    """Validate a ``time_limit`` option: seconds > 0 (finite), or ``None`` for no limit.

    Raises
    ------
    OptionError
        Naming the value.
    """
    if time_limit is None:
        return None
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, (int, float, np.integer, np.floating))
        or not (time_limit > 0 and math.isfinite(time_limit))
    ):
        raise OptionError(f"time_limit: {time_limit!r} must be a number of seconds > 0")
    return float(time_limit)


def _judge_cost(chain: Chain) -> float:
    """Estimated seconds to validate and replay one schedule of ``chain`` (the judging); building
    it is the method's to reserve (NOTE [ clock ] in ``chainoffload/_clock.py``)."""
    from .._clock import judge_seconds

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
        Passed to the method (e.g. ``slots``). Every pure-offloading method takes ``keep``:
        units (stages 1..L) that must stay resident (see :func:`check_keep`). Every method
        takes ``time_limit`` (below).

    time_limit
        (An option every method takes.) Seconds of wall time the whole call may take: the
        method, the lower bound and the judging of its schedule, within 10 % + 0.5 s. The
        method gets the limit less an estimate of the judging; when it bites, it returns the
        best schedule found so far (``feasible``, ``info["stopped"] == "time"``) or status
        ``timeout`` when it has none. A one-off compile of the kernels the method needs
        happens before the clock starts and is reported in ``info["compile_time"]``, not in
        ``runtime`` (``NOTE [ lazy kernels ]`` in ``chainoffload/_compile.py``). ``None`` (the
        default): the method's own default (``best``: 5 s + 0.5 ms per stage; the others have
        none).

    Returns
    -------
    Result
        Its makespan, peak memory and offloaded bytes are the simulator's. A method that
        raises, returns something other than a :class:`Result`, returns a schedule that is
        malformed or that the simulator rejects, offloads a unit of ``keep``, or (registered
        without ``remat=True``) returns a schedule that recomputes, gets status ``error`` with
        the reason in ``message`` (never ``feasible``). A pure-offloading result with a
        schedule carries the strongest lower bound the budget affords, from a ladder climbed
        cheapest first: ``trivial`` (sum of op times), ``volume`` (closed form, O(L):
        :func:`chainoffload.bounds.volume_lower_bound`), ``fluid-lp`` (the fluid LP, when its
        estimated time fits what is left of ``time_limit``, or of ``max(1 s, the method's
        runtime)`` without one, or when a method already solved it), then any rung added with
        ``chainoffload.solvers._ladder.add_rung``; or the method's own bound when larger.
        ``info["bound"]`` names the one kept (``NOTE [ bound ladder ]`` in
        ``chainoffload/solvers/_ladder.py``); a rung whose solver fails is skipped, with the
        reason in ``info["lower_bound_note"]``. The climb stops once the bound meets the
        makespan, so ``keep-all`` never pays for more than the trivial bound.

    Raises
    ------
    ValueError
        Misuse: an unknown method, an unknown or bad option (:class:`OptionError`; a bad
        ``keep`` or ``time_limit`` too), or memory below :meth:`Chain.stage_memory_floor`
        (:class:`~chainoffload.PlatformError`).
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"solve: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"solve: platform must be a Platform, got {type(platform).__name__}")
    entry = spec(method or DEFAULT_METHOD)
    check_memory_floor(chain, platform)
    func = entry.load()
    time_limit = check_time_limit(options.pop("time_limit", None))
    params = _check_options(entry.name, func, options)
    keep = check_keep(chain, options["keep"]) if "keep" in options else frozenset()
    from .._compile import compiling, prepare

    # Kernels are made ready before the clock starts: a one-off compile counts in neither
    # the time limit nor the runtime (NOTE [ lazy kernels ]).
    with prepare(entry.name, chain.length) as ready:
        t0 = time.perf_counter()
        deadline = t0 + time_limit if time_limit is not None else math.inf
        if time_limit is not None and ("time_limit" in params or _takes_any(func)):
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
        return _finish(chain, platform, entry, result, elapsed, ready, jit.seconds, keep, may_recompute, time_limit, deadline)


def _finish(chain, platform, entry, result, elapsed, ready, compiled, keep, may_recompute, time_limit, deadline) -> Result:
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
    if pure and result.status.has_schedule:
        # Every pure-offloading result carries a bound of the problem, as strong as the budget
        # affords (NOTE [ bound ladder ]); a schedule that recomputes solves another problem.
        from ._ladder import DEFAULT_BOUND_BUDGET, climb

        if time_limit is not None:
            budget = deadline - time.perf_counter() - _judge_cost(chain)
        else:
            budget = max(DEFAULT_BOUND_BUDGET, runtime)
        own = result.lower_bound if math.isfinite(result.lower_bound) else -math.inf
        value, rung = own, f"{entry.name}'s own"
        notes: list[str] = []
        if own < result.makespan * (1 - 1e-12):
            got, name, _ = climb(chain, platform, budget, target=result.makespan, notes=notes)
            if got > value:
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


def _takes_any(func: Callable[..., Result]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(func).parameters.values())


def _check_options(name: str, func: Callable[..., Result], options: dict[str, Any]) -> list[str]:
    """Reject options the method does not take, naming the ones it does; return its option names.

    ``time_limit`` is :func:`solve`'s own and always accepted.
    """
    params = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    accepted = [n for n, p in list(params.items())[2:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) if accepted else "no options"
        raise OptionError(f"options: method {name!r} does not take {', '.join(unknown)}; it takes: {takes}")
    return accepted


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


def minimum_memory(
    chain: Chain,
    platform: Platform,
    method: str | None = None,
    *,
    rel_tol: float = 1e-3,
    **options: Any,
) -> int | None:
    """The smallest memory limit at which ``method`` finds a feasible schedule, by bisection.

    The search runs between a proven floor (no schedule of the method's kind fits below it:
    :func:`chainoffload.bounds.offload_memory_floor` for pure offloading,
    :meth:`Chain.stage_memory_floor` for methods that recompute) and the keep-all peak, at
    which every method fits. Bisection assumes feasibility is monotone in memory, which holds
    for the baselines and which the search methods aim for; the answer is a limit at which
    the method was seen to succeed, within ``rel_tol`` of the smallest such limit.

    Parameters
    ----------
    chain, platform
        The instance; ``platform.memory`` is ignored.
    method
        A registry name; ``None`` means :data:`DEFAULT_METHOD`.
    rel_tol
        Relative width of the final bracket (0 < rel_tol < 1); the bracket is at least 1 B.
    **options
        Passed to the method.

    Returns
    -------
    int or None
        Bytes; ``None`` when the method fails even at the keep-all peak.
    """
    from ..bounds import offload_memory_floor
    from ..simulate import keep_all_peak

    if not (isinstance(rel_tol, (int, float)) and 0 < rel_tol < 1):
        raise ValueError(f"rel_tol: expected a number in (0, 1), got {rel_tol!r}")
    entry = spec(method or DEFAULT_METHOD)
    lo = chain.stage_memory_floor() if entry.remat else offload_memory_floor(chain)
    hi = max(keep_all_peak(chain), lo)

    from .._progress import progress
    from ._search import boundary

    width = max(1, int(rel_tol * hi))
    steps = 2 + max(1, math.ceil(math.log2(max(hi - lo, 1) / width)))
    with progress("minimum memory", total=steps, unit="solve") as bar:

        def fits(memory: int) -> bool:
            ok = solve(chain, platform.with_memory(memory), entry.name, **options).feasible
            bar.update(1)
            bar.note(memory=memory, fits=ok)
            return ok

        if not fits(hi):
            return None
        if fits(lo):
            return lo
        # fails at lo, fits at hi: the least memory that fits lies in (lo, hi]
        return boundary(hi, lo, fits, width=lambda good: max(1, int(rel_tol * good)))
