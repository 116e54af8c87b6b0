"""What a time limit has to leave room for: the cost model of the work no deadline check can cut.

Private. NOTE [ clock ]
-----------------------
``solve(..., time_limit=T)`` (and ``chainoffload solve --time-limit T``, whose clock starts
before it reads its input) must end within 1.1 T + 0.5 s. Search loops check their deadline
between steps, but some steps cannot be cut once started, and at 10^5-10^6 stages each takes
seconds: planning and scoring one unit set, turning the winner's arrays into a
:class:`~chainoffload.Schedule`, the judging replay in :func:`chainoffload.solve`, reading a
chain file. So the deadline checks ask whether the *next* step still fits (a step that does not
is not started: the method stops with what it has, or with status ``timeout``), and the
finishing steps are reserved ahead:

* :class:`chainoffload.solvers._search.Evaluator` does not start an evaluation unless it and
  building the schedule of its best candidate still fit (:func:`eval_seconds`,
  :func:`build_seconds`); it also remembers how long its evaluations really took, which
  replaces the model once known (:func:`observe`);
* :func:`chainoffload.solve` gives the method its limit less :func:`judge_seconds`;
* the CLI subtracts the seconds it spent reading from the limit, keeps :func:`report_seconds`
  for its table, and refuses up front (exit 2) a limit below :func:`read_seconds` of its files.

The constants are measured on this project's machine (2 cores shared with other work) on
``benchmarks/_common.py``'s instances at L = 10^5 and 3 * 10^5, divided by the pace of the
machine then (:func:`pace`: load average over cores, 1.5 at load 3) and rounded up by 30 %;
each estimate is multiplied by the pace at the time it is asked for, since the same step takes
2-3x longer at load 7 than at load 3 on these cores. Checked against the busiest measurements
(load 5-7.4): each estimate stays above what was measured.

* read a chain file (json + Chain): 36-40 ns per byte at load 3; 107 ns/B at load 5.2 (10^6);
* one evaluation (plan + score a unit set): 9-12 us per stage at load 3; 14.5-22 at load 5-7.4;
* building a schedule: 5.5 us per transfer at load 3; 11-12 us at load 6-7.4;
* judging (simulate()): 3.9-4.2 us per stage at load 3; 7.5-12.8 us at load 6-7.4.
"""

from __future__ import annotations

import os

__all__ = ["read_seconds", "file_read_seconds", "eval_seconds", "build_seconds", "judge_seconds", "report_seconds", "observe", "forget", "pace"]

#: Seconds per byte of a chain file at pace 1: JSON parsing and Chain's checks.
READ_PER_BYTE = 3.5e-8
#: Seconds per stage of one evaluation (two planner runs, three resolve + replay) at pace 1.
EVAL_PER_STAGE = 1.05e-5
#: Seconds per transfer of turning arrays into a Schedule of Transfer objects at pace 1.
BUILD_PER_TRANSFER = 4.8e-6
#: Seconds per stage of judging one schedule (validate, resolve, replay) at pace 1.
JUDGE_PER_STAGE = 3.6e-6
#: Seconds per stage of the CLI's table after a solve (stall_summary and the unit runs) at pace 1.
REPORT_PER_STAGE = 3e-6

# The longest evaluation seen per chain length in this process: measured beats modelled.
_SEEN: dict[int, float] = {}


def pace() -> float:
    """How much slower than an idle machine work runs now: the 1-minute load average over the
    cores, at least 1 (a process gets about cores / load of a core when more are runnable)."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:  # no load average on this platform
        return 1.0


def read_seconds(nbytes: int) -> float:
    """Estimated seconds to read and check a chain file of ``nbytes`` bytes."""
    return 0.05 + pace() * READ_PER_BYTE * nbytes


def file_read_seconds(*paths: str | None) -> float:
    """:func:`read_seconds` of the files named (0 for ``None`` or one that cannot be stat'ed:
    reading it will say why)."""
    total = 0
    for path in paths:
        if path is None:
            continue
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    return read_seconds(total) if total else 0.0


def eval_seconds(length: int) -> float:
    """Estimated seconds of one evaluation at ``length`` stages: the longest seen in this
    process at that length, else the model."""
    seen = _SEEN.get(length)
    return seen if seen is not None else 1e-3 + pace() * EVAL_PER_STAGE * length


def forget() -> None:
    """Drop what earlier solves measured (called as each solve's clock starts).

    Measurements are kept for one solve only: an earlier one may have run its kernels
    interpreted on a cold Numba cache or under a load spike, and its slowest evaluation would
    then stop a later solve from starting any (seen: a 60 s limit timed out at 6 stages).
    """
    _SEEN.clear()


def observe(length: int, seconds: float) -> None:
    """Record an evaluation's measured seconds at ``length`` stages."""
    if len(_SEEN) > 64:
        _SEEN.clear()
    # The longest, not the last: a loaded machine's slow evaluation is the one to plan for.
    _SEEN[length] = max(seconds, _SEEN.get(length, 0.0))


def build_seconds(transfers: int) -> float:
    """Estimated seconds to turn ``transfers`` transfer arrays into a Schedule."""
    return pace() * BUILD_PER_TRANSFER * transfers


def judge_seconds(length: int) -> float:
    """Estimated seconds for :func:`chainoffload.solve` to judge one schedule and climb the
    cheap rungs of the bound ladder at ``length`` stages."""
    return 0.02 + pace() * JUDGE_PER_STAGE * length


def report_seconds(length: int) -> float:
    """Estimated seconds of the CLI's output after a solve at ``length`` stages."""
    return 0.02 + pace() * REPORT_PER_STAGE * length
