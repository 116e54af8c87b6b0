"""The exact joint DP (at most one transfer in flight per channel), in slots.

Private; :mod:`chainoffload.solvers.joint_exact` rounds sizes to slots, fills the rotor table
(:func:`chainoffload._kernels.rotor.rotor_table`) for the segments that do not offload,
calls :func:`spine_table` for the top segment's spine and rebuilds the schedule with its
transfers. The recurrence is written in ``NOTE [ exact joint recurrence ]`` in that module.

Items (what a spine node keeps for its backward part) are indexed
``p = STRIDE * i + VARIANTS * kind + variant`` for stage i in 1..L-1: kind 0 a lone a_i
(made by a checkpoint node ending at stage i), kind 1 the whole unit i (made by F_all on
i); the variant says where its bytes are given back (:func:`item_credit_stage`). ``p = 0``
means "no offload pending".
"""

from __future__ import annotations

import numpy as np

from .config import njit

#: Credit variants per item (see :func:`item_credit_stage`).
VARIANTS = 3
#: Item indices per stage: two kinds times the variants.
STRIDE = 2 * VARIANTS


@njit
def item_credit_stage(fwd_min, bwd, d_item, h_item, length):
    """Where each item variant gives its bytes back: forward credit stage u, backward one v.

    ``fwd_min[i - 1]`` is the least time of a forward op of stage i (F, Fck or Fn);
    ``d_item[p]`` / ``h_item[p]`` the offload / prefetch time of item p (``inf`` when the
    link cannot carry it). The offload of item p (stage i = p // STRIDE) starts when its
    maker (the forward op of stage i) ends, on an idle channel; the spine then runs one
    forward op per stage, so it has ended by the start of the op of the least stage
    u0 >= i + 2 with sum(fwd_min[i+1 .. u0-1]) >= d_item[p]. Let v* be the least stage
    >= i + 2 with sum(bwd[i+2 .. v*-1]) >= h_item[p] (the prefetch hides behind those
    backward ops). Variants (p % VARIANTS):

    0. u = v = u0;
    1. v = v*, u = max(u0, v*): a later credit on a fast link, an earlier backward credit
       on a slow one; only where v* differs from u0;
    2. v = min(u0, v*) - 1, u = u0: one node more with the backward credit, for a wait;
       only where v >= i + 2.

    Returns ``(u, v)`` per item, ``length + 1`` where the variant does not exist (and for
    the unused p < STRIDE).
    """
    n_items = STRIDE * (length + 1)
    out_u = np.full(n_items, length + 1, dtype=np.int64)
    out_v = np.full(n_items, length + 1, dtype=np.int64)
    for p in range(STRIDE, n_items, VARIANTS):
        i = p // STRIDE
        if i >= length:
            continue
        d = d_item[p]
        h = h_item[p]
        if not (d < np.inf and h < np.inf):
            continue
        # u = i + 2 at least: the forward op of stage i + 1 reads a_i, so the GPU copy
        # lives until it ends even when the copy itself is instantaneous.
        acc = fwd_min[i]  # the op of stage i + 1
        u = i + 2
        while u <= length and acc < d:
            acc += fwd_min[u - 1]
            u += 1
        if u > length:
            continue
        out_u[p] = u
        out_v[p] = u
        back = 0.0
        v = i + 2
        while v <= length and back < h:
            back += bwd[v - 1]
            v += 1
        if v != u and v <= length:
            out_u[p + 1] = max(u, v)
            out_v[p + 1] = v
        early = min(u, v) - 1
        if early >= i + 2:
            out_u[p + 2] = u
            out_v[p + 2] = early
    return out_u, out_v


@njit
def spine_rows(item_u, length):
    """Row of each spine state (s, p) in the table, -1 where the state cannot occur.

    State (s, p) occurs for p = 0 and for the items of stages i <= s - 1 whose credit stage
    u satisfies s < u <= L; only those get a row, so the table's size follows the number
    of stages an offload spans, not L times the items. Returns ``(row_of, rows)``.
    """
    n_items = STRIDE * (length + 1)
    row_of = np.full((length + 2, n_items), -1, dtype=np.int64)
    rows = 0
    for s in range(1, length + 1):
        row_of[s, 0] = rows
        rows += 1
        for p in range(STRIDE, STRIDE * s):
            if item_u[p] <= length and item_u[p] > s:
                row_of[s, p] = rows
                rows += 1
    return row_of, rows


@njit
def _best_children(opt, row_of, lo_opt, item_u, item_h, c, first, n, slots, best, best_code, lo_best):
    """Row c of the best child among "no offload" and the variants of item ``first + var``.

    A parent that starts segment (c, L) with no offload pending (or one just credited) may
    offload its own item; its value then only depends on this minimum (ties: no offload).
    """
    r0 = row_of[c, 0]
    for m in range(slots + 1):
        best[c, m] = opt[r0, m]
        best_code[c, m] = 0
    lo = lo_opt[c, 0]
    if first >= 0:
        for var in range(VARIANTS):
            q = first + var
            if item_u[q] > n or not item_h[q] < np.inf or row_of[c, q] < 0:
                continue
            if lo_opt[c, q] < lo:
                lo = lo_opt[c, q]
            rq = row_of[c, q]
            for m in range(slots + 1):
                if opt[rq, m] < best[c, m]:
                    best[c, m] = opt[rq, m]
                    best_code[c, m] = 1 + var
    lo_best[c] = lo


@njit
def spine_table(
    fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, item_x, item_u, item_v, item_h, rot, slots
):
    """Fill the table of the top segment's spine: segments (s, L), pending offload, budget.

    Sizes in slots (rounded up; ``item_x`` is the item's size rounded down, what its
    offload gives back). ``item_u`` / ``item_v`` from :func:`item_credit_stage`,
    ``item_h`` the item's prefetch time (``inf`` when the link cannot carry it), ``rot``
    the rotor table of shape (L + 2, L + 2, slots + 1) for the segments off the spine.

    Returns ``(opt, choice, row_of)``: ``opt[row_of[s, p], m]`` is the least time (an upper
    bound of the simulated one) of segment (s, L) with budget m while item p's offload is
    pending (p = 0: none), ``inf`` where it cannot run (rows: :func:`spine_rows`).
    ``choice`` is ``(VARIANTS + 1) * j + off``: j = 0 "F_all on s", j > s "checkpoint
    a_{j-1}"; off = 0 no offload, 1 + v the node's own item is offloaded as variant v; -1
    where the segment cannot run.
    """
    n = fwd.shape[0]
    n_items = STRIDE * (n + 1)
    row_of, rows = spine_rows(item_u, n)
    opt = np.full((rows, slots + 1), np.inf)
    choice = np.full((rows, slots + 1), -1, dtype=np.int32)
    cum_b = np.zeros(n + 1)
    for q in range(1, n + 1):
        cum_b[q] = cum_b[q - 1] + bwd[q - 1]
    pend = np.empty(n_items, dtype=np.int64)
    # Every table here is finite on an upward-closed range of budgets (each condition is a
    # lower bound on m); lo_* is where that range starts (slots + 1: nowhere), so the loops
    # over m skip the budgets where a child cannot run.
    lo_opt = np.full((n + 2, n_items), slots + 1, dtype=np.int64)
    lo_rot = np.full((n + 2, n + 2), slots + 1, dtype=np.int64)
    for s in range(1, n + 1):
        for t in range(s, n + 1):
            for m in range(slots + 1):
                if rot[s, t, m] < np.inf:
                    lo_rot[s, t] = m
                    break

    # The last node: F_L then B_L; no offload can be pending (its credit stage is > L).
    usage_b = saved[n - 1] + act[n] + act[n - 1] + bwd_tmp[n - 1]
    need_a = max(saved[n - 1] + fwd_tmp[n - 1], usage_b)
    for m in range(max(need_a, 0), slots + 1):
        opt[row_of[n, 0], m] = fwd[n - 1] + bwd[n - 1]
        choice[row_of[n, 0], m] = 0
    lo_opt[n, 0] = max(need_a, 0)
    # best_ckpt[c] / best_fall[c]: the best child (c, L) of a checkpoint node ending at c-1
    # (own item the lone a_{c-1}) / of F_all on c-1 (own item unit c-1), for a parent with
    # no offload pending after this transition; *_code is 0 or 1 + the variant offloaded.
    best_ckpt = np.full((n + 2, slots + 1), np.inf)
    best_fall = np.full((n + 2, slots + 1), np.inf)
    code_ckpt = np.zeros((n + 2, slots + 1), dtype=np.int32)
    code_fall = np.zeros((n + 2, slots + 1), dtype=np.int32)
    lo_ckpt = np.full(n + 2, slots + 1, dtype=np.int64)
    lo_fall = np.full(n + 2, slots + 1, dtype=np.int64)
    first = STRIDE * (n - 1) if n > 1 else -1  # no item at stage 0
    _best_children(opt, row_of, lo_opt, item_u, item_h, n, first, n, slots, best_ckpt, code_ckpt, lo_ckpt)
    if n > 1:
        first += VARIANTS
    _best_children(opt, row_of, lo_opt, item_u, item_h, n, first, n, slots, best_fall, code_fall, lo_fall)

    for s in range(n - 1, 0, -1):
        # The pending states that can reach segment (s, L): none, or an item of an earlier
        # stage whose offload is not yet known to be over at s.
        n_pend = 0
        for p in range(STRIDE * s):
            if row_of[s, p] >= 0:
                pend[n_pend] = p
                n_pend += 1
        usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]

        # -- F_all on s: F_s keeps unit s (items STRIDE s + VARIANTS + variant) for B_s;
        # child (s + 1, L).
        y = saved[s - 1]
        for k in range(n_pend):
            p = pend[k]
            row = opt[row_of[s, p]]
            crow = choice[row_of[s, p]]
            credit = p != 0 and item_u[p] <= s + 1
            x = item_x[p] if credit else 0
            # Backward credit: p's copy is over and its prefetch not yet started while B_s runs.
            xb = item_x[p] if p != 0 and s >= item_v[p] else 0
            w = 0.0
            if p != 0 and p // STRIDE == s - 1:
                # p is the input a_{s-1} (or unit s-1): B_s reads it, its prefetch starts when
                # segment (r, L) ends, r >= v, so at least B_{s+1..v-1} run in between.
                w = item_h[p] - (cum_b[item_v[p] - 1] - cum_b[s])
                if w < 0.0:
                    w = 0.0
            free = p == 0 or credit
            need = max(saved[s - 1] + fwd_tmp[s - 1], usage_b - xb)
            lo_child = lo_fall[s + 1] if free else lo_opt[s + 1, p]
            if lo_child > slots:
                continue
            need = max(need, lo_child + y - x)
            if free:
                for m in range(need, slots + 1):
                    mc = m - y + x
                    if mc > slots:
                        mc = slots
                    sub = best_fall[s + 1, mc]
                    if sub < np.inf:
                        v = fwd[s - 1] + sub + w + bwd[s - 1]
                        if v < row[m]:
                            row[m] = v
                            crow[m] = code_fall[s + 1, mc]
            else:
                child = opt[row_of[s + 1, p]]
                for m in range(need, slots + 1):
                    sub = child[m - y]
                    if sub < np.inf:
                        v = fwd[s - 1] + sub + w + bwd[s - 1]
                        if v < row[m]:
                            row[m] = v
                            crow[m] = 0

        # -- checkpoint a_{j-1}: Fck_s, Fn_{s+1}..Fn_{j-1}; child (j, L); then (s, j-1) by rotor.
        need_f = act[s] + fwd_tmp[s - 1]
        ftime = 0.0
        for j in range(s + 1, n + 1):
            if j == s + 1:
                ftime = fwd_nosave[s - 1]
            else:
                ftime += fwd_nosave[j - 2]
                step = act[j - 2] + act[j - 1] + fwd_tmp[j - 2]
                if step > need_f:
                    need_f = step
            if need_f > slots:
                break
            a_j = act[j - 1]
            need = max(need_f, a_j)
            if lo_rot[s, j - 1] > slots:
                continue
            left_row = rot[s, j - 1]
            for k in range(n_pend):
                p = pend[k]
                row = opt[row_of[s, p]]
                crow = choice[row_of[s, p]]
                credit = p != 0 and item_u[p] <= j
                x = item_x[p] if credit else 0
                xb = item_x[p] if p != 0 and s >= item_v[p] else 0
                w = 0.0
                if p != 0 and p // STRIDE == s - 1:
                    # The left segment (s, j-1) re-runs from a_{s-1}; B_{j..v-1} run before it.
                    w = item_h[p] - (cum_b[item_v[p] - 1] - cum_b[j - 1])
                    if w < 0.0:
                        w = 0.0
                free = p == 0 or credit
                lo_child = lo_ckpt[j] if free else lo_opt[j, p]
                if lo_child > slots:
                    continue
                start = max(need, lo_child + a_j - x, lo_rot[s, j - 1] - xb)
                if not free:
                    # The hot path (an offload pending, not credited here): no branch on inf,
                    # which propagates through the sum and never compares below a value.
                    right_row = opt[row_of[j, p]]
                    code = (VARIANTS + 1) * j
                    for m in range(start, slots + 1):
                        mb = m + xb
                        if mb > slots:
                            mb = slots
                        v = ftime + right_row[m - a_j] + w + left_row[mb]
                        if v < row[m]:
                            row[m] = v
                            crow[m] = code
                    continue
                for m in range(start, slots + 1):
                    mb = m + xb
                    if mb > slots:
                        mb = slots
                    left = left_row[mb]
                    if left == np.inf:
                        continue
                    mc = m - a_j + x
                    if mc > slots:
                        mc = slots
                    right = best_ckpt[j, mc]
                    if right < np.inf:
                        v = ftime + right + w + left
                        if v < row[m]:
                            row[m] = v
                            crow[m] = (VARIANTS + 1) * j + code_ckpt[j, mc]
        for k in range(n_pend):
            p = pend[k]
            row = opt[row_of[s, p]]
            for m in range(slots + 1):
                if row[m] < np.inf:
                    lo_opt[s, p] = m
                    break
        if s >= 2:
            first = STRIDE * (s - 1)
            _best_children(opt, row_of, lo_opt, item_u, item_h, s, first, n, slots, best_ckpt, code_ckpt, lo_ckpt)
            first += VARIANTS
            _best_children(opt, row_of, lo_opt, item_u, item_h, s, first, n, slots, best_fall, code_fall, lo_fall)
    return opt, choice, row_of
