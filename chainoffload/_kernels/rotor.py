"""The rotor dynamic program (persistent checkpointing of a heterogeneous chain), in slots.

Private; :mod:`chainoffload.solvers.rotor` rounds sizes to slots, calls :func:`rotor_table`
and rebuilds the schedule. The recurrence and its memory terms are written in
``NOTE [ rotor recurrence ]`` in that module.
"""

from __future__ import annotations

import numpy as np

from .config import njit


@njit
def rotor_table(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots):
    """Fill the rotor table for every segment and every budget 0..``slots``.

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
            usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]
            need_a = max(g_t + saved[s - 1] + fwd_tmp[s - 1], usage_b)
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
            need = g_t + act[s] + fwd_tmp[s - 1]
            ftime = 0.0
            for j in range(s + 1, t + 1):
                if j == s + 1:
                    ftime = fwd_nosave[s - 1]
                else:
                    ftime += fwd_nosave[j - 2]
                    step = g_t + act[j - 2] + act[j - 1] + fwd_tmp[j - 2]
                    if step > need:
                        need = step
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
