"""The bound ladder: the lower bound :func:`chainoffload.solve` attaches, within a time budget.

NOTE [ bound ladder ]
---------------------
Every pure-offloading result carries a proven lower bound on the makespan. Bounds differ in
strength and cost by orders of magnitude (the fluid LP takes ~2 s of CPU at L = 1000 and ~60 s
at L = 10,000), so :func:`chainoffload.solve` climbs a ladder of rungs, cheapest first, and
keeps the largest value reached:

1. ``trivial``: sum(fwd) + sum(bwd), free;
2. ``volume``: :func:`chainoffload.bounds.volume_lower_bound`, closed form, O(L);
3. ``fluid-lp``: :func:`chainoffload.bounds.lower_bound`, the fluid LP, when its estimated time
   (:func:`fluid_lp_cost`) fits what is left of the budget, or when a method already solved it
   for this chain and platform (it is cached: free then);
4. ``unit-milp``: :func:`chainoffload.bounds.stronger_bound`, the whole-unit relaxation solved
   by SCIP within what is left (NOTE [ unit MILP lower bound ]), when its estimated time to a
   useful bound (:func:`chainoffload.bounds.unit_milp_seconds`: ~1 s at L = 20, a few seconds at
   L = 30-40) fits; on long chains the estimate grows past any ordinary budget, and the fluid
   LP is within a few percent there anyway;
5. any rung added with :func:`add_rung`.

A rung runs only if its estimated cost fits the budget left; a rung that runs out
(``TimeoutError``) is skipped, and so is one whose solver fails (``RuntimeError``), with a note
in ``Result.info["lower_bound_note"]``. The climb stops early once the bound reaches the result's
makespan (it is then proven optimal) and is not made at all for a result without a schedule.
``Result.info["bound"]`` names the rung whose value was kept.

The budget: with a ``time_limit``, what is left of it after the method (``solve`` keeps the
method to the limit less an estimate of the judging and of the cheap rungs); without one,
``max(DEFAULT_BOUND_BUDGET, the method's runtime)``, so a bound never costs much more than the
method it qualifies unless it is cheap anyway.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

from ..chain import Chain
from ..platform import Platform

__all__ = ["Rung", "LADDER", "add_rung", "climb", "fluid_lp_cost", "DEFAULT_BOUND_BUDGET"]

#: Seconds the ladder may spend when ``solve`` has no time limit (see ``NOTE [ bound ladder ]``).
DEFAULT_BOUND_BUDGET = 1.0


@dataclasses.dataclass(frozen=True)
class Rung:
    """One bound of the ladder.

    Attributes
    ----------
    name
        What ``Result.info["bound"]`` says when this rung gives the bound.
    bound
        ``bound(chain, platform, budget) -> float``: a proven lower bound on the makespan of
        every pure-offloading schedule the simulator accepts (``inf`` proves none fits),
        computed in about ``budget`` seconds; may raise ``TimeoutError``.
    cost
        ``cost(chain, platform) -> float``: the estimated seconds (0 when the answer is cached).
    """

    name: str
    bound: Callable[[Chain, Platform, float], float]
    cost: Callable[[Chain, Platform], float]


def fluid_lp_cost(stages: int) -> float:
    """Estimated seconds of one fluid LP solve with GLOP on a chain of ``stages`` stages.

    Fitted on this project's 2-core machine (CPU time: 0.14 s at L = 100, 2.0 s at 1000, 5.8 s
    at 2000: growth ~L^1.5).
    """
    return 0.05 + 2.0 * (stages / 1000.0) ** 1.5


def _trivial(chain: Chain, platform: Platform, budget: float) -> float:
    return chain.compute_time


def _volume(chain: Chain, platform: Platform, budget: float) -> float:
    from ..bounds import volume_lower_bound

    return volume_lower_bound(chain, platform)


def _fluid(chain: Chain, platform: Platform, budget: float) -> float:
    from ..bounds import lower_bound

    return lower_bound(chain, platform, time_limit=budget)


def _fluid_cost(chain: Chain, platform: Platform) -> float:
    from ..bounds import lp_cached

    return 0.0 if lp_cached(chain, platform) else fluid_lp_cost(chain.length)


def _unit_milp(chain: Chain, platform: Platform, budget: float) -> float:
    from ..bounds import stronger_bound

    # With no time left only a cached answer comes back (the fluid LP's and the MILP's).
    return stronger_bound(chain, platform, time_limit=max(budget, 1e-3)).value


def _unit_milp_cost(chain: Chain, platform: Platform) -> float:
    from ..bounds import unit_milp_seconds

    # stronger_bound solves the fluid LP first (free when the fluid-lp rung just did).
    return unit_milp_seconds(chain, platform) + _fluid_cost(chain, platform)


#: The rungs, cheapest first.
LADDER: list[Rung] = [
    Rung("trivial", _trivial, lambda chain, platform: 0.0),
    Rung("volume", _volume, lambda chain, platform: 2e-6 * chain.length),
    Rung("fluid-lp", _fluid, _fluid_cost),
    Rung("unit-milp", _unit_milp, _unit_milp_cost),
]


def add_rung(rung: Rung, *, after: str | None = None) -> None:
    """Add ``rung`` to the ladder (at the end, or right after the rung named ``after``)."""
    if any(r.name == rung.name for r in LADDER):
        raise ValueError(f"bound ladder: a rung named {rung.name!r} exists already")
    if after is None:
        LADDER.append(rung)
        return
    names = [r.name for r in LADDER]
    if after not in names:
        raise ValueError(f"bound ladder: no rung named {after!r}; rungs: {', '.join(names)}")
    LADDER.insert(names.index(after) + 1, rung)


def climb(
    chain: Chain, platform: Platform, budget: float, *, target: float = math.inf, notes: list[str] | None = None
) -> tuple[float, str, list[str]]:
    """Climb the ladder within ``budget`` seconds; stop once the bound reaches ``target``.

    A rung whose solver fails (``RuntimeError``, e.g. GLOP ending ``abnormal``) is skipped and
    the reason appended to ``notes``; one that runs out of time (``TimeoutError``) is skipped
    silently.

    Returns
    -------
    value, name, tried
        The largest bound reached, the rung that gave it, and every rung that ran.
    """
    t0 = time.perf_counter()
    value, name, tried = -math.inf, "trivial", []
    for rung in LADDER:
        if value >= target * (1 - 1e-12):
            break
        left = budget - (time.perf_counter() - t0)
        if tried and rung.cost(chain, platform) > max(left, 0.0):
            continue
        try:
            got = rung.bound(chain, platform, max(left, 0.0))
        except TimeoutError:
            continue
        except RuntimeError as exc:
            if notes is not None:
                notes.append(f"the {rung.name} bound is not available ({' '.join(str(exc).split())})")
            continue
        tried.append(rung.name)
        if got > value:
            value, name = got, rung.name
    return value, name, tried
