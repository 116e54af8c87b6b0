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

The constants are measured on this project's machine (2 cores shared with other work, load
average 4-6 while measuring; a busier machine is slower, and the 10 % + 0.5 s of the promise is
the margin for that), on ``benchmarks/_common.py``'s instances at L = 10^5 and 10^6, each
rounded up by 10-30 %:

======================  =====================================================================
step                    measured
======================  =====================================================================
read a chain file       json + Chain: 0.72 s for 9.1 MB (L = 10^5), 9.8 s for 91 MB (10^6)
one evaluation          plan + score one unit set: 3.1 s at 10^5 (first call, kernels loaded),
                        21.8 s at 10^6
build a schedule        Schedule from arrays: 1.33 s for 10^5 transfers, 11.5 s for 10^6
judge                   simulate(): 0.64 s at 10^5, 7.1-7.5 s at 10^6
======================  =====================================================================
"""

from __future__ import annotations

import os

__all__ = ["read_seconds", "file_read_seconds", "eval_seconds", "build_seconds", "judge_seconds", "report_seconds", "observe", "set_pace"]

#: Seconds per byte of a chain file: JSON parsing and Chain's checks (9.8 s for 91 MB).
READ_PER_BYTE = 1.2e-7
#: Seconds per stage of one evaluation (two planner runs, three resolve + replay): 21.8 s at
#: 10^6 (kernel loading included), 1.45 s at 10^5 (load 7.4).
EVAL_PER_STAGE = 2.0e-5
#: Seconds per transfer of turning arrays into a Schedule of Transfer objects (11.5 s per 10^6).
BUILD_PER_TRANSFER = 1.2e-5
#: Seconds per stage of judging one schedule (validate, resolve, replay): 7.5 s at 10^6, 1.28 s
#: at 10^5 (load 7.4).
JUDGE_PER_STAGE = 1.1e-5
#: Seconds per stage of the CLI's table after a solve (the stalls and the unit runs).
REPORT_PER_STAGE = 8e-6

# The longest evaluation seen per chain length in this process: measured beats modelled.
_SEEN: dict[int, float] = {}
# How much slower than the constants this machine runs now (measured by the CLI on its read).
_PACE = [1.0]


def set_pace(measured: float, estimated: float) -> float:
    """Scale the estimates by how long a step really took against its estimate (the CLI's
    read of a large file), within [0.5, 4]: the constants hold at load 4-6, and a machine that
    is idle or far busier than that is seen here before the method starts. Returns the pace."""
    if estimated >= 0.2 and measured > 0:
        _PACE[0] = min(max(measured / estimated, 0.5), 4.0)
    return _PACE[0]


def read_seconds(nbytes: int) -> float:
    """Estimated seconds to read and check a chain file of ``nbytes`` bytes."""
    return 0.05 + READ_PER_BYTE * nbytes


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
    return seen if seen is not None else 1e-3 + _PACE[0] * EVAL_PER_STAGE * length


def observe(length: int, seconds: float) -> None:
    """Record an evaluation's measured seconds at ``length`` stages."""
    if len(_SEEN) > 64:
        _SEEN.clear()
    # The longest, not the last: a loaded machine's slow evaluation is the one to plan for.
    _SEEN[length] = max(seconds, _SEEN.get(length, 0.0))


def build_seconds(transfers: int) -> float:
    """Estimated seconds to turn ``transfers`` transfer arrays into a Schedule."""
    return _PACE[0] * BUILD_PER_TRANSFER * transfers


def judge_seconds(length: int) -> float:
    """Estimated seconds for :func:`chainoffload.solve` to judge one schedule and climb the
    cheap rungs of the bound ladder at ``length`` stages."""
    return 0.02 + _PACE[0] * JUDGE_PER_STAGE * length


def report_seconds(length: int) -> float:
    """Estimated seconds of the CLI's output after a solve at ``length`` stages."""
    return 0.02 + _PACE[0] * REPORT_PER_STAGE * length
