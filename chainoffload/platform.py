"""The platform: GPU memory for activations and the host link that transfers use."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ._jsonio import JsonIO
from .units import parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["Platform", "PlatformError"]


class PlatformError(ValueError):
    """A platform's data is malformed; the message names the field and the value."""


@dataclasses.dataclass(frozen=True)
class Platform(JsonIO):
    """GPU memory limit and the GPU-host link.

    Parameters
    ----------
    memory
        Bytes of GPU memory available to activations (weights and optimizer state are outside it).
    bandwidth_d2h, bandwidth_h2d
        Link bandwidth in bytes per second, device to host and host to device. ``inf`` makes a
        transfer cost only the latency; ``0`` means no transfer is possible (a schedule that
        offloads anything is then rejected).
    latency
        Fixed cost of each transfer in seconds.
    duplex
        True: D2H and H2D are independent channels (PCIe with two copy engines). False: one
        shared channel.

    Notes
    -----
    Transfer time of x bytes is ``latency + x / bandwidth``.
    """

    _json_label = "platform"
    _json_error = PlatformError

    memory: int
    bandwidth_d2h: float
    bandwidth_h2d: float
    latency: float = 0.0
    duplex: bool = True

    def __post_init__(self) -> None:
        mem = self.memory
        if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not math.isfinite(mem) or mem < 0:
            raise PlatformError(f"platform.memory: {mem!r} must be a finite number of bytes >= 0")
        if float(mem) != math.floor(float(mem)):
            raise PlatformError(f"platform.memory: {mem!r} must be a whole number of bytes")
        object.__setattr__(self, "memory", int(mem))
        for name in ("bandwidth_d2h", "bandwidth_h2d"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
                raise PlatformError(f"platform.{name}: {v!r} must be a bandwidth >= 0 (bytes/s; inf allowed)")
            object.__setattr__(self, name, float(v))
        lat = self.latency
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat < 0:
            raise PlatformError(f"platform.latency: {lat!r} must be a finite time >= 0 (seconds)")
        object.__setattr__(self, "latency", float(lat))
        if not isinstance(self.duplex, bool):
            raise PlatformError(f"platform.duplex: {self.duplex!r} must be true or false")

    def d2h_time(self, nbytes: int) -> float:
        """Time of a device-to-host copy of ``nbytes``."""
        return _transfer_time(nbytes, self.bandwidth_d2h, self.latency)

    def h2d_time(self, nbytes: int) -> float:
        """Time of a host-to-device copy of ``nbytes``."""
        return _transfer_time(nbytes, self.bandwidth_h2d, self.latency)

    @property
    def can_transfer(self) -> bool:
        """Whether both directions have a bandwidth above zero."""
        return self.bandwidth_d2h > 0 and self.bandwidth_h2d > 0

    def replace(self, **changes: Any) -> "Platform":
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_memory(self, memory: int) -> "Platform":
        """A copy with another memory limit."""
        return dataclasses.replace(self, memory=int(memory))

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The platform as docs/model.md's JSON object."""
        return {
            "memory": self.memory,
            "bandwidth_d2h": self.bandwidth_d2h,
            "bandwidth_h2d": self.bandwidth_h2d,
            "latency": self.latency,
            "duplex": self.duplex,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Platform":
        """Build a platform from its JSON object. Human units are accepted in strings."""
        if not isinstance(data, Mapping):
            raise PlatformError(f"platform: expected a JSON object, got {type(data).__name__}")
        known = {"memory", "bandwidth_d2h", "bandwidth_h2d", "latency", "duplex"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlatformError(f"platform: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [k for k in ("memory", "bandwidth_d2h", "bandwidth_h2d") if k not in data]
        if missing:
            raise PlatformError(f"platform: missing field(s) {', '.join(missing)}")
        try:
            memory = data["memory"]
            if isinstance(memory, str):
                memory = parse_bytes(memory, field="platform.memory")
            d2h = data["bandwidth_d2h"]
            if isinstance(d2h, str):
                d2h = parse_bandwidth(d2h, field="platform.bandwidth_d2h")
            h2d = data["bandwidth_h2d"]
            if isinstance(h2d, str):
                h2d = parse_bandwidth(h2d, field="platform.bandwidth_h2d")
            latency = data.get("latency", 0.0)
            if isinstance(latency, str):
                latency = parse_seconds(latency, field="platform.latency")
        except ValueError as exc:
            raise PlatformError(str(exc)) from None
        return cls(memory=memory, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=latency, duplex=data.get("duplex", True))


def _transfer_time(nbytes: int, bandwidth: float, latency: float) -> float:
    if bandwidth <= 0:
        return math.inf
    return latency + nbytes / bandwidth
