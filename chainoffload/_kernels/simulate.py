"""The simulator's kernel: replay a resolved schedule event by event, with one memory sweep.

Private. Every schedule, fixed-order or rematerializing, is first resolved into per-op and
per-transfer lists by :func:`chainoffload._kernels.structure.resolve_kernel`; this kernel only
times the ops and transfers and sweeps the memory events in time order. The rules are
``docs/model.md``'s; ``NOTE [ one instant ]`` below says how an instant is ordered.

NOTE [ one instant ]
--------------------
Every memory event has a key ``(time, class, seq)``. Class 0 holds the frees of memory
allocated strictly earlier, at the end of an op that took time (or the release of an offloaded
copy): they go first at an instant. Class 1 holds everything else in causal order ``seq``: a_0
at time 0 (-2), the prefetch allocations (-1, in their channel's order), the start allocation of
op k (2k), the frees at the end of op k when it took no time or the memory was allocated at
that instant (2k + 1), a release caused by such an op's end (2k + 1), any other release of
memory allocated at that instant (2n + 2, last). Within one key the events are all frees or all
allocations, so the peak and the value after the instant do not depend on their order.

NOTE [ nearly sorted ]
----------------------
No comparison sort: the events come in three streams, each generated in nearly sorted order,
and each kept sorted by an insertion step that costs one comparison per event when the event is
already in place. The ops' starts and ends are in order (ops run one at a time, and a free of
class 0 only comes at the end of an op that took time); the prefetch allocations are in order (one channel serves them in turn); the releases of
offloaded copies come in trigger order, nearly sorted by the end of the copy or of the last
reader. The insertion step keeps each stream right whatever class the rules give an event (the
mutation check, ``benchmarks/mutations.py``, relies on that). One merge of the three gives the
curve.
"""

from __future__ import annotations

import numpy as np

from .config import njit

# Violation codes (the order is that of VIOLATION_RULES in simulate.py).
RULE_NONE = 0
RULE_MEMORY = 1
RULE_READ = 2

OP_F = 0
OP_B = 1


@njit(inline="always")
def _key_before(ta, ca, sa, tb, cb, sb):
    """Whether key (ta, ca, sa) sorts strictly before (tb, cb, sb)."""
    if ta != tb:
        return ta < tb
    if ca != cb:
        return ca < cb
    return sa < sb


@njit(inline="always")
def _stream(capacity):
    """Empty arrays for a stream of memory events: time, class, seq, delta, who."""
    return (
        np.empty(capacity),
        np.empty(capacity, dtype=np.int64),
        np.empty(capacity, dtype=np.int64),
        np.empty(capacity, dtype=np.int64),
        np.empty(capacity, dtype=np.int64),
    )


@njit(inline="always")
def _insert(e_time, e_cls, e_seq, e_delta, e_who, cnt, time, cls, seq, delta, who):
    """Insert an event into a sorted stream of ``cnt`` events, stably; returns the new count."""
    j = cnt
    while j > 0 and _key_before(time, cls, seq, e_time[j - 1], e_cls[j - 1], e_seq[j - 1]):
        e_time[j] = e_time[j - 1]
        e_cls[j] = e_cls[j - 1]
        e_seq[j] = e_seq[j - 1]
        e_delta[j] = e_delta[j - 1]
        e_who[j] = e_who[j - 1]
        j -= 1
    e_time[j] = time
    e_cls[j] = cls
    e_seq[j] = seq
    e_delta[j] = delta
    e_who[j] = who
    return cnt + 1


@njit
def replay_kernel(
    fwd,
    bwd,
    fwd_nosave,
    sizes,
    memory,
    bw_d2h,
    bw_h2d,
    latency,
    duplex,
    op_kind,
    op_stage,
    alloc_ptr,
    alloc_size,
    free_ptr,
    free_size,
    free_src,
    wait_ptr,
    wait_tr,
    hold_ptr,
    hold_op,
    tr_kind,
    tr_event,
    tr_size,
    tr_src,
    tr_after,
    tr_order,
):
    """Replay a resolved schedule.

    ``sizes`` is the chain's size table (:func:`~chainoffload._kernels.structure.size_table`);
    the structure arrays are :func:`~chainoffload._kernels.structure.resolve_kernel`'s.

    Returns
    -------
    tuple
        ``(op_start, op_end, tr_start, tr_end, mem_time, mem_bytes, mem_who, peak, peak_time,
        rule, who, viol_time, viol_bytes)``. ``who`` / ``mem_who`` encode an op as its index k >= 0
        and a transfer t as ``-(t + 1)``.
    """
    n = op_kind.shape[0]
    m = tr_kind.shape[0]
    op_start = np.zeros(n)
    op_end = np.zeros(n)
    tr_start = np.full(m, np.nan)
    tr_end = np.full(m, np.nan)

    rule = RULE_NONE
    who = 0
    viol_time = np.inf
    viol_bytes = 0

    # ---- times: ops in sequence, transfers queued at their trigger, FIFO per channel
    chan_free = np.zeros(2)
    ptr = 0
    prev_end = 0.0
    for k in range(n):
        s = prev_end
        late = -1
        for q in range(wait_ptr[k], wait_ptr[k + 1]):
            t = wait_tr[q]
            if tr_event[t] >= 2 * k:
                # triggered at or after this op's start: it cannot wait for it
                if late < 0:
                    late = t
            elif tr_end[t] > s:
                s = tr_end[t]
        if late >= 0 and s < viol_time:
            rule = RULE_READ
            who = k
            viol_time = s
            viol_bytes = sizes[tr_size[late]]
        kind = op_kind[k]
        stage = op_stage[k]
        if kind == OP_F:
            dur = fwd[stage - 1]
        elif kind == OP_B:
            dur = bwd[stage - 1]
        else:
            dur = fwd_nosave[stage - 1]
        e = s + dur
        op_start[k] = s
        op_end[k] = e
        prev_end = e
        for phase in range(2):
            event = 2 * k + phase
            when = s if phase == 0 else e
            while ptr < m and tr_event[tr_order[ptr]] == event:
                t = tr_order[ptr]
                ptr += 1
                size = sizes[tr_size[t]]
                if tr_kind[t] == 0:
                    c = 0
                    bw = bw_d2h
                    start = max(chan_free[0], when)
                    if event < 2 * tr_src[t] + 1:
                        # the offload copies data its maker has not made yet
                        if when < viol_time:
                            rule = RULE_READ
                            who = -(t + 1)
                            viol_time = when
                            viol_bytes = size
                else:
                    c = 1 if duplex else 0
                    bw = bw_h2d
                    start = max(chan_free[c], when)
                    end_off = tr_end[tr_after[t]]
                    if end_off > start:
                        start = end_off
                end = start + (latency + size / bw)
                tr_start[t] = start
                tr_end[t] = end
                chan_free[c] = end

    # ---- stream A: a_0, then each op's start allocation and end frees (NOTE [ nearly sorted ])
    na = 2 + n + free_ptr[n]
    a_time, a_cls, a_seq, a_delta, a_who = _stream(na)
    ca = _insert(a_time, a_cls, a_seq, a_delta, a_who, 0, 0.0, 1, -2, sizes[0], 0)
    for k in range(n):
        s = op_start[k]
        e = op_end[k]
        total = 0
        for q in range(alloc_ptr[k], alloc_ptr[k + 1]):
            total += sizes[alloc_size[q]]
        ca = _insert(a_time, a_cls, a_seq, a_delta, a_who, ca, s, 1, 2 * k, total, k)
        for q in range(free_ptr[k], free_ptr[k + 1]):
            src = free_src[q]
            alloc_t = op_start[src] if src >= 0 else tr_start[-src - 1]
            # class 0 (first at the instant) only for memory allocated strictly earlier, freed by
            # an op that took time (NOTE [ one instant ])
            c0 = e > s and e > alloc_t
            ca = _insert(a_time, a_cls, a_seq, a_delta, a_who, ca, e, 0 if c0 else 1, 2 * k + 1, -sizes[free_size[q]], k)

    # ---- stream B: the prefetch allocations, in their channel's order
    b_time, b_cls, b_seq, b_delta, b_who = _stream(m)
    cb = 0
    for q in range(m):
        t = tr_order[q]
        if tr_kind[t] == 1:
            cb = _insert(b_time, b_cls, b_seq, b_delta, b_who, cb, tr_start[t], 1, -1, sizes[tr_size[t]], -(t + 1))

    # ---- stream C: releases of the original copy of offloaded data
    c_time, c_cls, c_seq, c_delta, c_who = _stream(m)
    cc = 0
    for q in range(m):
        t = tr_order[q]
        if tr_kind[t] != 0:
            continue
        t_free = tr_end[t]
        for h in range(hold_ptr[t], hold_ptr[t + 1]):
            if op_end[hold_op[h]] > t_free:
                t_free = op_end[hold_op[h]]
        zl = -1
        for h in range(hold_ptr[t], hold_ptr[t + 1]):
            r = hold_op[h]
            if op_end[r] == t_free and op_end[r] <= op_start[r] and r > zl:
                zl = r
        if zl >= 0:
            # freed when a zero-length reader ends: after that op's own allocation
            cls = 1
            seq = 2 * zl + 1
        elif t_free > op_start[tr_src[t]]:
            cls = 0
            seq = 2 * n + 2
        else:
            cls = 1
            seq = 2 * n + 2
        cc = _insert(c_time, c_cls, c_seq, c_delta, c_who, cc, t_free, cls, seq, -sizes[tr_size[t]], -(t + 1))

    # ---- one merge of A, B and C (ties: A, B, C); the running sum is the curve
    total_events = ca + cb + cc
    mem_time = np.empty(total_events)
    mem_bytes = np.empty(total_events, dtype=np.int64)
    mem_who = np.empty(total_events, dtype=np.int64)
    running = 0
    peak = 0
    peak_time = 0.0
    over_found = False
    ia = 0
    ib = 0
    ic = 0
    for out in range(total_events):
        if ia < ca and (ib >= cb or not _key_before(b_time[ib], b_cls[ib], b_seq[ib], a_time[ia], a_cls[ia], a_seq[ia])):
            src = 0
            bt = a_time[ia]
            bc = a_cls[ia]
            bs = a_seq[ia]
        elif ib < cb:
            src = 1
            bt = b_time[ib]
            bc = b_cls[ib]
            bs = b_seq[ib]
        else:
            src = 2
            bt = 0.0
            bc = 0
            bs = 0
        if ic < cc and (src == 2 or _key_before(c_time[ic], c_cls[ic], c_seq[ic], bt, bc, bs)):
            src = 2
        if src == 0:
            time = a_time[ia]
            delta = a_delta[ia]
            w = a_who[ia]
            ia += 1
        elif src == 1:
            time = b_time[ib]
            delta = b_delta[ib]
            w = b_who[ib]
            ib += 1
        else:
            time = c_time[ic]
            delta = c_delta[ic]
            w = c_who[ic]
            ic += 1
        running += delta
        mem_time[out] = time
        mem_bytes[out] = running
        mem_who[out] = w
        if running > peak:
            peak = running
            peak_time = time
        if not over_found and running > memory:
            over_found = True
            if time < viol_time:
                rule = RULE_MEMORY
                who = w
                viol_time = time
                viol_bytes = running
    return (
        op_start,
        op_end,
        tr_start,
        tr_end,
        mem_time,
        mem_bytes,
        mem_who,
        peak,
        peak_time,
        rule,
        who,
        viol_time,
        viol_bytes,
    )
