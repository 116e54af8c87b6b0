"""The fluid dynamic program of method ``dp``: whole units, fluid transfers, bucketed states.

Private; :func:`chainoffload.solvers.dp.dp` validates the instance, calls :func:`fluid_dp` and
turns the chosen units into a schedule. The model, what it relaxes and why the states are
bucketed the way they are is written in ``NOTE [ fluid DP ]`` in that module.
"""

from __future__ import annotations

import numpy as np

from .config import njit

#: Units a pending queue of one state holds one by one; a longer queue merges its newest
#: units into one entry, freed when the last of them is (the conservative side).
QUEUE_CAP = 24


@njit
def _bucket(value, quantum, top):
    """Index of ``value`` in buckets of ``quantum`` (floor), clamped to 0..``top``."""
    b = int(value / quantum)
    if b < 0:
        return 0
    if b > top:
        return top
    return b


@njit
def _entry(size, chan, n, h0, hc, ext_size, ext_chan, mode, e):
    """Entry ``e`` of a FIFO held as ``size/chan[h0:n]`` plus an optional new unit.

    ``hc`` overrides the channel bytes left of the head ``h0``. ``mode`` 0: no new unit; 1: the
    new unit (``ext_size``, ``ext_chan``) is entry ``n``; 2: it is merged into entry ``n - 1``
    (the buffer is full), which then leaves only when all its bytes have drained.
    """
    sz = size[e] if e < n else ext_size
    ch = chan[e] if e < n else ext_chan
    if e == h0 and e < n:
        ch = hc
    if mode == 2 and e == n - 1:
        sz += ext_size
        ch += ext_chan
    return sz, ch


@njit
def _drain(size, chan, n, h0, hc, ext_size, ext_chan, mode, resident, amount):
    """Drain ``amount`` channel bytes from the FIFO of :func:`_entry`, in order.

    A unit leaves (its bytes stop being resident) only once its last byte has drained.
    Returns ``(h1, left, resident)``: the new head, the channel bytes left of it, and the
    resident bytes of the queue.
    """
    m = n + 1 if mode == 1 else n
    e = h0
    while e < m:
        sz, ch = _entry(size, chan, n, h0, hc, ext_size, ext_chan, mode, e)
        if amount >= ch:
            amount -= ch
            resident -= sz
            e += 1
        else:
            return e, ch - amount, resident
    return m, 0.0, resident


@njit
def _wait_for(size, chan, n, resident, excess, bandwidth):
    """Pop whole units from the head until ``excess`` resident bytes have left.

    Returns ``(wait, head, resident)``; ``wait`` is ``inf`` when the whole queue is not enough.
    """
    used = 0.0
    head = 0
    while excess > 0 and head < n:
        used += chan[head]
        excess -= size[head]
        resident -= size[head]
        head += 1
    if excess > 0:
        return np.inf, head, resident
    return used / bandwidth, head, resident


# NOTE [ prefetch at a zero-length B ]
# -------------------------------------
# A wait before B_{j+1} in the time-reversed backward is, forward in time, compute idle after
# B_{j+1} while the units popped come in. Their prefetches are all triggered when B_{j+1}
# ends, and the first one on the channel starts then. When B_{j+1} takes no time that is also
# its start instant, and a prefetch allocation counts before an op's own at one instant
# (docs/model.md, "One instant"): the first unit is resident during B_{j+1}, and during every
# zero-length B op before it at that instant (no wait between them). Counted as free, the DP
# chose units no schedule can run (the zero-length benchmark, seed 33: one unit whose prefetch
# must start at B_L's instant, 5 B over the memory, on 6 chains). So at a zero-length B the
# pops must cover the excess plus the first unit's bytes, carried in ``lay_zb`` while the next
# B ops take no time and do not wait. The first unit can be any unit offloaded before j (the
# planner sends a small one first, "queued behind a lead" in its kernel): the smallest, kept in
# ``lay_mo``; when it is not among the units popped (the model had brought it in later), the
# wait covers its transfer too, and its earlier arrival is not counted at the ops between (a
# heuristic choice: the planner and the simulator judge the plan). Both are 0 / unused on
# chains whose backward ops all take time, whose plans are unchanged.


@njit
def _wait_for_instant(size, chan, n, resident, excess, bandwidth, instant, lead, lead_chan):
    """:func:`_wait_for` for a zero-length B_{j+1} (``NOTE [ prefetch at a zero-length B ]``).

    ``instant``: bytes of prefetches that start at B_j's instant, which is B_{j+1}'s unless
    B_{j+1} waits. ``lead`` (``lead_chan`` channel bytes): the smallest unit offloaded before
    j, whose prefetch goes first when B_{j+1} ends. Returns ``(wait, head, resident,
    instant)`` with the bytes of prefetches that start at B_{j+1}'s instant.
    """
    if excess + instant <= 0:
        return 0.0, 0, resident, instant
    used = 0.0
    head = 0
    low = -1
    while head < n:
        used += chan[head]
        excess -= size[head]
        resident -= size[head]
        if low < 0 or size[head] < low:
            low = size[head]
        head += 1
        if excess + lead <= 0:
            if low > lead:
                # The lead is not among the units popped (its bytes drained in an earlier,
                # time-reversed, step): it goes first now, so the wait covers it too.
                used += lead_chan
            return used / bandwidth, head, resident, lead
    return np.inf, head, resident, 0


@njit
def _store(dst_size, dst_chan, size, chan, n, h0, hc, ext_size, ext_chan, mode, h1, left):
    """Write entries ``h1..`` of the FIFO of :func:`_entry` to ``dst``; return (count, bytes)."""
    m = n + 1 if mode == 1 else n
    q = 0.0
    for e in range(h1, m):
        sz, ch = _entry(size, chan, n, h0, hc, ext_size, ext_chan, mode, e)
        if e == h1:
            ch = left
        dst_size[e - h1] = sz
        dst_chan[e - h1] = ch
        q += ch
    return m - h1, q


@njit
def fluid_dp(fwd, bwd, act, saved, fwd_tmp, bwd_tmp, memory, bw_d2h, bw_h2d, latency, allow, slots, queue_slots, tight):
    """Choose the units to offload by the fluid dynamic program (``NOTE [ fluid DP ]``).

    Parameters
    ----------
    fwd, bwd
        Per-stage times (length L).
    act
        Activation sizes a_0..a_L (length L + 1).
    saved, fwd_tmp, bwd_tmp
        Per-stage sizes (length L).
    memory
        The byte budget the DP may use (a_0 included).
    bw_d2h, bw_h2d, latency
        The link; an infinite bandwidth drains a queue at once.
    allow
        Per unit j (1..L-1; length L + 1, index 0 unused): 0 keep it, 1 the DP decides, 2
        offload it. Forcing every unit evaluates one given offload set in the model.
    slots, queue_slots
        Buckets of the resident kept bytes and of each queue's resident bytes (>= 1).
    tight
        False: a cell keeps its partial plan of least time (ties: least memory in use). True:
        of fewest kept bytes, then least queued, then least time, which survives budgets near
        the floor where the time-first choice runs out of room.

    Returns
    -------
    tuple
        ``(offload, value, found)``: ``offload[j]`` is 1 for the chosen units (length L + 1),
        ``value`` the model's makespan of that choice (compute plus waits) and ``found``
        whether any choice passes the model's memory checks (``offload`` is all zero otherwise).
    """
    n = fwd.shape[0]
    offload = np.zeros(n + 1, dtype=np.int8)
    compute = 0.0
    for i in range(n):
        compute += fwd[i]
    for i in range(n - 1, -1, -1):
        compute += bwd[i]
    a0 = act[0]
    # At a full tie, keep the plan with the smaller lead when some B op takes no time (NOTE
    # [ prefetch at a zero-length B ]; a unit of 0 bytes offloaded is a lead that costs nothing).
    lead_ties = False
    for i in range(n):
        if bwd[i] == 0.0:
            lead_ties = True
    # Stage 1 has no decision: F_1 and B_1 must fit with nothing else resident.
    if a0 + saved[0] + fwd_tmp[0] > memory or a0 + saved[0] + act[1] + act[0] + bwd_tmp[0] > memory:
        return offload, np.inf, False
    if n == 1:
        return offload, compute, True

    span = float(max(memory - a0, 1))
    k_top = slots
    q_top = queue_slots
    k_quant = span / slots
    q_quant = span / queue_slots
    nq = q_top + 1
    ncell = (k_top + 1) * nq * nq
    cap = QUEUE_CAP

    # Channel bytes of a unit: its bytes plus the latency as bytes at the link's rate. An
    # infinite link drains at once, so nothing ever waits in its queue.
    fin_d = bw_d2h < np.inf
    fin_h = bw_h2d < np.inf
    lat_d = latency * bw_d2h if fin_d else 0.0
    lat_h = latency * bw_h2d if fin_h else 0.0

    # Two layers of cells: time, kept bytes, and per queue its resident bytes and its FIFO
    # of (bytes, channel bytes left) entries.
    lay_t = np.full((2, ncell), np.inf)
    lay_k = np.zeros((2, ncell), dtype=np.int64)
    lay_rf = np.zeros((2, ncell), dtype=np.int64)
    lay_rb = np.zeros((2, ncell), dtype=np.int64)
    # Bytes of prefetches that start at the instant of the last B op, when it took no time
    # (NOTE [ prefetch at a zero-length B ]); 0 on chains whose backward ops all take time.
    lay_zb = np.zeros((2, ncell), dtype=np.int64)
    # The smallest unit offloaded so far: the lead a prefetch can queue behind at such an
    # instant (``memory + 1``: none yet, too big to lead).
    lay_mo = np.full((2, ncell), memory + 1, dtype=np.int64)
    lay_qf = np.zeros((2, ncell))
    lay_qb = np.zeros((2, ncell))
    lay_nf = np.zeros((2, ncell), dtype=np.int64)
    lay_nb = np.zeros((2, ncell), dtype=np.int64)
    f_size = np.zeros((2, ncell, cap), dtype=np.int64)
    f_chan = np.zeros((2, ncell, cap))
    b_size = np.zeros((2, ncell, cap), dtype=np.int64)
    b_chan = np.zeros((2, ncell, cap))
    # parent[j, c] = 2 * (cell before transition j) + decision on unit j.
    parent = np.full((n, ncell), -1, dtype=np.int32)
    live = np.zeros((2, ncell), dtype=np.int64)
    n_live = 1
    lay_t[0, 0] = 0.0

    cur = 0
    for j in range(1, n):
        # Transition j: decide unit j, then run F_{j+1} (unit j is its input) and, in the
        # time-reversed backward, B_{j+1} (which needs units j and j+1 whole).
        nxt = 1 - cur
        s_j = saved[j - 1]
        need_f0 = a0 + s_j + saved[j] + fwd_tmp[j]
        need_b0 = a0 + s_j + saved[j] + act[j + 1] + act[j] + bwd_tmp[j]
        n_nxt = 0
        for li in range(n_live):
            c = live[cur, li]
            t0 = lay_t[cur, c]
            k0 = lay_k[cur, c]
            fs = f_size[cur, c]
            fc = f_chan[cur, c]
            bs = b_size[cur, c]
            bc = b_chan[cur, c]
            # Forward: F_{j+1} waits until enough queued units (all older than j) have left.
            nf = lay_nf[cur, c]
            w_f, hf, rf = _wait_for(fs, fc, nf, lay_rf[cur, c], k0 + lay_rf[cur, c] + need_f0 - memory, bw_d2h)
            if w_f == np.inf:
                continue
            # Backward, reversed: B_{j+1} waits the same way on the prefetch queue, then drains.
            nb = lay_nb[cur, c]
            excess_b = k0 + lay_rb[cur, c] + need_b0 - memory
            if bwd[j] == 0.0:
                mo = lay_mo[cur, c]
                w_b, hb, rb, zb = _wait_for_instant(
                    bs, bc, nb, lay_rb[cur, c], excess_b, bw_h2d, lay_zb[cur, c], mo, mo + lat_h
                )
            else:
                w_b, hb, rb = _wait_for(bs, bc, nb, lay_rb[cur, c], excess_b, bw_h2d)
                zb = 0
            if w_b == np.inf:
                continue
            hbc = bc[hb] if hb < nb else 0.0
            g1, left_b, rb0 = hb, hbc, rb
            if fin_h:
                g1, left_b, rb0 = _drain(bs, bc, nb, hb, hbc, 0, 0.0, 0, rb, bw_h2d * bwd[j])
            hfc = fc[hf] if hf < nf else 0.0
            t1 = t0 + w_f + w_b
            for d in range(2):
                if (d == 1 and allow[j] == 0) or (d == 0 and allow[j] == 2):
                    continue
                k1 = k0 + s_j if d == 0 else k0
                if k1 + a0 > memory:
                    continue
                # Forward queue: unit j joins the tail, then F_{j+1} drains.
                mode_f = 0
                rf1 = rf
                if d == 1 and fin_d:
                    mode_f = 2 if nf - hf == cap else 1
                    rf1 += s_j
                h1, left_f = hf, hfc
                if fin_d:
                    h1, left_f, rf1 = _drain(fs, fc, nf, hf, hfc, s_j, s_j + lat_d, mode_f, rf1, bw_d2h * fwd[j])
                # Prefetch queue: unit j joins after B_{j+1}.
                mode_b = 0
                rb1 = rb0
                if d == 1 and fin_h:
                    mode_b = 2 if nb - g1 == cap else 1
                    rb1 += s_j
                cell = (_bucket(float(k1), k_quant, k_top) * nq + _bucket(float(rf1), q_quant, q_top)) * nq + _bucket(
                    float(rb1), q_quant, q_top
                )
                old = lay_t[nxt, cell]
                mo1 = lay_mo[cur, c]
                if d == 1 and fin_h and s_j < mo1:
                    mo1 = s_j
                p_new = k1 + max(rf1, rb1 + zb)
                p_old = lay_k[nxt, cell] + max(lay_rf[nxt, cell], lay_rb[nxt, cell] + lay_zb[nxt, cell])
                better = False
                if old == np.inf:
                    better = True
                elif tight:
                    # Memory first: fewest kept bytes (they stay until the backward), then
                    # least queued, then least time.
                    k_old = lay_k[nxt, cell]
                    better = k1 < k_old or (k1 == k_old and (p_new < p_old or (p_new == p_old and t1 < old)))
                    if lead_ties and k1 == k_old and p_new == p_old and t1 == old:
                        better = mo1 < lay_mo[nxt, cell]
                elif t1 < old:
                    better = True
                elif t1 == old:
                    # Ties (zero-wait partial plans are common): keep the one with less memory
                    # in use, which leaves the most room later; the K buckets keep plans that
                    # keep more alive in other cells.
                    if p_new < p_old or (p_new == p_old and rf1 + rb1 < lay_rf[nxt, cell] + lay_rb[nxt, cell]):
                        better = True
                    elif lead_ties and p_new == p_old and rf1 + rb1 == lay_rf[nxt, cell] + lay_rb[nxt, cell]:
                        better = mo1 < lay_mo[nxt, cell]
                if better:
                    if old == np.inf:
                        live[nxt, n_nxt] = cell
                        n_nxt += 1
                    lay_t[nxt, cell] = t1
                    lay_k[nxt, cell] = k1
                    lay_rf[nxt, cell] = rf1
                    lay_rb[nxt, cell] = rb1
                    lay_zb[nxt, cell] = zb
                    lay_mo[nxt, cell] = mo1
                    cnt, q = _store(
                        f_size[nxt, cell], f_chan[nxt, cell], fs, fc, nf, hf, hfc, s_j, s_j + lat_d, mode_f, h1, left_f
                    )
                    lay_nf[nxt, cell] = cnt
                    lay_qf[nxt, cell] = q
                    # The new prefetch entry keeps its full channel bytes unless it is the head.
                    left = left_b if g1 < nb else s_j + lat_h
                    cnt, q = _store(
                        b_size[nxt, cell], b_chan[nxt, cell], bs, bc, nb, g1, left_b, s_j, s_j + lat_h, mode_b, g1, left
                    )
                    lay_nb[nxt, cell] = cnt
                    lay_qb[nxt, cell] = q
                    parent[j, cell] = 2 * c + d
        # Clear the old layer (only its live cells) and move on.
        for li in range(n_live):
            lay_t[cur, live[cur, li]] = np.inf
        n_live = n_nxt
        cur = nxt
        if n_live == 0:
            return offload, np.inf, False
        # Visit live cells in index order so that ties resolve the same way on every run.
        live[cur, :n_live] = np.sort(live[cur, :n_live])

    # Junction: what is still queued in the reversed backward must come in before B_L.
    best = -1
    best_t = np.inf
    best_k = -1
    for li in range(n_live):
        c = live[cur, li]
        t_end = lay_t[cur, c]
        if fin_h and lay_qb[cur, c] > 0.0:
            t_end += lay_qb[cur, c] / bw_h2d
        if t_end < best_t or (t_end == best_t and lay_k[cur, c] > best_k):
            best = c
            best_t = t_end
            best_k = lay_k[cur, c]
    c = best
    for j in range(n - 1, 0, -1):
        code = parent[j, c]
        offload[j] = code % 2
        c = code // 2
    return offload, compute + best_t, True
