"""How the pure-offloading methods scale with the chain's length, L = 10..100,000.

    python benchmarks/scaling.py                       # every length, every method
    python benchmarks/scaling.py --lengths 10 100 1000 --methods dp best

Each point is one ``solve()`` with default options (``best``'s default time limit, 5 s) in a
fresh process: wall and CPU seconds of the call, peak resident memory of the process
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, so the interpreter, numpy and the loaded
kernels, ~150-200 MB, are included), status, makespan / compute time and the bound rung
``solve`` reached. Kernels are compiled once before (a warm-up process). Instance: a random
chain (:func:`chainoffload.generators.random_chain`, seed 1000 + L), memory halfway between the
offload floor and the keep-all peak, bandwidth 0.5x the balance rate, latency 10 us, duplex.
Growth per method: the least-squares slope of log(wall) on log(L) over the lengths measured.
Writes ``benchmarks/results/scaling.md`` and ``scaling.png``. (The rematerialization DPs are
measured by ``benchmarks/scaling_remat.py``.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import BENCH, write_report

RESULTS = Path(__file__).resolve().parent / "results"
LENGTHS = (10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000)
METHODS = ("keep-all", "first-k", "lp", "dp", "best")
TARGET_SECONDS = 60.0
TARGET_MB = 2048.0

_CHILD = r"""
import json, resource, sys, time
import chainoffload as co
sys.path.insert(0, sys.argv[3])
from _common import mid_instance
method, length = sys.argv[1], int(sys.argv[2])
chain, platform = mid_instance(length)
c, w = time.process_time(), time.perf_counter()
r = co.solve(chain, platform, method)
wall, cpu = time.perf_counter() - w, time.process_time() - c
print(json.dumps({"wall": wall, "cpu": cpu, "runtime": r.runtime, "status": r.status.value,
                  "ratio": r.makespan / chain.compute_time if r.feasible else None,
                  "bound": r.info.get("bound"), "stopped": r.info.get("stopped"),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
"""


def point(method: str, length: int, timeout: float) -> dict:
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, method, str(length), BENCH], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"wall": math.inf, "cpu": math.inf, "status": f"killed after {timeout:.0f} s", "rss_mb": math.nan}
    if out.returncode != 0:
        return {"wall": math.inf, "cpu": math.inf, "status": "error: " + out.stderr.strip().splitlines()[-1][:120], "rss_mb": math.nan}
    return json.loads(out.stdout.strip().splitlines()[-1])


def slope(lengths: list[int], times: list[float]) -> float:
    pts = [(math.log(n), math.log(t)) for n, t in zip(lengths, times, strict=True) if math.isfinite(t) and t > 0]
    if len(pts) < 2:
        return math.nan
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per point before it is killed")
    parser.add_argument("--out", type=Path, default=RESULTS / "scaling.md")
    args = parser.parse_args(argv)
    from chainoffload._progress import progress

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    point("keep-all", 10, args.timeout)  # compile or load the kernels once, outside the timings
    point("best", 10, args.timeout)
    data: dict[str, dict[int, dict]] = {m: {} for m in args.methods}
    with progress("scaling", total=len(args.lengths) * len(args.methods), unit="point") as bar:
        for length in args.lengths:
            for m in args.methods:
                data[m][length] = point(m, length, args.timeout)
                bar.update(1)
                bar.note(L=length, method=m, wall=f"{data[m][length]['wall']:.2f}")
    load1 = os.getloadavg()[0]

    lines = [
        "# Scaling of the pure-offloading methods, L = 10..100,000",
        "",
        f"`python benchmarks/scaling.py`, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores shared "
        f"(load average {load0:.1f} at the start, {load1:.1f} at the end: wall times are inflated by other sessions, "
        "CPU times much less). One `solve()` with default options per point, in a fresh process; see the "
        "script's docstring for the instance. Targets (issue 13): `dp`, `best`, `lp` under "
        f"{TARGET_SECONDS:.0f} s and {TARGET_MB / 1024:.0f} GB at L = 100,000.",
        "",
        "## Growth: slope of log(time) on log(L)",
        "",
        "| method | slope (wall) | slope (CPU) | largest L | wall there (s) | CPU there (s) | peak RSS there (MB) | status | target |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for m in args.methods:
        ls = sorted(data[m])
        big = ls[-1]
        d = data[m][big]
        met = ""
        if big >= 100_000 and m in ("dp", "best", "lp"):
            feasible = d["status"] in ("feasible", "optimal")
            cpu_ok = feasible and d["cpu"] < TARGET_SECONDS and d["rss_mb"] < TARGET_MB
            wall_ok = feasible and d["wall"] < TARGET_SECONDS and d["rss_mb"] < TARGET_MB
            met = f"{'met' if cpu_ok else 'missed'} in CPU, {'met' if wall_ok else 'missed'} in wall"
        lines.append(
            f"| {m} | {slope(ls, [data[m][n]['wall'] for n in ls]):.2f} | {slope(ls, [data[m][n]['cpu'] for n in ls]):.2f} | "
            f"{big:,} | {d['wall']:.2f} | {d['cpu']:.2f} | {d['rss_mb']:.0f} | {d['status']} | {met} |"
        )
    lines += [
        "",
        "`best` stops at its default time limit (5 s + 0.5 ms per stage, the whole `solve()`, in wall time), so its time flattens by design; "
        "its quality at large L is whatever its starting points and the search reach within it.",
        "",
        "## Every point",
        "",
        "| method | L | wall (s) | CPU (s) | runtime field (s) | peak RSS (MB) | status | makespan / compute | bound | stopped |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for m in args.methods:
        for n in sorted(data[m]):
            d = data[m][n]
            ratio = "" if d.get("ratio") is None else f"{d['ratio']:.4f}"
            lines.append(
                f"| {m} | {n:,} | {d['wall']:.3f} | {d['cpu']:.3f} | {d.get('runtime', math.nan):.3f} | {d['rss_mb']:.0f} | "
                f"{d['status']} | {ratio} | {d.get('bound') or ''} | {d.get('stopped') or ''} |"
            )
    lines += ["", f"Total benchmark time {time.perf_counter() - t0:.0f} s.", "", "![scaling](scaling.png)"]
    write_report(lines, args.out)
    _plot(data, args.out.with_suffix(".png"))
    return 0


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for m, points in data.items():
        ls = [n for n in sorted(points) if math.isfinite(points[n]["wall"])]
        if not ls:
            continue
        ax1.loglog(ls, [points[n]["cpu"] for n in ls], marker="o", label=f"{m} (slope {slope(ls, [points[n]['cpu'] for n in ls]):.2f})")
        ax2.semilogx(ls, [points[n]["rss_mb"] for n in ls], marker="o", label=m)
    ax1.axhline(TARGET_SECONDS, color="grey", ls="--", lw=0.8)
    ax1.set_xlabel("chain length L")
    ax1.set_ylabel("CPU seconds of solve()")
    ax1.set_title("Time (default options)")
    ax1.legend(fontsize=8)
    ax2.axhline(TARGET_MB, color="grey", ls="--", lw=0.8)
    ax2.set_xlabel("chain length L")
    ax2.set_ylabel("peak RSS of the process (MB)")
    ax2.set_title("Memory")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
