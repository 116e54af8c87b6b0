import math

import pytest

from chainoffload.units import format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_seconds


@pytest.mark.parametrize(
    "text, expected",
    [
        ("6GiB", 6 * 1024**3),
        ("900MB", 900 * 10**6),
        ("512 KiB", 512 * 1024),
        ("1.5GB", 1_500_000_000),
        ("123456", 123456),
        (4096, 4096),
        ("16 gib", 16 * 1024**3),
        ("10B", 10),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1GB", "abc", "5 parsecs", "nan", "inf", True])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match="memory"):
        parse_bytes(text)


@pytest.mark.parametrize(
    "text, expected",
    [("12GB/s", 12e9), ("16 GiB/s", 16 * 1024**3), ("1e10", 1e10), ("25GBps", 25e9), ("inf", math.inf), (0, 0.0)],
)
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize("text", ["-3GB/s", "fast", "12 parsec/s"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


@pytest.mark.parametrize("text, expected", [("5us", 5e-6), ("0.2ms", 2e-4), ("1e-5", 1e-5), ("2s", 2.0), (0, 0.0)])
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["-1us", "soon", "inf"])
def test_parse_seconds_rejects(text):
    with pytest.raises(ValueError, match="latency"):
        parse_seconds(text)


def test_format():
    assert format_bytes(1536 * 1024**2) == "1.50 GiB"
    assert format_bytes(12) == "12 B"
    assert format_seconds(0.0123) == "12.300 ms"
    assert format_seconds(2.5) == "2.500 s"
    assert format_seconds(5e-6) == "5.0 us"


def test_sizes_parse_exactly():
    # No float rounding on the way: the largest memory limit is exactly int64's maximum.
    assert parse_bytes("9223372036854775807") == 2**63 - 1
    assert parse_bytes("9223372036854775808") == 2**63
    assert parse_bytes("1.5GiB") == 3 * 2**29


def test_huge_durations_stay_short():
    assert format_seconds(1e300) == "1e+300 s"
    assert format_seconds(12345.0) == "12345.000 s"


def test_format_percent_never_rounds_a_share_to_zero():
    from chainoffload.units import format_percent

    assert [format_percent(x) for x in (0.0, 0.5712, 1.0, 0.00012345, 0.0099)] == ["0%", "57%", "100%", "0.012%", "0.99%"]
