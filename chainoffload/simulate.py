"""The one simulator: every schedule of every solver, and every test, goes through it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ._kernels.simulate import RULE_MEMORY, RULE_NONE, RULE_READ, simulate_kernel
from .chain import Chain
from .platform import Platform, PlatformError
from .schedule import Schedule

__all__ = ["simulate", "Timeline", "Violation", "VIOLATION_RULES"]

#: The rules a well-formed schedule can break, as named in :attr:`Violation.rule`.
VIOLATION_RULES = ("memory", "read")


@dataclasses.dataclass(frozen=True)
class Violation:
    """The first rule a schedule breaks.

    Attributes
    ----------
    rule
        ``"memory"``: GPU memory goes over the limit; ``"read"``: an op reads data that is not
        on the GPU (an offload triggered before its unit exists, or a backward whose unit's
        prefetch is triggered only at or after that backward).
    op
        Name of the op concerned, e.g. ``"F_3"``, ``"B_2"``, ``"O_4"``, ``"P_4"``.
    time
        When it happens (seconds from the start of the iteration).
    bytes
        For ``memory``, the memory in use at that instant; for ``read``, the size of the unit.
    message
        A sentence for people.
    """

    rule: str
    op: str
    time: float
    bytes: int
    message: str


@dataclasses.dataclass(frozen=True, eq=False)
class Timeline:
    """What :func:`simulate` found: every op's start and end, the memory curve, and the verdict.

    Attributes
    ----------
    op_start, op_end
        Start and end of compute op k (index into ``schedule.compute``).
    transfer_start, transfer_end
        Start and end of transfer t (index into ``schedule.transfers``).
    memory_time, memory_bytes
        The memory curve, a step function: ``memory_bytes[q]`` is in use from ``memory_time[q]``
        on, after the q-th allocation or free. Times may repeat (several events at an instant;
        the last value at an instant is what holds after it).
    peak_memory, peak_time
        Highest memory in use and when it is first reached.
    makespan
        End of the last compute op (B_1).
    offloaded_bytes
        Bytes copied to the host (saved[i] for each offloaded unit).
    violation
        The first rule broken, or ``None`` when the schedule is feasible.
    """

    chain: Chain
    platform: Platform
    schedule: Schedule
    op_start: np.ndarray
    op_end: np.ndarray
    transfer_start: np.ndarray
    transfer_end: np.ndarray
    memory_time: np.ndarray
    memory_bytes: np.ndarray
    peak_memory: int
    peak_time: float
    makespan: float
    offloaded_bytes: int
    violation: Violation | None

    @property
    def feasible(self) -> bool:
        """Whether no rule is broken."""
        return self.violation is None

    @property
    def overhead(self) -> float:
        """makespan / (sum(fwd) + sum(bwd)) - 1: the time lost to transfers not hidden."""
        base = self.chain.compute_time
        return self.makespan / base - 1.0 if base > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The verdict as plain data (the ``simulate --json`` object)."""
        v = self.violation
        return {
            "feasible": self.feasible,
            "makespan": self.makespan,
            "peak_memory": self.peak_memory,
            "offloaded_bytes": self.offloaded_bytes,
            "violation": None if v is None else dataclasses.asdict(v),
        }

    def plot(self, path: str | None = None, **kwargs: Any):
        """Draw a Gantt chart of compute and transfer channels over the memory curve, stalls explained.

        Needs matplotlib, or plotly for a ``.html`` path (``pip install chainoffload[plot]``);
        the keyword arguments are :func:`chainoffload.plot.plot_timeline`'s.
        """
        from .plot import plot_timeline

        return plot_timeline(self, path, **kwargs)


def _describe(schedule: Schedule, code: int) -> str:
    return schedule.op_name(code) if code >= 0 else schedule.transfer_name(-code - 1)


def check_platform_for(schedule: Schedule, platform: Platform) -> None:
    """Raise :class:`PlatformError` if the schedule moves data over a link of bandwidth 0."""
    for t in schedule.transfers:
        if t.kind == "offload" and platform.bandwidth_d2h <= 0:
            raise PlatformError(f"platform.bandwidth_d2h: 0 but the schedule offloads unit {t.unit}")
        if t.kind == "prefetch" and platform.bandwidth_h2d <= 0:
            raise PlatformError(f"platform.bandwidth_h2d: 0 but the schedule prefetches unit {t.unit}")


def simulate(chain: Chain, platform: Platform, schedule: Schedule) -> Timeline:
    """Replay ``schedule`` on ``chain`` and ``platform`` event by event (DESIGN.md's rules).

    Never raises for an infeasible schedule: the result's ``violation`` names the first rule
    broken. Raises :class:`ScheduleError` for a malformed schedule (see
    :meth:`Schedule.validate`) and :class:`PlatformError` when it transfers over a link of
    bandwidth 0.

    Decisions where the contract leaves room
    ----------------------------------------
    * **Trigger order.** Triggers happen at compute-op boundaries, so "trigger order" is the
      order of those events in the compute sequence: start of op k, end of op k, start of op
      k + 1, ... Transfers with the same trigger event are queued in list order. Two events at
      the same instant (op k ends when op k + 1 starts) keep this causal order.
    * **Channels are FIFO and non-preemptive.** A transfer starts at max(its trigger, the end
      of the transfer ahead of it on its channel, and for a prefetch the end of its unit's
      offload); a prefetch waiting for its offload holds its channel (no overtaking), as a CUDA
      stream would. Channels therefore never overlap; with ``duplex=False`` offloads and
      prefetches share one queue.
    * **Waits.** Compute op k starts at max(end of op k - 1, end of every transfer with
      ``before == k``, and for B_j the ends of the prefetches of units j and j - 1). A prefetch
      that B_j needs but that is triggered only at or after B_j cannot be waited for: that is a
      ``read`` violation (B_j would read data that is not on the GPU); the op then starts
      without it so that the rest of the timeline is still reported.
    * **Offload before its data exists.** An offload of unit i triggered before F_i ends is a
      ``read`` violation.
    * **One instant.** Frees of memory allocated strictly earlier come before allocations at
      the same instant. A zero-length op's transient (fwd_tmp, bwd_tmp) is still counted: it is
      allocated and freed at that instant, in causal order; so are the frees at the end of a
      zero-length op (a zero-length B_i still holds its unit and g_i while it allocates, and
      a zero-length F_{i+1} still reads a_i). A prefetch's allocation at an
      instant counts before such a zero-length free (the conservative side).
    * **g_0.** B_1 allocates g_0 and nothing frees it (it is the chain's input gradient); a_0 is
      freed at the end of B_1.
    * **First rule broken** is the earliest in time; a ``read`` wins a tie with ``memory``.
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"simulate: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"simulate: platform must be a Platform, got {type(platform).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"simulate: schedule must be a Schedule, got {type(schedule).__name__}")
    schedule.validate(chain)
    check_platform_for(schedule, platform)
    if schedule.has_remat:
        from .remat import simulate_remat  # noqa: F401  (extension point; see remat module)

        return simulate_remat(chain, platform, schedule)
    arrays = schedule.arrays()
    out = simulate_kernel(
        chain.fwd,
        chain.bwd,
        chain.fwd_nosave,
        chain.act,
        chain.saved,
        chain.fwd_tmp,
        chain.bwd_tmp,
        platform.memory,
        platform.bandwidth_d2h,
        platform.bandwidth_h2d,
        platform.latency,
        platform.duplex,
        *arrays,
    )
    return _timeline_from_kernel(chain, platform, schedule, out)


def _timeline_from_kernel(chain: Chain, platform: Platform, schedule: Schedule, out: tuple) -> Timeline:
    (op_start, op_end, tr_start, tr_end, mem_time, mem_bytes, _mem_who, peak, peak_time, rule, who, vtime, vbytes) = out
    violation = None
    if rule != RULE_NONE:
        name = _describe(schedule, int(who))
        if rule == RULE_MEMORY:
            msg = (
                f"memory {int(vbytes)} B exceeds the limit {platform.memory} B by "
                f"{int(vbytes) - platform.memory} B at t={vtime:.6g}s ({name})"
            )
            violation = Violation("memory", name, float(vtime), int(vbytes), msg)
        elif rule == RULE_READ:
            if name.startswith("O_"):
                msg = f"{name} is triggered at t={vtime:.6g}s, before F_{name[2:]} has made unit {name[2:]}"
            else:
                msg = f"{name} at t={vtime:.6g}s reads a unit whose prefetch is triggered only at or after it"
            violation = Violation("read", name, float(vtime), int(vbytes), msg)
    for arr in (op_start, op_end, tr_start, tr_end, mem_time, mem_bytes):
        arr.setflags(write=False)
    return Timeline(
        chain=chain,
        platform=platform,
        schedule=schedule,
        op_start=op_start,
        op_end=op_end,
        transfer_start=tr_start,
        transfer_end=tr_end,
        memory_time=mem_time,
        memory_bytes=mem_bytes,
        peak_memory=int(peak),
        peak_time=float(peak_time),
        makespan=float(op_end[-1]) if op_end.shape[0] else 0.0,
        offloaded_bytes=schedule.offloaded_bytes(chain),
        violation=violation,
    )


def keep_all_peak(chain: Chain) -> int:
    """Peak memory of the schedule that offloads nothing (by the simulator)."""
    platform = Platform(memory=2**62, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    return simulate(chain, platform, Schedule.keep_all(chain.length)).peak_memory


__all__ += ["keep_all_peak", "check_platform_for"]
