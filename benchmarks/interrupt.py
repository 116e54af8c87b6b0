"""Ctrl-C during a solve: how long the CLI takes to exit, with which code, and what it leaves.

Starts ``chainoffload solve ... --out`` on shipped networks with methods whose time goes to a
long Numba call (joint's DP at many slots), an OR-Tools search (cpsat) and Python mixed with
Numba (best), sends SIGINT after a delay, and reports the exit code, the time from the signal to
the exit, the bytes on stdout and the files left in the folder. The target (issue 12): exit 130
within a second, nothing on stdout, no file. ``--cold`` gives each run an empty Numba cache, so
the signal lands in a compile.

    python benchmarks/interrupt.py [--delays 3 6] [--cold]   # table on stdout, benchmarks/results/interrupt.md
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

CASES = {
    "joint, slots=8000 (Numba DP)": ("gpt2_48", ["--memory", "8GiB", "--method", "joint", "--option", "slots=8000"]),
    "cpsat, 60 s limit (OR-Tools)": ("resnet152", ["--memory", "6GiB", "--method", "cpsat", "--time-limit", "60"]),
    "best, 60 s limit (Python, Numba)": ("gpt2_48", ["--memory", "6GiB", "--method", "best", "--time-limit", "60"]),
}


def run(folder: Path, network: str, flags: list[str], delay: float, cold: bool) -> dict:
    env = dict(os.environ)
    if cold:
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")
    cli = [sys.executable, "-m", "chainoffload"]
    argv = cli + ["solve", f"{network}.json", *flags, "--out", "schedule.json"]
    proc = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as at a terminal, even under `&`
    time.sleep(delay)
    if proc.poll() is not None:
        proc.communicate()
        return {"note": "finished before the signal"}
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    elapsed = time.monotonic() - t0
    inputs = {f"{n}.json" for n, _ in CASES.values()}
    left = sorted(p.name for p in folder.iterdir() if p.name not in inputs)
    return {
        "code": proc.returncode,
        "ms": 1e3 * elapsed,
        "stdout": len(out),
        "stderr": err.strip().splitlines()[-1] if err.strip() else "",
        "left": left,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[3.0, 6.0], help="seconds from the start to the signal")
    parser.add_argument("--cold", action="store_true", help="an empty Numba cache for every run")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="interrupt-"))
    for network in {n for n, _ in CASES.values()}:
        subprocess.run([sys.executable, "-m", "chainoffload", "example", network, "-o", str(folder / f"{network}.json")], check=True, capture_output=True)
    lines = [
        f"Ctrl-C during `chainoffload solve --out` ({'cold: empty Numba cache' if args.cold else 'warm Numba cache'}); "
        "target: exit 130 within 1000 ms, nothing on stdout, no file left.",
        "",
        "| case | signal at | exit | signal to exit | stdout bytes | files left | last stderr line |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (network, flags) in CASES.items():
        for delay in args.delays:
            r = run(folder, network, flags, delay, args.cold)
            if "note" in r:
                lines.append(f"| {name} | {delay:g} s | - | - | - | - | {r['note']} |")
            else:
                lines.append(
                    f"| {name} | {delay:g} s | {r['code']} | {r['ms']:.0f} ms | {r['stdout']} | {', '.join(r['left']) or 'none'} | `{r['stderr']}` |"
                )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("interrupt-cold.md" if args.cold else "interrupt.md")).write_text(text)
    print()
    print(text)


if __name__ == "__main__":
    main()
