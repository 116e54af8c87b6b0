"""Resolve a compute sequence and its transfers into what the replay kernel needs.

Private. :meth:`chainoffload.Schedule.validate` checks every field (kinds, stages, indices, one
offload and one prefetch per unit, prefetch not before offload) and then calls
:func:`resolve_kernel`, which checks the sequence (rematerialization rules) and resolves it into
*instances*: one residency of a unit's data on the GPU, made by one forward op, read by later
ops, freed by one op. The fixed order F_1..F_L, B_L..B_1 is one such sequence (one instance per
unit); a rematerializing sequence has more. The rules are ``docs/model.md``'s; the replay
(:mod:`chainoffload._kernels.simulate`) never looks at op kinds for memory, only at the lists
built here.

Sizes are *size ids*, indices into the chain's size table (:func:`size_table`), so that the
resolution depends on the chain's length only and is cached per schedule:
``ACT(j) = j`` (act[j], j = 0..L), ``SAVED(j) = L + j`` (saved[j]), ``REST(j) = 2L + j``
(saved[j] - act[j], what stays of unit j when only a_j moves), ``FTMP(j) = 3L + j``,
``BTMP(j) = 4L + j``.
"""

from __future__ import annotations

import numpy as np

from .config import njit

OP_F = 0
OP_B = 1
OP_FCK = 2
OP_FN = 3

# Error codes of resolve_kernel (chainoffload.schedule turns them into messages).
ERR_NONE = 0
ERR_B_ORDER = 1  # arg: the stage expected next (0: every B already ran)
ERR_B_NOT_WHOLE = 2
ERR_INPUT_ABSENT = 3
ERR_FWD_AFTER_B = 4
ERR_NO_READER = 5
ERR_F_RESIDENT = 6
ERR_CK_RESIDENT = 7
ERR_FN_WHOLE_INPUT = 8
ERR_B_MISSING = 9  # arg: the first stage whose B never runs

# Instance kinds: what of unit i is on the GPU.
INST_ACT = 0  # only a_i (made by Fck_i / Fn_i)
INST_FULL = 1  # the whole unit (made by F_i)


def size_table(act, saved, fwd_tmp, bwd_tmp):
    """The table size ids index: act, saved, saved - act, fwd_tmp, bwd_tmp (see module doc)."""
    length = saved.shape[0]
    table = np.zeros(5 * length + 1, dtype=np.int64)
    table[: length + 1] = act
    table[length + 1 : 2 * length + 1] = saved
    table[2 * length + 1 : 3 * length + 1] = saved - act[1:]
    table[3 * length + 1 : 4 * length + 1] = fwd_tmp
    table[4 * length + 1 : 5 * length + 1] = bwd_tmp
    return table


@njit
def resolve_kernel(length, op_kind, op_stage, tr_kind, tr_unit, tr_op, tr_at, tr_before):
    """Check a sequence whose fields are valid and resolve it for :func:`replay_kernel`.

    Returns
    -------
    tuple
        ``(err, err_op, err_arg, alloc_ptr, alloc_size, free_ptr, free_size, free_src, wait_ptr,
        wait_tr, hold_ptr, hold_op, tr_event, tr_size, tr_src, tr_after, tr_order)``.
        ``err`` is ``ERR_NONE`` or the first broken rule (at op ``err_op``; the arrays are then
        empty). Per op k: ``alloc_size[alloc_ptr[k]:alloc_ptr[k+1]]`` is allocated at its start;
        ``free_size[...]`` is freed at its end, each allocated at the start of ``free_src``
        (an op k >= 0, or transfer t as ``-(t + 1)``); ``wait_tr[...]`` lists the transfers it
        waits for (explicit ``before`` first, then the prefetches of the offloaded data it
        reads or frees). Per offload t: ``hold_op[hold_ptr[t]:hold_ptr[t+1]]`` are the ops that
        read its original GPU copy, which is freed only once they have ended; ``tr_src[t]`` is
        the op that made the data it moves. Per prefetch: ``tr_after[t]`` is its offload.
        ``tr_order`` lists the transfers in trigger order (ties: list order).
    """
    n = op_kind.shape[0]
    m = tr_kind.shape[0]
    e64 = np.zeros(0, dtype=np.int64)
    empty = (e64, e64, e64, e64, e64, e64, e64, e64, e64, e64, e64, e64, e64, e64)

    # ---- the sequence: instances, what each op reads and frees
    state = np.zeros(length + 1, dtype=np.int64)  # 0 none, 1 a only, 2 whole
    cur = np.full(length + 1, -1, dtype=np.int64)
    done_b = np.zeros(length + 2, dtype=np.bool_)
    inst_unit = np.empty(n, dtype=np.int64)
    inst_kind = np.empty(n, dtype=np.int64)
    inst_prod = np.empty(n, dtype=np.int64)
    inst_free = np.full(n, -1, dtype=np.int64)
    inst_next = np.full(n, -1, dtype=np.int64)  # the next instance of the same unit
    unit_head = np.full(length + 1, -1, dtype=np.int64)
    unit_tail = np.full(length + 1, -1, dtype=np.int64)
    n_inst = 0
    # uses of op k: use_inst[2k], use_inst[2k + 1] (-1: none); use_frees: whether op k frees it
    use_inst = np.full(2 * n, -1, dtype=np.int64)
    use_frees = np.zeros(2 * n, dtype=np.bool_)
    b_op = np.full(length + 2, -1, dtype=np.int64)
    next_b = length
    for k in range(n):
        kind = op_kind[k]
        i = op_stage[k]
        if kind == OP_B:
            if i != next_b:
                return (ERR_B_ORDER, k, next_b) + empty
            if state[i] != 2:
                return (ERR_B_NOT_WHOLE, k, 0) + empty
            if i > 1 and state[i - 1] == 0:
                return (ERR_INPUT_ABSENT, k, 0) + empty
            u = cur[i]
            use_inst[2 * k] = u
            use_frees[2 * k] = True
            inst_free[u] = k
            cur[i] = -1
            state[i] = 0
            if i > 1:
                v = cur[i - 1]
                use_inst[2 * k + 1] = v
                if state[i - 1] == 1:
                    # a lone a_{i-1} has no reader once stage i is done
                    use_frees[2 * k + 1] = True
                    inst_free[v] = k
                    cur[i - 1] = -1
                    state[i - 1] = 0
            done_b[i] = True
            b_op[i] = k
            next_b -= 1
            continue
        if done_b[i]:
            return (ERR_FWD_AFTER_B, k, 0) + empty
        if kind != OP_F and i < length and done_b[i + 1]:
            return (ERR_NO_READER, k, 0) + empty
        if i > 1 and state[i - 1] == 0:
            return (ERR_INPUT_ABSENT, k, 0) + empty
        if i > 1:
            use_inst[2 * k] = cur[i - 1]
        if kind == OP_F:
            if state[i] == 2:
                return (ERR_F_RESIDENT, k, 0) + empty
            if state[i] == 1:
                # the re-run's output replaces the lone a_i, freed at the end of F_i
                u = cur[i]
                use_inst[2 * k + 1] = u
                use_frees[2 * k + 1] = True
                inst_free[u] = k
            inst_kind[n_inst] = INST_FULL
            state[i] = 2
        else:
            if state[i] != 0:
                return (ERR_CK_RESIDENT, k, 0) + empty
            if kind == OP_FN and i > 1:
                if state[i - 1] != 1:
                    return (ERR_FN_WHOLE_INPUT, k, 0) + empty
                u = cur[i - 1]
                use_frees[2 * k] = True
                inst_free[u] = k
                cur[i - 1] = -1
                state[i - 1] = 0
            inst_kind[n_inst] = INST_ACT
            state[i] = 1
        inst_unit[n_inst] = i
        inst_prod[n_inst] = k
        if unit_tail[i] >= 0:
            inst_next[unit_tail[i]] = n_inst
        else:
            unit_head[i] = n_inst
        unit_tail[i] = n_inst
        cur[i] = n_inst
        n_inst += 1
    if next_b >= 1:
        return (ERR_B_MISSING, n, next_b) + empty

    # ---- transfers: the instance each one moves, its size and trigger order
    tr_event = 2 * tr_op + tr_at
    tr_inst = np.full(m, -1, dtype=np.int64)
    tr_size = np.empty(m, dtype=np.int64)
    tr_src = np.full(m, -1, dtype=np.int64)
    tr_after = np.full(m, -1, dtype=np.int64)
    inst_off = np.full(n_inst, -1, dtype=np.int64)
    inst_pre = np.full(n_inst, -1, dtype=np.int64)
    off_of = np.full(length + 1, -1, dtype=np.int64)
    for t in range(m):
        if tr_kind[t] != 0:
            continue
        i = tr_unit[t]
        off_of[i] = t
        # the instance of unit i made by the last op of stage i that starts at or before the
        # trigger; the first one when none does (then the data is not made yet: a read violation)
        hit = unit_head[i]
        u = inst_next[hit]
        while u >= 0 and 2 * inst_prod[u] <= tr_event[t]:
            hit = u
            u = inst_next[u]
        tr_inst[t] = hit
        inst_off[hit] = t
        tr_src[t] = inst_prod[hit]
    for t in range(m):
        if tr_kind[t] == 0:
            continue
        o = off_of[tr_unit[t]]
        u = tr_inst[o]
        tr_inst[t] = u
        inst_pre[u] = t
        tr_after[t] = o
    for t in range(m):
        u = tr_inst[t]
        tr_size[t] = inst_unit[u] if inst_kind[u] == INST_ACT else length + inst_unit[u]

    # trigger order by counting sort on the event (stable: list order at one event)
    count = np.zeros(2 * n + 1, dtype=np.int64)
    for t in range(m):
        count[tr_event[t] + 1] += 1
    for q in range(2 * n):
        count[q + 1] += count[q]
    tr_order = np.empty(m, dtype=np.int64)
    for t in range(m):
        e = tr_event[t]
        tr_order[count[e]] = t
        count[e] += 1

    # first backward op at or after each op position (n: none)
    next_bwd = np.full(n + 1, n, dtype=np.int64)
    for k in range(n - 1, -1, -1):
        next_bwd[k] = k if op_kind[k] == OP_B else next_bwd[k + 1]

    # ---- per op: allocations, frees, waits; per offload: the ops holding its original copy
    alloc_ptr = np.zeros(n + 1, dtype=np.int64)
    alloc_size = np.empty(3 * n, dtype=np.int64)
    free_ptr = np.zeros(n + 1, dtype=np.int64)
    free_size = np.empty(5 * n + 1, dtype=np.int64)
    free_src = np.empty(5 * n + 1, dtype=np.int64)
    n_wait = 0
    for t in range(m):
        if tr_before[t] >= 0:
            n_wait += 1
    wait_ptr = np.zeros(n + 1, dtype=np.int64)
    wait_tr = np.empty(n_wait + 2 * n, dtype=np.int64)
    hold_cnt = np.zeros(m + 1, dtype=np.int64)
    hold_of = np.full(2 * n, -1, dtype=np.int64)  # per use: the offload whose original copy it holds
    # explicit waits, grouped by the op that waits (counting sort on `before`)
    bcount = np.zeros(n + 1, dtype=np.int64)
    for t in range(m):
        if tr_before[t] >= 0:
            bcount[tr_before[t] + 1] += 1
    for k in range(n):
        bcount[k + 1] += bcount[k]
    by_before = np.empty(n_wait, dtype=np.int64)
    bfill = bcount.copy()
    for t in range(m):
        b = tr_before[t]
        if b >= 0:
            by_before[bfill[b]] = t
            bfill[b] += 1

    na = 0
    nf = 0
    nw = 0
    for k in range(n):
        kind = op_kind[k]
        i = op_stage[k]
        if kind == OP_B:
            alloc_size[na] = i - 1  # g_{i-1}
            alloc_size[na + 1] = 4 * length + i  # bwd_tmp[i]
            na += 2
            if i == length:
                alloc_size[na] = length  # g_L, the loss gradient
                na += 1
            free_size[nf] = 4 * length + i
            free_src[nf] = k
            free_size[nf + 1] = i  # g_i, allocated by B_{i+1} (by B_L itself for i = L)
            free_src[nf + 1] = k if i == length else b_op[i + 1]
            nf += 2
            if i == 1:
                free_size[nf] = 0  # a_0, resident from time 0 to the end of B_1
                free_src[nf] = k
                nf += 1
        else:
            alloc_size[na] = i if kind != OP_F else length + i
            alloc_size[na + 1] = 3 * length + i
            na += 2
            free_size[nf] = 3 * length + i
            free_src[nf] = k
            nf += 1
        alloc_ptr[k + 1] = na
        # waits: explicit first
        for q in range(bcount[k], bcount[k + 1]):
            wait_tr[nw] = by_before[q]
            nw += 1
        for side in range(2):
            u = use_inst[2 * k + side]
            if u < 0:
                continue
            frees = use_frees[2 * k + side]
            o = inst_off[u]
            if o >= 0:
                if kind != OP_B and not frees and k < next_bwd[(tr_event[o] + 1) // 2]:
                    # a forward reader before the first backward op at or after the offload's
                    # trigger reads the original GPU copy (as F_{i+1} reads a_i while O_i runs)
                    hold_of[2 * k + side] = o
                    hold_cnt[o + 1] += 1
                else:
                    wait_tr[nw] = inst_pre[u]
                    nw += 1
            if frees:
                p = inst_pre[u]
                free_size[nf] = inst_unit[u] if inst_kind[u] == INST_ACT else length + inst_unit[u]
                free_src[nf] = -(p + 1) if p >= 0 else inst_prod[u]
                nf += 1
        free_ptr[k + 1] = nf
        wait_ptr[k + 1] = nw

    for t in range(m):
        hold_cnt[t + 1] += hold_cnt[t]
    hold_op = np.empty(hold_cnt[m], dtype=np.int64)
    hfill = hold_cnt[:m].copy()
    for q in range(2 * n):
        o = hold_of[q]
        if o >= 0:
            hold_op[hfill[o]] = q // 2
            hfill[o] += 1

    return (
        ERR_NONE,
        -1,
        0,
        alloc_ptr,
        alloc_size[:na],
        free_ptr,
        free_size[:nf],
        free_src[:nf],
        wait_ptr,
        wait_tr[:nw],
        hold_cnt,
        hold_op,
        tr_event,
        tr_size,
        tr_src,
        tr_after,
        tr_order,
    )
