"""Baselines users know: keep-all, offload-all (vDNN), first-k (TransformerEngine), largest-first.

Each goes through the shared transfer planner and the simulator, so their makespans are
comparable with every other method's. Each takes ``keep=``: units that must stay resident are
left out of the sets it tries.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ._search import Evaluator

__all__ = ["keep_all", "offload_all", "first_k", "largest_first"]


def _offloadable(chain: Chain, platform: Platform, keep: Iterable[int] = ()) -> list[int]:
    # Unit L is read by B_L right after F_L: offloading it frees nothing, so baselines skip it.
    from ._options import check_keep

    kept = check_keep(chain, keep)
    if not platform.can_transfer:
        return []
    return [u for u in range(1, chain.length) if u not in kept]


def _first_fit(
    method: str, chain: Chain, platform: Platform, order: Sequence[int], time_limit: float | None, t0: float, scan: bool = False
) -> Result:
    """The shortest prefix of ``order`` that the simulator accepts, by bisection.

    Prefixes are nested and growing (offload more of the same order), so fitting is monotone
    in their length as far as memory goes; bisection (:meth:`Evaluator.prefixes`) finds one
    that fits whose predecessor does not, in O(log L) plans instead of L. Past ``time_limit``
    it stops with the fastest prefix seen to fit (``feasible``, ``info["stopped"] == "time"``;
    a longer prefix than the bisection would end with), or ``timeout`` if none fitted by then.
    ``scan``: when the whole order does not fit, try shorter prefixes (NOTE [ prefixes that fit
    below one that does not ] in ``_search``).
    """
    deadline = t0 + time_limit if time_limit is not None else math.inf
    search = Evaluator(chain, platform, deadline=deadline)
    found = search.prefixes(list(order), method, scan=scan)
    cand, info = None, {}
    if found is not None:
        cand = search.units(order[:found])
    elif search.stopped == "time" and search.best is not None:
        # Cut short with a prefix that fits in hand (the whole order, or a bisection step):
        # the best schedule found so far, not the smallest k.
        cand, info = search.best, {"stopped": "time"}
    if cand is not None:
        return Result(
            method,
            Status.FEASIBLE,
            cand.schedule(),
            makespan=cand.makespan,
            runtime=time.perf_counter() - t0,
            info={"units": list(cand.units), "tried": search.evals, **info},
        )
    if search.stopped == "time":
        return Result(
            method,
            Status.TIMEOUT,
            None,
            runtime=time.perf_counter() - t0,
            info={"tried": search.evals, "stopped": "time"},
            message=search.timeout_message(method, "a set", time_limit),
        )
    over = [c.peak for c in search.cache.values() if c.rule == 1]
    return Result(
        method,
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        min_memory=min(over) if over else None,
        info={"tried": search.evals},
        message=f"{method}: no offload set it tries fits in {platform.memory} B",
    )


def keep_all(chain: Chain, platform: Platform, *, keep: Iterable[int] = (), time_limit: float | None = None) -> Result:
    """No offload. Feasible (and optimal) exactly when every activation fits at once.

    ``keep`` (units that must stay resident) is accepted for the common call shape and
    checked; keep-all keeps everything anyway. ``time_limit`` (seconds) is accepted too: one
    simulation never needs it.
    """
    t0 = time.perf_counter()
    _offloadable(chain, platform, keep)
    return _first_fit("keep-all", chain, platform, [], time_limit, t0)


def offload_all(chain: Chain, platform: Platform, *, keep: Iterable[int] = (), time_limit: float | None = None) -> Result:
    """vDNN: offload every unit 1..L-1 not in ``keep`` as soon as it is made, prefetch one stage ahead."""
    t0 = time.perf_counter()
    units = _offloadable(chain, platform, keep)
    deadline = t0 + time_limit if time_limit is not None else math.inf
    search = Evaluator(chain, platform, deadline=deadline)
    if not search.fits(len(units)):  # NOTE [ clock ]: its one plan and schedule would not end in time
        return Result(
            "offload-all",
            Status.TIMEOUT,
            None,
            runtime=time.perf_counter() - t0,
            info={"tried": 0, "stopped": "time"},
            message=search.timeout_message("offload-all", "a plan", time_limit),
        )
    cand = search.units(units)
    if cand.feasible:
        return Result(
            "offload-all",
            Status.FEASIBLE,
            cand.schedule(),
            makespan=cand.makespan,
            runtime=time.perf_counter() - t0,
            info={"units": list(cand.units), "tried": 1},
        )
    return Result(
        "offload-all",
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        min_memory=cand.peak if cand.rule == 1 else None,
        info={"tried": 1},
        message=f"offload-all: no offload set it tries fits in {platform.memory} B",
    )


def first_k(chain: Chain, platform: Platform, *, keep: Iterable[int] = (), time_limit: float | None = None) -> Result:
    """TransformerEngine: offload the first k units not in ``keep``, smallest k that fits (bisection on k).

    Stops at ``time_limit`` seconds (status ``timeout`` if no k that fits was found by then).
    """
    t0 = time.perf_counter()
    return _first_fit("first-k", chain, platform, _offloadable(chain, platform, keep), time_limit, t0, scan=True)


def largest_first(chain: Chain, platform: Platform, *, keep: Iterable[int] = (), time_limit: float | None = None) -> Result:
    """Offload the largest units not in ``keep`` (by saved bytes; ties: earlier stage) until it fits (bisection on their number).

    Stops at ``time_limit`` seconds (status ``timeout`` if no set that fits was found by then).
    """
    t0 = time.perf_counter()
    units = sorted(_offloadable(chain, platform, keep), key=lambda u: (-int(chain.saved[u - 1]), u))
    return _first_fit("largest-first", chain, platform, units, time_limit, t0)
