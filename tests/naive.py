"""A naive simulator written from ``docs/model.md`` alone: the oracle the real one is held to.

Plain Python, no Numba, and no code shared with ``chainoffload.simulate``, its kernels, the
schedule's resolution or ``chainoffload.order``: its own instance bookkeeping, its own event
list, sorted with Python's ``sorted``. It trusts the schedule to be well formed (call
``chainoffload.simulate`` first: it raises on malformed ones) and reads only the public fields
of the chain, the platform and the schedule.

Each section below cites the part of ``docs/model.md`` it implements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Instance:
    """One residency of a unit's data on the GPU (docs/model.md, "Instances")."""

    unit: int
    whole: bool  # made by F (saved bytes) rather than Fck / Fn (act bytes)
    maker: int
    freed_by: int = -1
    offload: int = -1  # index of the transfer that moves it
    prefetch: int = -1


@dataclass
class NaiveTimeline:
    op_start: list[float]
    op_end: list[float]
    transfer_start: list[float]
    transfer_end: list[float]
    events: list[tuple]  # (time, class, order, rank, delta, who) in the order of "One instant"
    after_instant: dict[float, int]  # memory in use after each instant
    peak: int
    peak_time: float
    makespan: float
    offloaded_bytes: int
    violation: tuple | None  # (rule, op name, time, bytes)
    reads: list = field(default_factory=list)


def simulate_naive(chain, platform, schedule) -> NaiveTimeline:
    ops = [tuple(op) for op in schedule.compute]
    transfers = list(schedule.transfers)
    n = len(ops)
    length = chain.length
    act = [int(x) for x in chain.act]
    saved = [0] + [int(x) for x in chain.saved]  # saved[i] is stage i's unit
    fwd_tmp = [0] + [int(x) for x in chain.fwd_tmp]
    bwd_tmp = [0] + [int(x) for x in chain.bwd_tmp]

    def duration(kind, i):
        # "Compute ops": F takes fwd, Fck / Fn take fwd_nosave, B takes bwd
        if kind == "F":
            return float(chain.fwd[i - 1])
        if kind == "B":
            return float(chain.bwd[i - 1])
        return float(chain.fwd_nosave[i - 1])

    def name(kind, i):
        return f"{kind}_{i}"

    # ---- "Instances": walk the sequence, keep the resident instance of each unit
    instances: list[Instance] = []
    resident: dict[int, Instance] = {}
    uses: list[list[tuple[Instance, bool]]] = [[] for _ in range(n)]  # (instance, op frees it)
    b_index: dict[int, int] = {}
    for k, (kind, i) in enumerate(ops):
        if kind == "B":
            unit = resident.pop(i)
            unit.freed_by = k
            uses[k].append((unit, True))
            if i > 1:
                below = resident[i - 1]
                lone = not below.whole
                uses[k].append((below, lone))
                if lone:  # a lone a_{i-1} has no reader once stage i is done
                    below.freed_by = k
                    del resident[i - 1]
            b_index[i] = k
            continue
        if i > 1:
            frees_input = kind == "Fn"
            below = resident[i - 1]
            uses[k].append((below, frees_input))
            if frees_input:
                below.freed_by = k
                del resident[i - 1]
        if kind == "F" and i in resident:  # F over a lone a_i replaces it
            old = resident.pop(i)
            old.freed_by = k
            uses[k].append((old, True))
        inst = Instance(unit=i, whole=(kind == "F"), maker=k)
        instances.append(inst)
        resident[i] = inst

    def nbytes(inst):
        return saved[inst.unit] if inst.whole else act[inst.unit]

    def split(inst):
        # "What a transfer moves": a_i alone out of a whole unit; the rest stays on the GPU
        return inst.whole and inst.offload >= 0 and transfers[inst.offload].moves == "act"

    def moved_bytes(inst):
        return act[inst.unit] if split(inst) else nbytes(inst)

    # ---- transfers: events, the instance each moves ("Which instance a transfer moves")
    def ev(t):
        return 2 * t.op + (1 if t.at == "end" else 0)

    moved: list[Instance] = [None] * len(transfers)  # type: ignore[list-item]
    for idx, t in enumerate(transfers):
        if t.kind != "offload":
            continue
        mine = [x for x in instances if x.unit == t.unit]
        started = [x for x in mine if 2 * x.maker <= ev(t)]
        inst = started[-1] if started else mine[0]
        inst.offload = idx
        moved[idx] = inst
    for idx, t in enumerate(transfers):
        if t.kind == "prefetch":
            inst = next(x for x in instances if x.offload >= 0 and transfers[x.offload].unit == t.unit)
            inst.prefetch = idx
            moved[idx] = inst

    # ---- "Which copy an op reads"
    reads_original: dict[int, list[int]] = {}  # offload index -> ops reading the original
    waits_for: list[list[int]] = [[] for _ in range(n)]
    for k in range(n):
        for t_idx, t in enumerate(transfers):
            if t.before == k:
                waits_for[k].append(t_idx)
    for k, (kind, _i) in enumerate(ops):
        for inst, frees in uses[k]:
            if inst.offload < 0:
                continue
            e_off = ev(transfers[inst.offload])
            first_b = min([j for j in range(n) if ops[j][0] == "B" and 2 * j >= e_off], default=n)
            if kind != "B" and not frees and k < first_b:
                reads_original.setdefault(inst.offload, []).append(k)
            else:
                waits_for[k].append(inst.prefetch)

    # ---- "Time"
    op_start = [math.nan] * n
    op_end = [math.nan] * n
    tr_start = [math.nan] * len(transfers)
    tr_end = [math.nan] * len(transfers)
    channel_busy_until: dict[str, float] = {}
    served: list[int] = []  # transfers in the order they were queued (= served, per channel)
    reads = []  # (time, event position, rank, op name, bytes)

    def channel(t):
        if not platform.duplex:
            return "shared"
        return "d2h" if t.kind == "offload" else "h2d"

    def queue(event_pos, when):
        for idx, t in enumerate(transfers):  # list order at one event
            if ev(t) != event_pos:
                continue
            inst = moved[idx]
            size = moved_bytes(inst)
            ch = channel(t)
            start = max(when, channel_busy_until.get(ch, 0.0))
            if t.kind == "offload":
                bw = platform.bandwidth_d2h
                if event_pos < 2 * inst.maker + 1:
                    reads.append((when, event_pos, len(served), f"O_{t.unit}", size))
            else:
                bw = platform.bandwidth_h2d
                start = max(start, tr_end[inst.offload])
            tr_start[idx] = start
            tr_end[idx] = start + (platform.latency + size / bw)
            channel_busy_until[ch] = tr_end[idx]
            served.append(idx)

    prev = 0.0
    for k, (kind, i) in enumerate(ops):
        start = prev
        too_late = []
        for t_idx in waits_for[k]:
            if ev(transfers[t_idx]) >= 2 * k:
                too_late.append(t_idx)
            else:
                start = max(start, tr_end[t_idx])
        if too_late:
            reads.append((start, 2 * k, -1, name(kind, i), moved_bytes(moved[too_late[0]])))
        op_start[k] = start
        op_end[k] = start + duration(kind, i)
        prev = op_end[k]
        queue(2 * k, op_start[k])
        queue(2 * k + 1, op_end[k])

    # ---- "Memory" and "One instant": (time, class, order, rank, delta, who)
    events = []

    def free_at_end(k, nbytes_, allocated_at):
        s, e = op_start[k], op_end[k]
        cls = 0 if (e > s and e > allocated_at) else 1
        events.append((e, cls, 2 * k + 1, 0, -nbytes_, name(*ops[k])))

    events.append((0.0, 1, -2, 0, act[0], name(*ops[0])))  # a_0, resident from time 0
    for k, (kind, i) in enumerate(ops):
        s = op_start[k]
        if kind == "B":
            alloc = act[i - 1] + bwd_tmp[i] + (act[length] if i == length else 0)
        else:
            alloc = (saved[i] if kind == "F" else act[i]) + fwd_tmp[i]
        events.append((s, 1, 2 * k, 0, alloc, name(kind, i)))
        if kind == "B":
            free_at_end(k, bwd_tmp[i], s)
            free_at_end(k, act[i], s if i == length else op_start[b_index[i + 1]])  # g_i
            if i == 1:
                free_at_end(k, act[0], 0.0)  # a_0
        else:
            free_at_end(k, fwd_tmp[i], s)
        for inst, frees in uses[k]:
            if frees:
                where = tr_start[inst.prefetch] if inst.offload >= 0 else op_start[inst.maker]
                if split(inst):
                    free_at_end(k, saved[inst.unit] - act[inst.unit], op_start[inst.maker])  # the rest
                    free_at_end(k, act[inst.unit], where)
                else:
                    free_at_end(k, nbytes(inst), where)
    rank = {idx: r for r, idx in enumerate(served)}
    for idx, t in enumerate(transfers):
        inst = moved[idx]
        who = f"{'O' if t.kind == 'offload' else 'P'}_{t.unit}"
        if t.kind == "prefetch":
            events.append((tr_start[idx], 1, -1, rank[idx], moved_bytes(inst), who))
            continue
        readers = reads_original.get(idx, [])
        released = max([tr_end[idx]] + [op_end[r] for r in readers])
        zero = [r for r in readers if op_end[r] == released and op_end[r] <= op_start[r]]
        if zero:
            key = (1, 2 * max(zero) + 1)
        elif released > op_start[inst.maker]:
            key = (0, 2 * n + 2)
        else:
            key = (1, 2 * n + 2)
        events.append((released, key[0], key[1], 0, -moved_bytes(inst), who))
    events = sorted(events, key=lambda x: x[:4])

    # ---- the curve, peak, first memory violation
    running = 0
    after: dict[float, int] = {}
    peak, peak_time = 0, 0.0
    over = None
    for time, _cls, _order, _rank, delta, who in events:
        running += delta
        after[time] = running
        if running > peak:
            peak, peak_time = running, time
        if over is None and running > platform.memory:
            over = ("memory", who, time, running)

    # ---- "Violations": the earliest; read wins a tie; reads in event order
    first_read = min(reads, key=lambda r: r[:3]) if reads else None
    violation = None
    if first_read is not None and (over is None or first_read[0] <= over[2]):
        violation = ("read", first_read[3], first_read[0], first_read[4])
    elif over is not None:
        violation = over
    offloaded = sum(moved_bytes(moved[idx]) for idx, t in enumerate(transfers) if t.kind == "offload")
    return NaiveTimeline(
        op_start=op_start,
        op_end=op_end,
        transfer_start=tr_start,
        transfer_end=tr_end,
        events=events,
        after_instant=after,
        peak=peak,
        peak_time=peak_time,
        makespan=op_end[-1] if n else 0.0,
        offloaded_bytes=offloaded,
        violation=violation,
        reads=reads,
    )


def after_instants(timeline) -> dict[float, int]:
    """The memory after each instant of a real :class:`~chainoffload.Timeline`."""
    out: dict[float, int] = {}
    for time, value in zip(timeline.memory_time.tolist(), timeline.memory_bytes.tolist(), strict=True):
        out[time] = value
    return out


def assert_agrees(timeline, naive: NaiveTimeline) -> None:
    """Every figure of the real timeline equals the oracle's."""
    assert timeline.op_start.tolist() == naive.op_start, (timeline.op_start, naive.op_start)
    assert timeline.op_end.tolist() == naive.op_end
    assert _same(timeline.transfer_start.tolist(), naive.transfer_start), (timeline.transfer_start, naive.transfer_start)
    assert _same(timeline.transfer_end.tolist(), naive.transfer_end)
    assert after_instants(timeline) == naive.after_instant, (after_instants(timeline), naive.after_instant)
    assert (timeline.peak_memory, timeline.peak_time) == (naive.peak, naive.peak_time)
    assert timeline.makespan == naive.makespan
    assert timeline.offloaded_bytes == naive.offloaded_bytes
    v = timeline.violation
    got = None if v is None else (v.rule, v.op, v.time, v.bytes)
    assert got == naive.violation, (got, naive.violation)


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))
