"""The transfer planner's kernel: place the triggers of a given offload set, greedily.

Private; :func:`chainoffload.planner.plan_transfers` builds the arrays, calls
:func:`plan_kernel` and turns its answer into a :class:`~chainoffload.Schedule`. The rules it
follows are written in ``NOTE [ transfer planner ]`` in that module.
"""

from __future__ import annotations

import numpy as np

from .config import njit

# NOTE [ slack in blocks ]
# ------------------------
# The backward sweep asks, per offloaded unit, "is the slack of every phase in a window at
# least s?" or "which is the last phase of a window whose slack is below s?", then takes s off
# the window. Windows can span most of the chain (a prefetch issued long before its backward,
# an offload still in flight late into the backward), which made the sweep O(L^2): 2.2 s at
# L = 100,000. The slack is kept in blocks of about sqrt(L) phases, each with a pending add and
# its minimum, so each question and each update costs O(sqrt L). (The optimistic sweep's search
# for the phase a prefetch starts in is a bisection on prefix sums of bwd for the same reason;
# on 4,800 random plans both give exactly the old sweeps' answers.)


@njit
def _slack_get(vals, badd, width, j):
    return vals[j] + badd[j // width]


@njit
def _slack_fix(vals, badd, bmin, width, blk):
    """Recompute the minimum of block ``blk`` (its own values, without its pending add)."""
    lo = blk * width
    hi = min(lo + width, vals.shape[0])
    m = np.inf
    for j in range(lo, hi):
        if vals[j] < m:
            m = vals[j]
    bmin[blk] = m


@njit
def _slack_add(vals, badd, bmin, width, a, b, x):
    """Add ``x`` to the slack of phases a..b (inclusive; nothing when a > b)."""
    if a > b:
        return
    ba = a // width
    bb = b // width
    if ba == bb:
        for j in range(a, b + 1):
            vals[j] += x
        _slack_fix(vals, badd, bmin, width, ba)
        return
    for j in range(a, (ba + 1) * width):
        vals[j] += x
    _slack_fix(vals, badd, bmin, width, ba)
    for blk in range(ba + 1, bb):
        badd[blk] += x
    for j in range(bb * width, b + 1):
        vals[j] += x
    _slack_fix(vals, badd, bmin, width, bb)


@njit
def _slack_min(vals, badd, bmin, width, a, b):
    """Least slack over phases a..b (inf when a > b)."""
    m = np.inf
    if a > b:
        return m
    ba = a // width
    bb = b // width
    if ba == bb:
        for j in range(a, b + 1):
            v = vals[j] + badd[ba]
            if v < m:
                m = v
        return m
    for j in range(a, (ba + 1) * width):
        v = vals[j] + badd[ba]
        if v < m:
            m = v
    for blk in range(ba + 1, bb):
        v = bmin[blk] + badd[blk]
        if v < m:
            m = v
    for j in range(bb * width, b + 1):
        v = vals[j] + badd[bb]
        if v < m:
            m = v
    return m


@njit
def _slack_last_below(vals, badd, bmin, width, a, b, s):
    """The largest phase j in a..b whose slack is below ``s``, or -1."""
    j = b
    while j >= a:
        blk = j // width
        lo = blk * width
        if lo < a:
            lo = a
        if j == (blk + 1) * width - 1 and lo == blk * width and bmin[blk] + badd[blk] >= s:
            j = lo - 1  # the whole block is at least s
            continue
        while j >= lo:
            if vals[j] + badd[blk] < s:
                return j
            j -= 1
    return -1


@njit
def plan_kernel(fwd, bwd, act, saved, fwd_tmp, bwd_tmp, memory, d_time, h_time, duplex, offload, optimistic, moved):
    """Plan the transfers of the units ``offload[i] != 0`` (index i = stage, 1..L; index 0 unused).

    ``moved[i - 1]`` is what the offload of unit i moves: saved[i - 1] for the whole unit, or
    act[i] when a_i moves alone (the rest stays on the GPU from F_i to B_i); ``d_time`` and
    ``h_time`` are those bytes' transfer times.

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
            cur -= moved[off_units[fp] - 1]
            fp += 1
        need = cur + saved[k - 1] + fwd_tmp[k - 1]
        wait_on = -1
        while need > memory and fp < n_off and off_units[fp] <= k - 2:
            u = off_units[fp]
            if oend[u] > s:
                s = oend[u]
                wait_on = u
            cur -= moved[u - 1]
            need -= moved[u - 1]
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
    width = 1
    while width * width < n + 2:
        width += 1
    n_blk = (n + 2 + width - 1) // width
    badd = np.zeros(n_blk)
    bmin = np.zeros(n_blk)
    kept = act[0]
    for j in range(1, n + 1):
        kept += saved[j - 1] if offload[j] == 0 else saved[j - 1] - moved[j - 1]
        need_b = kept + act[j] + act[j - 1] + bwd_tmp[j - 1]
        if j == n:
            need_b += act[n]
        slack[j] = memory - need_b
    slack[0] = np.inf
    slack[n + 1] = np.inf
    for blk in range(n_blk):
        _slack_fix(slack, badd, bmin, width, blk)
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
        # Phases B_n, B_{n-1}, ..., B_v that could start before the free (lb_start grows as j
        # falls): j in lo..n; the last of them (largest j) that cannot run beside the copy waits.
        lo = v
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if lb_start[mid] >= free_v:
                lo = mid + 1
            else:
                hi = mid
        j = _slack_last_below(slack, badd, bmin, width, lo, n, moved[v - 1])
        if j >= 0:
            # B_j cannot run beside this copy: it waits for the offload, after which the
            # copy is gone (F_{v+1} ended in the forward) for B_j and every later phase.
            off_before[v] = 2 * n - j
            if oend[v] > bwait[j]:
                bwait[j] = oend[v]
            _slack_add(slack, badd, bmin, width, j + 1, n, -float(moved[v - 1]))
        else:
            _slack_add(slack, badd, bmin, width, lo, n, -float(moved[v - 1]))

    # ---- backward: prefetches in decreasing stage order on the H2D channel, each triggered at
    # the earliest boundary (end of F_L, then end of B_{j+1}) where its memory fits up to B_u;
    # the latest boundary is the one before B_{u+1}, which reads it.
    cum_b = np.zeros(n + 1)  # cum_b[x] = bwd[0] + ... + bwd[x-1]
    for x in range(n):
        cum_b[x + 1] = cum_b[x] + bwd[x]
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
            if optimistic and first > u + 1:
                # The smallest f in u+1..j with t + bwd_f + ... + bwd_{j-1} <= st (bisection on
                # prefix sums of bwd; a phase-by-phase walk made the sweep O(L^2)).
                lo = u + 1
                hi = j
                while lo < hi:
                    mid = (lo + hi) // 2
                    if t + (cum_b[j] - cum_b[mid]) <= st:
                        hi = mid
                    else:
                        lo = mid + 1
                first = lo
            ok = _slack_min(slack, badd, bmin, width, u, first) >= moved[u - 1]
            if not ok and not mandatory:
                break
            if not ok:
                fits = False
            _slack_add(slack, badd, bmin, width, u, first, -float(moved[u - 1]))
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
    if _slack_min(slack, badd, bmin, width, 1, n) < 0:
        fits = False
    return off_before, pre_op, fits, t
