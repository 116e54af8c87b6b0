"""A schedule file that says what it was made for: the chain, the platform, the solver's figures.

A :class:`~chainoffload.Schedule` stays a pure value (the compute sequence and the transfers);
:class:`ScheduleFile` wraps one with what ``chainoffload solve --out`` knows when it writes it,
so that ``simulate``, ``plot`` and ``verify`` can replay it on the platform it was solved for and
refuse it on another chain. The JSON is the schedule's object with three more keys, each
optional (a file without them, as written before they existed, still loads)::

    {"compute": [...], "transfers": [...],
     "chain": {"name": "resnet50", "fingerprint": "sha256:..."},
     "platform": {"memory": ..., "bandwidth_d2h": ..., "bandwidth_h2d": ..., "latency": ..., "duplex": ...},
     "solver": {"method": "best", "status": "feasible", "makespan": 0.112955,
                "lower_bound": 0.1104, "peak_memory": 4294967296}}

``chain.fingerprint`` is :meth:`Chain.fingerprint`; ``platform`` is the platform's own JSON
object; ``solver`` holds the method, its status and the simulator's figures (seconds and bytes;
``null`` when not finite). Parsing is strict: unknown keys, strings where numbers belong and a
malformed fingerprint are errors.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from ._jsonio import JsonIO, is_number
from .chain import Chain
from .platform import Platform, PlatformError
from .result import Result, Status
from .schedule import Schedule, ScheduleError

__all__ = ["ScheduleFile"]

#: The keys a schedule file may hold beyond the schedule's own (``compute``, ``transfers``).
METADATA_KEYS = ("chain", "platform", "solver")
_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")
_STATUSES = tuple(s.value for s in Status)


@dataclasses.dataclass(frozen=True)
class ScheduleFile(JsonIO):
    """A schedule and what it was made for (every field but ``schedule`` may be ``None``).

    Attributes
    ----------
    schedule
        The schedule itself.
    chain_name, fingerprint
        The chain's name and :meth:`Chain.fingerprint`.
    platform
        The platform it was solved for.
    method, status
        The method that made it and the status it reported.
    makespan, lower_bound, peak_memory
        The solver's figures, as the simulator found them on ``platform`` (seconds, bytes).
    """

    _json_label = "schedule"
    _json_error = ScheduleError

    schedule: Schedule
    chain_name: str | None = None
    fingerprint: str | None = None
    platform: Platform | None = None
    method: str | None = None
    status: str | None = None
    makespan: float | None = None
    lower_bound: float | None = None
    peak_memory: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, Schedule):
            raise ScheduleError(f"schedule: expected a Schedule, got {type(self.schedule).__name__}")
        if self.fingerprint is not None and not (isinstance(self.fingerprint, str) and _FINGERPRINT.match(self.fingerprint)):
            raise ScheduleError(f"schedule.chain.fingerprint: {self.fingerprint!r:.80} is not 'sha256:' and 64 hex digits")
        if self.platform is not None and not isinstance(self.platform, Platform):
            raise ScheduleError(f"schedule.platform: expected a Platform, got {type(self.platform).__name__}")

    @classmethod
    def from_result(cls, chain: Chain, platform: Platform, result: Result) -> ScheduleFile:
        """The file ``solve --out`` writes for ``result`` (which must hold a schedule).

        Raises
        ------
        ValueError
            If ``result`` has no schedule.
        """
        if result.schedule is None:
            raise ValueError(f"schedule: method {result.method!r} found no schedule ({result.status})")
        return cls(
            schedule=result.schedule,
            chain_name=chain.name,
            fingerprint=chain.fingerprint(),
            platform=platform,
            method=result.method,
            status=result.status.value,
            makespan=_finite(result.makespan),
            lower_bound=_finite(result.lower_bound),
            peak_memory=int(result.peak_memory),
        )

    def check_chain(self, chain: Chain) -> None:
        """Raise :class:`ScheduleError` if the file records another chain's fingerprint.

        A file without a fingerprint (written before they existed) passes.
        """
        if self.fingerprint is None:
            return
        own = chain.fingerprint()
        if own != self.fingerprint:
            made_for = f"chain {self.chain_name!r}" if self.chain_name is not None else "another chain"
            # Long enough to tell them apart: through the first digit that differs, and at least
            # 12 hex digits ("sha256:" is 7 characters).
            first = next(k for k, (a, b) in enumerate(zip(self.fingerprint, own, strict=True)) if a != b)
            n = max(19, first + 4)
            raise ScheduleError(
                f"schedule: made for {made_for} (fingerprint {self.fingerprint[:n]}...), not for chain "
                f"{chain.name!r} (fingerprint {own[:n]}...): its numbers differ"
            )

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The schedule's JSON object plus the keys that are known (see the module's text)."""
        out = self.schedule.to_dict()
        if self.chain_name is not None or self.fingerprint is not None:
            out["chain"] = {k: v for k, v in (("name", self.chain_name), ("fingerprint", self.fingerprint)) if v is not None}
        if self.platform is not None:
            out["platform"] = self.platform.to_dict()
        solver = {
            "method": self.method,
            "status": self.status,
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "peak_memory": self.peak_memory,
        }
        if any(v is not None for v in solver.values()):
            out["solver"] = solver
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScheduleFile:
        """Parse a schedule file; the three metadata keys are optional, each checked strictly."""
        if not isinstance(data, Mapping):
            raise ScheduleError(f"schedule: expected a JSON object, got {type(data).__name__}")
        schedule = Schedule.from_dict(data)
        fields: dict[str, Any] = {}
        chain = data.get("chain")
        if chain is not None:
            _check_keys(chain, "schedule.chain", {"name", "fingerprint"})
            name = chain.get("name")
            if name is not None and not isinstance(name, str):
                raise ScheduleError(f"schedule.chain.name: expected a string, got {name!r:.40}")
            fields.update(chain_name=name, fingerprint=chain.get("fingerprint"))
        if data.get("platform") is not None:
            try:
                fields["platform"] = Platform.from_dict(data["platform"])
            except PlatformError as exc:
                raise ScheduleError(f"schedule.{exc}") from None
        solver = data.get("solver")
        if solver is not None:
            _check_keys(solver, "schedule.solver", {"method", "status", "makespan", "lower_bound", "peak_memory"})
            method, status = solver.get("method"), solver.get("status")
            if method is not None and not isinstance(method, str):
                raise ScheduleError(f"schedule.solver.method: expected a string, got {method!r:.40}")
            if status is not None and status not in _STATUSES:
                raise ScheduleError(f"schedule.solver.status: {status!r:.40} is not one of {', '.join(_STATUSES)}")
            fields.update(method=method, status=status)
            for key in ("makespan", "lower_bound"):
                value = solver.get(key)
                if value is not None and (not is_number(value) or not math.isfinite(value) or value < 0):
                    raise ScheduleError(f"schedule.solver.{key}: {value!r:.40} must be null or a finite number of seconds >= 0")
                fields[key] = None if value is None else float(value)
            peak = solver.get("peak_memory")
            if peak is not None and (not is_number(peak) or not isinstance(peak, int) or peak < 0):
                raise ScheduleError(f"schedule.solver.peak_memory: {peak!r:.40} must be null or an integer number of bytes >= 0")
            fields["peak_memory"] = peak
        return cls(schedule, **fields)


def _check_keys(obj: Any, where: str, known: set[str]) -> None:
    if not isinstance(obj, Mapping):
        raise ScheduleError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(map(str, obj)) - known)
    if unknown:
        raise ScheduleError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _finite(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
