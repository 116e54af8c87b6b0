"""The joint rematerialization + offloading dynamic program, in slots.

Private; :mod:`chainoffload.solvers.joint` rounds sizes to slots, calls :func:`joint_table`
and rebuilds the schedule with its transfers. The recurrence is written in
``NOTE [ joint recurrence ]`` in that module.
"""

from __future__ import annotations

import numpy as np

from .config import njit


@njit
def joint_table(
    fwd,
    bwd,
    fwd_nosave,
    act,
    saved,
    fwd_tmp,
    bwd_tmp,
    act_down,
    saved_down,
    d_act,
    d_saved,
    h_act,
    h_saved,
    slots,
):
    """Fill the joint table for every segment, input state and budget 0..``slots``.

    Sizes in slots (``*_down`` rounded down, the others up); ``d_*`` / ``h_*`` are offload /
    prefetch times of a lone a_i (index i) and of a whole unit i (index i - 1), ``inf``
    when the link cannot carry them. Returns ``(opt, choice)`` of shape (3, L + 2, L + 2,
    slots + 1), indexed ``[f, s, t, m]``: f = 0 the input a_{s-1} stays, f = 1 the input is
    unit s-1 kept whole and is offloaded during the segment, f = 2 the input is a lone
    a_{s-1} and is offloaded. ``choice`` is ``4 * j + f_child`` (j = 0: F_all on s, else
    checkpoint a_{j-1}); -1 where the segment cannot run.
    """
    n = fwd.shape[0]
    opt = np.full((3, n + 2, n + 2, slots + 1), np.inf)
    choice = np.full((3, n + 2, n + 2, slots + 1), -1, dtype=np.int32)
    for d in range(n):
        for s in range(1, n - d + 1):
            t = s + d
            g_t = act[t] if t < n else 0
            usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]
            need_a = max(g_t + saved[s - 1] + fwd_tmp[s - 1], usage_b)
            if d == 0:
                # One stage: F_s reads a_{s-1}, B_s reads it right after; nothing to offload.
                for m in range(max(need_a, 0), slots + 1):
                    opt[0, s, t, m] = fwd[s - 1] + bwd[s - 1]
                    choice[0, s, t, m] = 0
                continue
            for f in range(3):
                if f > 0 and s == 1:
                    continue  # a_0 is never offloaded
                if f == 0:
                    x_dn = 0
                    x_d = 0.0
                    x_h = 0.0
                elif f == 1:
                    x_dn = saved_down[s - 2]
                    x_d = d_saved[s - 2]
                    x_h = h_saved[s - 2]
                else:
                    x_dn = act_down[s - 1]
                    x_d = d_act[s - 1]
                    x_h = h_act[s - 1]
                if f > 0 and (x_d == np.inf or x_h == np.inf):
                    continue
                # -- F_all on s; with f > 0 the input leaves during s+1..t and is back for B_s.
                need = need_a
                if f > 0:
                    usage_b1 = saved[s] + act[s + 1] + act[s] + bwd_tmp[s]
                    need = max(need, saved[s - 1] + usage_b1)
                    wait_o = max(0.0, x_d - fwd[s - 1])
                    wait_p = max(0.0, x_h - bwd[s])
                else:
                    wait_o = 0.0
                    wait_p = 0.0
                for fc in range(2):
                    for m in range(need, slots + 1):
                        mb = m - saved[s - 1] + x_dn
                        if mb > slots:
                            mb = slots
                        sub = opt[fc, s + 1, t, mb]
                        if sub == np.inf:
                            continue
                        v = fwd[s - 1] + wait_o + sub + wait_p + bwd[s - 1]
                        if v < opt[f, s, t, m]:
                            opt[f, s, t, m] = v
                            choice[f, s, t, m] = fc
                # -- checkpoint a_{j-1}; with f > 0 the input leaves during j..t, back for s..j-1.
                need_f = g_t + act[s] + fwd_tmp[s - 1]
                ftime = 0.0
                for j in range(s + 1, t + 1):
                    if j == s + 1:
                        ftime = fwd_nosave[s - 1]
                    else:
                        ftime += fwd_nosave[j - 2]
                        step = g_t + act[j - 2] + act[j - 1] + fwd_tmp[j - 2]
                        if step > need_f:
                            need_f = step
                    if need_f > slots:
                        break
                    a_j = act[j - 1]
                    need = max(need_f, a_j)
                    if f > 0:
                        usage_bj = saved[j - 1] + act[j] + act[j - 1] + bwd_tmp[j - 1]
                        need = max(need, a_j + usage_bj)
                        wait_o = max(0.0, x_d - ftime)
                        wait_p = max(0.0, x_h - bwd[j - 1])
                    for fr in range(0, 3, 2):
                        if fr == 2 and (d_act[j - 1] == np.inf or h_act[j - 1] == np.inf):
                            continue
                        for m in range(need, slots + 1):
                            mr = m - a_j + x_dn
                            if mr > slots:
                                mr = slots
                            right = opt[fr, j, t, mr]
                            if right == np.inf:
                                continue
                            v = ftime + wait_o + right + wait_p + opt[0, s, j - 1, m]
                            if v < opt[f, s, t, m]:
                                opt[f, s, t, m] = v
                                choice[f, s, t, m] = 4 * j + fr
    return opt, choice
