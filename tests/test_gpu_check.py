"""benchmarks/gpu_check.py's dry run on CPU: it profiles, solves, trains (chains with a plan of
their own, GPT-2 and ResNet-50 in place with the one-liner) and prints its table."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.thorough  # trains four workloads in a fresh process; the fast profile keeps the refusal below
def test_gpu_check_dry_run_on_cpu_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| workload | run |") and "measured step" in lines[0] and "predicted peak" in lines[0]
    body = lines[1:]
    for workload in ("resnet-like", "gpt-like", "resnet50", "gpt2"):
        runs = [line for line in body if line.startswith(f"| {workload} |")]
        assert any("plain training" in r for r in runs) and any("save_on_cpu" in r for r in runs)
        offloading = [r for r in runs if "not judged on CPU" in r and "at checkpointing's memory" not in r]
        assert len(offloading) == 3, runs  # three memory limits, each with a schedule
        at_ck = [r for r in runs if "at checkpointing's memory" in r]
        if workload in ("resnet50", "gpt2"):
            # Checkpointing every block, beside rotor, joint and offload-all at the memory it holds.
            ck = next(r for r in at_ck if "checkpoint" in r.split("|")[2])
            assert [c.strip() for c in ck.strip("|").split("|")][9] == "0", ck  # the same gradients as plain training
            recomputing = 0
            for method in ("rotor", "joint", "offload-all"):
                row = next(r for r in at_ck if f": {method} @ " in r)  # trained, or refused with offload()'s reason
                cells = [c.strip() for c in row.strip("|").split("|")]
                if "not judged on CPU" in row:
                    assert cells[9] == "0", row  # the same gradients as plain training
                    planned, moved = (c.strip() for c in cells[2].split("/"))
                    assert planned == moved, row
                    recomputing += "blocks recomputed" in cells[1] and not cells[1].split(", ")[-1].startswith("0 blocks")
                else:
                    assert "no schedule fits" in cells[2], row
            assert recomputing, at_ck  # a plan that recomputes ran on each model
        else:
            assert not at_ck, runs
        for r in offloading:
            cells = [c.strip() for c in r.strip("|").split("|")]
            planned, moved = (c.strip() for c in cells[2].split("/"))
            assert planned == moved  # bytes really moved are the plan's
            assert cells[9] == "0"  # gradients identical to plain training
        assert any(not r.split("|")[3].strip().startswith("0 B") for r in offloading)  # something offloaded
    assert "Targets: step time <= 1.05x" in out and "within 2 %" in out


def test_gpu_check_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--quick"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr
