"""Plain-Python oracle of the rotor dynamic program: the dense table, written for clarity.

The recurrence of ``NOTE [ rotor recurrence ]`` (chainoffload.solvers.rotor) evaluated as
the first, dense implementation did: every segment (s, t), every budget m, every option, the
same float expressions in the same association, ties to "F_all" then to the smallest j. The
lean kernel must reproduce ``opt`` bit for bit and ``choice`` exactly. No Numba, no trimming,
no cut: slow, so only for small chains.
"""

from __future__ import annotations

import math


def naive_rotor_table(fwd, bwd, fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots):
    """Return ``(opt, choice)`` as dicts keyed by (s, t, m) for 1 <= s <= t <= L, 0 <= m <= slots.

    Sizes are in slots; ``act`` has L + 1 entries (a_0..a_L), the others L (stage i at i - 1).
    ``opt`` is ``math.inf`` and ``choice`` -1 where the segment cannot run.
    """
    n = len(fwd)
    opt: dict[tuple[int, int, int], float] = {}
    choice: dict[tuple[int, int, int], int] = {}
    for d in range(n):
        for s in range(1, n - d + 1):
            t = s + d
            g_t = int(act[t]) if t < n else 0  # g_L is made by B_L itself
            usage_b = int(saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1])
            need_a = max(g_t + int(saved[s - 1] + fwd_tmp[s - 1]), usage_b)
            for m in range(slots + 1):
                value, pick = math.inf, -1
                # F_all on s (for s == t: F_s then B_s).
                if m >= need_a:
                    if s == t:
                        value, pick = float(fwd[s - 1]) + float(bwd[s - 1]), 0
                    else:
                        sub = opt[s + 1, t, m - int(saved[s - 1])]
                        if sub < math.inf:
                            value, pick = float(fwd[s - 1]) + sub + float(bwd[s - 1]), 0
                # Checkpoint a_{j-1}: Fck_s, Fn_{s+1}..Fn_{j-1}, then (j, t), then (s, j-1).
                need = g_t + int(act[s] + fwd_tmp[s - 1]) if s < t else 0
                ftime = 0.0
                for j in range(s + 1, t + 1):
                    if j == s + 1:
                        ftime = float(fwd_nosave[s - 1])
                    else:
                        ftime += float(fwd_nosave[j - 2])
                        need = max(need, g_t + int(act[j - 2] + act[j - 1] + fwd_tmp[j - 2]))
                    if need > slots:
                        break
                    a = int(act[j - 1])
                    if m < need or m < a:
                        continue
                    right = opt[j, t, m - a]
                    if right == math.inf:
                        continue
                    v = ftime + right + opt[s, j - 1, m]
                    if v < value:
                        value, pick = v, j
                opt[s, t, m] = value
                choice[s, t, m] = pick
    return opt, choice


def naive_bound_table(fwd_nosave, act, saved, fwd_tmp, bwd_tmp, slots, scale, cap):
    """The lower bounds of ``NOTE [ rotor by bounds ]``, as a dict like :func:`naive_rotor_table`'s ``opt``.

    The same options and memory checks, over overheads in units of 1 / ``scale``: F_all adds
    nothing, "checkpoint a_{j-1}" adds floor(ftime * scale); every entry is capped at ``cap``.
    """
    n = len(fwd_nosave)
    opt: dict[tuple[int, int, int], float] = {}
    for d in range(n):
        for s in range(1, n - d + 1):
            t = s + d
            g_t = int(act[t]) if t < n else 0
            usage_b = int(saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1])
            need_a = max(g_t + int(saved[s - 1] + fwd_tmp[s - 1]), usage_b)
            for m in range(slots + 1):
                value = math.inf
                if m >= need_a:
                    value = 0 if s == t else opt[s + 1, t, m - int(saved[s - 1])]
                need = g_t + int(act[s] + fwd_tmp[s - 1]) if s < t else 0
                ftime = 0.0
                for j in range(s + 1, t + 1):
                    if j == s + 1:
                        ftime = float(fwd_nosave[s - 1])
                    else:
                        ftime += float(fwd_nosave[j - 2])
                        need = max(need, g_t + int(act[j - 2] + act[j - 1] + fwd_tmp[j - 2]))
                    if need > slots:
                        break
                    a = int(act[j - 1])
                    if m < need or m < a:
                        continue
                    right, left = opt[j, t, m - a], opt[s, j - 1, m]
                    if right == math.inf or left == math.inf:
                        continue
                    value = min(value, min(math.floor(ftime * scale), cap) + right + left)
                opt[s, t, m] = min(value, cap) if value < math.inf else math.inf
    return opt
