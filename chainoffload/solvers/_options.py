"""Validation of what a caller passes to a method: misuse, raised as :class:`OptionError`.

A leaf of ``chainoffload.solvers``: it imports nothing from the package, so every method module
(and the registry and the front door) may import it without a cycle.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..chain import Chain
from ..platform import Platform, PlatformError
from ..result import Result, Status

__all__ = ["OptionError", "check_memory_floor", "check_keep", "check_time_limit", "check_options", "takes_any", "refusal"]


class OptionError(ValueError):
    """An unknown method, or a method's option that is unknown or out of range: misuse, which
    :func:`solve` raises.

    Methods raise it for a bad option value (``slots=0``) so that :func:`solve` can tell misuse
    from a method that fails, which it reports as a result with status ``error`` instead.
    """


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

    Every pure-offloading method and ``joint`` take ``keep=``; none of their schedules offloads a
    unit in it (``joint`` may still recompute one).

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


def takes_any(func: Callable[..., Result]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(func).parameters.values())


def check_options(name: str, func: Callable[..., Result], options: dict[str, Any]) -> list[str]:
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


def refusal(method: str, what: str, seconds: float, nbytes: float, time_limit: float | None, t0: float, *,
            length: int = 0, hint: str = "", info: dict | None = None) -> Result | None:
    """A result refusing up front work that cannot be cut and would not fit, or ``None`` when it fits.

    ``NOTE [ clock ]`` in ``chainoffload/_cost.py``: a step no deadline check can stop (a
    Numba table, a sequence built and simulated whole) is estimated before it starts; one whose
    estimate is above ``time_limit`` (seconds left; ``None``: no limit) or above 80 % of the
    memory free is not started. The result has status ``timeout``, ``info["refused"]`` and
    the estimates, and a message that names them.

    Parameters
    ----------
    method
        The method's registry name (the message starts with it).
    what
        The work, for the message ("a rotor table of 1000 stages and 500 slots").
    seconds, nbytes
        Its estimated wall seconds here and its memory.
    time_limit
        Seconds the method has left, or ``None``.
    t0
        ``time.perf_counter()`` at the method's start (for the runtime).
    length
        The chain's length: the limit to suggest adds what :func:`chainoffload.solve` keeps for
        judging the schedule (it gives the method the limit less that).
    hint
        What the caller could do instead (appended to the message).
    info
        More of the method's ``info``.
    """
    import time

    from .._cost import free_bytes, judge_seconds

    free = free_bytes()
    least = seconds + (judge_seconds(length) if length else 0.0)
    if nbytes > 0.8 * free:
        why = f"{what} would need ~{nbytes / 1e9:.3g} GB, more than the {free / 1e9:.3g} GB free"
    elif time_limit is not None and seconds > time_limit:
        why = (f"{what} would take ~{seconds:.3g} s here, more than the {time_limit:.3g} s left of the time limit; "
               f"give a time limit of at least {max(least * 1.1, least + 0.5):.3g} s")
    else:
        return None
    return Result(
        method, Status.TIMEOUT, None, runtime=time.perf_counter() - t0,
        info={**(info or {}), "refused": True, "estimated_seconds": seconds, "estimated_bytes": nbytes},
        message=f"{method}: refused up front: {why}{'; ' + hint if hint else ''}",
    )
