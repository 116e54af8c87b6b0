"""Index arithmetic of the fixed compute order F_1, ..., F_L, B_L, ..., B_1.

One place for the positions of ops, the trigger events and the windows in which a transfer of a
unit may be triggered or waited for, so that the schedule builders, the exact methods and the
bounds count the same way. Stages are 1-based, op positions and events 0-based; *event* ``2k``
is the start of op k and ``2k + 1`` its end (the order in which triggers happen, see
``docs/model.md``).
"""

from __future__ import annotations

import functools

__all__ = [
    "fixed_order",
    "f_pos",
    "b_pos",
    "event",
    "trigger",
    "reader_pos",
    "transfer_events",
    "prefetch_deadline",
    "wait_ops",
]


@functools.lru_cache(maxsize=64)
def fixed_order(length: int) -> tuple[tuple[str, int], ...]:
    """The fixed compute order of pure offloading: F_1..F_L, B_L..B_1 (one shared tuple per length)."""
    return tuple(("F", i) for i in range(1, length + 1)) + tuple(("B", i) for i in range(length, 0, -1))


def f_pos(stage: int) -> int:
    """Position of F_stage in the fixed order."""
    return stage - 1


def b_pos(length: int, stage: int) -> int:
    """Position of B_stage in the fixed order of a chain of ``length`` stages."""
    return 2 * length - stage


def event(op: int, at: str) -> int:
    """The trigger event of the start (``at="start"``) or end (``"end"``) of op ``op``."""
    return 2 * op + (1 if at == "end" else 0)


def trigger(ev: int) -> tuple[int, str]:
    """The ``(op, at)`` of event ``ev``; inverse of :func:`event`."""
    return ev // 2, ("end" if ev % 2 else "start")


def reader_pos(length: int, unit: int) -> int:
    """Position of the first backward op that reads unit ``unit``: B_{unit+1}, or B_L for unit L."""
    return b_pos(length, unit + 1 if unit < length else length)


def prefetch_deadline(length: int, unit: int) -> int:
    """The first event at which a prefetch of ``unit`` is too late: the start of its first backward reader."""
    return 2 * reader_pos(length, unit)


def transfer_events(length: int, unit: int) -> tuple[int, int]:
    """The events ``(lo, hi)`` at which a transfer of ``unit`` may be triggered, inclusive.

    From the end of F_unit (the unit exists) to the end of the op just before its first backward
    reader (:func:`reader_pos`): a prefetch triggered at or after that reader's start cannot be
    waited for, and the offload comes before its prefetch.
    """
    return 2 * f_pos(unit) + 1, prefetch_deadline(length, unit) - 1


def wait_ops(length: int, unit: int) -> range:
    """Ops that may wait for the offload of ``unit``: after F_unit and before B_{unit+1}.

    Empty for unit L (nothing runs between F_L and B_L that could use its freed memory).
    """
    if unit >= length:
        return range(0)
    return range(f_pos(unit) + 1, b_pos(length, unit + 1))
