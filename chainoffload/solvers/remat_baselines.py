"""Rematerialization baselines users know: checkpoint-all, sqrt-checkpoint (Chen et al. 2016), recompute-all.

Neither looks at the memory limit to choose its sequence: each is a fixed policy, reported
feasible when the simulator accepts it and infeasible (with its peak as ``min_memory``)
when not. They show what the rotor and joint dynamic programs gain over rules of thumb.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import simulate
from ._options import OptionError

__all__ = ["checkpoint_all", "sqrt_checkpoint", "recompute_all", "checkpoint_all_schedule", "sqrt_checkpoint_schedule",
           "recompute_all_schedule", "sequence_length", "family_schedules", "compute_seconds"]


def sqrt_checkpoint_schedule(length: int, segment: int | None = None) -> Schedule:
    """Chen et al.'s sequence: keep only the input of every segment of ``segment`` stages.

    The forward runs each segment but the last with Fck (keeping the segment's input) then Fn
    (dropping each intermediate a_i); the last segment runs with F_all. The backward
    re-runs each earlier segment with F_all from its kept input before its backward ops.
    ``segment`` defaults to ceil(sqrt(L)).
    """
    if segment is None:
        segment = max(1, math.ceil(math.sqrt(length)))
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise OptionError(f"segment: {segment!r} must be an integer >= 1")
    starts = list(range(1, length + 1, segment))
    bounds = [(s, min(s + segment - 1, length)) for s in starts]
    ops: list[tuple[str, int]] = []
    for s, e in bounds[:-1]:
        ops.append(("Fck", s))
        ops.extend(("Fn", k) for k in range(s + 1, e + 1))
    s_last, e_last = bounds[-1]
    ops.extend(("F", k) for k in range(s_last, e_last + 1))
    ops.extend(("B", k) for k in range(e_last, s_last - 1, -1))
    for s, e in reversed(bounds[:-1]):
        ops.extend(("F", k) for k in range(s, e + 1))
        ops.extend(("B", k) for k in range(e, s - 1, -1))
    return Schedule(tuple(ops), ())


def checkpoint_all_schedule(length: int, whole: Iterable[int] = ()) -> Schedule:
    """Checkpoint every block: keep each stage's input, recompute each stage just before its backward.

    What Hugging Face's ``model.gradient_checkpointing_enable()`` and Megatron's "full"
    recomputation do: the forward runs Fck_1, ..., Fck_{L-1} (each keeps its input and hands its
    output on without keeping anything for the backward), then F_L; the backward runs B_L, then
    for i = L-1, ..., 1: F_i (re-run from the kept a_{i-1}) and B_i. It is Chen et al.'s sequence
    with segments of one stage (:func:`sqrt_checkpoint_schedule` with ``segment=1``).

    NOTE [ the last stage is not recomputed ]
    -----------------------------------------
    Those libraries also wrap the last block, whose recomputation then starts the backward.
    In this model that would be Fck_L at once followed by F_L over its lone a_L: the same F_L
    holds unit L whole as well, so the re-run frees nothing and costs one more forward. So the
    last stage (which holds the head and the loss in the PyTorch adapter's chain) runs F_L once.

    ``whole``: stages that run F_all in the forward and are never recomputed (their whole unit
    is kept until their backward), as a checkpointing library leaves the embeddings unwrapped:
    the PyTorch adapter's prefix stage, or a stage its executor cannot run again.

    Raises
    ------
    ValueError
        A stage of ``whole`` is not in 1..``length``.
    """
    whole = set(whole)
    if not whole:
        return sqrt_checkpoint_schedule(length, 1)
    bad = sorted(i for i in whole if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= length)
    if bad:
        raise ValueError(f"whole: stage(s) {bad} are not in 1..{length}")
    ops: list[tuple[str, int]] = [("F" if i in whole else "Fck", i) for i in range(1, length)]
    ops += [("F", length), ("B", length)]
    for i in range(length - 1, 0, -1):
        if i not in whole:
            ops.append(("F", i))
        ops.append(("B", i))
    return Schedule(tuple(ops), ())


def recompute_all_schedule(length: int) -> Schedule:
    """The most memory-frugal persistent sequence: keep only a_0, recompute up to each stage.

    Before B_i it runs Fn_1..Fn_{i-1} (each dropping its input) and F_i, so at any time it
    holds a_0, at most two lone activations or one unit, and the gradients in flight. Its
    forward work is quadratic in L.
    """
    ops: list[tuple[str, int]] = []
    for i in range(length, 0, -1):
        ops.extend(("Fn", k) for k in range(1, i))
        ops.append(("F", i))
        ops.append(("B", i))
    return Schedule(tuple(ops), ())


def family_schedules(length: int) -> dict[str, tuple[int, Callable[[], Schedule]]]:
    """The fixed persistent checkpointing policies, by method name: (ops, a builder of the sequence).

    ``rotor`` and ``joint`` compare their plans with these (``NOTE [ never lose to the family ]``
    in :mod:`chainoffload.solvers.rotor`): each is in rotor's family of schedules, so neither
    method may return a slower plan at a memory where one of them fits. The op counts let a
    caller skip, or refuse under a clock, a sequence before building it (recompute-all's is
    quadratic in L).

    Parameters
    ----------
    length
        The chain's length L (>= 1).
    """
    return {
        "checkpoint-all": (sequence_length("checkpoint-all", length), lambda: checkpoint_all_schedule(length)),
        "sqrt-checkpoint": (sequence_length("sqrt-checkpoint", length), lambda: sqrt_checkpoint_schedule(length)),
        "recompute-all": (sequence_length("recompute-all", length), lambda: recompute_all_schedule(length)),
    }


def compute_seconds(chain: Chain, schedule: Schedule) -> float:
    """The sum of the durations of ``schedule``'s compute ops on ``chain`` (F: fwd, Fck / Fn:
    fwd_nosave, B: bwd): its makespan when nothing waits for a transfer.

    Parameters
    ----------
    chain
        The chain.
    schedule
        A schedule of ``chain`` (its transfers are not looked at).
    """
    table = {"F": chain.fwd, "Fck": chain.fwd_nosave, "Fn": chain.fwd_nosave, "B": chain.bwd}
    total = 0.0
    for kind, stage in schedule.compute:
        total += float(table[kind][stage - 1])
    return total


def _fixed_policy(method: str, chain: Chain, platform: Platform, schedule: Schedule, t0: float, info: dict) -> Result:
    timeline = simulate(chain, platform, schedule)
    if timeline.feasible:
        return Result(method, Status.FEASIBLE, schedule, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info)
    return Result(
        method,
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        min_memory=timeline.peak_memory,
        info=info,
        message=f"{method}: its sequence needs {timeline.peak_memory} B, above {platform.memory} B",
    )


def sequence_length(method: str, length: int, segment: int | None = None) -> int:
    """Ops in the compute sequence of ``method`` (``"checkpoint-all"``, ``"sqrt-checkpoint"`` or
    ``"recompute-all"``) on ``length`` stages, known before it is built: its cost (``NOTE [ clock ]``)."""
    if method == "recompute-all":
        return length * (length + 1) // 2 + length
    if method == "checkpoint-all":
        method, segment = "sqrt-checkpoint", 1
    if method != "sqrt-checkpoint":
        raise ValueError(f"method: {method!r} is not checkpoint-all, sqrt-checkpoint or recompute-all")
    seg = max(1, math.ceil(math.sqrt(length))) if segment is None else segment
    last = length - (length - 1) // seg * seg  # stages of the last segment
    return 3 * length - last  # every forward once, every backward, and the earlier segments' forwards again


def _refused(method: str, chain: Chain, ops: int, time_limit: float | None, t0: float, info: dict) -> Result | None:
    from .._cost import sequence_bytes, sequence_seconds
    from ._options import check_time_limit, refusal

    time_limit = check_time_limit(time_limit)
    return refusal(method, f"its sequence of {ops:,} ops on {chain.length:,} stages", sequence_seconds(ops),
                   sequence_bytes(ops), time_limit, t0, length=chain.length, info=info,
                   hint="rotor or sqrt-checkpoint need far fewer ops" if method == "recompute-all" else "")


def checkpoint_all(chain: Chain, platform: Platform, *, time_limit: float | None = None) -> Result:
    """Checkpoint every block (HF ``gradient_checkpointing_enable``, Megatron's "full" recomputation).

    Keeps each stage's input a_{i-1} through the forward (Fck_i, which keeps nothing for the
    backward) and re-runs stage i with F_all just before B_i; the last stage runs once
    (:func:`checkpoint_all_schedule`). A fixed policy: reported feasible when the simulator
    accepts its sequence at ``platform.memory``, infeasible with its peak as ``min_memory``
    when not.

    Parameters
    ----------
    chain, platform
        The instance (the platform's bandwidths are not used).
    time_limit
        Seconds it may take (``None``: no limit). Its sequence (3 L - 1 ops) is built and
        simulated whole, which no clock can cut, so it is refused up front (status ``timeout``,
        the estimate in the message) when the estimate does not fit, or does not fit in memory.

    Returns
    -------
    Result
        ``feasible`` with the sequence, or ``infeasible`` with ``min_memory``: the memory it needs.
    """
    t0 = time.perf_counter()
    info: dict = {}
    refused = _refused("checkpoint-all", chain, sequence_length("checkpoint-all", chain.length), time_limit, t0, info)
    if refused is not None:
        return refused
    return _fixed_policy("checkpoint-all", chain, platform, checkpoint_all_schedule(chain.length), t0, info)


def sqrt_checkpoint(chain: Chain, platform: Platform, *, segment: int | None = None, time_limit: float | None = None) -> Result:
    """Checkpoint every ceil(sqrt(L)) stages (Chen et al., "Training deep nets with sublinear memory cost").

    Parameters
    ----------
    segment
        Stages per segment; default ceil(sqrt(L)).
    time_limit
        Seconds it may take (``None``: no limit). Its sequence (about 3 L ops) is built and
        simulated whole, which no clock can cut, so it is refused up front (status ``timeout``,
        the estimate in the message) when the estimate does not fit, or does not fit in memory.
    """
    t0 = time.perf_counter()
    seg = max(1, math.ceil(math.sqrt(chain.length))) if segment is None else segment
    if isinstance(seg, bool) or not isinstance(seg, int) or seg < 1:
        raise OptionError(f"segment: {segment!r} must be an integer >= 1")
    info = {"segment": seg}
    refused = _refused("sqrt-checkpoint", chain, sequence_length("sqrt-checkpoint", chain.length, seg), time_limit, t0, info)
    if refused is not None:
        return refused
    schedule = sqrt_checkpoint_schedule(chain.length, segment)
    return _fixed_policy("sqrt-checkpoint", chain, platform, schedule, t0, info)


def recompute_all(chain: Chain, platform: Platform, *, time_limit: float | None = None) -> Result:
    """Keep only the chain's input; recompute the forward up to each stage before its backward.

    Its sequence has L (L + 1) / 2 + L ops, built and simulated whole: with ``time_limit``
    (seconds) it is refused up front (status ``timeout``, the estimate in the message) when
    that would not fit, and at any limit when it would not fit in memory (L = 10^5: 5 * 10^9 ops).
    """
    t0 = time.perf_counter()
    refused = _refused("recompute-all", chain, sequence_length("recompute-all", chain.length), time_limit, t0, {})
    if refused is not None:
        return refused
    return _fixed_policy("recompute-all", chain, platform, recompute_all_schedule(chain.length), t0, {})
