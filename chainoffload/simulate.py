"""The one simulator: every schedule of every solver, and every test, goes through it.

:func:`simulate` is the entry point: it validates the schedule, replays it and returns a
:class:`Timeline`. The rules it applies are ``docs/model.md``'s.

Array-level replay (private; for search loops that hold candidates as arrays)
------------------------------------------------------------------------------
A search that evaluates many candidate schedules need not build a :class:`Schedule` for each:

1. ``structure = chainoffload.schedule.resolve(L, op_kind, op_stage, tr_kind, tr_unit, tr_op,
   tr_at, tr_before)`` checks the compute sequence (the fields must be in range, as
   :meth:`Schedule.arrays` encodes them: int64 arrays; op kinds are codes of ``OP_KINDS``,
   transfer kind 0 = offload, 1 = prefetch, ``at`` 0 = start, 1 = end, ``before`` -1 when
   absent; every offload has its prefetch, triggered no earlier) and resolves it into a
   :class:`~chainoffload.schedule.Structure`; it raises :class:`ScheduleError` if the sequence
   breaks a rule. For the fixed order, ``op_kind`` / ``op_stage`` come from
   ``Schedule.keep_all(L).arrays()``.
2. ``out = replay(chain, platform, structure)`` runs the kernel and returns its raw tuple
   ``(op_start, op_end, tr_start, tr_end, mem_time, mem_bytes, mem_who, peak, peak_time, rule,
   who, viol_time, viol_bytes)``: ``rule`` is 0 (feasible), 1 (memory) or 2 (read); ``who``
   encodes op k as k and transfer t as ``-(t + 1)``; the makespan is ``op_end[-1]``.

Both steps are Numba kernels underneath (``chainoffload._kernels.structure.resolve_kernel`` and
``chainoffload._kernels.simulate.replay_kernel``), which jitted code can call directly.
Only the winner of a search needs to become a :class:`Schedule` and go through :func:`simulate`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ._kernels import lazy
from .chain import Chain
from .platform import Platform, PlatformError
from .schedule import Schedule, Structure

__all__ = ["simulate", "Timeline", "Violation", "VIOLATION_RULES"]

_ksim = lazy("simulate")  # imports Numba on first use only
_kst = lazy("structure")

#: The rules a well-formed schedule can break, as named in :attr:`Violation.rule`.
VIOLATION_RULES = ("memory", "read")


@dataclasses.dataclass(frozen=True)
class Violation:
    """The first rule a schedule breaks.

    Attributes
    ----------
    rule
        ``"memory"``: GPU memory goes over the limit; ``"read"``: an op reads data that is not
        on the GPU (an offload triggered before the data it copies is made, or an op that needs
        the copy a prefetch brings back while that prefetch is triggered only at or after its
        start).
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
        Bytes copied to the host (saved[i] for each offloaded unit, act[i] for a lone a_i).
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
    def serial_makespan(self) -> float:
        """The step time where copies do not overlap compute: every compute op's duration plus
        every transfer's, one after another (NOTE [ copies that do not overlap compute ]).

        Each term is this timeline's own (``op_end - op_start``, ``transfer_end -
        transfer_start``), so it is what the simulator timed, summed in schedule order. It is
        never below :attr:`makespan`: compute only ever waits while a transfer runs.
        """
        compute = float(np.sum(self.op_end - self.op_start))
        moved = float(np.sum(self.transfer_end - self.transfer_start)) if self.transfer_end.shape[0] else 0.0
        return compute + moved

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
        # Imported here so that simulating never loads the drawing code; chainoffload.plot
        # imports nothing of this module (it reads a Timeline's fields), so no circle closes.
        from .plot import plot_timeline

        return plot_timeline(self, path, **kwargs)


# NOTE [ copies that do not overlap compute ]
# The model of docs/model.md runs transfers on channels of their own, beside compute: what a GPU's
# copy engines do. A host whose "device" memory is host memory (PyTorch on CPU) has no such
# engine: the PyTorch adapter's copies there run inline on the compute thread, at their trigger,
# so a step takes the compute ops' time plus every copy's. Timeline.serial_makespan is that time,
# summed from the same simulation (the same op and transfer durations), not from a second
# simulator: the solvers keep planning for overlapped copies, and a caller that knows its copies
# do not overlap (the adapter, from its copy engine) compares and reports this figure instead of
# the makespan. The memory curve is the simulator's as it is: inline, a copy starts at its
# trigger, which is where the simulator starts it whenever its channel is free, and a channel
# here is busy for a copy's duration only (the CPU link's memcpy), so the two curves differ only
# where copies queue, which a CPU memcpy link seldom makes them do.


def _describe(schedule: Schedule, code: int) -> str:
    return schedule.op_name(code) if code >= 0 else schedule.transfer_name(-code - 1)


def check_platform_for(schedule: Schedule, platform: Platform) -> None:
    """Raise :class:`PlatformError` if the schedule moves data over a link of bandwidth 0."""
    if platform.bandwidth_d2h > 0 and platform.bandwidth_h2d > 0:
        return
    for t in schedule.transfers:
        if t.kind == "offload" and platform.bandwidth_d2h <= 0:
            raise PlatformError(f"platform.bandwidth_d2h: 0 but the schedule offloads unit {t.unit}")
        if t.kind == "prefetch" and platform.bandwidth_h2d <= 0:
            raise PlatformError(f"platform.bandwidth_h2d: 0 but the schedule prefetches unit {t.unit}")


def simulate(chain: Chain, platform: Platform, schedule: Schedule) -> Timeline:
    """Replay ``schedule`` on ``chain`` and ``platform`` event by event.

    Fixed-order and rematerializing schedules alike; the rules, and every decision taken where
    they leave room (trigger order, FIFO channels, waits, which copy of offloaded data an op
    reads, what happens at one instant, zero-length ops, the first rule broken), are stated in
    ``docs/model.md``.

    Never raises for an infeasible schedule: the result's ``violation`` names the first rule
    broken (the earliest in time; a ``read`` wins a tie with ``memory``), and the rest of the
    timeline is still computed by the same rules. Raises :class:`ScheduleError` for a malformed
    schedule (see :meth:`Schedule.validate`) and :class:`PlatformError` when it transfers over
    a link of bandwidth 0.

    Returns
    -------
    Timeline
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"simulate: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"simulate: platform must be a Platform, got {type(platform).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"simulate: schedule must be a Schedule, got {type(schedule).__name__}")
    schedule.validate(chain)
    check_platform_for(schedule, platform)
    structure = schedule._structure(chain.length)
    sizes = _sizes(chain)
    out = _replay(chain, platform, structure, sizes)
    moved = int(sizes[structure.tr_size[structure.tr_kind == 0]].sum()) if structure.tr_kind.shape[0] else 0
    return _timeline(chain, platform, schedule, out, moved)


_SIZE_CACHE: list = [None, None]


def _sizes(chain: Chain) -> np.ndarray:
    """The chain's size table (``_kernels.structure.size_table``), kept for the last chain seen."""
    if _SIZE_CACHE[0] is not chain:
        table = _kst.size_table(chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp)
        table.setflags(write=False)
        _SIZE_CACHE[:] = [chain, table]
    return _SIZE_CACHE[1]


def _replay(chain: Chain, platform: Platform, structure: Structure, sizes: np.ndarray) -> tuple:
    return _ksim.replay_kernel(
        chain.fwd,
        chain.bwd,
        chain.fwd_nosave,
        sizes,
        platform.memory,
        platform.bandwidth_d2h,
        platform.bandwidth_h2d,
        platform.latency,
        platform.duplex,
        *structure.kernel_args(),
    )


def replay(chain: Chain, platform: Platform, structure: Structure) -> tuple:
    """The kernel's raw outputs for a resolved schedule (private array-level entry; see the module doc).

    ``structure`` must come from :func:`chainoffload.schedule.resolve` for ``chain.length``;
    nothing is validated here, so a search loop pays only for the kernel.
    """
    return _replay(chain, platform, structure, _sizes(chain))


def _timeline(chain: Chain, platform: Platform, schedule: Schedule, out: tuple, moved: int) -> Timeline:
    (op_start, op_end, tr_start, tr_end, mem_time, mem_bytes, _mem_who, peak, peak_time, rule, who, vtime, vbytes) = out
    violation = None
    if rule != _ksim.RULE_NONE:
        name = _describe(schedule, int(who))
        if rule == _ksim.RULE_MEMORY:
            msg = (
                f"memory {int(vbytes)} B exceeds the limit {platform.memory} B by "
                f"{int(vbytes) - platform.memory} B at t={vtime:.6g}s ({name})"
            )
            violation = Violation("memory", name, float(vtime), int(vbytes), msg)
        elif rule == _ksim.RULE_READ:
            if name.startswith("O_"):
                msg = f"{name} is triggered at t={vtime:.6g}s, before the data it copies is made"
            else:
                msg = f"{name} at t={vtime:.6g}s reads offloaded data whose prefetch is triggered only at or after it"
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
        offloaded_bytes=moved,
        violation=violation,
    )


def keep_all_peak(chain: Chain) -> int:
    """Peak memory of the schedule that offloads nothing (by the simulator)."""
    platform = Platform(memory=2**62, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    return simulate(chain, platform, Schedule.keep_all(chain.length)).peak_memory


__all__ += ["keep_all_peak", "check_platform_for"]
