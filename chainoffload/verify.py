"""Verify a schedule: feasibility by the simulator, optimality gap against CP-SAT.

``chainoffload verify CHAIN.json SCHEDULE.json [platform flags] [--time-limit S] [--json]``
replays the schedule in the one simulator and solves the instance with the exact method
``cpsat`` (warm-started from the schedule itself), so it says both whether the schedule keeps
to the memory limit and how far it is from the optimum, or from CP-SAT's proven bound when
the time limit runs out first.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .chain import Chain
from .platform import Platform
from .schedule import Schedule
from .simulate import simulate

__all__ = ["verify"]


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def verify(chain: Chain, platform: Platform, schedule: Schedule, *, time_limit: float = 60.0, workers: int | None = None) -> dict[str, Any]:
    """Check ``schedule`` by the simulator and measure its gap to the optimum by CP-SAT.

    Parameters
    ----------
    chain, platform, schedule
        The instance and the schedule to check.
    time_limit
        Seconds CP-SAT may search.
    workers
        CP-SAT search workers; default: every core this process may use.

    Returns
    -------
    dict
        Plain JSON-ready data: ``feasible``, ``makespan``, ``peak_memory``, ``offloaded_bytes``,
        ``violation`` (the simulator's verdict); ``cpsat_status`` (optimal, feasible,
        infeasible, timeout), ``optimum`` (makespan of the best schedule CP-SAT found, ``None``
        if none), ``lower_bound`` (the problem's bound,
        :func:`chainoffload.bounds.problem_bound`: the figure ``solve``, ``plot`` and
        ``tradeoff`` report, which does not depend on the machine), ``lower_bound_rung`` (its
        rung), ``cpsat_bound`` (CP-SAT's own proven bound, which may depend on the machine when
        the time limit stops it); ``gap`` = makespan / reference - 1 with ``gap_reference``
        ``"optimum"`` when CP-SAT proved optimality, else ``"lower_bound"`` or ``"cpsat_bound"``,
        the larger of the two (``None`` for an infeasible schedule), and ``tolerance``,
        the CP-SAT time scale's rounding in seconds (a gap within 3 * tolerance / makespan of
        0 means optimal). Infinite values are ``None``.

    Raises
    ------
    ScheduleError, PlatformError
        A malformed schedule, a transfer over a link of bandwidth 0, or memory below the
        chain's stage floor.
    """
    from .bounds import problem_bound
    from .solvers import check_memory_floor
    from .solvers.cpsat import cpsat

    timeline = simulate(chain, platform, schedule)
    check_memory_floor(chain, platform)
    exact = cpsat(chain, platform, time_limit=time_limit, workers=workers, hint=schedule if timeline.feasible else True)
    optimum = exact.makespan if exact.feasible else None
    cp_bound = exact.lower_bound
    # The problem's bound, as solve and plot compute it for this schedule.
    found = problem_bound(chain, platform, target=timeline.makespan if timeline.feasible else math.inf)
    lb = found.value
    if timeline.feasible and math.isfinite(timeline.makespan):
        lb = min(lb, timeline.makespan)  # as solve's judge: float noise never puts it above
    proven = exact.status.value == "optimal"
    gap = None
    reference = None
    if timeline.feasible:
        if proven and optimum is not None:
            # The better of the two: CP-SAT's optimum is optimal only within its tolerance.
            ref = min(optimum, timeline.makespan)
            reference = "optimum"
        else:
            # The larger proven bound (CP-SAT's may beat the ladder's when it ran long enough).
            ref, reference = max((lb, "lower_bound"), (cp_bound if math.isfinite(cp_bound) else -math.inf, "cpsat_bound"))
            if not (math.isfinite(ref) and ref > 0):
                ref, reference = None, None
        if ref is not None and ref > 0:
            gap = timeline.makespan / ref - 1.0
    v = timeline.violation
    return {
        "feasible": timeline.feasible,
        "makespan": _num(timeline.makespan),
        "peak_memory": timeline.peak_memory,
        "offloaded_bytes": timeline.offloaded_bytes,
        "violation": None if v is None else dataclasses.asdict(v),
        "cpsat_status": exact.status.value,
        "optimum": _num(optimum),
        "lower_bound": _num(lb),
        "lower_bound_rung": found.rung,
        "cpsat_bound": _num(cp_bound),
        "gap": _num(gap),
        "gap_reference": reference,
        "tolerance": _num(exact.info.get("tolerance")),
        "cpsat_runtime": exact.runtime,
        "message": exact.message,
    }
