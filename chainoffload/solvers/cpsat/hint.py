"""Warm starts: a schedule mapped into the model's space and onto its variables.

:func:`in_model_space` says whether a schedule can be a solution of the model (and drops the
waits the model leaves implicit), :func:`integer_replay` times it on the model's integer grid
with the simulator's rules, :func:`canonical` moves its triggers where the model expects them
(NOTE [ cpsat: canonical triggers ]), and :func:`hint_values` gives every decision variable
its value, so that CP-SAT starts from that schedule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...chain import Chain
from ...order import fixed_order, reader_pos, transfer_events, trigger, wait_ops
from ...schedule import Schedule, ScheduleError
from .grid import TimeGrid
from .variables import Variables

__all__ = ["in_model_space", "integer_replay", "canonical", "hint_values"]


def in_model_space(chain: Chain, schedule: Schedule) -> Schedule | None:
    """The schedule with redundant waits dropped, if it lies in the CP-SAT model's space; else None.

    The space (NOTE [ cpsat: expressible timings ]): the fixed compute order, every transfer
    triggered in its valid range, prefetch not before offload, and explicit waits only on
    offloads at ops before B_{u+1}. Waits at B_{u+1} or later are implied and dropped here;
    waits that do not bind are kept (the model re-derives which bind).
    """
    try:
        schedule.validate(chain)
    except ScheduleError:
        return None
    if schedule.has_remat:
        return None
    length = chain.length
    out = []
    for t in schedule.transfers:
        lo, hi = transfer_events(length, t.unit)
        if not lo <= t.event <= hi:
            return None
        before = t.before
        if before is not None:
            if t.kind == "prefetch":
                if before >= reader_pos(length, t.unit):
                    before = None  # implied by B_{u+1}'s implicit wait on this prefetch
                else:
                    return None
            elif before not in wait_ops(length, t.unit):
                before = None  # at or after B_{u+1}: implied by the wait on P_u
        out.append(dataclasses.replace(t, before=before))
    return Schedule(schedule.compute, tuple(out))


def integer_replay(grid: TimeGrid, length: int, schedule: Schedule, duplex: bool) -> dict[str, list[int]]:
    """The simulator's timing rules replayed on the integer durations of ``grid``.

    Mirrors chainoffload.simulate's timing decisions (trigger order with list-order ties,
    FIFO non-preemptive channels, a prefetch waits for its offload, explicit and implicit
    waits) with integer arithmetic; memory is not checked. Used to complete solution hints
    and, in the tests, to show that CP-SAT's times are exactly this replay.

    Returns
    -------
    dict
        ``op_start``, ``op_end`` (per compute op) and ``start``, ``end`` (per transfer).
    """
    n = 2 * length
    transfers = schedule.transfers
    m = len(transfers)
    order = sorted(range(m), key=lambda t: (transfers[t].event, t))
    offload_of = {t.unit: idx for idx, t in enumerate(transfers) if t.kind == "offload"}
    prefetch_of = {t.unit: idx for idx, t in enumerate(transfers) if t.kind == "prefetch"}
    waits: dict[int, list[int]] = {}
    for idx, t in enumerate(transfers):
        if t.before is not None:
            waits.setdefault(t.before, []).append(idx)
    op_start, op_end = [0] * n, [0] * n
    start: list[int] = [0] * m
    end: list[int] = [0] * m
    done = [False] * m
    chan_free = [0, 0]
    ptr = 0
    for k, (kind, stage) in enumerate(fixed_order(length)):
        s = op_end[k - 1] if k else 0
        for t in waits.get(k, ()):
            if done[t]:
                s = max(s, end[t])
        if kind == "B":
            for u in (stage, stage - 1):
                p = prefetch_of.get(u)
                if p is not None and done[p]:
                    s = max(s, end[p])
        op_start[k], op_end[k] = s, s + grid.op[k]
        for event, when in ((2 * k, s), (2 * k + 1, s + grid.op[k])):
            while ptr < m and transfers[order[ptr]].event == event:
                t = order[ptr]
                ptr += 1
                tr = transfers[t]
                dur = grid.transfer(tr.kind, tr.unit, tr.moves)
                if tr.kind == "offload":
                    c = 0
                    st = max(chan_free[c], when)
                else:
                    c = 1 if duplex else 0
                    st = max(chan_free[c], when)
                    o = offload_of.get(tr.unit)
                    if o is not None and done[o]:
                        st = max(st, end[o])
                start[t], end[t], done[t] = st, st + dur, True
                chan_free[c] = st + dur
    return {"op_start": op_start, "op_end": op_end, "start": start, "end": end}


def _merge_coinciding_starts(grid: TimeGrid, length: int, schedule: Schedule, duplex: bool) -> Schedule:
    """Move triggers at the start of op k+1 that coincides with the end of op k to that end.

    The FIFO order is kept: transfers are listed in their original trigger order, and the
    moved ones only join the adjacent event, so the replay is unchanged.
    """
    rep = integer_replay(grid, length, schedule, duplex)
    order = sorted(range(len(schedule.transfers)), key=lambda t: (schedule.transfers[t].event, t))
    out = []
    for t in order:
        tr = schedule.transfers[t]
        k = tr.op
        if tr.at == "start" and k >= 1 and rep["op_start"][k] == rep["op_end"][k - 1]:
            tr = dataclasses.replace(tr, op=k - 1, at="end")
        out.append(tr)
    return Schedule(schedule.compute, tuple(out))


def canonical(grid: TimeGrid, length: int, schedule: Schedule, duplex: bool, *, latest: bool) -> Schedule:
    """The same timeline with the triggers the model allows (NOTE [ cpsat: canonical triggers ]).

    A start of op k+1 at the instant op k ends becomes that end; with ``latest``, every
    trigger moves to the latest allowed event not after its transfer's start, and transfers
    are listed in start order (the FIFO order). Falls back to the first step alone if the
    second would change the replay (it cannot for transfers of at least one unit; the check
    is cheap).
    """
    merged = _merge_coinciding_starts(grid, length, schedule, duplex)
    if not latest:
        return merged
    rep = integer_replay(grid, length, merged, duplex)
    n = 2 * length
    allowed = []
    for k in range(n):
        if not (k >= 1 and rep["op_start"][k] == rep["op_end"][k - 1]):
            allowed.append((2 * k, rep["op_start"][k]))
        allowed.append((2 * k + 1, rep["op_end"][k]))
    rows = []
    for idx, tr in enumerate(merged.transfers):
        lo, hi = transfer_events(length, tr.unit)
        start = rep["start"][idx]
        ev = max(e for e, tm in allowed if lo <= e <= hi and (tm <= start or e == lo))
        op, at = trigger(ev)
        rows.append(((ev, start, rep["end"][idx], tr.kind == "prefetch"), dataclasses.replace(tr, op=op, at=at)))
    rows.sort(key=lambda r: r[0])
    canon = Schedule(schedule.compute, tuple(tr for _, tr in rows))
    again = integer_replay(grid, length, canon, duplex)
    same = again["op_start"] == rep["op_start"] and sorted(zip(again["start"], again["end"], strict=True)) == sorted(zip(rep["start"], rep["end"], strict=True))
    return canon if same else merged


def hint_values(variables: Variables, schedule: Schedule) -> dict[Any, int]:
    """A value for every decision variable of ``variables`` that makes ``schedule`` a solution.

    ``schedule`` must lie in the model's space (:func:`in_model_space`). Times come from the
    integer replay; the Booleans that say which term is each start's maximum, which transfer
    goes first on a channel and which wait binds are read off those times.
    """
    v = variables
    grid, length, duplex = v.grid, v.length, v.platform.duplex
    schedule = canonical(grid, length, schedule, duplex, latest=v.canonical)
    rep = integer_replay(grid, length, schedule, duplex)
    values: dict[Any, int] = {}
    for op in v.ops:
        values[op.start] = rep["op_start"][op.index]
        values[op.end] = rep["op_end"][op.index]
        if op.gap is not None:
            values[op.gap] = int(rep["op_start"][op.index] > rep["op_end"][op.index - 1])
    timed: dict[tuple[str, int], tuple[int, int, int, int]] = {}  # key -> (start, end, event, list position)
    for idx, t in enumerate(schedule.transfers):
        timed[("O" if t.kind == "offload" else "P", t.unit)] = (rep["start"][idx], rep["end"][idx], t.event, idx)

    def event_time(e: int) -> int:
        return rep["op_start"][e // 2] if e % 2 == 0 else rep["op_end"][e // 2]

    alone = {t.unit for t in schedule.transfers if t.moves == "act"}
    for u, unit in v.units.items():
        values[unit.offloaded] = int(("O", u) in timed)
        if unit.alone is not None:
            values[unit.alone] = int(("O", u) in timed and u in alone)
            values[unit.whole] = int(("O", u) in timed and u not in alone)
        for tr in (unit.offload, unit.prefetch):
            if tr.key in timed:
                st, en, ev, _ = timed[tr.key]
                trig = event_time(ev)
            else:
                st, en, ev, trig = 0, tr.duration, tr.events[0], 0
            values[tr.start], values[tr.end], values[tr.event], values[tr.trigger_time] = st, en, ev, trig
            for e, y in tr.triggers.items():
                values[y] = int(tr.key in timed and e == ev)
    for (a, b), p in v.order.items():
        if a in timed and b in timed:
            # FIFO: trigger order, ties by list order.
            values[p] = int((timed[a][2], timed[a][3]) < (timed[b][2], timed[b][3]))
        else:
            values[p] = 1  # the value symmetry breaking gives a pair with an absent member

    def goes_first(a, b) -> bool:
        if a[1] == b[1]:
            return a[0] == "O"
        lit = v.order.get((a, b))
        return bool(values[lit]) if lit is not None else not values[v.order[(b, a)]]

    for key, causes in v.transfer_cause.items():
        tr = v.transfer(key)
        for what, c in causes.items():
            ok = False
            if key in timed:
                st = timed[key][0]
                if what == "trigger":
                    ok = st == values[tr.trigger_time]
                elif what == "offload":
                    ok = st == timed[("O", key[1])][1]
                elif what in timed:
                    ok = st == timed[what][1] and goes_first(what, key)
            values[c] = int(ok)
    waits = {(t.unit, t.before) for t in schedule.transfers if t.kind == "offload" and t.before is not None}
    for u, unit in v.units.items():
        for k, w in unit.waits.items():
            values[w] = int((u, k) in waits and rep["op_start"][k] == timed[("O", u)][1])
    for op in v.ops[1:]:
        for what, c in v.op_cause[op.index].items():
            if what == "previous":
                continue  # the negation of op.gap, hinted above
            if what[0] == "P":
                values[c] = int(what in timed and rep["op_start"][op.index] == timed[what][1])
    return values

