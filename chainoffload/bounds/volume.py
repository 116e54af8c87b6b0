"""The closed-form volume bound (``NOTE [ volume lower bound ]``), O(L)."""

from __future__ import annotations

import math

import numpy as np

from ..chain import Chain
from ..platform import Platform
from ._common import _check_pair
from .floor import keep_all_start_memory

__all__ = ["volume_lower_bound"]

# NOTE [ volume lower bound ]
# ----------------------------
# A closed-form bound in O(L), the cheap rung of the bound ladder (``chainoffload.bounds.ladder``,
# ``NOTE [ bound ladder ]``). Ops k = 0..n-1 of the fixed order, dur_k, keepall_k and S_k as in
# ``NOTE [ fluid LP lower bound ]``; e_k = keepall_k - memory. Take a schedule the simulator
# accepts and an op k with dur_k > 0 and e_k > 0. By (5) of that note, memory at op k's
# allocation is keepall_k - f_k + P_k + (unit L's adjustment, >= 0), so f_k - P_k >= e_k: the
# units (<= L-1) whose moved part (b_i bytes, NOTE [ what a unit moves ]) was freed before op
# k's allocation and whose prefetch had not allocated by then hold at least e_k bytes.
#  (a) Each of those frees came after its offload ended, and every offload starts after F_1
#      ends (O_i after F_i): at least e_k bytes crossed the D2H channel, one transfer at a time,
#      in [fwd_1, S_k]. So S_k >= fwd_1 + latency + e_k / bw_d2h, and S_k >= sum_{j<k} dur_j.
#  (b) Each of those prefetches starts at or after S_k and ends before B_{j+1} of its unit j
#      starts, so by the start of B_2 at the latest (j >= 1): for op k before B_2, at least e_k
#      bytes cross the H2D channel in [S_k, S_{B_2}], and S_{B_2} >= S_k + latency + e_k /
#      bw_h2d as well as S_k + the ops k..B_3 in between.
# So the makespan is at least S_k + sum_{j>=k} dur_j, and (for k before B_2) S_k + max(latency +
# e_k / bw_h2d, sum of dur_j from k to B_3) + bwd_2 + bwd_1. When some e_k > 0 and nothing can
# move (a bandwidth of 0, or L = 1), no schedule fits: the bound is inf. (a) and (b) use
# disjoint intervals, so they hold on a half-duplex link too. The LP imposes (a) and (b) among
# its rows, but the LP is solved only when the ladder can afford it.


def volume_lower_bound(chain: Chain, platform: Platform) -> float:
    """A closed-form lower bound on the makespan, in O(L) (``NOTE [ volume lower bound ]``).

    What must be offloaded before each op that would not fit with everything kept, and
    prefetched again before the backward needs it, at the link's bandwidth.

    Returns
    -------
    float
        Seconds, at least ``chain.compute_time``; ``inf`` when some op cannot fit and nothing
        can move.
    """
    _check_pair(chain, platform, "volume_lower_bound")
    length = chain.length
    n = 2 * length
    dur = np.concatenate([chain.fwd, chain.bwd[::-1]]).astype(np.float64)
    compute = chain.compute_time
    excess = (keep_all_start_memory(chain) - int(platform.memory)).astype(np.float64)
    check = (dur > 0) & (excess > 0)
    if not np.any(check):
        return compute
    if length < 2 or not platform.can_transfer:
        return math.inf
    prefix = np.concatenate([[0.0], np.cumsum(dur)[:-1]])  # sum_{j<k} dur_j
    suffix = compute - prefix  # sum_{j>=k} dur_j
    lat = platform.latency
    d2h = excess / platform.bandwidth_d2h if math.isfinite(platform.bandwidth_d2h) else np.zeros(n)
    h2d = excess / platform.bandwidth_h2d if math.isfinite(platform.bandwidth_h2d) else np.zeros(n)
    start = np.maximum(prefix, float(chain.fwd[0]) + lat + d2h)
    best = np.where(check, start + suffix, 0.0)
    b2 = n - 2  # op index of B_2
    tail = float(chain.bwd[1] + chain.bwd[0])
    between = np.maximum(suffix - suffix[b2], 0.0)  # ops k..B_3, for k < b2
    back = start + np.maximum(lat + h2d, between) + tail
    early = check & (np.arange(n) < b2)
    best = np.maximum(best, np.where(early, back, 0.0))
    return max(compute, float(best.max()))


