"""The command line's text tables: the rows each command prints, stalls in words, stages as runs.

Each function turns figures into the text of a table row; :func:`_table` lines the rows up in an
:class:`~chainoffload.cli.contract.Output`. A row stays one line at a million stages (``--json``
has every figure in full).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..chain import Chain
from ..platform import Platform
from ..schedule_file import ScheduleFile
from ..units import format_bytes, format_percent, format_seconds
from .contract import Output


def _platform_source(args: argparse.Namespace, record: ScheduleFile) -> str:
    """Where the platform came from, for the table: '' unless the schedule file's was used."""
    if record.platform is None:
        return ""
    flags = [a for a in ("platform", "memory", "bandwidth", "bandwidth_d2h", "bandwidth_h2d", "latency") if getattr(args, a, None) is not None]
    if getattr(args, "duplex", None) is not None:
        flags.append("duplex")
    return f"  (recorded in {args.schedule}" + (", overridden by " + ", ".join("--" + f.replace("_", "-") for f in flags) if flags else "") + ")"


def _instance_rows(chain: Chain, platform: Platform, source: str = "") -> list[tuple[str, str]]:
    return [
        ("chain", f"{chain.name} ({chain.length} stages, compute {format_seconds(chain.compute_time)})"),
        ("platform", platform.describe() + source),
    ]


def _idle_text(timeline: Any) -> str:
    """Where compute waits, by cause (see :func:`chainoffload.stalls`), for the tables.

    From :func:`chainoffload.stalls.stall_summary`'s arrays: building a Stall object per stall
    took seconds per 10^5 stages, after a solve that had kept its time limit.
    """
    from ..stalls import stall_summary

    _ops, durations, transfers = stall_summary(timeline)
    if not transfers.shape[0]:
        return "never (every copy is hidden behind compute)"
    schedule = timeline.schedule
    is_offload = schedule.arrays()[2][transfers] == 0

    def names(mask: np.ndarray) -> str:
        seen: list[int] = []
        for t in transfers[mask].tolist():  # the first 7 distinct ones, in time order
            if t not in seen:
                seen.append(t)
                if len(seen) > 6:
                    break
        return ", ".join(schedule.transfer_name(t) for t in seen[:6]) + (", ..." if len(seen) > 6 else "")

    idle = sum(durations.tolist())
    parts = []
    for mask, what in ((is_offload, "for offloads to free memory"), (~is_offload, "for prefetches to arrive")):
        total = sum(durations[mask].tolist())
        if total > 0:
            parts.append(f"{format_seconds(total)} {what} ({names(mask)})")
    count = int(transfers.shape[0])
    share = f" ({format_percent(idle / timeline.makespan)} of the makespan)" if timeline.makespan > 0 else ""
    return f"{format_seconds(idle)}{share} in {count} stall{'' if count == 1 else 's'}: " + "; ".join(parts)


def _units_text(units: Sequence[int], runs_shown: int = 12) -> str:
    """'4 units: 1, 6, 9-10': the stages as runs of consecutive ones, for a table.

    Past ``runs_shown`` runs the middle ones are left out with a count: a line must stay a line
    at a million stages (``--json`` has every stage).
    """
    units = sorted(int(u) for u in units)
    if not units:
        return "0 units"
    runs: list[list[int]] = []
    for u in units:
        if runs and u == runs[-1][1] + 1:
            runs[-1][1] = u
        else:
            runs.append([u, u])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(runs) > runs_shown:
        head, tail = runs_shown - 4, 3
        hidden = runs[head:-tail]
        count = sum(b - a + 1 for a, b in hidden)
        words = words[:head] + [f"... ({count} more in {len(hidden)} runs) ..."] + words[-tail:]
    return f"{len(units)} unit{'' if len(units) == 1 else 's'}: " + ", ".join(words)


def _table(out: Output, rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}")


def _over_compute(makespan: float, compute: float) -> str:
    """'(+x% over compute)', or what stands for it when compute takes no time."""
    if not math.isfinite(makespan):
        return ""
    if compute > 0:
        return f"  (+{100 * (makespan / compute - 1):.2f}% over compute)"
    return "  (compute takes no time)" if makespan == 0 else "  (all of it waiting: compute takes no time)"



def _least_text(search: Any) -> str:
    """The ``least memory`` row of ``solve --min-memory`` from a :class:`~chainoffload.solvers.MemorySearch`."""
    if search.memory is None:
        if search.stopped:
            return f"unknown: the time limit ended the bisection after {search.solves} solve(s) with no schedule found"
        return "none up to keep-all"
    text = f"{format_bytes(search.memory)} ({search.memory} B) for this method, by bisection"
    if not search.converged:
        text += (f"; the time limit stopped it after {search.solves} solve(s): the least lies above "
                 f"{format_bytes(search.below)} ({search.below} B)")
    return text


def _recorded_row(record: ScheduleFile) -> list[tuple[str, str]]:
    if record.method is None:
        return []
    figures = [f"{record.method} ({record.status})"]
    if record.makespan is not None:
        figures.append(f"makespan {format_seconds(record.makespan)}")
    if record.lower_bound is not None:
        figures.append(f"lower bound {format_seconds(record.lower_bound)}")
    return [("solved by", ", ".join(figures))]



# How the tradeoff table names each fixed recomputing policy's peak.
_POLICY_WORDS = {
    "checkpoint-all": "checkpointing every block (HF gradient_checkpointing_enable) holds",
    "sqrt-checkpoint": "sqrt checkpointing holds",
    "recompute-all": "recomputing everything from the input holds (the least of any sequence)",
}


def _sweep_stop(curve: Any) -> str:
    """What stopped the sweep's runs, and so whether its figures are the machine's
    (NOTE [ a sweep without a clock ] in ``chainoffload/tradeoff.py``)."""
    if curve.time_limit is not None:
        return f"a time limit of {curve.time_limit:g} s per run: figures may depend on the machine"
    text = "work budgets, no clock: the same figures on any machine"
    if curve.clocked:
        text += f", except {', '.join(curve.clocked)} (its own wall-clock limit)"
    return text

