"""The transfer planner's kernel: place the triggers of a given offload set, greedily.

Private; :func:`chainoffload.planner.plan_transfers` builds the arrays, calls
:func:`plan_kernel` and turns its answer into a :class:`~chainoffload.Schedule`. The rules it
follows are written in ``NOTE [ transfer planner ]`` in that module.
"""

from __future__ import annotations

import numpy as np

from .config import njit


@njit
def plan_kernel(fwd, bwd, act, saved, fwd_tmp, bwd_tmp, memory, d_time, h_time, duplex, offload, optimistic):
    """Plan the transfers of the units ``offload[i] != 0`` (index i = stage, 1..L; index 0 unused).

    With ``optimistic`` false a prefetch's memory is counted from its trigger on (safe); with
    it true, from the backward phase in which the copy is expected to start, given the H2D
    queue and no further waits (later, tighter, but a wait the planner did not foresee can
    make it wrong: the caller simulates both and keeps the better).

    Returns
    -------
    tuple
        ``(off_before, pre_op, fits, makespan)``: per stage, the compute op (0-based) that waits
        for its offload (-1: none) and the compute op whose end triggers its prefetch (-1: not
        offloaded); whether every memory check passed; and the makespan the plan gives under
        the simulator's timing rules.
    """
    n = fwd.shape[0]
    off_before = np.full(n + 1, -1, dtype=np.int64)
    pre_op = np.full(n + 1, -1, dtype=np.int64)
    oend = np.zeros(n + 1)
    fend = np.zeros(n + 2)
    fits = True

    # Offloaded units in stage order: the D2H channel serves them in this order.
    n_off = 0
    for i in range(1, n + 1):
        if offload[i] != 0:
            n_off += 1
    off_units = np.empty(n_off, dtype=np.int64)
    q = 0
    for i in range(1, n + 1):
        if offload[i] != 0:
            off_units[q] = i
            q += 1

    # ---- forward: O_i at the end of F_i; F_k waits for the fewest offloads that make it fit.
    t = 0.0
    chan_d = 0.0
    cur = act[0]
    fp = 0  # next offloaded unit whose GPU copy has not been freed
    for k in range(1, n + 1):
        s = t
        while fp < n_off and off_units[fp] <= k - 2 and oend[off_units[fp]] <= s:
            cur -= saved[off_units[fp] - 1]
            fp += 1
        need = cur + saved[k - 1] + fwd_tmp[k - 1]
        wait_on = -1
        while need > memory and fp < n_off and off_units[fp] <= k - 2:
            u = off_units[fp]
            if oend[u] > s:
                s = oend[u]
                wait_on = u
            cur -= saved[u - 1]
            need -= saved[u - 1]
            fp += 1
        if need > memory:
            fits = False
        if wait_on > 0:
            off_before[wait_on] = k - 1
        e = s + fwd[k - 1]
        fend[k] = e
        t = e
        cur += saved[k - 1]
        if offload[k] != 0:
            st = chan_d if chan_d > e else e
            oend[k] = st + d_time[k - 1]
            chan_d = oend[k]
    t_fwd = t

    # ---- backward memory per phase B_j without any offloaded unit, plus the GPU copies whose
    # offload ends after the backward has begun (counted while B_j could start before the free:
    # start times are bounded below by running the backward without waits).
    slack = np.zeros(n + 2)
    kept = act[0]
    for j in range(1, n + 1):
        if offload[j] == 0:
            kept += saved[j - 1]
        need_b = kept + act[j] + act[j - 1] + bwd_tmp[j - 1]
        if j == n:
            need_b += act[n]
        slack[j] = memory - need_b
    lb_start = np.zeros(n + 2)
    bwait = np.zeros(n + 2)
    acc = t_fwd
    for j in range(n, 0, -1):
        lb_start[j] = acc
        acc += bwd[j - 1]
    for q in range(n_off):
        v = off_units[q]
        free_v = oend[v]
        if v < n and fend[v + 1] > free_v:
            free_v = fend[v + 1]
        if free_v <= t_fwd:
            continue
        for j in range(n, v - 1, -1):
            if lb_start[j] >= free_v:
                break
            if slack[j] < saved[v - 1]:
                # B_j cannot run beside this copy: it waits for the offload, after which the
                # copy is gone (F_{v+1} ended in the forward) for B_j and every later phase.
                off_before[v] = 2 * n - j
                if oend[v] > bwait[j]:
                    bwait[j] = oend[v]
                break
            slack[j] -= saved[v - 1]

    # ---- backward: prefetches in decreasing stage order on the H2D channel, each triggered at
    # the earliest boundary (end of F_L, then end of B_{j+1}) where its memory fits up to B_u;
    # the latest boundary is the one before B_{u+1}, which reads it.
    chan_h = 0.0 if duplex else chan_d
    pend = np.zeros(n + 2)
    nxt = n_off - 1
    t = t_fwd
    for j in range(n, 0, -1):
        trig_op = n - 1 if j == n else 2 * n - j - 1  # F_L, or B_{j+1}
        while nxt >= 0:
            u = off_units[nxt]
            mandatory = u >= j - 1
            st = t
            if chan_h > st:
                st = chan_h
            if oend[u] > st:
                st = oend[u]
            # First phase the copy is present in: the trigger's, or (optimistic) the one its
            # start falls in if the backward runs on without waiting; never after B_{u+1}.
            first = j
            if optimistic:
                est = t
                while first > u + 1 and est + bwd[first - 1] <= st:
                    est += bwd[first - 1]
                    first -= 1
            ok = True
            for i in range(u, first + 1):
                if slack[i] < saved[u - 1]:
                    ok = False
                    break
            if not ok and not mandatory:
                break
            if not ok:
                fits = False
            for i in range(u, first + 1):
                slack[i] -= saved[u - 1]
            pre_op[u] = trig_op
            pend[u] = st + h_time[u - 1]
            chan_h = pend[u]
            nxt -= 1
        s = t
        if bwait[j] > s:
            s = bwait[j]
        if offload[j] != 0 and pend[j] > s:
            s = pend[j]
        if j >= 2 and offload[j - 1] != 0 and pend[j - 1] > s:
            s = pend[j - 1]
        t = s + bwd[j - 1]
    for j in range(1, n + 1):
        if slack[j] < 0:
            fits = False
    return off_before, pre_op, fits, t
