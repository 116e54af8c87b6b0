"""Method ``dp``: the fluid dynamic program over stages, planned and repaired by bisection.

The DP of Beaumont, Eyraud-Dubois, Shilova, "Efficient Combination of Rematerialization and
Offloading for Training DNNs" (NeurIPS 2021), restricted to pure offloading: the compute order
is fixed (F_1..F_L, B_L..B_1) and the only decision is, per unit, offload or keep. The paper's
full text is not at hand; the recurrence below is ours, held to the baselines by measurement.

NOTE [ fluid DP ]
-----------------
**The model.** Units are whole: each unit 1..L-1 is offloaded or kept. Transfer *timing* is
fluid: each channel drains its queue of pending units continuously at its bandwidth while
compute runs, in stage order, never idle while something is queued; the latency of a transfer
is counted as ``latency * bandwidth`` extra bytes on the channel. A queued unit stays resident
until its last byte has drained (the real rule, rather than freeing memory in proportion to the
bytes moved: measured, proportional freeing let the DP pick plans with no slack that the
simulator then had to slow down). An op that does not fit waits, compute idle, until enough
whole units have left the queue ahead of it.

**The backward is the time-mirror of the forward.** P_i must end before B_{i+1} starts and
allocates unit i when it starts, so read backwards in time (B_1, B_2, ..., B_L) the prefetch of
unit i *starts* once B_{i+1} is done, and unit i leaves the GPU when its last byte has drained:
the same queue as the forward's offloads, visited in the same stage order. One pass over
j = 1..L-1 therefore carries both queues. Transition j decides unit j and runs

* F_{j+1}: resident are a_0, the kept units 1..j-1 (K bytes), the offload queue (units older
  than j, freeable since F_j has ended), unit j whole (F_{j+1} reads a_j) and saved[j+1] +
  fwd_tmp[j+1]. If that exceeds the budget, F_{j+1} waits for the head units of the queue to
  finish. An offloaded unit j joins the queue's tail; then the channel drains
  bandwidth * fwd[j+1] bytes;
* B_{j+1}, time-reversed: resident are a_0, K, the prefetch queue (units older than j), units
  j and j+1 whole, g_{j+1}, g_j and bwd_tmp[j+1]; the same wait rule; the H2D channel drains
  bandwidth * bwd[j+1] bytes; then an offloaded unit j joins the queue's tail. When B_{j+1}
  takes no time, the prefetch that goes first after it allocates at its instant and counts
  (``NOTE [ prefetch at a zero-length B ]`` in the kernel).

Transition 0 (F_1 and B_1) has no decision. After the last transition, what is left in the
prefetch queue is brought in with compute idle before B_L (the junction). The DP value is
sum(fwd) + sum(bwd) plus every wait.

**States.** A state after transition j is K plus each queue (its units' bytes and the channel
bytes left of its head). They are kept *exactly* inside each cell of a grid of ``slots``
buckets of K times ``queue_slots`` buckets of each queue's resident bytes (bucket width =
budget / count); a queue holds up to ``QUEUE_CAP`` units one by one and merges newer ones into
its last entry (freed later: the conservative side). A cell keeps one representative: least
time, ties (zero-wait partial plans are common) to least memory in use. Rounding the queues
into buckets at every step would not do: the drain of one stage is often far below a bucket
and a rounded queue would never shrink; carrying exact figures makes the bucketing a choice of
which partial plans to keep, not an error that builds up. Cost: O(L * slots * queue_slots^2)
time and an int32 back-pointer per cell and stage. Defaults ``slots`` 256, ``queue_slots`` 3
by measurement (30 random chains of 100 stages, 3 memory levels, geometric mean of dp over the
better of first-k and largest-first, and the time of one DP run at L = 1000): (32, 4): 0.999 /
1.014 / 1.000, 0.03 s; (64, 8): 0.989 / 1.008 / 1.000, 0.12 s; (128, 8): 0.986 / 1.007 /
1.000, 0.24 s; (256, 3): 0.985 / 1.001 / 1.000, 0.11 s; (512, 2): 0.985 / 1.004 / 1.000,
0.34 s. Resolution in K matters more than in the queues.

**What it relaxes, and why it is a heuristic.** The model has no triggers: a transfer starts the
moment its channel is free (forward) or as late as the mirror allows (backward), where the
planner must tie each to a compute op's start or end. It ignores where the phases meet (the
forward's unfinished offloads are still resident during the first backward ops; prefetches may
overlap the end of the forward), a half-duplex link's sharing of one channel between the
phases, and the link's queue order beyond stage order. The bucketing drops partial plans a
finer grid would keep. Its value is neither a lower nor an upper bound on the true makespan: it
is a guide for choosing units. The chosen units are timed by the shared planner
(:func:`chainoffload.planner.plan_transfers`) and judged by the simulator.

**Budgets and repair.** The DP runs at the platform's memory and at a few budgets just below it
(``MARGINS``; a plan with slack often runs with fewer waits); the best plan the simulator
accepts wins. If it accepts none, the repair runs a memory-first DP (a cell keeps the partial
plan with fewest kept bytes, which survives budgets near the floor where the time-first one
runs out of room) at the memory, then bisects on its budget between the least memory any
pure-offloading schedule needs (:func:`offload_memory_floor`) and the memory: a smaller budget
makes it offload more. A plan the simulator rejects is never reported; if no budget gives one,
the result is ``infeasible``. Monotonicity in the memory is not built in (the budgets tried are
relative to the memory); the tests check it on a sweep of chains and memories.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from .._cost import judge_seconds
from .._kernels import lazy
from ..bounds import offload_memory_floor
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import keep_all_peak
from ._options import OptionError, check_keep, check_memory_floor, check_time_limit
from ._search import Evaluator, boundary

_kdp = lazy("dp")  # imports Numba on first use only

__all__ = ["dp", "fluid_plan", "DEFAULT_SLOTS", "DEFAULT_QUEUE_SLOTS"]

#: Buckets of the kept bytes (the ``slots`` of the DP) when none are given; the measurement
#: behind it is in ``NOTE [ fluid DP ]``, "States".
DEFAULT_SLOTS = 256

#: Buckets of each pending queue when none are given.
DEFAULT_QUEUE_SLOTS = 3

#: Relative margins below the memory at which the DP is run (measured: lower ones never won).
MARGINS = (0.0, 0.02, 0.05, 0.1)

#: Most back-pointers (int32, one per cell and stage) one DP run may hold: 1 GiB.
MAX_TABLE = 1 << 28

#: Back-pointers the automatic choice of ``slots`` aims at (256 MiB; ``NOTE [ slots from the
#: instance ]``).
AUTO_TABLE = 1 << 26

# NOTE [ slots from the instance ]
# --------------------------------
# Unless the caller sets them, ``slots`` and ``queue_slots`` come from the instance: the
# measured defaults (256, 3) while the table of back-pointers, L * (slots + 1) *
# (queue_slots + 1)^2 int32, stays under ``AUTO_TABLE`` (up to L = 16,320), beyond that
# queue_slots 2 and as many K buckets as fit (73 at L = 100,000; at least 8). A DP run's time
# grows with the same product, so this also keeps one run to about a second at L = 100,000.
# With a time limit, the product is cut further so that the runs fit a fifth of it.

#: Cell-stages one DP run visits per second, about (measured on the 2-core machine: 20 s of
#: CPU for dp's four runs and plans at L = 100,000 with 666 cells): what a time limit is
#: turned into cells with, and what decides whether one more run fits.
CELL_RATE = 1.2e7

#: Bisection steps of the repair.
REPAIR_STEPS = 8


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionError(f"{name}: {value!r} must be an integer >= 1")
    if value > 1 << 14:
        raise OptionError(f"{name}: {value!r} is too large (at most {1 << 14})")
    return int(value)


def _check_table(chain: Chain, slots: int, queue_slots: int) -> None:
    cells = (slots + 1) * (queue_slots + 1) ** 2
    if cells * chain.length > MAX_TABLE:
        raise OptionError(
            f"slots: {slots} with queue_slots: {queue_slots} needs {cells} cells per stage, "
            f"{cells * chain.length} back-pointers for L = {chain.length}; at most {MAX_TABLE} fit"
        )


def auto_slots(length: int, seconds: float | None = None) -> tuple[int, int]:
    """``(slots, queue_slots)`` for a chain of ``length`` stages (``NOTE [ slots from the instance ]``).

    ``seconds``: the time one DP run may take (``None``: no limit).
    """
    cells = AUTO_TABLE // max(length, 1)
    if seconds is not None:
        # Compared as floats: a time limit such as 1e308 s makes the product infinite, which
        # int() cannot take and which means no limit here anyway.
        budget = CELL_RATE * seconds / max(length, 1)
        if budget < cells:
            cells = int(budget)
    if cells >= (DEFAULT_SLOTS + 1) * (DEFAULT_QUEUE_SLOTS + 1) ** 2:
        return DEFAULT_SLOTS, DEFAULT_QUEUE_SLOTS
    return max(8, cells // 9 - 1), 2


def fluid_plan(
    chain: Chain,
    platform: Platform,
    budget: int | None = None,
    *,
    slots: int = DEFAULT_SLOTS,
    queue_slots: int = DEFAULT_QUEUE_SLOTS,
    tight: bool = False,
    keep: Iterable[int] = (),
) -> tuple[list[int], float]:
    """Run the fluid DP once and return the units it offloads and its fluid makespan.

    Parameters
    ----------
    chain, platform
        The instance (the platform gives the link).
    budget
        Bytes the DP may use; default ``platform.memory``.
    slots, queue_slots
        Buckets of the kept bytes and of each pending queue (``NOTE [ fluid DP ]``).
    tight
        Keep, per cell, the partial plan of least memory in use rather than of least time
        (the repair's choice near the memory floor).
    keep
        Units (stages 1..L) the DP may not offload.

    Returns
    -------
    units, value
        The offloaded stages (sorted) and the model's makespan; ``([], inf)`` when no choice
        of units passes the model's memory checks at ``budget``. The value is a heuristic
        figure, not a bound.

    Raises
    ------
    ValueError
        If ``slots``, ``queue_slots`` or ``budget`` is out of range (the message names it).
    """
    slots = _check_count("slots", slots)
    queue_slots = _check_count("queue_slots", queue_slots)
    _check_table(chain, slots, queue_slots)
    kept = check_keep(chain, keep)
    budget = platform.memory if budget is None else int(budget)
    if budget < 0:
        raise OptionError(f"budget: {budget!r} must be >= 0 bytes")
    allow = np.zeros(chain.length + 1, dtype=np.int8)
    if platform.can_transfer:
        allow[1 : chain.length] = 1
        for u in kept:
            allow[u] = 0
    offload, value, found = _kdp.fluid_dp(
        chain.fwd,
        chain.bwd,
        chain.act,
        chain.saved,
        chain.fwd_tmp,
        chain.bwd_tmp,
        budget,
        platform.bandwidth_d2h,
        platform.bandwidth_h2d,
        platform.latency,
        allow,
        slots,
        queue_slots,
        bool(tight),
    )
    if not found:
        return [], math.inf
    return [int(j) for j in np.flatnonzero(offload)], float(value)


class _Budgets:
    """The DP runs made so far (per budget), their plans scored by the shared search."""

    def __init__(self, search: Evaluator, slots: int, queue_slots: int, keep: frozenset[int]) -> None:
        self.search = search
        self.slots = slots
        self.queue_slots = queue_slots
        self.keep = keep
        self.seen: set[tuple[int, bool]] = set()
        self.origin: dict[tuple[int, ...], tuple[float, int]] = {}  # units -> (fluid value, budget)
        self.tried = 0

    def attempt(self, budget: int, tight: bool = False) -> bool | None:
        """Run the DP at ``budget``, plan and simulate; whether the plan is accepted (``None``:
        out of time)."""
        if (budget, tight) in self.seen:
            return False
        if self.search.exhausted:
            return None
        search = self.search
        cells = (self.slots + 1) * (self.queue_slots + 1) ** 2
        need = search.chain.length * cells / CELL_RATE + search.reserve()
        if time.perf_counter() + need > search.deadline:
            # The table fill and the evaluation of its plan would not end in time (NOTE [ clock ]),
            # whether or not a plan is in hand: without one, the method times out.
            search.refused(need)
            return None
        self.seen.add((budget, tight))
        self.tried += 1
        units, value = fluid_plan(
            search.chain, search.platform, budget, slots=self.slots, queue_slots=self.queue_slots, tight=tight, keep=self.keep
        )
        if not math.isfinite(value):
            return False
        if not search.fits(len(units)):
            return None
        cand = search.units(units)
        self.origin.setdefault(cand.units, (value, budget))
        search.offer(cand, f"budget {budget}")
        return cand.feasible


def dp(
    chain: Chain,
    platform: Platform,
    *,
    slots: int | None = None,
    queue_slots: int | None = None,
    keep: Iterable[int] = (),
    time_limit: float | None = None,
) -> Result:
    """Offload the units the fluid dynamic program chooses (``NOTE [ fluid DP ]``).

    Parameters
    ----------
    chain, platform
        The instance.
    slots
        Buckets of the kept bytes in the DP's states (>= 1). More lose fewer partial plans and
        cost time linearly. ``None`` (default): chosen from the instance with
        ``queue_slots`` (``NOTE [ slots from the instance ]``: 256 and 3 up to L = 16,320).
    queue_slots
        Buckets of each pending-transfer queue (>= 1); time grows with its square.
    keep
        Units (stages 1..L) that must stay resident: the DP never offloads them.
    time_limit
        Seconds (> 0) the method may take: no DP run starts after it, and the best plan so far
        is returned (status ``timeout`` when none fits yet). ``None``: no limit.

    Returns
    -------
    Result
        ``feasible`` with the best schedule the simulator accepts over the budgets tried, or
        ``infeasible``. ``info`` holds ``slots``, ``queue_slots``, ``dp_makespan`` (the fluid
        value of the chosen plan; a heuristic figure, not a bound), ``units``, ``budget`` (the
        bytes the DP was allowed for that plan), ``repairs`` (DP runs made after the one at
        the platform's memory was rejected) and ``tried`` (DP runs in all).

    Raises
    ------
    ValueError
        If ``slots`` or ``queue_slots`` is not an integer in 1..16384, or the DP's table for
        them would exceed ``MAX_TABLE`` back-pointers, ``keep`` names a unit that is not a
        stage, or the memory is below :meth:`Chain.stage_memory_floor` (a
        :class:`~chainoffload.PlatformError`).
    """
    t0 = time.perf_counter()
    time_limit = check_time_limit(time_limit)
    auto = auto_slots(chain.length, None if time_limit is None else 0.2 * time_limit)
    slots = auto[0] if slots is None else _check_count("slots", slots)
    queue_slots = auto[1] if queue_slots is None else _check_count("queue_slots", queue_slots)
    _check_table(chain, slots, queue_slots)
    kept = check_keep(chain, keep)
    check_memory_floor(chain, platform)
    memory = platform.memory
    base_info: dict[str, Any] = {"slots": slots, "queue_slots": queue_slots}

    if time_limit is not None and time.perf_counter() + judge_seconds(chain.length) > t0 + time_limit:
        # Even the keep-all replay below would not end in time (NOTE [ clock ]).
        return Result(
            "dp",
            Status.TIMEOUT,
            None,
            runtime=time.perf_counter() - t0,
            info={**base_info, "repairs": 0, "tried": 0, "stopped": "time"},
            message=f"dp: the time limit ({time_limit} s) is below what replaying one schedule of {chain.length} stages takes",
        )
    keep_peak = keep_all_peak(chain)
    if keep_peak <= memory:
        # Keeping everything is optimal (makespan = compute time); no DP needed.
        schedule = Schedule.keep_all(chain.length)
        info = {**base_info, "dp_makespan": chain.compute_time, "units": [], "budget": memory, "repairs": 0, "tried": 0}
        return Result(
            "dp", Status.FEASIBLE, schedule, makespan=chain.compute_time, runtime=time.perf_counter() - t0, info=info
        )

    floor = offload_memory_floor(chain)
    if not platform.can_transfer or memory < floor:
        why = (
            "the link has bandwidth 0"
            if not platform.can_transfer
            else f"no pure-offloading schedule fits below {floor} B"
        )
        return Result(
            "dp",
            Status.INFEASIBLE,
            None,
            runtime=time.perf_counter() - t0,
            min_memory=keep_peak if not platform.can_transfer else None,
            info={**base_info, "repairs": 0, "tried": 0, "offload_floor": floor},
            message=f"dp: nothing fits in {memory} B: {why}",
        )

    deadline = t0 + time_limit if time_limit is not None else math.inf
    search = Evaluator(chain, platform, deadline=deadline)
    runs = _Budgets(search, slots, queue_slots, kept)
    # The fluid model frees memory earlier than the real rules, so a plan made with a little
    # less memory than there is often runs with fewer waits: try a few budgets just below.
    for margin in MARGINS:
        runs.attempt(max(floor, int(memory * (1.0 - margin))))
    repairs = 0
    if search.best is None:
        # Repair: the memory-first DP at the full memory, then bisection on its budget (a
        # smaller one makes it offload more; the largest budget that works is kept).
        repairs += 1
        if not runs.attempt(memory, tight=True) and not search.exhausted:
            before = runs.tried
            lo = boundary(floor, memory, lambda mid: runs.attempt(mid, tight=True), steps=REPAIR_STEPS)
            repairs += runs.tried - before
            if search.best is None and lo == floor:
                repairs += 1
                runs.attempt(floor, tight=True)

    if search.best is None:
        if search.stopped == "time":
            return Result(
                "dp",
                Status.TIMEOUT,
                None,
                runtime=time.perf_counter() - t0,
                info={**base_info, "repairs": repairs, "tried": runs.tried, "stopped": "time"},
                message=search.timeout_message("dp", "a plan", time_limit),
            )
        return Result(
            "dp",
            Status.INFEASIBLE,
            None,
            runtime=time.perf_counter() - t0,
            info={**base_info, "repairs": repairs, "tried": runs.tried, "offload_floor": floor},
            message=f"dp: the simulator rejects the plan of every budget tried ({runs.tried}) at {memory} B",
        )
    best = search.best
    value, budget = runs.origin[best.units]
    info = {
        **base_info,
        "dp_makespan": value,
        "units": list(best.units),
        "budget": budget,
        "repairs": repairs,
        "tried": runs.tried,
    }
    if search.stopped == "time":
        info["stopped"] = "time"
    return Result(
        "dp",
        Status.FEASIBLE,
        best.schedule(),
        makespan=best.makespan,
        runtime=time.perf_counter() - t0,
        info=info,
    )
