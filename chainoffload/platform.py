"""The platform: GPU memory for activations and the host link that transfers use."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._jsonio import JsonIO, is_number
from .units import format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["Platform", "PlatformError", "MAX_MEMORY"]

#: The largest memory limit (bytes): int64's maximum, what the kernels count in.
MAX_MEMORY = 2**63 - 1


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
        if not is_number(mem) or not math.isfinite(mem) or mem < 0:
            raise PlatformError(f"platform.memory: {mem!r:.40} must be a finite number of bytes >= 0")
        if float(mem) != math.floor(float(mem)):
            raise PlatformError(f"platform.memory: {mem!r} must be a whole number of bytes")
        if int(mem) > MAX_MEMORY:
            raise PlatformError(
                f"platform.memory: {int(mem)} B is above 2^63 - 1 B, the largest limit int64 holds "
                "(any limit above the chain's keep-all peak already means no limit)"
            )
        object.__setattr__(self, "memory", int(mem))
        for name in ("bandwidth_d2h", "bandwidth_h2d"):
            v = getattr(self, name)
            if not is_number(v) or math.isnan(v) or v < 0:
                raise PlatformError(f"platform.{name}: {v!r:.40} must be a bandwidth >= 0 (bytes/s; inf allowed)")
            object.__setattr__(self, name, float(v))
        lat = self.latency
        if not is_number(lat) or not math.isfinite(lat) or lat < 0:
            raise PlatformError(f"platform.latency: {lat!r:.40} must be a finite time >= 0 (seconds)")
        object.__setattr__(self, "latency", float(lat))
        if not isinstance(self.duplex, (bool, np.bool_)):
            raise PlatformError(f"platform.duplex: {self.duplex!r:.40} must be true or false")
        object.__setattr__(self, "duplex", bool(self.duplex))

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

    def replace(self, **changes: Any) -> Platform:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_memory(self, memory: int) -> Platform:
        """A copy with another memory limit."""
        return dataclasses.replace(self, memory=int(memory))

    def describe(self, *, memory: bool = True) -> str:
        """One line for people, e.g. ``4.00 GiB, 25 GB/s, latency 10.0 us, duplex``.

        Parameters
        ----------
        memory
            Whether to start with the memory limit (a sweep over memories leaves it out).
        """
        def bw(x: float) -> str:
            if math.isinf(x):
                return "inf"
            for factor, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
                if x >= factor:
                    return f"{x / factor:.3g} {unit}"
            return f"{x:.3g} B/s"

        if self.bandwidth_d2h == self.bandwidth_h2d:
            link = bw(self.bandwidth_d2h)
        else:
            link = f"D2H {bw(self.bandwidth_d2h)}, H2D {bw(self.bandwidth_h2d)}"
        parts = [format_bytes(self.memory)] if memory else []
        parts += [link, f"latency {format_seconds(self.latency)}", "duplex" if self.duplex else "half duplex"]
        return ", ".join(parts)

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
    def from_dict(cls, data: Mapping[str, Any]) -> Platform:
        """Build a platform from its JSON object: numbers only (bytes, bytes/s, seconds), no
        unknown or missing keys (``latency`` defaults to 0, ``duplex`` to true)."""
        if not isinstance(data, Mapping):
            raise PlatformError(f"platform: expected a JSON object, got {type(data).__name__}")
        known = {"memory", "bandwidth_d2h", "bandwidth_h2d", "latency", "duplex"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlatformError(f"platform: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        missing = [k for k in ("memory", "bandwidth_d2h", "bandwidth_h2d") if k not in data]
        if missing:
            raise PlatformError(f"platform: missing field(s) {', '.join(missing)}")
        for key, parse in (("memory", parse_bytes), ("bandwidth_d2h", parse_bandwidth), ("bandwidth_h2d", parse_bandwidth), ("latency", parse_seconds)):
            value = data.get(key, 0.0)
            if isinstance(value, str):
                # Human units belong to the command line's flags; a file holds JSON numbers.
                try:
                    hint = f" (the number {parse(value, field=key)!r})"
                except ValueError:
                    hint = ""
                raise PlatformError(f"platform.{key}: {value!r:.40} is a string; write a JSON number{hint}")
        return cls(
            memory=data["memory"],
            bandwidth_d2h=data["bandwidth_d2h"],
            bandwidth_h2d=data["bandwidth_h2d"],
            latency=data.get("latency", 0.0),
            duplex=data.get("duplex", True),
        )


def _transfer_time(nbytes: int, bandwidth: float, latency: float) -> float:
    if bandwidth <= 0:
        return math.inf
    return latency + nbytes / bandwidth
