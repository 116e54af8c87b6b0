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

The sweeps take O(L + |U| sqrt(L)) (``NOTE [ slack in blocks ]`` in the kernel) and are
deterministic: the same inputs give the same schedule.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ._kernels import lazy
from .chain import Chain
from .platform import Platform
from .schedule import Schedule, Transfer, fixed_order
from .simulate import Timeline, simulate

_kplan = lazy("planner")  # imports Numba on first use only

__all__ = ["plan_transfers", "plan_and_simulate", "eager_plan", "plan_arrays", "schedule_from_arrays"]


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

    The candidate plans are scored on arrays (``chainoffload.solvers._search``); only the one
    chosen becomes a :class:`Schedule` and goes through :func:`simulate`.
    """
    from .solvers._search import Evaluator

    candidate = Evaluator(chain, platform).units(units)
    schedule = candidate.schedule()
    return schedule, simulate(chain, platform, schedule)


def check_units(chain: Chain, platform: Platform, units: Iterable[int]) -> np.ndarray:
    """``units`` as a sorted int64 array of distinct stages; raises ``ValueError`` like :func:`plan_transfers`."""
    chosen = np.unique(np.fromiter((int(u) for u in units), dtype=np.int64))
    if chosen.shape[0] and (chosen[0] < 1 or chosen[-1] > chain.length):
        bad = int(chosen[0]) if chosen[0] < 1 else int(chosen[-1])
        raise ValueError(f"units: {bad} is not a stage in 1..{chain.length}")
    if chosen.shape[0] and not platform.can_transfer:
        raise ValueError(
            f"units: cannot offload {chosen.tolist()} over a link of bandwidth "
            f"{platform.bandwidth_d2h} B/s (D2H) / {platform.bandwidth_h2d} B/s (H2D)"
        )
    return chosen


def plan_arrays(chain: Chain, platform: Platform, chosen: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """The planner's candidate plans for the sorted units ``chosen`` as transfer arrays.

    Returns the safe sweep, the optimistic sweep and the eager timing, in that order (ties go
    to the first), each ``(kind, unit, op, at, before)`` int64 arrays as
    :meth:`Schedule.arrays` encodes transfers. Nothing is validated or simulated here.
    """
    length = chain.length
    offload = np.zeros(length + 1, dtype=np.int64)
    offload[chosen] = 1
    saved = chain.saved
    # Platform.d2h_time / h2d_time, element-wise (the same float operations).
    d_time = platform.latency + saved / platform.bandwidth_d2h
    h_time = platform.latency + saved / platform.bandwidth_h2d
    plans = [_kernel_arrays(chain, platform, chosen, offload, d_time, h_time, opt) for opt in (False, True)]
    plans.append(eager_arrays(length, chosen))
    return plans


def eager_arrays(length: int, chosen: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`eager_plan`'s transfers as arrays (``chosen``: sorted stages)."""
    m = chosen.shape[0]
    kind = np.concatenate([np.zeros(m, dtype=np.int64), np.ones(m, dtype=np.int64)])
    unit = np.concatenate([chosen, chosen])
    # P_u at the start of B_{u+2} (op 2L - u - 2); units L-1 and L at the end of F_L (op L-1).
    pre_op = np.where(chosen + 2 <= length, 2 * length - chosen - 2, length - 1)
    op = np.concatenate([chosen - 1, pre_op])
    at = np.concatenate([np.ones(m, dtype=np.int64), np.where(chosen + 2 <= length, 0, 1)])
    before = np.full(2 * m, -1, dtype=np.int64)
    return kind, unit, op.astype(np.int64), at.astype(np.int64), before


def _kernel_arrays(
    chain: Chain,
    platform: Platform,
    chosen: np.ndarray,
    offload: np.ndarray,
    d_time: np.ndarray,
    h_time: np.ndarray,
    optimistic: bool,
) -> tuple[np.ndarray, ...]:
    off_before, pre_op, _fits, _makespan = _kplan.plan_kernel(
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
    m = chosen.shape[0]
    # Decreasing stage order within one trigger: the H2D queue serves them in need order.
    down = chosen[::-1]
    order = np.argsort(pre_op[down], kind="stable")
    pre_units = down[order]
    kind = np.concatenate([np.zeros(m, dtype=np.int64), np.ones(m, dtype=np.int64)])
    unit = np.concatenate([chosen, pre_units])
    op = np.concatenate([chosen - 1, pre_op[pre_units]])
    at = np.ones(2 * m, dtype=np.int64)
    before = np.concatenate([off_before[chosen], np.full(m, -1, dtype=np.int64)])
    return kind, unit, op, at, before


def schedule_from_arrays(length: int, transfers: tuple[np.ndarray, ...]) -> Schedule:
    """A fixed-order :class:`Schedule` from ``(kind, unit, op, at, before)`` transfer arrays."""
    kind, unit, op, at, before = (a.tolist() for a in transfers)
    out = tuple(
        Transfer(_KIND[k], u, o, _AT[a], None if b < 0 else b) for k, u, o, a, b in zip(kind, unit, op, at, before)
    )
    return Schedule(fixed_order(length), out)


_KIND = ("offload", "prefetch")
_AT = ("start", "end")
