"""The simulator's kernel: replay a fixed-order schedule event by event.

Private. :func:`chainoffload.simulate` validates the schedule, then calls
:func:`simulate_kernel` with flat arrays. The rules are DESIGN.md's; the decisions the contract
leaves open are written in the docstring of :func:`chainoffload.simulate.simulate`.
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


@njit
def _stable_order(keys, idx):
    """Stable argsort of ``keys[idx]``, applied to ``idx``."""
    sub = keys[idx]
    perm = np.argsort(sub, kind="mergesort")
    return idx[perm]


@njit
def _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, time, cls, seq, delta, who):
    """Append one memory event; returns the new count."""
    e_time[cnt] = time
    e_cls[cnt] = cls
    e_seq[cnt] = seq
    e_delta[cnt] = delta
    e_who[cnt] = who
    return cnt + 1


@njit
def simulate_kernel(
    fwd,
    bwd,
    fwd_nosave,
    act,
    saved,
    fwd_tmp,
    bwd_tmp,
    memory,
    bw_d2h,
    bw_h2d,
    latency,
    duplex,
    op_kind,
    op_stage,
    tr_kind,
    tr_unit,
    tr_op,
    tr_at,
    tr_before,
):
    """Replay a validated fixed-order schedule.

    Returns
    -------
    tuple
        ``(op_start, op_end, tr_start, tr_end, mem_time, mem_bytes, mem_who, peak, peak_time,
        rule, who, viol_time, viol_bytes)``. ``who`` / ``mem_who`` encode an op as its index k >= 0
        and a transfer t as ``-(t + 1)``.
    """
    n_stage = fwd.shape[0]
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

    f_pos = np.full(n_stage + 2, -1, dtype=np.int64)
    b_pos = np.full(n_stage + 2, -1, dtype=np.int64)
    for k in range(n):
        if op_kind[k] == OP_F and f_pos[op_stage[k]] < 0:
            f_pos[op_stage[k]] = k
        elif op_kind[k] == OP_B and b_pos[op_stage[k]] < 0:
            b_pos[op_stage[k]] = k
    off_idx = np.full(n_stage + 2, -1, dtype=np.int64)
    pre_idx = np.full(n_stage + 2, -1, dtype=np.int64)
    for t in range(m):
        if tr_kind[t] == 0:
            off_idx[tr_unit[t]] = t
        else:
            pre_idx[tr_unit[t]] = t

    # Trigger order: event position 2*op + at; ties keep list order (stable sort).
    ev = 2 * tr_op + tr_at
    order = np.argsort(ev, kind="mergesort")
    # Explicit waits, grouped by the op that waits.
    wait_order = np.argsort(tr_before, kind="mergesort")
    wptr = 0
    while wptr < m and tr_before[wait_order[wptr]] < 0:
        wptr += 1

    chan_free = np.zeros(2)
    ptr = 0
    prev_end = 0.0
    for k in range(n):
        s = prev_end
        while wptr < m and tr_before[wait_order[wptr]] == k:
            t = wait_order[wptr]
            if tr_end[t] > s:
                s = tr_end[t]
            wptr += 1
        if op_kind[k] == OP_B:
            j = op_stage[k]
            for u in (j, j - 1):
                if u >= 1 and pre_idx[u] >= 0:
                    p = pre_idx[u]
                    if np.isnan(tr_end[p]):
                        # The prefetch is triggered at or after this op: B_j would read a unit
                        # that is not on the GPU.
                        if s < viol_time:
                            rule = RULE_READ
                            who = k
                            viol_time = s
                            viol_bytes = saved[u - 1]
                    elif tr_end[p] > s:
                        s = tr_end[p]
        op_start[k] = s
        kind = op_kind[k]
        stage = op_stage[k]
        if kind == OP_F:
            dur = fwd[stage - 1]
        elif kind == OP_B:
            dur = bwd[stage - 1]
        else:
            dur = fwd_nosave[stage - 1]
        e = s + dur
        op_end[k] = e
        prev_end = e
        for phase in range(2):
            event = 2 * k + phase
            when = s if phase == 0 else e
            while ptr < m and ev[order[ptr]] == event:
                t = order[ptr]
                ptr += 1
                u = tr_unit[t]
                size = saved[u - 1]
                if tr_kind[t] == 0:
                    c = 0
                    bw = bw_d2h
                    start = max(chan_free[c], when)
                    fk = f_pos[u]
                    if fk < 0 or event < 2 * fk + 1:
                        # O_u reads unit u before F_u has made it.
                        if when < viol_time:
                            rule = RULE_READ
                            who = -(t + 1)
                            viol_time = when
                            viol_bytes = size
                else:
                    c = 1 if duplex else 0
                    bw = bw_h2d
                    start = max(chan_free[c], when)
                    o = off_idx[u]
                    if o >= 0 and not np.isnan(tr_end[o]) and tr_end[o] > start:
                        start = tr_end[o]
                dur_t = latency + size / bw
                tr_start[t] = start
                tr_end[t] = start + dur_t
                chan_free[c] = start + dur_t

    # ---- memory: events (time, class, seq, delta, who); class 0 frees memory allocated strictly
    # earlier and goes first at an instant; class 1 holds allocations and frees of memory
    # allocated at the same instant (zero-length ops), in causal order (seq).
    cap = 4 * n + 2 * m + 8
    e_time = np.zeros(cap)
    e_cls = np.zeros(cap, dtype=np.int64)
    e_seq = np.zeros(cap, dtype=np.int64)
    e_delta = np.zeros(cap, dtype=np.int64)
    e_who = np.zeros(cap, dtype=np.int64)
    cnt = 0

    # a_0, resident from time 0 to the end of B_1.
    b1 = b_pos[1]
    cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, 0.0, 1, -2, act[0], 0)
    if b1 >= 0:
        t_free = op_end[b1]
        # B_1's end frees go first at an instant only if B_1 took time (else after its own start).
        c0 = 0 if (t_free > 0.0 and t_free > op_start[b1]) else 1
        cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, t_free, c0, 2 * b1 + 1, -act[0], b1)

    # when each unit's saved[i] was last allocated (for the class of its free)
    for k in range(n):
        kind = op_kind[k]
        i = op_stage[k]
        s = op_start[k]
        e = op_end[k]
        if kind == OP_F:
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, s, 1, 2 * k, saved[i - 1] + fwd_tmp[i - 1], k)
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > s else 1, 2 * k + 1, -fwd_tmp[i - 1], k)
        elif kind == OP_B:
            alloc = act[i - 1] + bwd_tmp[i - 1]
            if i == n_stage:
                alloc += act[n_stage]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, s, 1, 2 * k, alloc, k)
            # bwd_tmp and g_i (allocated by B_{i+1}, or by B_i itself when i = L)
            g_alloc = s if i == n_stage else op_start[b_pos[i + 1]]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > s else 1, 2 * k + 1, -bwd_tmp[i - 1], k)
            # A zero-length B_i frees only after its own start allocation (causal order), even
            # memory allocated earlier: it still holds its inputs while it runs.
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if (e > g_alloc and e > s) else 1, 2 * k + 1, -act[i], k)
            # saved[i]: allocated by F_i, or by P_i when the unit was offloaded
            p = pre_idx[i]
            s_alloc = tr_start[p] if p >= 0 else op_start[f_pos[i]]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if (e > s_alloc and e > s) else 1, 2 * k + 1, -saved[i - 1], k)
    for t in range(m):
        u = tr_unit[t]
        if tr_kind[t] == 0:
            # The GPU copy is freed once the copy is done and F_{u+1} no longer reads a_u.
            t_free = tr_end[t]
            if u < n_stage and f_pos[u + 1] >= 0 and op_end[f_pos[u + 1]] > t_free:
                t_free = op_end[f_pos[u + 1]]
            fk = f_pos[u]
            alloc_t = op_start[fk] if fk >= 0 else 0.0
            f_cls = 0 if t_free > alloc_t else 1
            f_seq = 2 * n + 2
            if u < n_stage and f_pos[u + 1] >= 0:
                f1 = f_pos[u + 1]
                if op_end[f1] == t_free and op_end[f1] <= op_start[f1]:
                    # Freed when a zero-length F_{u+1} ends: after that op's own allocation.
                    f_cls = 1
                    f_seq = 2 * f1 + 1
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, t_free, f_cls, f_seq, -saved[u - 1], -(t + 1))
        else:
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, tr_start[t], 1, -1, saved[u - 1], -(t + 1))

    idx = np.arange(cnt)
    idx = _stable_order(e_seq, idx)
    idx = _stable_order(e_cls, idx)
    idx = _stable_order(e_time, idx)

    mem_time = np.empty(cnt)
    mem_bytes = np.empty(cnt, dtype=np.int64)
    mem_who = np.empty(cnt, dtype=np.int64)
    running = 0
    peak = 0
    peak_time = 0.0
    over_found = False
    for q in range(cnt):
        ev_i = idx[q]
        running += e_delta[ev_i]
        mem_time[q] = e_time[ev_i]
        mem_bytes[q] = running
        mem_who[q] = e_who[ev_i]
        if running > peak:
            peak = running
            peak_time = e_time[ev_i]
        if not over_found and running > memory:
            over_found = True
            if e_time[ev_i] < viol_time:
                rule = RULE_MEMORY
                who = e_who[ev_i]
                viol_time = e_time[ev_i]
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
