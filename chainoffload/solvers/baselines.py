"""Baselines users know: keep-all, offload-all (vDNN), first-k (TransformerEngine), largest-first.

Each goes through the shared transfer planner and the simulator, so their makespans are
comparable with every other method's. Each takes ``keep=``: units that must stay resident are
left out of the sets it tries.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

from ..chain import Chain
from ..planner import plan_and_simulate
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import Timeline

__all__ = ["keep_all", "offload_all", "first_k", "largest_first"]


def _offloadable(chain: Chain, platform: Platform, keep: Iterable[int] = ()) -> list[int]:
    # Unit L is read by B_L right after F_L: offloading it frees nothing, so baselines skip it.
    from . import check_keep

    kept = check_keep(chain, keep)
    if not platform.can_transfer:
        return []
    return [u for u in range(1, chain.length) if u not in kept]


def _first_fit(method: str, chain: Chain, platform: Platform, candidates: Sequence[Sequence[int]], t0: float) -> Result:
    """The first offload set in ``candidates`` that the simulator accepts, by bisection.

    Candidates are nested and growing (offload more of the same order), so fitting is
    monotone in the index as far as memory goes; bisection finds an index that fits whose
    predecessor does not, in O(log n) plans instead of n (L = 1000 has a thousand sets).
    """
    least = math.inf
    seen: dict[int, tuple[Schedule, Timeline]] = {}

    def fits(k: int) -> bool:
        nonlocal least
        if k not in seen:
            seen[k] = plan_and_simulate(chain, platform, candidates[k])
        timeline = seen[k][1]
        if not timeline.feasible and timeline.violation.rule == "memory":
            least = min(least, timeline.peak_memory)
        return timeline.feasible

    n = len(candidates)
    found: int | None = None
    if fits(0):
        found = 0
    elif n > 1 and fits(n - 1):
        lo, hi = 0, n - 1  # fails at lo, fits at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid
        found = hi
    if found is not None:
        schedule, timeline = seen[found]
        return Result(
            method,
            Status.FEASIBLE,
            schedule,
            makespan=timeline.makespan,
            runtime=time.perf_counter() - t0,
            info={"units": list(candidates[found]), "tried": len(seen)},
        )
    return Result(
        method,
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        min_memory=None if not math.isfinite(least) else int(least),
        info={"tried": len(seen)},
        message=f"{method}: no offload set it tries fits in {platform.memory} B",
    )


def keep_all(chain: Chain, platform: Platform, *, keep: Iterable[int] = ()) -> Result:
    """No offload. Feasible (and optimal) exactly when every activation fits at once.

    ``keep`` (units that must stay resident) is accepted for the common call shape and
    checked; keep-all keeps everything anyway.
    """
    t0 = time.perf_counter()
    _offloadable(chain, platform, keep)
    return _first_fit("keep-all", chain, platform, [[]], t0)


def offload_all(chain: Chain, platform: Platform, *, keep: Iterable[int] = ()) -> Result:
    """vDNN: offload every unit 1..L-1 not in ``keep`` as soon as it is made, prefetch one stage ahead."""
    t0 = time.perf_counter()
    return _first_fit("offload-all", chain, platform, [_offloadable(chain, platform, keep)], t0)


def first_k(chain: Chain, platform: Platform, *, keep: Iterable[int] = ()) -> Result:
    """TransformerEngine: offload the first k units not in ``keep``, smallest k that fits (bisection on k)."""
    t0 = time.perf_counter()
    units = _offloadable(chain, platform, keep)
    return _first_fit("first-k", chain, platform, [units[:k] for k in range(len(units) + 1)], t0)


def largest_first(chain: Chain, platform: Platform, *, keep: Iterable[int] = ()) -> Result:
    """Offload the largest units not in ``keep`` (by saved bytes; ties: earlier stage) until it fits (bisection on their number)."""
    t0 = time.perf_counter()
    units = sorted(_offloadable(chain, platform, keep), key=lambda u: (-int(chain.saved[u - 1]), u))
    return _first_fit("largest-first", chain, platform, [sorted(units[:k]) for k in range(len(units) + 1)], t0)
