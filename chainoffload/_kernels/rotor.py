"""The rotor dynamic program (persistent checkpointing of a heterogeneous chain), in slots.

Private; :mod:`chainoffload.solvers.rotor` rounds sizes to slots, calls :func:`rotor_lean`
and rebuilds the schedule with :func:`rotor_argmin`. The recurrence and its memory terms are
written in ``NOTE [ rotor recurrence ]`` in that module, the storage and the order of work in
``NOTE [ lean rotor table ]`` below.

:func:`rotor_table` is the dense table of the same recurrence, kept for the joint DP
(:mod:`chainoffload.solvers.joint` reads whole rows of it).

NOTE [ lean rotor table ]
-------------------------
The dense table (L + 2)^2 (S + 1) float64 plus an int32 choice per entry is 6 GB at L = 1000,
S = 500. The lean table keeps only what no other entry can be derived from, and is equal to
the dense one bit for bit (the same float expressions, evaluated in the same association):

* **Rows are trimmed.** opt[s, t, m] is nonincreasing in m (every option is, and so is their
  minimum; float addition is monotone). Below lo(s, t) it is inf; from top(s, t) on it is
  constant (the keep-all value once keep-all fits, whatever the float ties). Only
  m in [lo, top] is stored, the rows one after the other in one float64 array; off[s, t] is
  the row's place in it. The array is allocated at the dense size but written from its
  start, so the pages past the last row are never touched and never become resident. An
  option's value is itself constant from M = max(a + top(right), top(left)) on, so the work
  for one option is over [lo_j, min(M, S + 1)) and a fill beyond.
* **No choice table.** The argmin is recomputed when the schedule is rebuilt
  (:func:`rotor_argmin`), with the dense table's tie-break: "F_all" when it attains the
  minimum, else the smallest j that does.
* **Options that cannot improve are cut.** The row under construction ``best`` holds the
  minimum over the options applied so far, filled to S + 1, so it is nonincreasing too. An
  option is never below its own value at S; from the first m where ``best`` is already at or
  below that value, it cannot improve any entry, and the loop over m stops there (binary
  search). This halves the work on chains where many options are close.
* **Tiles, rows reused.** Segments are filled in tiles of ``block`` starts s by ``block``
  ends t: column blocks t0..t1-1 left to right, and in each the tile on the diagonal, then
  the tiles above it (s descending). The bulk of a tile's work is the options whose both
  parts lie outside the tile (j - 1 < t0 and j > every s of the tile), all final already:
  for each such j, every right row (j, t) serves every s of the tile and every left row
  (s, j-1) every t, as in a blocked matrix product (min-plus, with rows for entries); this
  halved the fill's CPU time at L = 1000 (72 s to 37 s in one run) against reading one right
  row per option, the rows being read from main memory. Then each s of the tile
  (descending) takes F_all and the options inside the tile, j ascending; row (s, j-1) of the
  tile is final, and stored, just before it serves as a left part. The order in which options are applied does not
  change the table (the minimum is exact; only the work the cut above saves does). The
  inner loops run over contiguous slices so that LLVM vectorizes them; the minimum is
  written as ``(v if v < x else x) + 0.0``: without the ``+ 0.0`` LLVM turns the store into
  a masked store, several times slower on x86 (the values are sums of times >= 0, never
  -0.0, so adding 0.0 changes none).

Work is still O(S L^3) in the worst case and storage O(S L^2): on random chains at 30 % of
the way from the memory floor to keep-all, storage is about 80 % of the dense float64 part
(rows hold a distinct value at nearly every budget, so they do not compress into steps).
Measured and not kept, all exact: skipping 32 budgets at once where the option's value at
the last is no better than ``best`` at the first (skips ~45 % of the work, costs more than
it saves); dropping entries whose recompute overhead exceeds the optimum's (they cannot lie
on an optimal path, but 94 % of the table stays); tiles cut along m as well (the per-option
setup, ~80 ns, then doubles the time).
"""

from __future__ import annotations

import numpy as np

from .config import njit

#: Side of the tiles of segments filled together (NOTE [ lean rotor table ]).
BLOCK = 16


@njit
def forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak):
    """Time and memory peak (less g_t) of Fck_s, Fn_{s+1}..Fn_{j-1}, from those ending at a_{j-2}.

    For j = s + 1 (Fck_s alone) ``ftime`` and ``peak`` are not read. The time is summed in
    stage order, the association every table of this module uses.
    """
    if j == s + 1:
        return fwd_nosave[s - 1], act[s] + fwd_tmp[s - 1]
    return ftime + fwd_nosave[j - 2], max(peak, act[j - 2] + act[j - 1] + fwd_tmp[j - 2])


@njit
def keep_need(act, saved, fwd_tmp, bwd_tmp, s, t):
    """Least budget of F_s keeping unit s in segment (s, t) (and of s..s): F_s's peak with g_t, or B_s's own.

    NOTE [ rotor recurrence ] in :mod:`chainoffload.solvers.rotor`: max(g(t) + saved[s] +
    fwd_tmp[s], usage_B(s)), with g(L) = 0 since B_L makes g_L itself.
    """
    g_t = act[t] if t < fwd_tmp.shape[0] else 0
    usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]
    return max(g_t + saved[s - 1] + fwd_tmp[s - 1], usage_b)


@njit
def rotor_table(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots):
    """Fill the dense rotor table for every segment and every budget 0..``slots``.

    Sizes are in slots (``act`` has length L + 1, the others L; stage i is index i - 1 except
    in ``act``). Returns ``(opt, choice)`` of shape (L + 2, L + 2, slots + 1): ``opt[s, t, m]``
    is the least time of segment s..t with budget m (``inf`` when it cannot run), and
    ``choice[s, t, m]`` is 0 for "F_all on s" and j > s for "checkpoint a_{j-1}".
    """
    n = fwd.shape[0]
    opt = np.full((n + 2, n + 2, slots + 1), np.inf)
    choice = np.full((n + 2, n + 2, slots + 1), -1, dtype=np.int32)
    for d in range(n):
        for s in range(1, n - d + 1):
            t = s + d
            g_t = act[t] if t < n else 0
            need_a = keep_need(act, saved, fwd_tmp, bwd_tmp, s, t)
            if d == 0:
                for m in range(max(need_a, 0), slots + 1):
                    opt[s, t, m] = fwd[s - 1] + bwd[s - 1]
                    choice[s, t, m] = 0
                continue
            # F_all on s keeps unit s while s+1..t runs.
            for m in range(need_a, slots + 1):
                sub = opt[s + 1, t, m - saved[s - 1]]
                if sub < np.inf:
                    opt[s, t, m] = fwd[s - 1] + sub + bwd[s - 1]
                    choice[s, t, m] = 0
            # Fck_s, Fn_{s+1}..Fn_{j-1}: keep a_{s-1}, run j..t from the lone a_{j-1}, then s..j-1.
            ftime, peak = 0.0, 0
            for j in range(s + 1, t + 1):
                ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
                need = g_t + peak
                if need > slots:
                    break
                a_j = act[j - 1]
                for m in range(max(need, a_j), slots + 1):
                    right = opt[j, t, m - a_j]
                    if right == np.inf:
                        continue
                    v = ftime + right + opt[s, j - 1, m]
                    if v < opt[s, t, m]:
                        opt[s, t, m] = v
                        choice[s, t, m] = j
    return opt, choice


@njit
def _checkpoint_option(best, right, o_right, lo_right, top_right, left, o_left, lo_left, top_left, a, need, ftime, slots):
    """Lower ``best`` (nonincreasing, length slots + 1) by "checkpoint a_{j-1}" of one segment.

    ``right`` / ``left`` hold the rows (j, t) and (s, j-1) at offsets ``o_right`` / ``o_left``
    (their values at lo); ``a`` is act[j-1] in slots, ``need`` the forward phase's memory,
    ``ftime`` the time of Fck_s, Fn_{s+1}..Fn_{j-1}. ``best`` stays nonincreasing.
    """
    s1 = slots + 1
    first = max(need, a + lo_right, lo_left)
    if first > slots:
        return
    base_r = o_right - lo_right - a  # right[base_r + m] is the right part's value at m - a
    base_l = o_left - lo_left
    flat = max(a + top_right, top_left, first)  # the option is constant from here on
    at_top = ftime + right[base_r + min(slots, a + top_right)] + left[base_l + min(slots, top_left)]
    # best is nonincreasing and the option is never below at_top: stop where best reaches it.
    lo_, hi_ = first, s1
    while lo_ < hi_:
        mid = (lo_ + hi_) // 2
        if best[mid] <= at_top:
            hi_ = mid
        else:
            lo_ = mid + 1
    stop = lo_
    m0 = first
    both = min(a + top_right, top_left, stop)  # both rows explicit below this
    if both > m0:
        b = best[m0:both]
        r = right[base_r + m0:base_r + both]
        lf = left[base_l + m0:base_l + both]
        for k in range(both - m0):
            x = b[k]
            v = ftime + r[k] + lf[k]
            b[k] = (v if v < x else x) + 0.0  # NOTE [ lean rotor table ]: + 0.0
        m0 = both
    one = min(flat, stop)  # one row constant below this
    if one > m0:
        b = best[m0:one]
        if a + top_right <= top_left:
            rv = ftime + right[base_r + a + top_right]
            lf = left[base_l + m0:base_l + one]
            for k in range(one - m0):
                x = b[k]
                v = rv + lf[k]
                b[k] = (v if v < x else x) + 0.0
        else:
            lv = left[base_l + top_left]
            r = right[base_r + m0:base_r + one]
            for k in range(one - m0):
                x = b[k]
                v = ftime + r[k] + lv
                b[k] = (v if v < x else x) + 0.0
        m0 = one
    if stop > m0:
        b = best[m0:stop]
        for k in range(stop - m0):
            x = b[k]
            b[k] = (at_top if at_top < x else x) + 0.0


@njit
def _store_row(best, store, used, slots):
    """Copy the explicit part of a finished row into ``store`` at ``used``; return (lo, top, used)."""
    s1 = slots + 1
    lo = s1
    for m in range(s1):
        if best[m] < np.inf:
            lo = m
            break
    if lo == s1:
        return s1, s1, used
    top = slots
    last = best[slots]
    while top > lo and best[top - 1] == last:
        top -= 1
    # Plain loops, not slice assignment: Numba's generic setitem costs seconds of compile.
    for m in range(lo, top + 1):
        store[used + m - lo] = best[m]
    return lo, top, used + top - lo + 1


@njit
def rotor_lean(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, block):
    """Fill the lean rotor table (``NOTE [ lean rotor table ]``), equal to :func:`rotor_table`'s ``opt``.

    Sizes in slots as for :func:`rotor_table`; tiles are ``block`` x ``block`` segments.
    Returns ``(store, used, lo, top, off)``: opt[s, t, m] is inf for m < lo[s, t], else
    ``store[off[s, t] + min(m, top[s, t]) - lo[s, t]]`` (see :func:`rotor_value`); only
    ``store[:used]`` is written.
    """
    n = fwd.shape[0]
    s1 = slots + 1
    lo = np.full((n + 2, n + 2), s1, dtype=np.int32)
    top = np.full((n + 2, n + 2), s1, dtype=np.int32)
    off = np.zeros((n + 2, n + 2), dtype=np.int64)
    # Room for every row at full length; rows are written one after the other from the start,
    # and pages past the last row are never touched (NOTE [ lean rotor table ]).
    store = np.empty(n * (n + 1) // 2 * s1 + 1)
    used = 0
    best = np.empty((block, block, s1))  # the tile's rows under construction, [s - s_lo, t - t0]
    ftab = np.zeros((block, n + 2))  # forward phase of (s, j): time
    ptab = np.zeros((block, n + 2), dtype=np.int64)  # and peak (less g_t)
    for t0 in range(1, n + 1, block):
        t1 = min(t0 + block, n + 1)
        s_lo, s_hi = t0, t1 - 1  # the tile on the diagonal first, then those above it
        while s_hi >= 1:
            for s in range(s_lo, s_hi + 1):
                ftime, fpeak = 0.0, 0
                for j in range(s + 1, t1):
                    ftime, fpeak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, fpeak)
                    ftab[s - s_lo, j] = ftime
                    ptab[s - s_lo, j] = fpeak
                for t in range(max(s + 1, t0), t1):
                    row = best[s - s_lo, t - t0]
                    for m in range(s1):
                        row[m] = np.inf
            # Checkpoints whose both parts lie outside the tile (j - 1 < t0, j > s_hi), final
            # already: each right row (j, t) serves every s of the tile, each left row (s, j - 1)
            # every t (NOTE [ lean rotor table ]: tiles).
            for j in range(s_hi + 1, t0 + 1):
                a = act[j - 1]
                for s in range(s_lo, s_hi + 1):
                    fpeak = ptab[s - s_lo, j]
                    lo_left = lo[s, j - 1]
                    if fpeak > slots or lo_left > slots:
                        continue
                    o_left = off[s, j - 1]
                    top_left = top[s, j - 1]
                    ftime = ftab[s - s_lo, j]
                    for t in range(t0, t1):
                        g_t = act[t] if t < n else 0
                        _checkpoint_option(best[s - s_lo, t - t0], store, off[j, t], lo[j, t], top[j, t], store, o_left,
                                           lo_left, top_left, a, g_t + fpeak, ftime, slots)
            # The rest, one s at a time (descending): F_all, then the checkpoints inside the tile
            # (j ascending), each row stored once its last option is in, just before it serves as
            # a left part.
            for s in range(s_hi, s_lo - 1, -1):
                first_t = max(s, t0)
                if s >= t0:
                    # s..s: F_s then B_s.
                    need_a = keep_need(act, saved, fwd_tmp, bwd_tmp, s, s)
                    if need_a <= slots:
                        lo[s, s] = need_a
                        top[s, s] = need_a
                        off[s, s] = used
                        store[used] = fwd[s - 1] + bwd[s - 1]
                        used += 1
                    first_t = s + 1
                for t in range(first_t, t1):
                    # F_all on s: unit s stays while s+1..t runs at m - saved[s].
                    row = best[s - s_lo, t - t0]
                    need_a = keep_need(act, saved, fwd_tmp, bwd_tmp, s, t)
                    sv = saved[s - 1]
                    lo_sub = lo[s + 1, t]
                    first = max(need_a, sv + lo_sub)
                    if first <= slots:
                        top_sub = top[s + 1, t]
                        flat = max(sv + top_sub, first)
                        base = off[s + 1, t] - lo_sub - sv
                        for m in range(first, min(flat, s1)):
                            x = row[m]
                            v = fwd[s - 1] + store[base + m] + bwd[s - 1]
                            row[m] = (v if v < x else x) + 0.0
                        if flat <= slots:
                            c = fwd[s - 1] + store[base + sv + top_sub] + bwd[s - 1]
                            for m in range(flat, s1):
                                x = row[m]
                                row[m] = (c if c < x else x) + 0.0
                for j in range(s + 1, t1 + 1):
                    if j - 1 >= first_t:
                        first_m, top_m, new_used = _store_row(best[s - s_lo, j - 1 - t0], store, used, slots)
                        if first_m < s1:
                            lo[s, j - 1] = first_m
                            top[s, j - 1] = top_m
                            off[s, j - 1] = used
                            used = new_used
                    if j == t1:
                        break
                    if s_hi < j <= t0:
                        continue  # applied with the whole tile above
                    fpeak = ptab[s - s_lo, j]
                    lo_left = lo[s, j - 1]
                    if fpeak > slots or lo_left > slots:
                        continue
                    o_left = off[s, j - 1]
                    top_left = top[s, j - 1]
                    a = act[j - 1]
                    ftime = ftab[s - s_lo, j]
                    for t in range(max(first_t, j), t1):
                        g_t = act[t] if t < n else 0
                        _checkpoint_option(best[s - s_lo, t - t0], store, off[j, t], lo[j, t], top[j, t], store, o_left,
                                           lo_left, top_left, a, g_t + fpeak, ftime, slots)
            s_hi = s_lo - 1
            s_lo = max(1, s_hi - block + 1)
    return store, used, lo, top, off


@njit
def rotor_value(store, lo, top, off, s, t, m):
    """opt[s, t, m] of the lean table (``inf`` below the row's least budget)."""
    if m < lo[s, t]:
        return np.inf
    return store[off[s, t] + min(m, top[s, t]) - lo[s, t]]


@njit
def rotor_argmin(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, store, lo, top, off, slots, s, t, m):
    """The dense table's ``choice[s, t, m]``: 0 for "F_all on s", j for "checkpoint a_{j-1}", -1 for none.

    Recomputes each option with the fill's float expressions and returns the first (F_all,
    then j ascending) whose value equals the table's, which is the dense table's tie-break.
    """
    n = fwd.shape[0]
    target = rotor_value(store, lo, top, off, s, t, m)
    if target == np.inf:
        return -1
    if s == t:
        return 0
    g_t = act[t] if t < n else 0
    need_a = keep_need(act, saved, fwd_tmp, bwd_tmp, s, t)
    if m >= need_a:
        sub = rotor_value(store, lo, top, off, s + 1, t, m - saved[s - 1])
        if sub < np.inf and fwd[s - 1] + sub + bwd[s - 1] == target:
            return 0
    ftime, peak = 0.0, 0
    for j in range(s + 1, t + 1):
        ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
        need = g_t + peak
        if need > slots:
            break
        a = act[j - 1]
        if m < need or m < a:
            continue
        right = rotor_value(store, lo, top, off, j, t, m - a)
        if right == np.inf:
            continue
        if ftime + right + rotor_value(store, lo, top, off, s, j - 1, m) == target:
            return j
    return -1
