"""What every solver returns: a status, the schedule, and figures taken from the simulator."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from .schedule import Schedule

__all__ = ["Result", "Status"]


class Status(enum.StrEnum):
    """Outcome of a solver run (a status, not an exception: see STYLE.md, habit 4)."""

    OPTIMAL = "optimal"  #: proven optimal for the method's model
    FEASIBLE = "feasible"  #: a schedule the simulator accepts, optimality not proven
    INFEASIBLE = "infeasible"  #: the method found no schedule within the memory limit
    TIMEOUT = "timeout"  #: the time limit ran out before any schedule was found
    ERROR = "error"  #: the method failed (its schedule was rejected by the simulator, or it crashed)

    def __str__(self) -> str:
        return self.value

    @property
    def has_schedule(self) -> bool:
        """Whether this status comes with a schedule the simulator accepted."""
        return self in (Status.OPTIMAL, Status.FEASIBLE)


@dataclasses.dataclass(frozen=True, eq=False)
class Result:
    """One solver run.

    Attributes
    ----------
    method
        Registry name of the method.
    status
        See :class:`Status`.
    schedule
        The schedule found (``None`` when there is none).
    makespan
        The simulator's makespan of ``schedule`` (``inf`` when there is no feasible schedule).
    lower_bound
        A proven lower bound on the makespan of every feasible schedule of the problem (at
        least sum(fwd) + sum(bwd)); ``nan`` when the instance is infeasible for the method.
    peak_memory
        The simulator's peak memory of ``schedule`` (0 when there is none).
    offloaded_bytes
        Bytes the schedule copies to the host.
    runtime
        Wall-clock seconds the method took.
    min_memory
        For an infeasible result, the smallest memory limit at which this method would find a
        feasible schedule (``None`` when unknown or not applicable).
    timeline
        The simulator's :class:`~chainoffload.Timeline` of ``schedule``, when there is one.
    info
        Method-specific figures (e.g. LP value, DP slots, CP-SAT bound, iterations).
    message
        A sentence for people, e.g. why a result is infeasible.
    """

    method: str
    status: Status
    schedule: Schedule | None = None
    makespan: float = math.inf
    lower_bound: float = math.nan
    peak_memory: int = 0
    offloaded_bytes: int = 0
    runtime: float = 0.0
    min_memory: int | None = None
    timeline: Any = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    message: str = ""

    @property
    def feasible(self) -> bool:
        """Whether the result carries a schedule the simulator accepted."""
        return self.status.has_schedule

    @property
    def gap(self) -> float:
        """makespan / lower_bound - 1 (``nan`` without a feasible schedule or bound)."""
        if not self.feasible or not (self.lower_bound > 0):
            return math.nan if not self.feasible else 0.0
        return self.makespan / self.lower_bound - 1.0

    def replace(self, **changes: Any) -> Result:
        """A copy with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The CLI's ``--json`` object (README, "Command line"): plain data, infinities as ``null``."""

        def num(x: float | None) -> float | None:
            if x is None or not math.isfinite(x):
                return None
            return x

        return {
            "method": self.method,
            "status": self.status.value,
            "makespan": num(self.makespan),
            "lower_bound": num(self.lower_bound),
            "gap": num(self.gap),
            "peak_memory": self.peak_memory,
            "offloaded_bytes": self.offloaded_bytes,
            "runtime": self.runtime,
            "min_memory": self.min_memory,
            "message": self.message,
            "info": _plain(self.info),
            "schedule": None if self.schedule is None else self.schedule.to_dict(),
        }


def _plain(obj: Any) -> Any:
    """JSON-safe copy of ``info`` (numpy scalars to Python, non-finite floats to None)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
