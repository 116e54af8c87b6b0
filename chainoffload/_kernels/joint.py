"""The joint rematerialization + offloading dynamic program (the spine table), in slots.

Private; :mod:`chainoffload.solvers.joint` rounds sizes to slots, fills rotor's table for the
backward parts of checkpointed nodes, calls :func:`spine_table` and rebuilds the schedule. The
model is written in ``NOTE [ joint recurrence ]`` in that module; the names here follow it.

A *state* is (s, row, m): the spine node that starts at stage s, the row (what kind of input
the node reads, where the D2H queue ends, where the H2D pipeline ends) and the budget m of
segment (s, L) in slots. Rows are ``(flag * (n_f + 1) + i_f) * (n_b + 1) + i_b``:

* ``flag``: 0 the node's input is a lone a_{s-1} (made by a checkpointed node), 1 the whole
  unit s-1 (made by F_all on s-1);
* ``i_f``: 0 the D2H channel is idle when the node starts, else it is busy up to the grid
  point ``(kf0(s) + i_f - 1) * delta_f`` of the forward clock (``kf0(s)`` the first grid point
  after the node's start);
* ``i_b``: 0 the H2D pipeline is empty, else it ends at the grid point ``(kb0(s) + i_b - 1) *
  delta_b`` of the backward clock.

Both grids are absolute (a point of the clock, not a distance from the node), so rounding a
queue end up to the grid never creeps as the DP moves along the chain.
"""

from __future__ import annotations

import math

import numpy as np

from .config import njit

#: Codes of ``spine_table``'s choice array: ``3 * j + off`` with j = 0 for F_all, j > s for
#: "checkpoint, next node at j"; off = 0: the node's input stays, 1: it is offloaded whole (a
#: lone a_{s-1}, or unit s-1), 2: only a_{s-1} of a whole unit s-1 is (the rest stays). -1: no
#: choice.
NO_CHOICE = -1
#: Offload choices per node: none, whole, a alone.
OFFLOADS = 3


@njit
def grid_index(x, delta):
    """The least grid index k with ``k * delta >= x`` (x >= 0, delta > 0), up to float rounding.

    The table and the walk that rebuilds its plan call the same function, so they agree.
    """
    return int(math.ceil(x / delta))


@njit
def first_after(clock, delta):
    """The least grid index whose point lies after ``clock`` (up to float rounding)."""
    return int(math.floor(clock / delta)) + 1


@njit
def slots_of(seconds, rate):
    """Slots moved by a link of ``rate`` slots/s in ``seconds`` (rounded up; 0 for no time)."""
    if seconds <= 0.0:
        return 0
    v = seconds * rate
    if v >= 1e15:
        return 1 << 40
    return math.ceil(v - 1e-9)


@njit
def d2h_row(k_new, clock_j, delta_f, kf0_j):
    """Row of the D2H queue ending at grid point ``k_new`` (-1: idle) at the node starting at ``clock_j``."""
    if k_new < 0 or k_new * delta_f <= clock_j:
        return 0
    return k_new - kf0_j + 1


@njit
def h2d_row(i_b, r_old, tau, bclk_s, bclk_j, h_add, delta_b, kb0_j):
    """Row of the pipeline at the next node (clock ``bclk_j``) once node s's backward part
    (``tau``) has absorbed what it can and ``h_add`` (the offloaded input's time) has joined."""
    r = bclk_j
    if i_b > 0:
        r = r_old - (tau - (bclk_j - bclk_s))
        if r < bclk_j:
            r = bclk_j
    r += h_add
    if r <= bclk_j:
        return 0
    return grid_index(r, delta_b) - kb0_j + 1


@njit
def child_rows(s, j, off, i_f, i_b, tau, d_in, h_in, fclk, bclk, delta_f, n_f, delta_b, n_b):
    """The queue rows of the child (j, .) of node s, and whether they fit the table.

    ``d_in`` / ``h_in`` are the D2H / H2D times of node s's input (used when ``off``), ``tau``
    the duration of node s's backward part. Returns ``(i_f', i_b', ok)``. The table fills its
    rows with the same two functions (:func:`d2h_row`, :func:`h2d_row`).
    """
    if n_f == 0 and n_b == 0:
        return 0, 0, True
    k_new = -1 if i_f == 0 else first_after(fclk[s], delta_f) + i_f - 1
    end_old = fclk[s] if i_f == 0 else k_new * delta_f
    h_add = 0.0
    if off:
        k_new = grid_index(end_old + d_in, delta_f)
        h_add = h_in
    nf = d2h_row(k_new, fclk[j], delta_f, first_after(fclk[j], delta_f)) if n_f > 0 else 0
    r_old = bclk[s] if i_b == 0 else (first_after(bclk[s], delta_b) + i_b - 1) * delta_b
    nb = h2d_row(i_b, r_old, tau, bclk[s], bclk[j], h_add, delta_b, first_after(bclk[j], delta_b))
    return nf, nb, nf <= n_f and nb <= n_b


@njit
def pipe_slots(s, i_b, bclk, delta_b, rate_b):
    """Slots the H2D pipeline holds on the GPU during node s's backward part (row i_b)."""
    if i_b == 0:
        return 0
    end = (first_after(bclk[s], delta_b) + i_b - 1) * delta_b
    return slots_of(end - bclk[s], rate_b)


@njit
def reachable_rows(n, budget, bwd, win, in_slots, d_in, h_in, fclk, bclk, delta_f, n_f, delta_b, n_b, n_off):
    """Which rows of each node the walk from node 1 can reach, for any budget.

    A node's backward part lasts between the bwd of its stages and rotor's time at the least
    budget it runs with; the pipeline row it leaves to its child moves monotonically with that
    duration, so every row between the two extremes is marked. Returns ``reach[s, row]``.
    """
    nf1 = n_f + 1
    nb1 = n_b + 1
    rows = 2 * nf1 * nb1
    reach = np.zeros((n + 2, rows), dtype=np.bool_)
    reach[1, 0] = True
    cum = np.zeros(n + 2)
    for k in range(1, n + 1):
        cum[k + 1] = cum[k] + bwd[k - 1]
    for s in range(1, n):
        for row in range(rows):
            if not reach[s, row]:
                continue
            i_b = row % nb1
            i_f = (row // nb1) % nf1
            flag = row // (nf1 * nb1)
            for off in range(n_off):
                part = flag if off == 1 else 0
                if off > 0 and not (s >= 2 and n_b > 0 and d_in[s, part] < np.inf and h_in[s, part] < np.inf):
                    break
                if off == 2 and flag == 0:
                    break
                for j in range(s + 1, min(n, s + win.shape[1]) + 1):
                    f_all = j == s + 1
                    for kind in range(2):
                        if kind == 1 and not f_all:
                            break
                        # kind 1: F_all on s (child s + 1, flag 1); kind 0: checkpoint to j (flag 0).
                        if kind == 1:
                            lo_tau = bwd[s - 1]
                            hi_tau = bwd[s - 1]
                        else:
                            lo_tau = cum[j] - cum[s]
                            hi_tau = lo_tau
                            d = j - 1 - s
                            for m in range(budget + 1):
                                if win[s, d, m] < np.inf:
                                    hi_tau = win[s, d, m]
                                    break
                            if not hi_tau < np.inf or win[s, d, budget] == np.inf:
                                continue
                        nf_a, nb_a, ok_a = child_rows(s, j, off, i_f, i_b, lo_tau, d_in[s, part], h_in[s, part],
                                                      fclk, bclk, delta_f, n_f, delta_b, n_b)
                        nf_b, nb_b, ok_b = child_rows(s, j, off, i_f, i_b, hi_tau, d_in[s, part], h_in[s, part],
                                                      fclk, bclk, delta_f, n_f, delta_b, n_b)
                        if nf_a > n_f:
                            continue
                        top = min(nb_a, n_b)
                        for nb in range(nb_b, top + 1):
                            reach[j, (kind * nf1 + nf_a) * nb1 + nb] = True
    return reach


@njit
def spine_table(
    fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, win, budget,
    in_slots, d_in, h_in, fclk, bclk, rate_f, rate_b, delta_f, n_f, delta_b, n_b, n_off,
):
    """Fill the joint DP over the spine (``NOTE [ joint recurrence ]``).

    Sizes in slots (``act`` length L + 1, the others L; stage i at index i - 1 except in
    ``act``). ``win[s, d, m]`` is rotor's time of segment (s, s + d) at budget m, for d below
    ``win.shape[1]`` (the backward parts of checkpointed nodes; see
    :func:`chainoffload.solvers.joint.window_tables`). ``in_slots[s, flag]``, ``d_in[s, flag]``, ``h_in[s, flag]``:
    size of node s's input and its D2H / H2D times (``inf``: it cannot move). ``fclk[s]`` /
    ``bclk[s]`` (s = 1..L+1): the forward clock at stage s (sum of the least forward times
    before it) and the backward one (sum of bwd before it). ``rate_f`` / ``rate_b``: link
    rates in slots per second; grids ``delta_f`` (s) with ``n_f`` rows, ``delta_b`` (s) with
    ``n_b`` rows (``n_f = n_b = 0``: no transfer, the recurrence is rotor's); a checkpointed
    node spans at most ``win.shape[1]`` stages; ``n_off`` offload choices per node (2: none or
    whole, 3: also a_{s-1} alone out of a whole unit s-1, read from ``[s, 0]``).

    Returns ``(opt, choice)`` of shape (L + 2, rows, budget + 1): ``opt[s, row, m]`` is the
    model's time of segment (s, L) from that state (``inf``: it cannot run), ``choice`` the
    code of the best node (see :data:`NO_CHOICE`).
    """
    n = fwd.shape[0]
    nf1 = n_f + 1
    nb1 = n_b + 1
    rows = 2 * nf1 * nb1
    opt = np.full((n + 2, rows, budget + 1), np.inf)
    choice = np.full((n + 2, rows, budget + 1), NO_CHOICE, dtype=np.int32)
    band = win.shape[1]
    # lo_win[s, d]: the least budget at which rotor's segment (s, s + d) runs.
    lo_win = np.full((n + 2, band), budget + 1, dtype=np.int64)
    for s in range(1, n + 1):
        for d in range(min(band, n - s + 1)):
            for m in range(budget + 1):
                if win[s, d, m] < np.inf:
                    lo_win[s, d] = m
                    break
    # First grid points after each stage's clocks.
    kf0 = np.zeros(n + 2, dtype=np.int64)
    kb0 = np.zeros(n + 2, dtype=np.int64)
    for s in range(1, n + 2):
        if n_f > 0:
            kf0[s] = first_after(fclk[s], delta_f)
        if n_b > 0:
            kb0[s] = first_after(bclk[s], delta_b)
    reach = reachable_rows(n, budget, bwd, win, in_slots, d_in, h_in, fclk, bclk, delta_f, n_f, delta_b, n_b, n_off)
    for s in range(n, 0, -1):
        usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]
        for flag in range(2):
            if s == 1 and flag == 1:
                continue
            can_off = s >= 2 and s < n and n_b > 0
            for i_f in range(nf1):
                if s == 1 and i_f > 0:
                    break
                # The D2H queue's end (grid index, -1: idle), before and after this node's offload.
                k_old = -1 if i_f == 0 else kf0[s] + i_f - 1
                end_old = fclk[s] if i_f == 0 else k_old * delta_f
                debt_s = slots_of(end_old - fclk[s], rate_f) if i_f > 0 else 0
                for i_b in range(nb1):
                    if s == 1 and i_b > 0:
                        break
                    row = (flag * nf1 + i_f) * nb1 + i_b
                    if not reach[s, row]:
                        continue
                    cur = opt[s, row]
                    cho = choice[s, row]
                    r_old = bclk[s] if i_b == 0 else (kb0[s] + i_b - 1) * delta_b
                    charge = slots_of(r_old - bclk[s], rate_b) if i_b > 0 else 0
                    if s == n:
                        # The deepest node: F_L then B_L; the queues' leftovers wait before B_L.
                        need = max(saved[n - 1] + fwd_tmp[n - 1] + debt_s, usage_b + charge)
                        idle = 0.0
                        if n_f > 0 and end_old > fclk[n + 1]:
                            idle += end_old - fclk[n + 1]
                        if r_old > bclk[n + 1]:
                            idle += r_old - bclk[n + 1]
                        for m in range(max(need, 0), budget + 1):
                            cur[m] = fwd[n - 1] + idle + bwd[n - 1]
                            cho[m] = 0
                        continue
                    for off in range(n_off):
                        # What moves: the input whole (its own kind), or a_{s-1} out of unit s-1.
                        part = flag if off == 1 else 0
                        if off > 0 and not (can_off and d_in[s, part] < np.inf and h_in[s, part] < np.inf):
                            break
                        if off == 2 and flag == 0:
                            break
                        back = in_slots[s, part] if off > 0 else 0
                        k_new = k_old
                        h_add = 0.0
                        if off > 0:
                            k_new = grid_index(end_old + d_in[s, part], delta_f)
                            h_add = h_in[s, part]
                        # -- F_all on s: child (s + 1, L) with unit s as its input.
                        nf = d2h_row(k_new, fclk[s + 1], delta_f, kf0[s + 1]) if n_f > 0 else 0
                        nb = h2d_row(i_b, r_old, bwd[s - 1], bclk[s], bclk[s + 1], h_add, delta_b, kb0[s + 1]) if n_b > 0 else 0
                        if nf <= n_f and nb <= n_b:
                            child = opt[s + 1, (nf1 + nf) * nb1 + nb]
                            ysub = saved[s - 1]
                            need = max(saved[s - 1] + fwd_tmp[s - 1] + debt_s, usage_b + charge, ysub - back, 0)
                            for m in range(need, budget + 1):
                                mc = m - ysub + back
                                if mc > budget:
                                    mc = budget
                                sub = child[mc]
                                if sub < np.inf:
                                    v = fwd[s - 1] + sub + bwd[s - 1]
                                    if v < cur[m]:
                                        cur[m] = v
                                        cho[m] = off
                        # -- checkpoint: Fck_s, Fn_{s+1}..Fn_{j-1}; child (j, L) with the lone a_{j-1}.
                        need_first = act[s] + fwd_tmp[s - 1] + debt_s
                        need_rest = 0  # max over the Fn ops, on the budget m + back
                        ftime = 0.0
                        for j in range(s + 1, min(n, s + band) + 1):
                            if j == s + 1:
                                ftime = fwd_nosave[s - 1]
                            else:
                                t = j - 1
                                ftime += fwd_nosave[t - 1]
                                d_t = 0
                                if k_new >= 0 and n_f > 0:
                                    d_t = slots_of(k_new * delta_f - fclk[t], rate_f)
                                step = act[t - 1] + act[t] + fwd_tmp[t - 1] + d_t
                                if step > need_rest:
                                    need_rest = step
                            if need_first > budget or need_rest - back > budget:
                                break
                            lo = max(need_first, need_rest - back, act[j - 1] - back, lo_win[s, j - 1 - s] + charge)
                            if lo > budget:
                                continue
                            nf = d2h_row(k_new, fclk[j], delta_f, kf0[j]) if n_f > 0 else 0
                            if nf > n_f:
                                continue
                            left_row = win[s, j - 1 - s]
                            aj = act[j - 1]
                            code = OFFLOADS * j + off
                            base = nf * nb1  # the child's input is a lone activation: flag 0
                            last_tau = -1.0
                            nb = 0
                            child = opt[j, base]
                            for m in range(lo, budget + 1):
                                tau = left_row[m - charge]
                                if n_b > 0 and tau != last_tau:
                                    # rotor's time changes at a few budgets only
                                    last_tau = tau
                                    nb = h2d_row(i_b, r_old, tau, bclk[s], bclk[j], h_add, delta_b, kb0[j])
                                    if nb <= n_b:
                                        child = opt[j, base + nb]
                                if nb > n_b:
                                    continue
                                mc = m - aj + back
                                if mc > budget:
                                    mc = budget
                                sub = child[mc]
                                if sub < np.inf:
                                    v = ftime + sub + tau
                                    if v < cur[m]:
                                        cur[m] = v
                                        cho[m] = code
    return opt, choice
