"""The simulator's kernel for schedules with rematerialization (Fck / Fn ops, repeated forwards).

Private. :func:`chainoffload.remat.simulate_remat` checks the structure, resolves every op's
reads and frees into *instances* (one residency of a unit's data on the GPU, made by one op),
then calls :func:`simulate_remat_kernel` with flat arrays. The memory semantics are written
in the docstring of :func:`chainoffload.remat.simulate_remat`; the timing decisions are those
of :func:`chainoffload.simulate.simulate` (trigger order, FIFO channels, waits, instants).
"""

from __future__ import annotations

import numpy as np

from .config import njit
from .simulate import RULE_MEMORY, RULE_NONE, RULE_READ, _push, _stable_order

OP_F = 0
OP_B = 1
OP_FCK = 2
OP_FN = 3


@njit
def simulate_remat_kernel(
    act,
    fwd_tmp,
    bwd_tmp,
    memory,
    bw_d2h,
    bw_h2d,
    latency,
    duplex,
    op_kind,
    op_stage,
    op_dur,
    op_inst,
    use_ptr,
    use_inst,
    free_ptr,
    free_inst,
    inst_size,
    inst_prod,
    inst_off,
    inst_pre,
    tr_kind,
    tr_inst,
    tr_op,
    tr_at,
    tr_before,
):
    """Replay a validated rematerialization schedule.

    ``op_inst[k]`` is the instance op k makes (-1 for B); ``use_inst[use_ptr[k]:use_ptr[k+1]]``
    the instances op k reads or frees (it waits for their prefetch); ``free_inst[...]`` the
    instances freed at the end of op k. ``inst_off`` / ``inst_pre`` give an instance's offload
    and prefetch (-1 when none).

    Returns
    -------
    tuple
        As :func:`chainoffload._kernels.simulate.simulate_kernel`.
    """
    n_stage = fwd_tmp.shape[0]
    n = op_kind.shape[0]
    m = tr_kind.shape[0]
    n_inst = inst_size.shape[0]
    op_start = np.zeros(n)
    op_end = np.zeros(n)
    tr_start = np.full(m, np.nan)
    tr_end = np.full(m, np.nan)

    rule = RULE_NONE
    who = 0
    viol_time = np.inf
    viol_bytes = 0

    ev = 2 * tr_op + tr_at
    order = np.argsort(ev, kind="mergesort")
    wait_order = np.argsort(tr_before, kind="mergesort")
    wptr = 0
    while wptr < m and tr_before[wait_order[wptr]] < 0:
        wptr += 1

    # Latest end of the ops that read an offloaded instance before its prefetch is triggered:
    # the original GPU copy stays until they are done (as F_{i+1} keeps a_i in the fixed order).
    mid_end = np.full(n_inst, -np.inf)
    b_pos = np.full(n_stage + 2, -1, dtype=np.int64)

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
        for q in range(use_ptr[k], use_ptr[k + 1]):
            u = use_inst[q]
            p = inst_pre[u]
            if p >= 0 and ev[p] < 2 * k:
                if tr_end[p] > s:
                    s = tr_end[p]
            elif p >= 0 and ev[p] == 2 * k:
                # Triggered by this op's own start: the op cannot wait for it.
                if s < viol_time:
                    rule = RULE_READ
                    who = k
                    viol_time = s
                    viol_bytes = inst_size[u]
        op_start[k] = s
        e = s + op_dur[k]
        op_end[k] = e
        prev_end = e
        if op_kind[k] == OP_B:
            b_pos[op_stage[k]] = k
        for q in range(use_ptr[k], use_ptr[k + 1]):
            u = use_inst[q]
            p = inst_pre[u]
            if inst_off[u] >= 0 and p >= 0 and ev[p] > 2 * k and e > mid_end[u]:
                mid_end[u] = e
        for phase in range(2):
            event = 2 * k + phase
            when = s if phase == 0 else e
            while ptr < m and ev[order[ptr]] == event:
                t = order[ptr]
                ptr += 1
                u = tr_inst[t]
                size = inst_size[u]
                if tr_kind[t] == 0:
                    c = 0
                    bw = bw_d2h
                    start = max(chan_free[c], when)
                else:
                    c = 1 if duplex else 0
                    bw = bw_h2d
                    start = max(chan_free[c], when)
                    o = inst_off[u]
                    if o >= 0 and not np.isnan(tr_end[o]) and tr_end[o] > start:
                        start = tr_end[o]
                dur_t = latency + size / bw
                tr_start[t] = start
                tr_end[t] = start + dur_t
                chan_free[c] = start + dur_t

    # ---- memory events, classes as in the fixed-order kernel: class 0 frees memory allocated
    # strictly earlier and goes first at an instant; class 1 holds allocations and same-instant
    # frees in causal order (seq).
    cap = 4 * n + 3 * n_inst + 8
    e_time = np.zeros(cap)
    e_cls = np.zeros(cap, dtype=np.int64)
    e_seq = np.zeros(cap, dtype=np.int64)
    e_delta = np.zeros(cap, dtype=np.int64)
    e_who = np.zeros(cap, dtype=np.int64)
    cnt = 0

    b1 = b_pos[1]
    cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, 0.0, 1, -2, act[0], 0)
    if b1 >= 0:
        t_free = op_end[b1]
        cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, t_free, 0 if t_free > 0.0 else 1, 2 * b1 + 1, -act[0], b1)

    for k in range(n):
        kind = op_kind[k]
        i = op_stage[k]
        s = op_start[k]
        e = op_end[k]
        if kind == OP_B:
            alloc = act[i - 1] + bwd_tmp[i - 1]
            if i == n_stage:
                alloc += act[n_stage]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, s, 1, 2 * k, alloc, k)
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > s else 1, 2 * k + 1, -bwd_tmp[i - 1], k)
            g_alloc = s if i == n_stage else op_start[b_pos[i + 1]]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > g_alloc else 1, 2 * k + 1, -act[i], k)
        else:
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, s, 1, 2 * k, inst_size[op_inst[k]] + fwd_tmp[i - 1], k)
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > s else 1, 2 * k + 1, -fwd_tmp[i - 1], k)
        for q in range(free_ptr[k], free_ptr[k + 1]):
            u = free_inst[q]
            p = inst_pre[u]
            a_t = tr_start[p] if p >= 0 else op_start[inst_prod[u]]
            cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, e, 0 if e > a_t else 1, 2 * k + 1, -inst_size[u], k)
    for u in range(n_inst):
        o = inst_off[u]
        if o < 0:
            continue
        # The original copy: freed once copied and no earlier reader needs it.
        t_free = tr_end[o]
        if mid_end[u] > t_free:
            t_free = mid_end[u]
        a_t = op_start[inst_prod[u]]
        cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, t_free, 0 if t_free > a_t else 1, 2 * n + 2, -inst_size[u], -(o + 1))
        p = inst_pre[u]
        cnt = _push(e_time, e_cls, e_seq, e_delta, e_who, cnt, tr_start[p], 1, -1, inst_size[u], -(p + 1))

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
