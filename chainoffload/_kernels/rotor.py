"""The rotor dynamic program (persistent checkpointing of a heterogeneous chain), in slots.

Private; :mod:`chainoffload.solvers.rotor` rounds sizes to slots, fills a lower-bound table
with :func:`bound_table` and gets the exact table's entries and choices from
:func:`exact_entries`. The recurrence and its memory terms are written in ``NOTE [ rotor
recurrence ]`` in that module; how the exact table is obtained from a table of integer lower
bounds in ``NOTE [ rotor by bounds ]`` below.

:func:`rotor_table` is the dense float64 table of the same recurrence, kept for the joint DP
(:mod:`chainoffload.solvers.joint` reads whole rows of it).

NOTE [ rotor by bounds ]
------------------------
Every option of the recurrence is a sum of positive times, and every entry is the compute
time C(s, t) of its stages (each runs forward and backward once at least) plus an *overhead*:
the forward recomputations of the checkpoint options on the way down. F_all adds no overhead
of its own; "checkpoint a_{j-1}" adds ftime(s, j), the time of Fck_s, Fn_{s+1}..Fn_{j-1}.
The float64 table (the dense one, :func:`rotor_table`, and ``tests/naive_rotor.py``) costs
O(S L^3) 8-byte updates; at L = 1000, S = 500 the lean float64 table took 21-37 s of CPU (load
3-5) and 1.5 GB. It is obtained in two steps instead, and equal bit for bit:

1. **A table of lower bounds in integers** (:func:`bound_table`). Units are delta = 2^-k s
   (a power of two, so ``ftime * 2^k`` and its floor are exact): each option adds
   floor(ftime / delta), and the same recurrence over overheads, in uint32, gives
   B(s, t, m) <= overhead(s, t, m) / delta (floors only lower the sum; the minimum is exact).
   A schedule of a segment of d stages has at most d - 1 checkpoint options, each floored
   by less than one unit, so the best option's overhead is below (B + d) delta as well.
   Sums are capped at CAP = 2^29 - 1 (still a lower bound); three of them never wrap a
   uint32, and INF_U = 2^31 - 1 above every feasible sum marks "cannot run". The table is
   filled one budget at a time (``m`` ascending, a *slice* of all segments per budget):
   the right part of a checkpoint reads slice m - act[j-1] of row j, F_all slice
   m - saved[s] of row s + 1, both finished, and the left part (s, j-1) the current row's
   column j - 1, final once the options j' < j are in. So for one (s, j) the update is a
   contiguous run over t, ``row_s[t] = min(row_s[t], c + row_j[t])``, 16 uint32 a vector,
   and 8 rows s share each row j. Rows whose keep-all peak fits at m (t <= z(m, s)) are 0
   and not stored, so slices shrink as m grows. An option whose floor f = floor(ftime / delta)
   is above the previous slice's value at (s, t) cannot help there (values only fall with m,
   and the option is never below f), so a run starts after the prefix of t whose
   previous-slice maximum is below f; strictly below, so that the option that made the
   previous value is never cut. 8 rows are filled together unless an item of 0 slots makes
   one row read another's current slice; then rows go one at a time, s descending.
2. **The exact values where they matter** (:func:`exact_entries`), top-down from the entry
   asked: at (s, t, m) every option's bound is read from the table; an option whose bound
   is above the least (bound + d) (plus the float64 rounding of the sums, a relative
   (4 L + 16) 2^-53, far below a unit) cannot be the minimum of the float64 recurrence
   either, and is dropped; the others' parts are made exact first (an explicit stack,
   results in a hash table), then the entry is evaluated with the dense table's float
   expressions and association, F_all first then j ascending, ties to the first: the same
   value and choice as the dense table. Any entry can be asked, so the whole exact table
   stays available; the schedule's top entry needs a few thousand.

Delta must be fine enough for step 2 to drop nearly everything, and coarse enough that the
top's bound stays below CAP / 2 (then no bound step 2 reads is capped).
:func:`chainoffload.solvers.rotor.fill_rotor_table` takes an upper bound on the top's
overhead from a first table on a grid 16 times coarser (every size ceil(c / 16), budget
floor(S / 16): every memory check is a sum of sizes against a budget, so a plan that fits
it fits the fine grid, and its overhead bounds the fine optimum's from above), with units
from the crude bound L * sum(fwd_nosave) (each stage is re-run at most once per segment
above it, and those nest); it took 0.8 s of 10.6 at L = 1000 in one run. With units from the
crude bound alone, step 2 visited about 10^7 entries at L = 1000 instead of about 2000.

Measured at L = 1000, S = 500 (random chains of ``benchmarks/scaling_remat.py``): 7.9e10
candidate updates before the cut above, which keeps about 60 % of them (counted at L = 200),
against 4.1e10 float64 updates of the lean table this replaced, but 16 to a vector, 4 bytes
each and no per-option setup: 8.7 s against 20.9 s in the same run of the benchmark (1006 MiB
against 1669); the exact entries take 0.07 s. Tried and not kept: the lean
float64 rows (trimmed to [least budget, constant tail], filled in 16 x 16 tiles of segments)
in uint32, 1.6-1.8x faster, the tile of rows under construction then spilling out of L2; the
slices in a ring of 16 copied into such rows every 16 budgets (the copy was 30 % of the
fill); register blocks of 16 columns (Numba leaves loops of a fixed 16 scalar, their stores
possibly aliasing their loads).
"""

from __future__ import annotations

import numpy as np

from .config import njit

#: Rows of the lower-bound table filled together (NOTE [ rotor by bounds ]): 8 rows of 1000
#: uint32 stay in a 32 KiB L1 (L = 1000: 8.2 s against 9.7 s for 16 rows, same machine and load).
BLOCK = 8
#: Cap of the lower bounds, in units; three capped values sum below 2^31.
CAP = 2**29 - 1
#: "Cannot run" in the lower-bound table; above every capped sum.
INF_U = 2**31 - 1
#: Spare entries after each stored row, so that vector loops may round their length up.
PAD = 16


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
def keep_all_needs(act, saved, fwd_tmp, bwd_tmp):
    """ka[s, t]: the least budget at which (s, t) runs with F_all all the way (no recompute)."""
    n = saved.shape[0]
    ka = np.zeros((n + 2, n + 2), dtype=np.int64)
    for t in range(1, n + 1):
        ka[t, t] = keep_need(act, saved, fwd_tmp, bwd_tmp, t, t)
        for s in range(t - 1, 0, -1):
            ka[s, t] = max(keep_need(act, saved, fwd_tmp, bwd_tmp, s, t), saved[s - 1] + ka[s + 1, t])
    return ka


@njit
def floor_units(ftime, scale):
    """floor(ftime * scale) capped at CAP; exact when ``scale`` is a power of two."""
    return min(np.floor(ftime * scale), CAP)


@njit
def bound_table(fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, scale, block):
    """Fill the lower-bound table of ``NOTE [ rotor by bounds ]`` for budgets 0..``slots``.

    Sizes in slots as for :func:`rotor_table`; ``scale`` = 1 / delta, a power of two; rows
    are filled ``block`` at a time. Returns ``(store, zs, rof)``: see :func:`bound_at`.
    """
    n = fwd_nosave.shape[0]
    s1 = slots + 1
    cap = np.uint32(CAP)
    inf_u = np.uint32(INF_U)
    gu = np.zeros(n + 1 + PAD, dtype=np.uint32)  # g_t, the gradient a segment ending at t holds
    gmax = 0
    for t in range(1, n):
        gu[t] = min(act[t], INF_U)
        gmax = max(gmax, act[t])
    ka = keep_all_needs(act, saved, fwd_tmp, bwd_tmp)
    ff = np.zeros((n + 2, n + 2), dtype=np.uint32)  # [j, s]: floor of the forward phase's time
    fp = np.zeros((n + 2, n + 2), dtype=np.int64)  # [j, s]: its peak, less g_t
    for s in range(1, n + 1):
        ftime, peak = 0.0, 0
        for j in range(s + 1, n + 1):
            ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
            ff[j, s] = floor_units(ftime, scale)
            fp[j, s] = peak
    # Slice m stores row s for t in (zs[m, s], n] at store[rof[m, s] + t], then PAD spares.
    zs = np.zeros((s1, n + 2), dtype=np.int32)
    rof = np.zeros((s1, n + 2), dtype=np.int64)
    z = np.zeros(n + 2, dtype=np.int64)
    for s in range(1, n + 2):
        z[s] = s - 1
    total = n + 2 + PAD  # keeps rof >= 0 (t starts at zs + 1 <= n + 1), for the uint64 offsets
    for m in range(s1):
        for s in range(1, n + 1):
            while z[s] < n and ka[s, z[s] + 1] <= m:
                z[s] += 1
            zs[m, s] = z[s]
            rof[m, s] = total - (z[s] + 1)
            total += n - z[s] + PAD
        zs[m, n + 1] = n
    store = np.full(total + PAD, inf_u, dtype=np.uint32)
    sd = np.full(n + 2, n + 1, dtype=np.int64)  # rows s < sd[j]: the forward phase to j does not fit
    sm = np.full(n + 2, n + 1, dtype=np.int64)  # rows s < sm[j]: it fits only beside a small g_t
    pm = np.zeros((block, n + 2), dtype=np.uint32)  # prefix maxima of the previous slice's rows
    tc = np.zeros(block, dtype=np.int64)
    zb = np.zeros(block, dtype=np.int64)  # the block's rows in this slice: keep-all prefix
    rb_ = np.zeros(block, dtype=np.int64)  # and offset
    for m in range(s1):
        # fp[j, s] is nonincreasing in s (a shorter forward phase peaks no higher)
        for j in range(2, n + 1):
            while sd[j] > 1 and fp[j, sd[j] - 1] <= m:
                sd[j] -= 1
            while sm[j] > 1 and fp[j, sm[j] - 1] + gmax <= m:
                sm[j] -= 1
        s_hi = n
        while s_hi >= 1:
            s_lo = max(1, s_hi - block + 1)
            for r in range(s_lo + 1, s_hi + 1):
                if act[r - 1] == 0 or saved[r - 2] == 0:
                    s_lo = s_hi  # a row reads row r's current slice: one row at a time
                    break
            for s in range(s_lo, s_hi + 1):
                b = s - s_lo
                zr = zs[m, s]
                rs = rof[m, s]
                zb[b] = zr
                rb_[b] = rs
                tc[b] = zr
                mx = np.uint32(0)
                if m >= 1:
                    zp = zs[m - 1, s]
                    rp = rof[m - 1, s]
                    for t in range(s, zp + 1):
                        pm[b, t] = 0
                    for t in range(max(s, zp + 1), n + 1):
                        mx = max(mx, store[rp + t])
                        pm[b, t] = mx
                else:
                    for t in range(s, n + 1):
                        pm[b, t] = inf_u
                # F_all on s: unit s stays while s+1..t runs at m - saved[s]
                sv = saved[s - 1]
                if s < n and m >= sv:
                    usage_b = sv + act[s] + act[s - 1] + bwd_tmp[s - 1]
                    lim = m - sv - fwd_tmp[s - 1]
                    if m >= usage_b and lim >= 0:
                        limu = np.uint32(min(lim, INF_U))
                        zn = zs[m - sv, s + 1]
                        rn = np.uint64(rof[m - sv, s + 1])
                        ru = np.uint64(rs)
                        mid = max(zr, zn)
                        for t in range(np.uint64(zr + 1), np.uint64(mid + 1)):
                            store[ru + t] = np.uint32(0) if gu[t] <= limu else inf_u
                        for t in range(np.uint64(mid + 1), np.uint64(n + 1)):
                            v = store[rn + t]
                            store[ru + t] = v if gu[t] <= limu else inf_u
            # Checkpoint a_{j-1}, j ascending: (s, j - 1) is final when j comes.
            for j in range(s_lo + 1, n + 1):
                a = act[j - 1]
                if m < a:
                    continue
                s_a = max(s_lo, sd[j])
                s_b = min(s_hi, j - 1)
                if s_a > s_b:
                    continue
                zj = zs[m - a, j]
                rj = np.uint64(rof[m - a, j])
                for s in range(s_a, s_b + 1):
                    b = s - s_lo
                    f = ff[j, s]
                    if pm[b, n] < f:
                        continue
                    zr = zb[b]
                    rs = rb_[b]
                    if j - 1 <= zr:
                        lv = np.uint32(0)
                    else:
                        lv = store[rs + j - 1]
                        if lv >= inf_u:
                            continue
                    c = np.uint32(f + min(lv, cap))
                    k = tc[b]  # f grows with j: the cut prefix only grows
                    while k < n and pm[b, k + 1] < f:
                        k += 1
                    tc[b] = k
                    t_first = max(j, zr + 1, k + 1)
                    if t_first > n:
                        continue
                    ru = np.uint64(rs)
                    if s >= sm[j]:
                        mid = min(max(zj, t_first - 1), n)  # (j, t) is 0 up to zj
                        for t in range(np.uint64(t_first), np.uint64(mid + 1)):
                            x = store[ru + t]
                            store[ru + t] = min(c, x)
                        t2 = mid + 1
                        if t2 <= n:
                            # rounded up to whole vectors: the spares after the rows take the rest
                            cnt = np.uint64((n + 1 - t2 + PAD - 1) // PAD * PAD)
                            rb = ru + np.uint64(t2)
                            jb = rj + np.uint64(t2)
                            for q in range(cnt):
                                v = np.uint32(c + store[jb + q])
                                x = store[rb + q]
                                store[rb + q] = min(v, x)
                    else:
                        limu = np.uint32(m - fp[j, s])
                        for t in range(np.uint64(t_first), np.uint64(n + 1)):
                            rv = np.uint32(0) if t <= np.uint64(zj) else store[rj + t]
                            v = np.uint32(c + rv)
                            v = v if gu[t] <= limu else inf_u
                            x = store[ru + t]
                            store[ru + t] = min(v, x)
            for s in range(s_lo, s_hi + 1):
                ru = np.uint64(rof[m, s])
                for t in range(np.uint64(zs[m, s] + 1), np.uint64(n + 1)):
                    v = store[ru + t]
                    store[ru + t] = cap if (v > cap and v < inf_u) else v
            s_hi = s_lo - 1
    return store, zs, rof


@njit
def bound_at(store, zs, rof, s, t, m):
    """The lower bound (units) of (s, t) at budget m; INF_U when the segment cannot run."""
    if m < 0:
        return np.int64(INF_U)
    if t <= zs[m, s]:
        return np.int64(0)
    return np.int64(store[rof[m, s] + t])


@njit
def _memo_slot(keys, key):
    mask = keys.shape[0] - 1
    i = (key ^ (key >> 12) ^ (key >> 24)) & mask  # no multiply: the same in Numba and in Python
    while keys[i] != -1 and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit
def _push(stack, sp, s, t, m):
    if sp >= stack.shape[0]:
        bigger = np.empty((2 * stack.shape[0], 3), dtype=np.int64)
        bigger[: stack.shape[0]] = stack
        stack = bigger
    stack[sp, 0], stack[sp, 1], stack[sp, 2] = s, t, m
    return stack, sp + 1


@njit
def _rehash(keys, vals, picks):
    size = 2 * keys.shape[0]
    k2 = np.full(size, -1, dtype=np.int64)
    v2 = np.empty(size)
    p2 = np.empty(size, dtype=np.int32)
    for i in range(keys.shape[0]):
        if keys[i] != -1:
            j = _memo_slot(k2, keys[i])
            k2[j] = keys[i]
            v2[j] = vals[i]
            p2[j] = picks[i]
    return k2, v2, p2


@njit
def _survivors(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, scale, store, zs, rof, s, t, m, eps):
    """The bound above which no option of (s, t, m) can be the float64 minimum, and F_all's bound."""
    n = fwd.shape[0]
    d = t - s + 1
    g_t = act[t] if t < n else 0
    lb_f = np.int64(-1)
    if m >= keep_need(act, saved, fwd_tmp, bwd_tmp, s, t):
        lb_f = bound_at(store, zs, rof, s + 1, t, m - saved[s - 1])
        if lb_f >= INF_U:
            lb_f = -1
    least = np.int64(2**62)
    if 0 <= lb_f < CAP:
        least = lb_f
    ftime, peak = 0.0, 0
    for j in range(s + 1, t + 1):
        ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
        if g_t + peak > slots:
            break
        a = act[j - 1]
        if m < g_t + peak or m < a:
            continue
        r = bound_at(store, zs, rof, j, t, m - a)
        lf = bound_at(store, zs, rof, s, j - 1, m)
        if r >= INF_U or lf >= INF_U:
            continue
        lb = np.int64(floor_units(ftime, scale)) + r + lf
        if lb < CAP:
            least = min(least, lb)
    if least >= 2**62:
        return np.int64(2**62), lb_f
    bound = least + d
    # float64 sums of up to 3 L + 2 terms in sequence, against the real ones the bounds bound
    compute = 0.0
    for i in range(s - 1, t):
        compute += fwd[i] + bwd[i]
    bound += np.int64(2.0 * eps * (compute * scale + bound)) + 2
    return bound, lb_f


@njit
def exact_entries(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, scale, store, zs, rof,
                  keys, vals, picks, count, s0, t0, m0):
    """Make the exact entry (s0, t0, m0) and what it rests on known in the memo (``NOTE [ rotor by bounds ]``).

    The memo is an open-addressing table: ``keys`` (-1: empty; key (s (L + 2) + t) (S + 1) + m),
    ``vals`` the dense table's value, ``picks`` its choice (0: F_all, j: checkpoint a_{j-1},
    -1: cannot run). Returns ``(keys, vals, picks, count)`` (new arrays when it grew).
    """
    n = fwd.shape[0]
    eps = (4.0 * n + 16.0) * 2.0**-53
    stack = np.empty((64, 3), dtype=np.int64)
    stack, sp = _push(stack, 0, s0, t0, m0)
    while sp > 0:
        sp -= 1
        s, t, m = stack[sp, 0], stack[sp, 1], stack[sp, 2]
        key = (s * (n + 2) + t) * (slots + 1) + m
        if keys[_memo_slot(keys, key)] == key:
            continue
        if m < 0 or bound_at(store, zs, rof, s, t, m) >= INF_U:
            value, pick = np.inf, -1
        elif s == t:
            value, pick = fwd[s - 1] + bwd[s - 1], 0
        else:
            bound, lb_f = _survivors(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, scale, store, zs,
                                     rof, s, t, m, eps)
            g_t = act[t] if t < n else 0
            # the survivors' parts first
            waiting = sp
            if lb_f >= 0 and lb_f <= bound:
                k2 = ((s + 1) * (n + 2) + t) * (slots + 1) + m - saved[s - 1]
                if keys[_memo_slot(keys, k2)] != k2:
                    stack, sp = _push(stack, sp, s + 1, t, m - saved[s - 1])
            ftime, peak = 0.0, 0
            for j in range(s + 1, t + 1):
                ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
                if g_t + peak > slots:
                    break
                a = act[j - 1]
                if m < g_t + peak or m < a:
                    continue
                r = bound_at(store, zs, rof, j, t, m - a)
                lf = bound_at(store, zs, rof, s, j - 1, m)
                if r >= INF_U or lf >= INF_U or np.int64(floor_units(ftime, scale)) + r + lf > bound:
                    continue
                kr = (j * (n + 2) + t) * (slots + 1) + m - a
                if keys[_memo_slot(keys, kr)] != kr:
                    stack, sp = _push(stack, sp, j, t, m - a)
                kl = (s * (n + 2) + j - 1) * (slots + 1) + m
                if keys[_memo_slot(keys, kl)] != kl:
                    stack, sp = _push(stack, sp, s, j - 1, m)
            if sp > waiting:
                # come back to (s, t, m) once they are known: below them on the stack
                stack, sp = _push(stack, sp, 0, 0, 0)
                for i in range(sp - 1, waiting, -1):
                    stack[i, 0], stack[i, 1], stack[i, 2] = stack[i - 1, 0], stack[i - 1, 1], stack[i - 1, 2]
                stack[waiting, 0], stack[waiting, 1], stack[waiting, 2] = s, t, m
                continue
            # the dense table's expressions, in its order, over the survivors
            value, pick = np.inf, -1
            if lb_f >= 0 and lb_f <= bound:
                sub = vals[_memo_slot(keys, ((s + 1) * (n + 2) + t) * (slots + 1) + m - saved[s - 1])]
                if sub < np.inf:
                    value, pick = fwd[s - 1] + sub + bwd[s - 1], 0
            ftime, peak = 0.0, 0
            for j in range(s + 1, t + 1):
                ftime, peak = forward_phase(fwd_nosave, act, fwd_tmp, s, j, ftime, peak)
                if g_t + peak > slots:
                    break
                a = act[j - 1]
                if m < g_t + peak or m < a:
                    continue
                r = bound_at(store, zs, rof, j, t, m - a)
                lf = bound_at(store, zs, rof, s, j - 1, m)
                if r >= INF_U or lf >= INF_U or np.int64(floor_units(ftime, scale)) + r + lf > bound:
                    continue
                right = vals[_memo_slot(keys, (j * (n + 2) + t) * (slots + 1) + m - a)]
                if right == np.inf:
                    continue
                v = ftime + right + vals[_memo_slot(keys, (s * (n + 2) + j - 1) * (slots + 1) + m)]
                if v < value:
                    value, pick = v, j
        if 2 * (count + 1) > keys.shape[0]:
            keys, vals, picks = _rehash(keys, vals, picks)
        i = _memo_slot(keys, key)
        keys[i] = key
        vals[i] = value
        picks[i] = pick
        count += 1
    return keys, vals, picks, count
