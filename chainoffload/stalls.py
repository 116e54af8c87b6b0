"""Why compute idles: every stall of a :class:`~chainoffload.Timeline` and the copy that causes it.

Compute runs one op at a time; an op starts at the end of the op before it unless it waits
for a transfer (docs/model.md, "Time"): an explicit ``before`` wait, or B_j's implicit wait
for the prefetches of units j and j - 1 (in general, any op that uses the prefetched copy of
offloaded data waits for its prefetch). A *stall* is the interval in which compute is idle
because of such a wait. :func:`stalls` finds each one from the timeline and names the transfer
that ends it, so a picture or a report can say "B_5 waits 1.2 ms for P_5 to arrive" instead of
leaving a gap unexplained. Needs nothing beyond the core.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

import numpy as np

from .chain import Chain
from .platform import Platform
from .schedule import Schedule

if TYPE_CHECKING:
    from .simulate import Timeline

__all__ = ["Stall", "stalls", "stall_summary", "STALL_CAUSES"]

#: What a stall waits for: ``"offload"`` (an explicit wait for O_i to end, so that the GPU copy
#: of unit i is freed and the op fits in memory) or ``"prefetch"`` (P_j must arrive before the op
#: reads unit j).
STALL_CAUSES = ("offload", "prefetch")


@dataclasses.dataclass(frozen=True)
class Stall:
    """One interval in which compute idles, waiting for a transfer.

    Attributes
    ----------
    op
        Index (into ``schedule.compute``) of the op held back: it starts at ``end``.
    op_name
        Its name, e.g. ``"B_5"``.
    start, end
        The idle interval in seconds: from the end of the previous op to the start of ``op``.
    transfer
        Index (into ``schedule.transfers``) of the transfer whose end releases ``op``. When
        several waited-for transfers end at that same instant, the first in ``transfers``.
    transfers
        Every waited-for transfer that ends at ``end``: explicit waits first, then implicit
        ones, each in list order.
    transfer_name
        Name of ``transfer``, e.g. ``"O_3"`` or ``"P_5"``.
    cause
        ``"offload"``: waiting for O_i to free memory; ``"prefetch"``: waiting for P_j to arrive
        (see :data:`STALL_CAUSES`).
    explicit
        Whether the wait is a ``before`` of the schedule (``False``: the op reads the
        prefetched unit, so it waits by the rules).
    late_because
        Why ``transfer`` started when it did: ``"trigger"`` (it started as soon as it was
        triggered), ``"channel"`` (queued behind the transfer ``behind`` on its channel), or
        ``"offload"`` (a prefetch waiting for its own unit's offload to end).
    behind
        With ``late_because == "channel"`` or ``"offload"``, the index of the transfer it
        waited for; otherwise ``None``.
    message
        One sentence for people.
    """

    op: int
    op_name: str
    start: float
    end: float
    transfer: int
    transfers: tuple[int, ...]
    transfer_name: str
    cause: str
    explicit: bool
    late_because: str
    behind: int | None
    message: str

    @property
    def duration(self) -> float:
        """``end - start`` in seconds."""
        return self.end - self.start


# The stalls are read off a timeline's fields, so those are what is checked: the model objects
# it was simulated from and the op and transfer times. The class is not (isinstance would need
# chainoffload.simulate, which sits above this module: Timeline.plot draws the stalls through
# chainoffload.plot, so simulate -> plot -> stalls, and an import back would close a circle).
_TIMES = ("op_start", "op_end", "transfer_start", "transfer_end")


def _check_timeline(who: str, timeline: object) -> None:
    """Raise TypeError unless ``timeline`` has a Timeline's model objects and times."""
    if not (
        isinstance(getattr(timeline, "chain", None), Chain)
        and isinstance(getattr(timeline, "platform", None), Platform)
        and isinstance(getattr(timeline, "schedule", None), Schedule)
        and all(hasattr(timeline, name) for name in _TIMES)
    ):
        hint = "; pass its .timeline" if getattr(timeline, "timeline", None) is not None else ""
        raise TypeError(
            f"{who}: timeline must be a Timeline (what chainoffload.simulate returns), got {type(timeline).__name__}{hint}"
        )


def _waited(timeline: Timeline) -> list[tuple[list[int], list[int]]]:
    """Per compute op: (explicit waits, implicit waits) as transfer indices, as the simulator has them."""
    schedule = timeline.schedule
    n = len(schedule.compute)
    ev = [t.event for t in schedule.transfers]
    explicit: list[list[int]] = [[] for _ in range(n)]
    implicit: list[list[int]] = [[] for _ in range(n)]
    for t, tr in enumerate(schedule.transfers):
        if tr.before is not None:
            explicit[tr.before].append(t)
    # The simulator's own wait lists (docs/model.md, "Which copy an op reads"): explicit waits,
    # then the prefetches of the offloaded data the op uses; one triggered at or after the op's
    # start is not waited for (a read violation).
    schedule.validate(timeline.chain)
    struct = schedule._structure(timeline.chain.length)
    for k in range(n):
        for q in range(int(struct.wait_ptr[k]), int(struct.wait_ptr[k + 1])):
            p = int(struct.wait_tr[q])
            if ev[p] < 2 * k and p not in implicit[k]:
                implicit[k].append(p)
    for k in range(n):
        implicit[k] = sorted(t for t in implicit[k] if t not in explicit[k])
    return [(explicit[k], implicit[k]) for k in range(n)]


class _Queues:
    """Per transfer: its channel predecessor in service order, and per unit its offload.

    Built once per :func:`stalls` call, so that explaining each stall is a look-up: the scan
    over every transfer per stall was O(stalls x transfers), hours at 10^5 stages.
    """

    def __init__(self, timeline: Timeline) -> None:
        transfers = timeline.schedule.transfers
        duplex = timeline.platform.duplex
        self.offload_of: dict[int, int] = {}
        queues: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
        for o, tr in enumerate(transfers):
            if tr.kind == "offload":
                self.offload_of.setdefault(tr.unit, o)
            # FIFO in trigger order, ties in list order (docs/model.md, "Time").
            queues[0 if tr.kind == "offload" or not duplex else 1].append((tr.event, o))
        self.ahead: dict[int, int] = {}
        for queue in queues.values():
            queue.sort()
            for (_, prev), (_, o) in itertools.pairwise(queue):
                self.ahead[o] = prev


def _late_because(timeline: Timeline, t: int, queues: _Queues | None = None) -> tuple[str, int | None]:
    """Why transfer ``t`` started when it did (see :attr:`Stall.late_because`)."""
    schedule = timeline.schedule
    queues = queues if queues is not None else _Queues(timeline)
    tr = schedule.transfers[t]
    start = float(timeline.transfer_start[t])
    trigger = float(timeline.op_start[tr.op] if tr.at == "start" else timeline.op_end[tr.op])
    if start <= trigger:
        return "trigger", None
    if tr.kind == "prefetch":
        # At most one offload per unit (a well-formed schedule).
        o = queues.offload_of.get(tr.unit)
        if o is not None and float(timeline.transfer_end[o]) == start:
            return "offload", o
    # The transfer ahead of it on its channel: FIFO in trigger order, ties in list order.
    if t in queues.ahead:
        return "channel", queues.ahead[t]
    return "trigger", None  # pragma: no cover  (a transfer starts at its trigger, its channel or its offload)


def stalls(timeline: Timeline) -> list[Stall]:
    """Every interval in which compute idles, in time order, with the transfer that causes it.

    Compute op k starts at the latest of the end of op k - 1, the end of every transfer with
    ``before == k``, and the end of every prefetch it reads (for B_j: units j and j - 1) that
    is triggered before it starts. When that start is later than the end of op k - 1, compute
    idles in between: a stall, caused by the waited-for transfer that ends last.

    The durations add up to the makespan less the time of the compute ops; for a
    fixed-order schedule that is ``timeline.makespan - timeline.chain.compute_time``.

    Parameters
    ----------
    timeline
        From :func:`chainoffload.simulate` (feasible or not; a prefetch triggered too late to
        be waited for is a read violation and causes no stall).

    Returns
    -------
    list of Stall
        Ordered by time; empty when compute never idles.

    Examples
    --------
    >>> import chainoffload as co
    >>> from chainoffload.examples import tiny
    >>> s = co.Schedule.from_units(3, [co.Transfer("offload", 1, 0), co.Transfer("prefetch", 1, 3)])
    >>> tl = co.simulate(tiny(), co.Platform(memory=10**6, bandwidth_d2h=25.0, bandwidth_h2d=25.0), s)
    >>> [(x.op_name, x.start, x.end, x.transfer_name) for x in co.stalls(tl)]
    [('B_2', 6.0, 7.0, 'P_1')]
    """
    _check_timeline("stalls", timeline)
    schedule = timeline.schedule
    op_start = np.asarray(timeline.op_start, dtype=float)
    op_end = np.asarray(timeline.op_end, dtype=float)
    tr_end = np.asarray(timeline.transfer_end, dtype=float)
    waits = _waited(timeline)
    queues = _Queues(timeline)
    out: list[Stall] = []
    for k in range(1, len(schedule.compute)):
        idle_from, released = float(op_end[k - 1]), float(op_start[k])
        if not released > idle_from:
            continue
        explicit, implicit = waits[k]
        # The simulator sets the op's start to the end of the waited-for transfer that ends
        # last, so that end equals the start exactly (no tolerance needed).
        binding = [t for t in explicit + implicit if float(tr_end[t]) == released]
        if not binding:  # pragma: no cover  (the simulator starts an op only at a wait's end)
            raise RuntimeError(f"stalls: {schedule.op_name(k)} starts at {released!r} but no transfer it waits for ends then")
        t = binding[0]
        tr = schedule.transfers[t]
        name = schedule.transfer_name(t)
        op_name = schedule.op_name(k)
        cause = "offload" if tr.kind == "offload" else "prefetch"
        is_explicit = t in explicit
        late, behind = _late_because(timeline, t, queues)
        what = f"{name} to free unit {tr.unit}" if cause == "offload" else f"{name} to bring unit {tr.unit} back"
        how = "an explicit wait" if is_explicit else f"{op_name} reads unit {tr.unit}"
        if late == "channel":
            why = f"; {name} was queued behind {schedule.transfer_name(behind)}"
        elif late == "offload":
            why = f"; {name} waited for {schedule.transfer_name(behind)} to end"
        else:
            why = ""
        message = f"{op_name} waits {released - idle_from:.6g} s for {what} ({how}){why}"
        out.append(
            Stall(
                op=k,
                op_name=op_name,
                start=idle_from,
                end=released,
                transfer=t,
                transfers=tuple(binding),
                transfer_name=name,
                cause=cause,
                explicit=is_explicit,
                late_because=late,
                behind=behind,
                message=message,
            )
        )
    return out


def stall_summary(timeline: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stalls of :func:`stalls` as arrays, without the objects: ``(op, duration, transfer)``,
    in time order, ``transfer`` being :attr:`Stall.transfer` (the first waited-for transfer that
    ends at the op's start, explicit waits first in list order, then implicit ones by index).

    For tables at 10^5-10^6 stages, where :func:`stalls` builds a message per stall in Python
    (seconds per 10^5 stages) and the CLI's one line needs only causes, durations and names.
    """
    _check_timeline("stall_summary", timeline)
    schedule = timeline.schedule
    n = len(schedule.compute)
    op_start = np.asarray(timeline.op_start, dtype=float)
    op_end = np.asarray(timeline.op_end, dtype=float)
    tr_end = np.asarray(timeline.transfer_end, dtype=float)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
    if n < 2:
        return empty
    stalled = np.zeros(n, dtype=bool)
    stalled[1:] = op_start[1:] > op_end[:-1]
    if not stalled.any():
        return empty
    schedule.validate(timeline.chain)
    struct = schedule._structure(timeline.chain.length)
    arrays = schedule.arrays()
    tr_op, tr_at, tr_before = arrays[4], arrays[5], arrays[6]
    event = 2 * tr_op + tr_at
    # Explicit waits: (op, transfer) for every `before`.
    has = tr_before >= 0
    ex_t = np.flatnonzero(has)
    ex_k = tr_before[has]
    # Implicit waits: the simulator's wait lists, less those triggered at or after the op's
    # start (a read violation, not waited for) and those the op waits for explicitly anyway.
    ptr = np.asarray(struct.wait_ptr, dtype=np.int64)
    im_t = np.asarray(struct.wait_tr, dtype=np.int64)
    im_k = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    ok = event[im_t] < 2 * im_k
    im_t, im_k = im_t[ok], im_k[ok]
    if ex_t.shape[0]:
        explicit_pairs = ex_k * (tr_op.shape[0] + 1) + ex_t
        keep = ~np.isin(im_k * (tr_op.shape[0] + 1) + im_t, explicit_pairs)
        im_t, im_k = im_t[keep], im_k[keep]
    k = np.concatenate([ex_k, im_k])
    t = np.concatenate([ex_t, im_t])
    second = np.concatenate([np.zeros(ex_t.shape[0], dtype=np.int64), np.ones(im_t.shape[0], dtype=np.int64)])
    binding = stalled[k] & (tr_end[t] == op_start[k])
    k, t, second = k[binding], t[binding], second[binding]
    order = np.lexsort((t, second, k))  # by op, explicit first, then transfer index
    k, t = k[order], t[order]
    first = np.ones(k.shape[0], dtype=bool)
    first[1:] = k[1:] != k[:-1]
    k, t = k[first], t[first]
    if k.shape[0] != int(stalled.sum()):  # pragma: no cover  (the simulator starts an op only at a wait's end)
        raise RuntimeError("stall_summary: a stalled op has no transfer ending at its start")
    return k, op_start[k] - op_end[k - 1], t
