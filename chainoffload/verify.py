"""Verify a schedule: feasibility by the simulator, optimality gap against CP-SAT.

``chainoffload verify CHAIN.json SCHEDULE.json [platform flags] [--time-limit S] [--json]``
replays the schedule in the one simulator and solves the instance with the exact method
``cpsat`` (warm-started from the schedule itself), so it says both whether the schedule keeps
to the memory limit and how far it is from the optimum, or from CP-SAT's proven bound when
the time limit runs out first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from .chain import Chain
from .platform import Platform
from .schedule import Schedule
from .simulate import simulate

__all__ = ["verify", "add_verify_command"]


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def verify(chain: Chain, platform: Platform, schedule: Schedule, *, time_limit: float = 60.0, workers: int = 2) -> dict[str, Any]:
    """Check ``schedule`` by the simulator and measure its gap to the optimum by CP-SAT.

    Parameters
    ----------
    chain, platform, schedule
        The instance and the schedule to check.
    time_limit
        Seconds CP-SAT may search.
    workers
        CP-SAT search workers.

    Returns
    -------
    dict
        Plain JSON-ready data: ``feasible``, ``makespan``, ``peak_memory``, ``offloaded_bytes``,
        ``violation`` (the simulator's verdict); ``cpsat_status`` (optimal, feasible,
        infeasible, timeout), ``optimum`` (makespan of the best schedule CP-SAT found, ``None``
        if none), ``lower_bound`` (the larger of CP-SAT's proven bound and :func:`chainoffload.bounds.lower_bound`, seconds); ``gap`` = makespan /
        reference - 1 with ``gap_reference`` ``"optimum"`` when CP-SAT proved optimality and
        ``"lower_bound"`` otherwise (``None`` for an infeasible schedule), and ``tolerance``,
        the CP-SAT time scale's rounding in seconds (a gap within 3 * tolerance / makespan of
        0 means optimal). Infinite values are ``None``.

    Raises
    ------
    ScheduleError, PlatformError
        A malformed schedule, a transfer over a link of bandwidth 0, or memory below the
        chain's stage floor.
    """
    from .bounds import lower_bound
    from .solvers import check_memory_floor
    from .solvers.cpsat import cpsat

    timeline = simulate(chain, platform, schedule)
    check_memory_floor(chain, platform)
    exact = cpsat(chain, platform, time_limit=time_limit, workers=workers, hint=schedule if timeline.feasible else True)
    optimum = exact.makespan if exact.feasible else None
    lb = exact.lower_bound
    if math.isfinite(lb):
        # The problem's own bound (sum(fwd) + sum(bwd), fluid LP) may beat CP-SAT's at a timeout.
        lb = max(lb, lower_bound(chain, platform))
    proven = exact.status.value == "optimal"
    gap = None
    reference = None
    if timeline.feasible:
        if proven and optimum is not None:
            # The better of the two: CP-SAT's optimum is optimal only within its tolerance.
            ref = min(optimum, timeline.makespan)
            reference = "optimum"
        else:
            ref = lb if math.isfinite(lb) else None
            reference = "lower_bound" if ref is not None else None
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
        "gap": _num(gap),
        "gap_reference": reference,
        "tolerance": _num(exact.info.get("tolerance")),
        "cpsat_runtime": exact.runtime,
        "message": exact.message,
    }


def add_verify_command(subparsers: Any) -> None:
    """Register ``chainoffload verify CHAIN.json SCHEDULE.json [platform flags] [--time-limit S] [--json]``."""
    from .cli import add_platform_flags

    p = subparsers.add_parser("verify", help="check a schedule by the simulator and its optimality gap by CP-SAT")
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p)
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds CP-SAT may search (default 60)")
    p.add_argument("--workers", type=int, default=2, help="CP-SAT search workers (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .cli import CliError, _instance_rows, _print_table, load_platform
    from .units import format_bytes, format_seconds

    if not args.time_limit > 0 or not math.isfinite(args.time_limit):
        raise CliError(f"--time-limit: {args.time_limit!r} must be a number of seconds > 0")
    if args.workers < 1:
        raise CliError(f"--workers: {args.workers!r} must be an integer >= 1")
    chain = Chain.load(args.chain)
    schedule = Schedule.load(args.schedule)
    platform = load_platform(args)
    report = verify(chain, platform, schedule, time_limit=args.time_limit, workers=args.workers)
    if args.json:
        print(json.dumps(report))
        return 0
    v = report["violation"]
    rows = _instance_rows(chain, platform) + [
        ("feasible", "yes" if v is None else f"no: {v['rule']} rule broken by {v['op']}"),
        ("makespan", format_seconds(report["makespan"]) if report["makespan"] is not None else "-"),
        ("peak memory", f"{format_bytes(report['peak_memory'])} of {format_bytes(platform.memory)}"),
    ]
    if v is not None:
        rows.append(("violation", v["message"]))
    rows.append(("cpsat", f"{report['cpsat_status']} in {format_seconds(report['cpsat_runtime'])}"))
    if report["optimum"] is not None:
        rows.append(("optimum" if report["cpsat_status"] == "optimal" else "best found", format_seconds(report["optimum"])))
    if report["lower_bound"] is not None:
        rows.append(("lower bound", format_seconds(report["lower_bound"])))
    if report["gap"] is not None:
        rows.append(("gap", f"{100 * report['gap']:.3f}% over the {report['gap_reference'].replace('_', ' ')}"))
    if report["message"]:
        rows.append(("message", report["message"]))
    _print_table(rows)
    return 0
