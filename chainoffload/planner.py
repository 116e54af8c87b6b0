"""The transfer planner: given which units to offload, place every trigger.

Every heuristic and the baselines that benefit go through :func:`plan_transfers`, so that a
comparison between methods compares their choice of units, not their timing code.
"""

from __future__ import annotations

from typing import Iterable

from .chain import Chain
from .platform import Platform
from .schedule import Schedule, Transfer, fixed_order

__all__ = ["plan_transfers", "eager_plan"]


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
        A fixed-order schedule with one offload and one prefetch per unit. It is not
        guaranteed feasible: callers simulate it.
    """
    return eager_plan(chain, units)
