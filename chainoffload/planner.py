"""The transfer planner: given which units to offload, place every trigger.

Every heuristic and the baselines that benefit go through :func:`plan_transfers`, so that a
comparison between methods compares their choice of units, not their timing code.

NOTE [ transfer planner ]
-------------------------
Given the set U of units to offload, the planner fixes every trigger in one forward and one
backward sweep (:func:`chainoffload._kernels.planner.plan_kernel`), replaying the simulator's
timing rules as it goes:

* **Offloads** are triggered at the end of F_i, the earliest instant the data exists, so the
  D2H channel serves U in stage order. Before F_k starts, the planner frees every GPU copy
  whose offload has already ended (and whose F_{i+1} is over). If F_k's allocation still does
  not fit, F_k waits (``before``) for the fewest further offloads, in channel order, that make
  it fit; unit k - 1 cannot help, since F_k reads a_{k-1}. Waiting is the only lever the
  forward has: compute never idles unless a named transfer makes it.
* **Prefetches** are issued in decreasing stage order (the order the backward needs them),
  each at the earliest boundary (end of F_L, then the end of each B_{j+1}) from which the
  unit fits in every backward phase up to B_u, with memory counted from the trigger (an
  upper bound of when the copy really allocates). A unit that fits nowhere earlier is issued
  at the last boundary before B_{u+1}, which reads it. GPU copies whose offload may still be
  in flight when the backward begins are counted present in each B_j that could start before
  they are freed (start times are bounded below by running the backward with no waits); the
  first B_j that cannot run beside such a copy waits (``before``) for its offload.
* Memory checks use the same accounting as the simulator, so the plan is feasible whenever
  every check passes; the caller still simulates it (the simulator is the only judge).

The sweeps are O(L + |U| L) in the worst case and deterministic: the same inputs give the
same schedule.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ._kernels.planner import plan_kernel
from .chain import Chain
from .platform import Platform
from .schedule import Schedule, Transfer, fixed_order
from .simulate import Timeline, simulate

__all__ = ["plan_transfers", "plan_and_simulate", "eager_plan"]


def eager_plan(chain: Chain, units: Iterable[int]) -> Schedule:
    """The vDNN-style timing: O_i at the end of F_i, P_i at the start of B_{i+2}.

    Each unit is copied out as soon as it is made and copied back one stage ahead of the
    backward that first reads it (B_{i+1} reads a_i); units L - 1 and L, which B_L reads, are
    prefetched at the end of F_L. Nothing waits explicitly.
    """
    length = chain.length
    chosen = sorted({int(u) for u in units})
    for u in chosen:
        if not 1 <= u <= length:
            raise ValueError(f"units: {u} is not a stage in 1..{length}")
    compute = fixed_order(length)
    pos = {op: k for k, op in enumerate(compute)}
    offloads, prefetches = [], []
    for u in chosen:
        offloads.append(Transfer("offload", u, pos[("F", u)], "end"))
        if u + 2 <= length:
            prefetches.append(Transfer("prefetch", u, pos[("B", u + 2)], "start"))
        else:
            prefetches.append(Transfer("prefetch", u, pos[("F", length)], "end"))
    return Schedule(compute, tuple(offloads + prefetches))


def plan_transfers(chain: Chain, platform: Platform, units: Iterable[int]) -> Schedule:
    """Place the offload and prefetch triggers for ``units`` (stages, 1-based).

    Parameters
    ----------
    chain, platform
        The instance; the platform's memory limit guides where compute must wait.
    units
        The units to offload.

    Returns
    -------
    Schedule
        A fixed-order schedule with one offload and one prefetch per unit, placed as NOTE
        [ transfer planner ] describes. It is not guaranteed feasible (the units may not be
        enough to fit the limit): callers simulate it.

    Raises
    ------
    ValueError
        A unit outside 1..L, or units to move over a link of bandwidth 0.
    """
    return plan_and_simulate(chain, platform, units)[0]


def plan_and_simulate(chain: Chain, platform: Platform, units: Iterable[int]) -> tuple[Schedule, Timeline]:
    """:func:`plan_transfers` together with the simulator's timeline of the plan it returns.

    The planner simulates its candidates anyway; searches that score many unit sets use this
    to avoid replaying the chosen plan a second time.
    """
    length = chain.length
    chosen = sorted({int(u) for u in units})
    for u in chosen:
        if not 1 <= u <= length:
            raise ValueError(f"units: {u} is not a stage in 1..{length}")
    if not chosen:
        schedule = Schedule.keep_all(length)
        return schedule, simulate(chain, platform, schedule)
    if not platform.can_transfer:
        raise ValueError(
            f"units: cannot offload {chosen} over a link of bandwidth "
            f"{platform.bandwidth_d2h} B/s (D2H) / {platform.bandwidth_h2d} B/s (H2D)"
        )
    offload = np.zeros(length + 1, dtype=np.int64)
    offload[chosen] = 1
    saved = chain.saved
    # Platform.d2h_time / h2d_time, element-wise (the same float operations).
    d_time = platform.latency + saved / platform.bandwidth_d2h
    h_time = platform.latency + saved / platform.bandwidth_h2d
    best: tuple[tuple[int, float, int], Schedule, Timeline] | None = None
    candidates = [_kernel_plan(chain, platform, chosen, offload, d_time, h_time, opt) for opt in (False, True)]
    candidates.append(eager_plan(chain, chosen))
    for schedule in candidates:
        timeline = simulate(chain, platform, schedule)
        # Feasible first, then the shorter makespan, then the lower peak (a hint for repairs).
        key = (0 if timeline.feasible else 1, timeline.makespan if timeline.feasible else 0.0, timeline.peak_memory)
        if best is None or key < best[0]:
            best = (key, schedule, timeline)
    return best[1], best[2]


def _kernel_plan(
    chain: Chain,
    platform: Platform,
    chosen: list[int],
    offload: np.ndarray,
    d_time: np.ndarray,
    h_time: np.ndarray,
    optimistic: bool,
) -> Schedule:
    off_before, pre_op, _fits, _makespan = plan_kernel(
        chain.fwd,
        chain.bwd,
        chain.act,
        chain.saved,
        chain.fwd_tmp,
        chain.bwd_tmp,
        platform.memory,
        d_time,
        h_time,
        platform.duplex,
        offload,
        optimistic,
    )
    offloads = [
        Transfer("offload", u, u - 1, "end", int(off_before[u]) if off_before[u] >= 0 else None) for u in chosen
    ]
    # Decreasing stage order within one trigger: the H2D queue serves them in need order.
    prefetches = [Transfer("prefetch", u, int(pre_op[u]), "end") for u in reversed(chosen)]
    prefetches.sort(key=lambda t: t.op)
    return Schedule(fixed_order(chain.length), tuple(offloads + prefetches))
