"""benchmarks/offload_models.py's search for the least memory offload() accepts."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("offload_models", BENCH / "offload_models.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_least_accepted_finds_the_threshold_and_tries_the_floor_first():
    script = _script()
    calls = []

    def accepts_from(threshold):
        def accepts(memory):
            calls.append(memory)
            return memory >= threshold
        return accepts

    assert script.least_accepted(accepts_from(1000), 1000, 5000) == 1000 and calls == [1000]
    calls.clear()
    found = script.least_accepted(accepts_from(1010), 1000, 5000)
    assert 1010 <= found <= 1010 * (1 + script.BISECT_TOL) + 1
    assert calls[:2] == [1000, 1020]  # the floor, then the floor + 2 %
    found = script.least_accepted(accepts_from(3333), 1000, 5000)
    assert 3333 <= found <= 3333 * (1 + script.BISECT_TOL) + 1
    assert script.least_accepted(accepts_from(6000), 1000, 5000) is None
    with pytest.raises(ValueError, match="floor, top"):
        script.least_accepted(accepts_from(1), 10, 5)
