import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare.py"


@pytest.mark.thorough  # a benchmark's quick run: every method over a small sweep, in a fresh process
def test_compare_quick_runs_and_writes_table_and_plots(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "compare-quick.md").read_text()
    assert "| keep-all |" in md and "lower bound" in md
    pngs = list(tmp_path.glob("compare-*.png"))
    assert pngs and all(p.stat().st_size > 5000 for p in pngs)
