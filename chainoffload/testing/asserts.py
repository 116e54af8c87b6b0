"""Assertions for tests of solvers: re-simulate and compare, with messages that say what is off.

These do not need Hypothesis. Each raises :class:`AssertionError` with a message naming the
method, the figure and both values.
"""

from __future__ import annotations

import math

from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import Timeline, simulate

__all__ = ["assert_feasible", "assert_no_better_than_optimal", "REL_TOL"]

#: Relative tolerance of makespan comparisons (the one ``solve()`` uses to judge claims).
REL_TOL = 1e-9
_ABS_TOL = 1e-12


def _check_tol(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite tolerance >= 0, got {value!r}")


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=_ABS_TOL)


def assert_feasible(
    result_or_timeline: Result | Timeline | Schedule,
    chain: Chain | None = None,
    platform: Platform | None = None,
    *,
    rel_tol: float = REL_TOL,
) -> Timeline:
    """Re-simulate a result (or timeline, or schedule) and check that it is feasible as claimed.

    Checked: there is a schedule; the simulator accepts it on ``platform`` (no violation), its
    peak memory is at most ``platform.memory``; and for a :class:`~chainoffload.Result` or a
    :class:`~chainoffload.Timeline`, the makespan, peak memory and offloaded bytes it reports are
    the simulator's, and (for a result) ``compute_time <= lower_bound <= makespan``.

    Parameters
    ----------
    result_or_timeline
        A :class:`~chainoffload.Result` with a schedule (status optimal or feasible), a
        :class:`~chainoffload.Timeline`, or a bare :class:`~chainoffload.Schedule`.
    chain, platform
        The instance. Optional for a timeline, and for a result that went through
        :func:`~chainoffload.solve` (its ``timeline`` holds them); required for a bare
        schedule, and for a result built by hand. When given, they are what is checked against.
    rel_tol
        Relative tolerance on the makespan comparison.

    Returns
    -------
    Timeline
        The fresh simulation.

    Raises
    ------
    AssertionError
        With a message naming what differs.
    TypeError
        If the first argument is none of the above, or the instance cannot be found.
    """
    _check_tol("rel_tol", rel_tol)
    obj = result_or_timeline
    if isinstance(obj, Result):
        label = f"method {obj.method!r}"
        if not obj.status.has_schedule or obj.schedule is None:
            raise AssertionError(
                f"{label}: expected a feasible result, got status {obj.status.value!r}"
                + (f" ({obj.message})" if obj.message else "")
                + ("" if obj.schedule is not None else " and no schedule")
            )
        tl = obj.timeline if isinstance(obj.timeline, Timeline) else None
        schedule = obj.schedule
    elif isinstance(obj, Timeline):
        label = "timeline"
        tl = obj
        schedule = obj.schedule
    elif isinstance(obj, Schedule):
        label = "schedule"
        tl = None
        schedule = obj
    else:
        raise TypeError(f"assert_feasible: expected a Result, Timeline or Schedule, got {type(obj).__name__}")
    if chain is None:
        chain = tl.chain if tl is not None else None
    if platform is None:
        platform = tl.platform if tl is not None else None
    if not isinstance(chain, Chain) or not isinstance(platform, Platform):
        raise TypeError(f"assert_feasible: pass chain= and platform= for a {type(obj).__name__} that does not carry them")

    fresh = simulate(chain, platform, schedule)
    if fresh.violation is not None:
        v = fresh.violation
        raise AssertionError(f"{label}: the simulator rejects the schedule: rule {v.rule!r} at {v.op}: {v.message}")
    if fresh.peak_memory > platform.memory:
        raise AssertionError(f"{label}: peak memory {fresh.peak_memory} B is above the limit {platform.memory} B")

    if isinstance(obj, (Result, Timeline)):
        if not _close(obj.makespan, fresh.makespan, rel_tol):
            raise AssertionError(
                f"{label}: reports makespan {obj.makespan!r} but the simulator gives {fresh.makespan!r} "
                f"(difference {obj.makespan - fresh.makespan:+.3g} s)"
            )
        if obj.peak_memory != fresh.peak_memory:
            raise AssertionError(f"{label}: reports peak memory {obj.peak_memory} B but the simulator gives {fresh.peak_memory} B")
        if obj.offloaded_bytes != fresh.offloaded_bytes:
            raise AssertionError(
                f"{label}: reports {obj.offloaded_bytes} offloaded bytes but the schedule moves {fresh.offloaded_bytes}"
            )
    if isinstance(obj, Result):
        trivial = chain.compute_time
        lb = obj.lower_bound
        if not (isinstance(lb, (int, float)) and math.isfinite(lb)):
            raise AssertionError(f"{label}: a feasible result needs a finite lower bound, got {lb!r}")
        if lb < trivial * (1 - rel_tol) - _ABS_TOL:
            raise AssertionError(
                f"{label}: lower bound {lb!r} is below the trivial bound sum(fwd) + sum(bwd) = {trivial!r}"
            )
        if lb > fresh.makespan * (1 + rel_tol) + _ABS_TOL:
            raise AssertionError(f"{label}: lower bound {lb!r} is above the simulated makespan {fresh.makespan!r}")
    return fresh


def assert_no_better_than_optimal(
    result: Result,
    optimum_or_bound: Result | float,
    *,
    rel_tol: float = REL_TOL,
    abs_tol: float = 0.0,
) -> None:
    """Check that ``result`` does not beat an optimum or a lower bound.

    Parameters
    ----------
    result
        A result with a schedule (status optimal or feasible); an infeasible result passes
        trivially, since it claims nothing.
    optimum_or_bound
        A number (a proven lower bound, or the optimal makespan), or a reference
        :class:`~chainoffload.Result`: its makespan if its status is optimal, else its
        ``lower_bound``.
    rel_tol
        Relative tolerance: ``result.makespan`` may be below the bound by this fraction (float
        sums taken in another order differ by a few ulps).
    abs_tol
        Absolute tolerance in seconds, e.g. the ``info["tolerance"]`` of a ``cpsat`` result,
        whose optimum is exact for its integer time grid only up to that much.

    Raises
    ------
    AssertionError
        If ``result.makespan`` is below the bound beyond the tolerance: either the result's
        schedule is not what it claims, or the optimum or bound is wrong. Both values and the
        methods are in the message.
    """
    if not isinstance(result, Result):
        raise TypeError(f"assert_no_better_than_optimal: result must be a Result, got {type(result).__name__}")
    _check_tol("rel_tol", rel_tol)
    _check_tol("abs_tol", abs_tol)
    if isinstance(optimum_or_bound, Result):
        ref = optimum_or_bound
        if ref.status == Status.OPTIMAL:
            bound, what = ref.makespan, f"the optimum of method {ref.method!r}"
        else:
            bound, what = ref.lower_bound, f"the lower bound of method {ref.method!r} (status {ref.status.value})"
    elif isinstance(optimum_or_bound, (int, float)) and not isinstance(optimum_or_bound, bool):
        bound, what = float(optimum_or_bound), "the optimum or bound"
    else:
        raise TypeError(
            f"assert_no_better_than_optimal: optimum_or_bound must be a Result or a number, got {type(optimum_or_bound).__name__}"
        )
    if not result.status.has_schedule:
        return
    if not (isinstance(bound, (int, float)) and math.isfinite(bound)):
        # nan (no bound known) or inf (the reference found the instance infeasible)
        if isinstance(bound, float) and math.isinf(bound) and bound > 0:
            raise AssertionError(
                f"method {result.method!r} found a schedule of makespan {result.makespan!r} but {what} is inf "
                "(the reference says no schedule exists)"
            )
        return
    if result.makespan < bound * (1 - rel_tol) - abs_tol - _ABS_TOL:
        raise AssertionError(
            f"method {result.method!r}: makespan {result.makespan!r} is below {what}, {bound!r} "
            f"(by {bound - result.makespan:.3g} s, {(bound - result.makespan) / bound if bound else math.inf:.3g} relative)"
        )
