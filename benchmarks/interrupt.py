"""Signals at random moments of real commands: exit 130 / 143 with nothing left, or the whole answer.

Two modes.

``--random N`` (issue 33): runs each job once without a signal (the reference: its exit code,
its stdout figures, the bytes of its file, its wall time T), then N times with SIGINT or
SIGTERM (chosen at random) sent at a moment drawn uniformly from [0, 1.1 T]: the start-up,
reading, every solver phase (CP-SAT's search, SCIP's bound, Numba kernels), the writing and the
rename. Every run must end one of two ways:

* stopped: exit 130 (SIGINT) or 143 (SIGTERM), no file left in the folder (no target, no
  temporary), or death by the signal itself (-2 / -15, what a shell shows as 130 / 143) while
  Python is still importing, before the command line has started (nothing read or written yet);
* finished: the reference's exit code, its file byte for byte, and its figures (lower bound,
  makespan, status) identical: a signal never changes an answer, in particular never a bound.

The jobs: the README's main job's solve (ResNet-50 in 4 GiB, PCIe 4, ``--min-memory``, the
default method, ``--out``) and its plot; ``cpsat`` on resnet18 at 50 % of the way from the
offload floor to the keep-all peak (CP-SAT proves the optimum in seconds, after SCIP's bound);
``tradeoff`` on resnet18 with its plot.

``--delays`` (issue 12): Ctrl-C at fixed delays into long solves, time from the signal to the
exit, as before.

    python benchmarks/interrupt.py --random 20 [--seed 0] [--jobs main cpsat tradeoff]
    python benchmarks/interrupt.py [--delays 3 6] [--cold]

Results: benchmarks/results/interrupt.md (random mode, with the command and the machine load);
benchmarks/results/interrupt-delays.md and interrupt-cold.md (delays mode).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "joint, slots=8000 (Numba DP)": ("gpt2_48", ["--memory", "8GiB", "--method", "joint", "--option", "slots=8000"]),
    "cpsat, 60 s limit (OR-Tools)": ("resnet152", ["--memory", "6GiB", "--method", "cpsat", "--time-limit", "60"]),
    "best, 60 s limit (Python, Numba)": ("gpt2_48", ["--memory", "6GiB", "--method", "best", "--time-limit", "60"]),
}

PCIE4 = ["--bandwidth", "25GB/s", "--latency", "10us"]

#: name -> (network, argv after `chainoffload`, the file it writes, whether stdout is JSON)
JOBS = {
    "main": ("resnet50", ["solve", "resnet50.json", "--memory", "4GiB", *PCIE4, "--min-memory", "--json", "--out", "schedule.json"],
             "schedule.json"),
    "main-plot": ("resnet50", ["plot", "resnet50.json", "schedule.json", "-o", "schedule.png"], "schedule.png"),
    "cpsat": ("resnet18", ["solve", "resnet18.json", "--memory", "MEM50", *PCIE4, "--method", "cpsat", "--time-limit", "60",
                           "--option", "workers=1", "--json", "--out", "s.json"], "s.json"),
    "tradeoff": ("resnet18", ["tradeoff", "resnet18.json", *PCIE4, "--points", "3", "--json", "-o", "t.png"], "t.png"),
}


def _child() -> None:
    # As at a terminal, even when this benchmark runs as a background job (`&` ignores SIGINT).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}


def _figures(stdout: str) -> dict:
    """The figures a signal must not change: bounds, makespans, statuses (not runtimes)."""
    try:
        data = json.loads(stdout)
    except ValueError:
        return {"stdout": hashlib.sha256(stdout.encode()).hexdigest()[:16]}

    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if "runtime" not in k and "time" != k and k != "info"}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    return strip(data)


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else None


def _prepare(folder: Path, job: str) -> tuple[list[str], set[str]]:
    """The job's argv (memory filled in) and the names in its folder before it runs."""
    network, argv, _ = JOBS[job]
    env = _env()
    if not (folder / f"{network}.json").exists():
        subprocess.run([sys.executable, "-m", "chainoffload", "example", network, "-o", str(folder / f"{network}.json")],
                       check=True, capture_output=True, env=env)
    if "MEM50" in argv:
        sys.path.insert(0, str(ROOT))
        from chainoffload import Chain, keep_all_peak
        from chainoffload.bounds import offload_memory_floor

        chain = Chain.load(folder / f"{network}.json")
        top = keep_all_peak(chain)
        floor = offload_memory_floor(chain)
        argv = [str(floor + (top - floor) // 2) if a == "MEM50" else a for a in argv]
    if job == "main-plot" and not (folder / "schedule.json").exists():
        subprocess.run([sys.executable, "-m", "chainoffload", *JOBS["main"][1]], cwd=folder, check=True, capture_output=True, env=env)
    return argv, {p.name for p in folder.iterdir()}


def _run(folder: Path, argv: list[str], target: str, keep: set[str], delay: float | None, signum: int | None) -> dict:
    for p in folder.iterdir():  # a fresh folder state: the inputs only (the target removed)
        if p.name not in keep or p.name == target:
            if p.is_dir():
                import shutil

                shutil.rmtree(p)
            else:
                p.unlink()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "chainoffload", *argv], cwd=folder, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_child)
    sent = None
    if delay is not None:
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
            sent = time.monotonic() - t0
    out, err = proc.communicate(timeout=600)
    wall = time.monotonic() - t0
    left = sorted(p.name for p in folder.iterdir() if p.name not in keep or p.name == target)
    return {"code": proc.returncode, "out": out, "err": err, "wall": wall, "sent": sent, "left": left,
            "file": _digest(folder / target)}


def random_mode(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    lines = [
        "# Signals at random moments (issue 33)",
        "",
        f"Command: `python benchmarks/interrupt.py --random {args.random} --seed {args.seed} --jobs {' '.join(args.jobs)}`; "
        f"load average before: {' '.join(load)} (2 cores shared with other work).",
        "",
        "Each job ran once without a signal (the reference), then with SIGINT or SIGTERM at a moment drawn "
        "uniformly from [0, 1.1 T], T the reference's wall time. A run passes when it stopped (exit 130 / 143, "
        "nothing left in the folder; or killed by the signal while Python was still importing, nothing left) "
        "or finished with the reference's exit code, its file byte for byte and its figures "
        "(bounds, makespans, statuses) identical.",
        "",
        "| job | T (s) | runs | exit 130 | exit 143 | killed in start-up | finished, identical | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    failures: list[str] = []
    for job in args.jobs:
        folder = Path(tempfile.mkdtemp(prefix=f"interrupt-{job}-"))
        argv, keep = _prepare(folder, job)
        target = JOBS[job][2]
        ref = _run(folder, argv, target, keep, None, None)
        if ref["code"] not in (0, 1):
            raise SystemExit(f"{job}: the reference run failed ({ref['code']}): {ref['err'][-500:]}")
        ref_fig = _figures(ref["out"])
        counts = {"130": 0, "143": 0, "startup": 0, "same": 0, "failed": 0}
        for i in range(args.random):
            signum = rng.choice([signal.SIGINT, signal.SIGTERM])
            delay = rng.uniform(0.0, 1.1 * ref["wall"])
            r = _run(folder, argv, target, keep, delay, signum)
            nothing = r["left"] == []
            code = {signal.SIGINT: 130, signal.SIGTERM: 143}[signum]
            if r["sent"] is not None and r["code"] == code and nothing:
                counts[str(code)] += 1
                continue
            if r["sent"] is not None and r["code"] == -signum and nothing:
                # Killed by the signal itself: Python's own handling while it still imports numpy
                # and Numba, before the command line starts (nothing read or written yet).
                counts["startup"] += 1
                continue
            if r["code"] == ref["code"] and r["file"] == ref["file"] and _figures(r["out"]) == ref_fig:
                counts["same"] += 1
                continue
            counts["failed"] += 1
            failures.append(f"- {job}, run {i}: {signal.Signals(signum).name} at {delay:.3f} s (sent: {r['sent']}), "
                            f"exit {r['code']}, left {r['left']}, file {'same' if r['file'] == ref['file'] else r['file']}, "
                            f"figures {'same' if _figures(r['out']) == ref_fig else 'DIFFERENT'}, stderr "
                            f"`{r['err'].strip().splitlines()[-1] if r['err'].strip() else ''}`")
            print(failures[-1], flush=True)
        lines.append(f"| {job} | {ref['wall']:.2f} | {args.random} | {counts['130']} | {counts['143']} | {counts['startup']} | "
                     f"{counts['same']} | {counts['failed']} |")
        print(lines[-1], flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"] * 3
    lines += ["", f"Load average after: {' '.join(load)}.", ""]
    lines += (["Failures:", "", *failures] if failures else ["No failure."])
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "interrupt.md").write_text(text)
    print(text)


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


def delays_mode(args: argparse.Namespace) -> None:
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
    (RESULTS / ("interrupt-cold.md" if args.cold else "interrupt-delays.md")).write_text(text)
    print()
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=None, metavar="N", help="N runs per job with a signal at a random moment")
    parser.add_argument("--seed", type=int, default=0, help="seed of the moments and signals (--random)")
    parser.add_argument("--jobs", nargs="+", default=["main", "main-plot", "cpsat", "tradeoff"], choices=sorted(JOBS))
    parser.add_argument("--delays", type=float, nargs="+", default=[3.0, 6.0], help="seconds from the start to the signal")
    parser.add_argument("--cold", action="store_true", help="an empty Numba cache for every run")
    args = parser.parse_args()
    if args.random is not None:
        random_mode(args)
    else:
        delays_mode(args)


if __name__ == "__main__":
    main()
