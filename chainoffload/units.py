"""Human units for sizes, bandwidths and times ("6GiB", "12GB/s", "5us").

Decimal prefixes (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers
of 1024, as in the SI and IEC standards; "B" alone is bytes. A bare number is taken as it is
(bytes, bytes per second or seconds).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["parse_bytes", "parse_bandwidth", "parse_seconds", "format_bytes", "format_seconds", "format_percent"]

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


def _split(value: str | int | float, field: str, what: str, regex: re.Pattern, units: dict, examples: str) -> tuple[float, float]:
    """(number, unit factor) of ``value``; bare numbers have factor 1."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a {what}")
    if isinstance(value, (int, float)):
        return float(value), 1
    match = regex.match(str(value))
    if not match:
        raise ValueError(f"{field}: {value!r} is not a {what} (examples: {examples})")
    unit = match.group(2).lower()
    if unit not in units:
        raise ValueError(f"{field}: unknown {what} unit {match.group(2)!r} in {value!r}")
    return _number(match.group(1)), units[unit]


def parse_bytes(value: str | int | float, *, field: str = "memory") -> int:
    """Parse a size such as ``"6GiB"``, ``"900MB"``, ``"512 KiB"`` or ``123456`` into bytes.

    A size that is not a whole number of bytes is rounded down (``"166.6"`` is 166 B): a memory
    limit is a ceiling, and rounding it up would let a schedule go over what was asked.

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
    number, factor = _split(value, field, "size", _SIZE_RE, _SIZE_FACTORS, "6GiB, 900MB, 1048576")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a finite size >= 0")
    # A fraction of a byte is floored, never rounded up: a memory limit of 166.6 B must not
    # let a schedule peak at 167 B.
    if isinstance(value, str):
        # Exact: "9223372036854775807" is that many bytes, not the float nearest to it.
        return math.floor(Fraction(_SIZE_RE.match(value).group(1)) * factor)
    if isinstance(value, int):
        return value
    return math.floor(number * factor)


def parse_bandwidth(value: str | int | float, *, field: str = "bandwidth") -> float:
    """Parse a bandwidth such as ``"12GB/s"``, ``"16 GiB/s"``, ``"100Gb/s"`` or ``1.2e10`` into bytes per second.

    An upper-case ``B`` is a byte, a lower-case ``b`` a bit (``"100Gb/s"`` and ``"100Gbps"`` are
    12.5 GB/s). ``"inf"`` is accepted (transfers then cost only the latency); a number too
    large for a float (``"1e400"``) is refused, not taken as infinite.

    Raises
    ------
    ValueError
        If the text is not a bandwidth, is negative, or is a finite number that overflows.
    """
    number, factor = _split(value, field, "bandwidth", _BW_RE, _SIZE_FACTORS, "12GB/s, 16GiB/s, 100Gb/s")
    if math.isnan(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a bandwidth >= 0")
    if isinstance(value, str):
        unit = _BW_RE.match(value).group(2)
        if unit.endswith("b"):
            # A lower-case b is a bit, as network and PCIe rates are quoted (100Gb/s, 25 Gbps):
            # read as bytes it was 8 times the link.
            factor = Fraction(factor, 8)
        if math.isinf(number) and _BW_RE.match(value).group(1).lower() not in ("inf", "infinity", "+inf", "+infinity"):
            raise ValueError(f"{field}: {value!r} is too large to be a number of bytes per second; write inf for a link "
                             "whose transfers cost only the latency")
    result = number * float(factor) if factor != 1 else number
    if math.isinf(result) and not math.isinf(number):
        raise ValueError(f"{field}: {value!r} is too large to be a number of bytes per second")
    return result


def parse_seconds(value: str | int | float, *, field: str = "latency") -> float:
    """Parse a duration such as ``"5us"``, ``"0.2ms"`` or ``1e-5`` into seconds.

    Raises
    ------
    ValueError
        If the text is not a duration, is negative or not finite.
    """
    number, divisor = _split(value, field, "duration", _TIME_RE, _TIME_DIVISORS, "5us, 0.2ms, 1e-5")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: {value!r} must be a finite duration >= 0")
    return number / divisor


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
    if abs(t) >= 1e6:
        return f"{t:.3g} s"
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"


def format_percent(fraction: float) -> str:
    """Format a fraction as a percentage that never rounds a nonzero share to 0, e.g. ``57%``, ``0.013%``."""
    if not math.isfinite(fraction):
        return str(fraction)
    pct = 100.0 * fraction
    if pct == 0 or abs(pct) >= 1:
        return f"{pct:.0f}%"
    return f"{pct:.2g}%"
