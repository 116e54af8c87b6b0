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

The methods that recompute cannot be cut either where their time goes: a fixed sequence is
built and simulated whole (``sqrt-checkpoint``, ``recompute-all``: L (L + 1) / 2 + L ops),
and rotor's and the joint DP's tables are each one Numba call. They are estimated before they
start (same pace rule, rounded up) and refused up front, with the estimate in the message, when
they do not fit what is left of the limit, or the memory free (below); what can be cut (the joint DP's walks, ``joint``'s candidates) is cut at the
deadline. Measured at load 6.1-6.9 (pace 3.1-3.5) on ``benchmarks/_common.py``'s instance:

* a sequence: building 0.7 us per op, simulating it 0.6-1.1 us per op (L = 10^3-10^5);
* rotor's table (``fill_rotor_table``): 1.9 s of CPU at L = 1000, S = 100, 7.9 s at S = 500,
  0.34 s at L = 300, S = 500: below 2e-11 s x S L^3 + 0.1 s; wall is CPU times the pace;
* the joint DP's windows and spine table (``joint_dp``): 1.2 s of CPU at L = 300, 1.9 s at
  L = 1000, 5.8 s at L = 3000 (S = 500): below 1 s + 2.6e-6 s x L S at pace 1;
* ``joint``'s dense float64 rotor table (L <= 200, for the exact DP): 0.16 s of CPU at L = 100,
  1.24 s at L = 200 (S = 500): 3.1e-10 s x S L^3; the exact DP after it 0.11 s and 0.49 s:
  2.5e-8 s x S L^2 (load 7.2).
"""

from __future__ import annotations

import os
import time

__all__ = [
    "read_seconds", "file_read_seconds", "eval_seconds", "build_seconds", "judge_seconds", "report_seconds", "observe",
    "forget", "pace", "sequence_seconds", "sequence_bytes", "rotor_seconds", "rotor_bytes", "joint_dp_seconds",
    "joint_dp_bytes", "joint_exact_seconds", "free_bytes", "cpu_share",
]

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

#: Seconds per op of building a recomputing sequence, simulating it, and judging it again, at pace 1.
SEQUENCE_PER_OP = 1.0e-6
#: Bytes per op of a sequence held as a Schedule and replayed (tuples, the simulator's arrays).
SEQUENCE_BYTES_PER_OP = 400
#: Seconds per S L^3 of rotor's table at pace 1 (NOTE [ rotor by bounds ]).
ROTOR_PER_CELL = 2.0e-11
#: Seconds per L S of the joint DP's windows and spine table at pace 1, and its fixed part.
JOINT_DP_PER_CELL = 2.6e-6
JOINT_DP_FIXED = 1.0
#: Seconds per S L^3 of the dense float64 rotor table, and per S L^2 of the exact joint DP, at pace 1.
DENSE_ROTOR_PER_CELL = 4.0e-10
JOINT_EXACT_PER_CELL = 3.5e-8

# The longest evaluation seen per chain length in this process: measured beats modelled.
_SEEN: dict[int, float] = {}


# NOTE [ pace under contention ]
# The load average is a 1-minute mean: when three solves start at once on 2 cores it still says
# "idle" for tens of seconds while each gets two thirds of a core, and every estimate made
# from it was short (issue 33: --time-limit 1 ran 2.0-2.7 s inside main()). So pace() also
# measures the share of a core this process has had since its solve's clock started
# (forget()): CPU seconds over wall seconds, once at least SHARE_WINDOW s have passed (a
# shorter window is noise). Work on one thread that got a share s of a core runs 1/s times
# slower than on an idle core; the pace is the larger of that and the load average's word.
# Several threads at work (CP-SAT's workers) give a share above 1: the load average decides.
# The clock functions are module attributes so that a test can replace them (a fake clock).

#: Wall seconds after which the measured share of a core counts.
SHARE_WINDOW = 0.2

_wall = time.perf_counter
_cpu = time.process_time
_since: tuple[float, float] | None = None  # (wall, cpu) when the solve's clock started


def cpu_share() -> float | None:
    """The share of one core this process has had since :func:`forget` (CPU over wall
    seconds; above 1 when several threads ran), or ``None`` before ``SHARE_WINDOW`` s."""
    if _since is None:
        return None
    wall = _wall() - _since[0]
    if wall < SHARE_WINDOW:
        return None
    return max(0.0, _cpu() - _since[1]) / wall


def pace() -> float:
    """How much slower than an idle machine work runs now, at least 1: the larger of the
    1-minute load average over the cores (a process gets about cores / load of a core when more
    are runnable) and the inverse of the share of a core this solve has measured (NOTE [ pace
    under contention ])."""
    try:
        by_load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:  # no load average on this platform
        by_load = 1.0
    share = cpu_share()
    if share is None or share <= 0.0:
        return by_load
    return max(by_load, min(1.0 / share, 100.0))


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
    It also starts the measure of this solve's share of a core (NOTE [ pace under contention ]).
    """
    global _since
    _SEEN.clear()
    _since = (_wall(), _cpu())


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


def sequence_seconds(ops: int) -> float:
    """Estimated seconds to build a compute sequence of ``ops`` ops as a Schedule, simulate it,
    and have :func:`chainoffload.solve` judge it again."""
    return 0.02 + pace() * SEQUENCE_PER_OP * ops


def sequence_bytes(ops: int) -> float:
    """Estimated memory of a sequence of ``ops`` ops held as a Schedule and simulated."""
    return float(SEQUENCE_BYTES_PER_OP) * ops


def rotor_seconds(length: int, slots: int) -> float:
    """Estimated seconds of rotor's table at ``length`` stages and ``slots`` slots (an upper
    bound where measured: the cut of NOTE [ rotor by bounds ] makes it grow slower than L^3)."""
    return 0.1 + pace() * ROTOR_PER_CELL * slots * float(length) ** 3


def rotor_bytes(length: int, slots: int) -> float:
    """Estimated memory of rotor's table: the forward phases' tables and keep-all needs
    (20 bytes a segment) and the bounds (4 bytes a segment and budget, at most)."""
    segments = (length + 2) ** 2
    return 20.0 * segments + 4.0 * (slots + 1) * segments / 2


def joint_dp_seconds(length: int, slots: int) -> float:
    """Estimated seconds of the joint DP's windows and spine table (the walks are cut apart)."""
    return pace() * (JOINT_DP_FIXED + JOINT_DP_PER_CELL * length * slots)


def joint_dp_bytes(length: int, slots: int, span: int = 16, rows: int = 2) -> float:
    """Estimated memory of the joint DP's tables: the windows (12 bytes a stage, span and slot)
    and the spine (12 bytes a stage, queue row and slot)."""
    return 12.0 * (length + 2) * (slots + 1) * (span + 2 * (rows + 1) ** 2)


def joint_exact_seconds(length: int, slots: int) -> float:
    """Estimated seconds of the dense rotor table and the exact joint DP on it (``joint``, L <= 200)."""
    return 0.05 + pace() * (DENSE_ROTOR_PER_CELL * slots * float(length) ** 3 + JOINT_EXACT_PER_CELL * slots * float(length) ** 2)


def free_bytes() -> float:
    """MemAvailable from /proc/meminfo (``inf`` where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")
