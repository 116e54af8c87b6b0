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
def _block_width(size):
    """Width of the blocks a slack array of ``size`` phases is kept in (about its square root:
    a range update or query touches O(sqrt(size)) entries) and how many blocks there are."""
    width = 1
    while width * width < size:
        width += 1
    return width, (size + width - 1) // width


@njit
def _hold_prefetch(slack, badd, bmin, width, fsl, fbadd, fbmin, fwidth,
                   run_a, run_b, back_a, back_b, fwd_a, fwd_b, need):
    """Take a prefetch's ``need`` bytes from the slack it holds: backward phases run_a..run_b
    (from its start on) and back_a..back_b, and forward phases fwd_a..fwd_b (the instant it
    allocates at, zero-length ops included)."""
    _slack_add(slack, badd, bmin, width, run_a, run_b, -need)
    _slack_add(slack, badd, bmin, width, back_a, back_b, -need)
    _slack_add(fsl, fbadd, fbmin, fwidth, fwd_a, fwd_b, -need)


@njit
def _mark_issued(unit, trig_op, end, seq, pre_op, pend, issued, pre_seq):
    """Record ``unit``'s prefetch as issued at op ``trig_op``, ending at ``end``, ``seq``-th on its
    channel; return the next sequence number."""
    pre_op[unit] = trig_op
    pend[unit] = end
    issued[unit] = True
    pre_seq[unit] = seq
    return seq + 1


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


# NOTE [ a wait frees the copies before it ]
# --------------------------------------------
# The backward's start times are bounded below by running it without waits, so a copy whose
# offload ends after the forward is counted in every phase that could start before it is freed.
# Once the sweep makes B_j wait for O_v, B_j and every phase after it start after O_v ends, and
# every copy counted before v is freed by then: its offload ended earlier in the D2H queue
# (stage order) and its reader F_{w+1} ended before F_v did. So those copies are given back to
# the phases up to B_j. Counting them there anyway made the planner hold back prefetches that
# fit; it shows most where the backward's first ops take no time (issue 33's chain: B_4, of 0 s,
# waits for O_3, and unit 2's copy, freed long before, was still counted in B_4 and B_3). The
# copies released at a wait merge into one entry (they all leave the same phases from then
# on), so a wait costs one block update per entry alive, not per copy ever counted.

# NOTE [ the original is gone when B_{v+1} starts ]
# --------------------------------------------------
# docs/model.md releases the original of an offloaded unit w at free_w = max(end of O_w, end of
# F_{w+1}) (rule 4). Let V be the largest unit offloaded. B_{V+1} reads a_V through the
# prefetched copy: it starts after P_V ends, P_V starts after O_V ends, and O_V ends after every
# O_w, w < V (the D2H channel serves the offloads in stage order, and on a shared channel every
# prefetch is queued behind them); every F_{w+1} ended before the backward began. So B_{V+1}
# and every phase after it start at or after every free_w. At that instant the release comes
# before their allocations: it is class 0 when free_w is after F_w's start, and otherwise F_{w+1}
# took no time and ends then, so the release is ordered at F_{w+1}'s end (2w + 1, "zero-length
# reader"), before every backward op's start (docs/model.md, "One instant"). The originals are
# therefore counted only in B_n..B_{V+2}, in those that could start strictly before the free.
# The one exception is unit L, which no forward reads: when O_L ends at F_L's start (F_L and O_L
# take no time) its release is the instant's last event (order 2n + 2), after the allocations of
# every backward phase starting then; and when P_L takes no time either, B_L and B_{L-1} can start
# then too, so it is counted in every phase that could (a wait for O_L cannot help there; when P_L
# takes time, B_L starts after the instant). Counting copies in B_{V+1} and below made the planner hold back
# prefetches that fit (issue 33's chain 74 of benchmarks/zero_length.py: offload-all's P_1 and
# P_2 fit beside B_4, which waits for P_3 and so starts after unit 3's original is gone), and
# made the sweep wait at B_{v+1} for an offload it waits for anyway. Skipping unit L's copy at
# F_L's instant counted it freed before B_L allocated (optimistic).

# NOTE [ prefetch at a zero-length instant ]
# ------------------------------------------
# docs/model.md orders one instant: the frees at the end of ops that took time, then the
# prefetch allocations (order -1), then each op's start allocation, a zero-length op's frees
# after its own allocation. So a copy whose transfer starts at the instant a zero-length op
# starts counts at that op's allocation, and at the allocation of every op starting then,
# before its trigger in the sequence or not; "memory counted from the trigger" would be below
# the truth there. The sweep keeps each phase's start (B_j's, and F_k's for a run that reaches
# the forward) and, for a copy starting at ``st``, checks and reserves the phases above the
# trigger whose op starts at ``st`` too: B_{j+1}, B_{j+2}, ... while they start then, then
# F_L, F_{L-1}, ... (a zero-length run has no waits inside it, so those phases are contiguous).
#
# Where only that instant is short (issue 33's chain: O_2 ends as the zero-length B_4 starts,
# which waits for it, so P_2, which B_3 needs and which cannot start before O_2 ends, would
# allocate with B_4), the one lever left is the channel: a later unit's prefetch queued ahead
# of it (its copy takes time) moves its start past the instant. The sweep tries the next
# LEAD_TRIES units not yet sent, in stage order down, and sends the first whose own copy fits
# (at its trigger and at any instant it starts in) and whose end moves u's start; then u is
# placed again behind it. Prefetches are listed in the order the sweep sends them, which is
# the FIFO channel's order. Without zero-length ops no phase above the trigger starts when a
# copy does, and the plan is what it was.

#: Later units the sweep tries as a lead (NOTE [ prefetch at a zero-length instant ]).
LEAD_TRIES = 8


@njit
def _first_phase(optimistic, t, st, u, j, cum_b):
    """First phase a copy of unit ``u`` triggered at boundary ``j`` (time ``t``) and starting at
    ``st`` is counted in: ``j``, or (optimistic) the one its start falls in if the backward runs
    on without waiting; never after B_{u+1}."""
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
    return first


@njit
def _instant(j, n, st, bstart, beq_top, fstart, feq_low):
    """The phases above boundary ``j`` whose op starts at ``st`` (NOTE [ prefetch at a
    zero-length instant ]): backward phases j+1..bh, forward phases fl..fh (empty: bh = j, fl > fh)."""
    bh = j
    fl = n + 1
    fh = n
    reach_fwd = j == n
    if j < n and bstart[j + 1] == st:
        bh = beq_top[j + 1]
        reach_fwd = bh == n
    if reach_fwd and fstart[n] == st:
        fl = feq_low[n]
        fh = n
    return bh, fl, fh


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
        ``(off_before, pre_op, pre_seq, fits, makespan)``: per stage, the compute op (0-based)
        that waits for its offload (-1: none), the compute op whose end triggers its prefetch
        (-1: not offloaded) and the prefetch's place in the H2D queue (the order to list them
        in: NOTE [ prefetch at a zero-length instant ]); whether every memory check passed; and
        the makespan the plan gives under the simulator's timing rules.
    """
    n = fwd.shape[0]
    off_before = np.full(n + 1, -1, dtype=np.int64)
    pre_op = np.full(n + 1, -1, dtype=np.int64)
    oend = np.zeros(n + 1)
    fend = np.zeros(n + 2)
    # Start of F_k and what is on the GPU at its allocation, for NOTE [ prefetch at a zero-length
    # instant ]; feq_low[k] is the first stage of the run of forwards that start when F_k does.
    fstart = np.zeros(n + 2)
    fneed = np.zeros(n + 2)
    feq_low = np.zeros(n + 2, dtype=np.int64)
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
        fstart[k] = s
        fneed[k] = need
        feq_low[k] = feq_low[k - 1] if k > 1 and fstart[k - 1] == s else k
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
    width, n_blk = _block_width(n + 2)
    badd = np.zeros(n_blk)
    bmin = np.zeros(n_blk)
    kept = act[0]
    for j in range(1, n + 1):
        kept += saved[j - 1] if offload[j] == 0 else saved[j - 1] - moved[j - 1]
        # g_j (B_{j+1}'s, or for j = L the loss gradient B_L allocates: act[L] either way) and
        # the g_{j-1} B_j allocates (counting act[L] a second time at B_L made the planner
        # hold back prefetches that fit there).
        need_b = kept + act[j] + act[j - 1] + bwd_tmp[j - 1]
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
    # Copies counted so far, as (first phase counted, bytes); a wait at B_j gives each back to
    # the phases up to j (NOTE [ a wait frees the copies before it ]).
    ent_lo = np.zeros(n_off + 1, dtype=np.int64)
    ent_bytes = np.zeros(n_off + 1)
    n_ent = 0
    # NOTE [ the original is gone when B_{v+1} starts ]: no copy counts below B_{V+2}, V the
    # largest unit offloaded.
    top_all = off_units[n_off - 1] + 2 if n_off > 0 else n + 1
    for q in range(n_off):
        v = off_units[q]
        free_v = oend[v]
        if v < n and fend[v + 1] > free_v:
            free_v = fend[v + 1]
        # The copy counts in B_n..B_{V+2} at most; but an original of unit L released at its
        # maker's instant is released last (order 2n + 2) and counts in every phase starting
        # then (NOTE [ the original is gone when B_{v+1} starts ]).
        last = v == n and free_v <= fstart[n] and h_time[n - 1] <= 0.0
        if free_v < t_fwd or (free_v == t_fwd and not last):
            continue
        # Phases B_n, B_{n-1}, ..., B_top that could start before the free (lb_start grows as j
        # falls), or at it when the free comes last: j in lo..n; the last of them (largest j)
        # that cannot run beside the copy waits.
        top = v if last else top_all
        lo = top
        hi = n + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if lb_start[mid] > free_v or (lb_start[mid] == free_v and not last):
                lo = mid + 1
            else:
                hi = mid
        if lo > n:
            continue
        if last:
            # a wait for O_L cannot help: the original stays until after the instant's allocations
            _slack_add(slack, badd, bmin, width, lo, n, -float(moved[v - 1]))
            ent_lo[n_ent] = lo
            ent_bytes[n_ent] = float(moved[v - 1])
            n_ent += 1
            continue
        j = _slack_last_below(slack, badd, bmin, width, lo, n, moved[v - 1])
        if j >= 0:
            # B_j cannot run beside this copy: it waits for the offload, after which the
            # copy is gone (F_{v+1} ended in the forward) for B_j and every later phase.
            off_before[v] = 2 * n - j
            if oend[v] > bwait[j]:
                bwait[j] = oend[v]
            _slack_add(slack, badd, bmin, width, j + 1, n, -float(moved[v - 1]))
            # B_j and every phase after it start after O_v ends, so after every copy counted
            # before this one is freed: they leave phases ..j, and merge into one entry.
            merged = 0.0
            keep_n = 0
            for e in range(n_ent):
                if ent_lo[e] <= j:
                    _slack_add(slack, badd, bmin, width, ent_lo[e], j, ent_bytes[e])
                    merged += ent_bytes[e]
                else:
                    ent_lo[keep_n] = ent_lo[e]
                    ent_bytes[keep_n] = ent_bytes[e]
                    keep_n += 1
            n_ent = keep_n
            if merged > 0 and j < n:
                ent_lo[n_ent] = j + 1
                ent_bytes[n_ent] = merged
                n_ent += 1
        else:
            _slack_add(slack, badd, bmin, width, lo, n, -float(moved[v - 1]))
            ent_lo[n_ent] = lo
            ent_bytes[n_ent] = float(moved[v - 1])
            n_ent += 1

    # ---- backward: prefetches in decreasing stage order on the H2D channel, each triggered at
    # the earliest boundary (end of F_L, then end of B_{j+1}) where its memory fits up to B_u;
    # the latest boundary is the one before B_{u+1}, which reads it. NOTE [ prefetch at a
    # zero-length instant ]: a copy that starts when the zero-length ops before its trigger
    # start also counts at their allocations, and may be queued behind a lead to leave it.
    cum_b = np.zeros(n + 1)  # cum_b[x] = bwd[0] + ... + bwd[x-1]
    for x in range(n):
        cum_b[x + 1] = cum_b[x] + bwd[x]
    # The forward's phases as a second slack structure (F_k's allocation; only a copy that
    # starts at a zero-length F_L's instant reaches them).
    fsl = np.full(n + 2, np.inf)
    for k in range(1, n + 1):
        fsl[k] = memory - fneed[k]
    fwidth, f_blk = _block_width(n + 2)
    fbadd = np.zeros(f_blk)
    fbmin = np.zeros(f_blk)
    for blk in range(f_blk):
        _slack_fix(fsl, fbadd, fbmin, fwidth, blk)
    bstart = np.zeros(n + 2)
    beq_top = np.zeros(n + 2, dtype=np.int64)
    issued = np.zeros(n + 1, dtype=np.bool_)
    pre_seq = np.full(n + 1, -1, dtype=np.int64)
    seq = 0
    chan_h = 0.0 if duplex else chan_d
    pend = np.zeros(n + 2)
    nxt = n_off - 1
    t = t_fwd
    for j in range(n, 0, -1):
        trig_op = n - 1 if j == n else 2 * n - j - 1  # F_L, or B_{j+1}
        while nxt >= 0:
            u = off_units[nxt]
            if issued[u]:  # sent earlier as a lead
                nxt -= 1
                continue
            mandatory = u >= j - 1
            st = t
            if chan_h > st:
                st = chan_h
            if oend[u] > st:
                st = oend[u]
            first = _first_phase(optimistic, t, st, u, j, cum_b)
            need_u = float(moved[u - 1])
            ok_run = _slack_min(slack, badd, bmin, width, u, first) >= need_u
            bh, fl, fh = _instant(j, n, st, bstart, beq_top, fstart, feq_low)
            ok_inst = (_slack_min(slack, badd, bmin, width, j + 1, bh) >= need_u
                       and _slack_min(fsl, fbadd, fbmin, fwidth, fl, fh) >= need_u)
            if ok_run and not ok_inst:
                # Only the instant is short: queue the first later unit that fits ahead of u
                # (its copy takes time, so u's starts after the instant), if that moves u's.
                q2 = nxt - 1
                tries = 0
                lead = -1
                while q2 >= 0 and tries < LEAD_TRIES:
                    v = off_units[q2]
                    q2 -= 1
                    if issued[v]:
                        continue
                    tries += 1
                    stv = t
                    if chan_h > stv:
                        stv = chan_h
                    if oend[v] > stv:
                        stv = oend[v]
                    if not (stv + h_time[v - 1] > st and stv + h_time[v - 1] > oend[u]):
                        continue
                    fv = _first_phase(optimistic, t, stv, v, j, cum_b)
                    need_v = float(moved[v - 1])
                    vbh, vfl, vfh = _instant(j, n, stv, bstart, beq_top, fstart, feq_low)
                    if (_slack_min(slack, badd, bmin, width, v, fv) >= need_v
                            and _slack_min(slack, badd, bmin, width, j + 1, vbh) >= need_v
                            and _slack_min(fsl, fbadd, fbmin, fwidth, vfl, vfh) >= need_v):
                        lead = v
                        _hold_prefetch(slack, badd, bmin, width, fsl, fbadd, fbmin, fwidth,
                                       v, fv, j + 1, vbh, vfl, vfh, need_v)
                        seq = _mark_issued(v, trig_op, stv + h_time[v - 1], seq, pre_op, pend, issued, pre_seq)
                        chan_h = pend[v]
                        break
                if lead > 0:
                    continue  # u again, behind its lead
            ok = ok_run and ok_inst
            if not ok and not mandatory:
                break
            if not ok:
                fits = False
            _hold_prefetch(slack, badd, bmin, width, fsl, fbadd, fbmin, fwidth, u, first, j + 1, bh, fl, fh, need_u)
            seq = _mark_issued(u, trig_op, st + h_time[u - 1], seq, pre_op, pend, issued, pre_seq)
            chan_h = pend[u]
            nxt -= 1
        s = t
        if bwait[j] > s:
            s = bwait[j]
        if offload[j] != 0 and pend[j] > s:
            s = pend[j]
        if j >= 2 and offload[j - 1] != 0 and pend[j - 1] > s:
            s = pend[j - 1]
        bstart[j] = s
        beq_top[j] = beq_top[j + 1] if j < n and bstart[j + 1] == s else j
        t = s + bwd[j - 1]
    if _slack_min(slack, badd, bmin, width, 1, n) < 0:
        fits = False
    if _slack_min(fsl, fbadd, fbmin, fwidth, 1, n) < 0:
        fits = False
    return off_before, pre_op, pre_seq, fits, t
