"""Human units for sizes, bandwidths and times ("6GiB", "12GB/s", "5us").

Decimal prefixes (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers
of 1024, as in the SI and IEC standards; "B" alone is bytes. A bare number is taken as it is
(bytes, bytes per second or seconds).
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_bytes", "parse_bandwidth", "parse_seconds", "format_bytes", "format_seconds"]

_SIZE_FACTORS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}

# divisors, not factors: 10 / 1e6 is exactly 1e-5, 10 * 1e-6 is not
_TIME_DIVISORS = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity)"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z]*)\s*$", re.IGNORECASE)
_BW_RE = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z]*?)\s*(?:/\s*s|ps)?\s*$", re.IGNORECASE)
_TIME_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zµ]*)\s*$", re.IGNORECASE)


def _number(text: str) -> float:
    return math.inf if text.lower() in ("inf", "infinity") else float(text)


def parse_bytes(value: str | int | float, *, field: str = "memory") -> int:
    """Parse a size such as ``"6GiB"``, ``"900MB"``, ``"512 KiB"`` or ``123456`` into bytes.

    Parameters
    ----------
    value
        A number of bytes or a string with a decimal or binary unit.
    field
        Name used in the error message.

    Raises
    ------
    ValueError
        If the text is not a size, is negative, or is not finite.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a size")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _SIZE_RE.match(str(value))
        if not match:
            raise ValueError(f"{field}: {value!r} is not a size (examples: 6GiB, 900MB, 1048576)")
        number, unit = _number(match.group(1)), match.group(2).lower()
        if unit not in _SIZE_FACTORS:
            raise ValueError(f"{field}: unknown size unit {match.group(2)!r} in {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a finite size >= 0")
    total = number * _SIZE_FACTORS[unit]
    return int(round(total))


def parse_bandwidth(value: str | int | float, *, field: str = "bandwidth") -> float:
    """Parse a bandwidth such as ``"12GB/s"``, ``"16 GiB/s"`` or ``1.2e10`` into bytes per second.

    ``"inf"`` is accepted (transfers then cost only the latency).

    Raises
    ------
    ValueError
        If the text is not a bandwidth or is negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a bandwidth")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _BW_RE.match(str(value))
        if not match:
            raise ValueError(f"{field}: {value!r} is not a bandwidth (examples: 12GB/s, 16GiB/s)")
        number, unit = _number(match.group(1)), match.group(2).lower()
        if unit not in _SIZE_FACTORS:
            raise ValueError(f"{field}: unknown unit {match.group(2)!r} in {value!r}")
    if math.isnan(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a bandwidth >= 0")
    return number * _SIZE_FACTORS[unit]


def parse_seconds(value: str | int | float, *, field: str = "latency") -> float:
    """Parse a duration such as ``"5us"``, ``"0.2ms"`` or ``1e-5`` into seconds.

    Raises
    ------
    ValueError
        If the text is not a duration, is negative or not finite.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _TIME_RE.match(str(value))
        if not match:
            raise ValueError(f"{field}: {value!r} is not a duration (examples: 5us, 0.2ms, 1e-5)")
        number, unit = _number(match.group(1)), match.group(2).lower()
        if unit not in _TIME_DIVISORS:
            raise ValueError(f"{field}: unknown time unit {match.group(2)!r} in {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a finite duration >= 0")
    return number / _TIME_DIVISORS[unit]


def format_bytes(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``1.50 GiB``."""
    if not math.isfinite(n):
        return str(n)
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{int(n)} B"


def format_seconds(t: float) -> str:
    """Format a duration with a readable unit, e.g. ``12.3 ms``."""
    if not math.isfinite(t):
        return str(t)
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"
