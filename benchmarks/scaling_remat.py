"""How rotor's time and memory grow with the chain's length L: the table of bounds against the earlier tables.

For each L (10, 30, 100, 300, 1000 by default) a random chain (``remat.random_chain``, the
chains of ``benchmarks/remat.py``) is solved by ``rotor`` at S = 500 slots with memory 30 % of
the way from the least any stage needs to the keep-all peak. Each point runs in a fresh
process:

* **warm**: the Numba cache filled and the kernels loaded by a call on a 5-stage chain, then
  one timed call at size L (best of ``--repeat`` for L <= 100); wall and CPU time;
* **peak memory**: ``ru_maxrss`` of that process, and its rise over the process's peak before
  the call (imports, warm-up): what the table and the rebuild cost;
* **cold**: the first call in a process with an empty Numba cache (compile + run), for
  L <= ``--cold-max``.

Two earlier revisions run from temporary copies of ``chainoffload/``: ``dense`` at
``--old-ref`` (the last commit before the lean table: a dense (L + 2)^2 (S + 1) table with a
choice per entry), for L <= ``--old-max``; ``lean`` at ``--lean-ref`` (the float64 lean table
filled in tiles, before the table of bounds), for L in ``--lean-lengths``. Every run reports
the table's makespan, and they must all agree. The growth exponent is the slope of log(time) and
log(memory rise) against log(L), fitted over L >= 100.

    python benchmarks/scaling_remat.py                     # benchmarks/results/scaling-remat.md and .png
    python benchmarks/scaling_remat.py --old-max 1000      # the dense table at L = 1000 too (minutes, 6 GB)
    python benchmarks/scaling_remat.py --lengths 10 30 100 --quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent

#: The last commit whose rotor filled the dense table (what the lean table replaced).
OLD_REF = "c9e63eca37ad16466893273cf8864c7a00717387"
#: The last commit whose rotor filled the float64 lean table (in tiles), before the table of bounds.
LEAN_REF = "c1fa0e1"
SLOTS = 500
FRACTION = 0.3


def instance(length: int, fraction: float = FRACTION):
    """The random chain of ``benchmarks/remat.py`` with L stages and its platform."""
    sys.path.insert(0, str(HERE))
    from chainoffload import Platform
    from chainoffload.simulate import keep_all_peak
    from remat import random_chain

    chain = random_chain(np.random.default_rng(length), length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    memory = int(floor + fraction * (top - floor))
    return chain, Platform(memory=memory, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)


def worker(spec: dict) -> dict:
    """Run inside the measuring process: warm up (unless cold), then time rotor at one L."""
    import chainoffload
    from chainoffload.solvers.rotor import rotor

    out = {"module": chainoffload.__file__}
    if not spec["cold"]:
        small, platform = instance(5, spec["fraction"])
        rotor(small, platform, slots=spec["slots"])
    out["rss_before_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    chain, platform = instance(spec["length"], spec["fraction"])
    walls, cpus = [], []
    for _ in range(spec["repeat"]):
        c0, w0 = time.process_time(), time.perf_counter()
        res = rotor(chain, platform, slots=spec["slots"])
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    out.update(
        wall=min(walls), cpu=min(cpus), rss_peak_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        status=res.status.value, makespan=res.makespan, dp_makespan=res.info.get("dp_makespan"),
        source=res.info.get("source"), table_bytes=res.info.get("table_bytes"),
        exact_entries=res.info.get("exact_entries"),
    )
    return out


def run_point(length: int, *, old_root: str | None, cache: str, cold: bool, repeat: int, fraction: float, timeout: float) -> dict:
    spec = {"length": length, "cold": cold, "repeat": repeat, "slots": SLOTS, "fraction": fraction}
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    if old_root is not None:
        env["PYTHONPATH"] = old_root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"L = {length} ({'old' if old_root else 'new'}) failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = old_root if old_root is not None else str(REPO)
    if not out["module"].startswith(expected):
        raise RuntimeError(f"the worker imported {out['module']}, not the code under {expected}")
    return out


def old_copy(ref: str, into: str) -> str | None:
    """Extract ``chainoffload/`` at ``ref`` into ``into``; None when git cannot."""
    try:
        os.makedirs(into, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "chainoffload"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"old code at {ref} not available ({exc}); measuring the new code only", file=sys.stderr)
        return None
    return into


def slope(lengths, values, least: int = 100) -> float:
    pts = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if n >= least and v and v > 0 and math.isfinite(v)]
    if len(pts) < 2:
        return math.nan
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


SERIES = ("new", "lean", "dense")


def plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, style in zip(SERIES, ("o-", "^-.", "s--"), strict=True):
        pts = rows.get(name, [])
        if not pts:
            continue
        lengths = [p["length"] for p in pts]
        ax_t.loglog(lengths, [p["cpu"] for p in pts], style, label=f"{name}: warm CPU time")
        ax_m.loglog(lengths, [p["rss_peak_kb"] / 1024 for p in pts], style, label=f"{name}: peak RSS")
        ax_m.loglog(lengths, [max(p["rss_peak_kb"] - p["rss_before_kb"], 1) / 1024 for p in pts], style, alpha=0.5,
                    label=f"{name}: rise over imports + warm-up")
    ax_t.axhline(10, color="grey", lw=0.8, ls=":")
    ax_t.text(10, 11, "target at L = 1000: 10 s", fontsize=8, color="grey")
    ax_m.axhline(1024, color="grey", lw=0.8, ls=":")
    ax_m.text(10, 1100, "target: 1 GiB", fontsize=8, color="grey")
    ax_t.set_xlabel("chain length L")
    ax_t.set_ylabel("seconds")
    ax_m.set_xlabel("chain length L")
    ax_m.set_ylabel("MiB")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"rotor, S = {SLOTS} slots, memory {int(100 * FRACTION)} % of the way from the floor to keep-all", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 30, 100, 300, 1000])
    parser.add_argument("--old-max", type=int, default=300, help="largest L the dense table runs at (default 300)")
    parser.add_argument("--cold-max", type=int, default=1000, help="largest L timed cold (default 1000)")
    parser.add_argument("--old-ref", default=OLD_REF, help="git ref of the dense table")
    parser.add_argument("--lean-ref", default=LEAN_REF, help="git ref of the float64 lean table")
    parser.add_argument("--lean-lengths", type=int, nargs="*", default=[100, 300, 1000],
                        help="lengths the float64 lean table runs at (default 100 300 1000)")
    parser.add_argument("--fraction", type=float, default=FRACTION, help="memory between the floor (0) and keep-all (1)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per point")
    parser.add_argument("--quick", action="store_true", help="one repeat everywhere; no files written")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    load = os.getloadavg()[0]
    refs = {"new": None, "lean": args.lean_ref, "dense": args.old_ref}
    runs_at = {"new": lambda n: True, "lean": lambda n: n in args.lean_lengths, "dense": lambda n: n <= args.old_max}
    rows: dict[str, list[dict]] = {name: [] for name in SERIES}
    cold: dict[str, dict[int, dict]] = {name: {} for name in SERIES}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {name: None if ref is None else old_copy(ref, os.path.join(tmp, name)) for name, ref in refs.items()}
        live = [name for name in SERIES if name == "new" or roots[name] is not None]
        caches = {name: os.path.join(tmp, f"cache-{name}") for name in SERIES}
        for name in live:
            if any(runs_at[name](n) for n in args.lengths):
                # Fill the Numba cache once, so that every warm point only loads it.
                run_point(5, old_root=roots[name], cache=caches[name], cold=False, repeat=1, fraction=args.fraction,
                          timeout=args.timeout)
        for length in sorted(args.lengths):
            for name in live:
                if not runs_at[name](length):
                    continue
                if length <= args.cold_max:
                    empty = tempfile.mkdtemp(dir=tmp)
                    cold[name][length] = run_point(length, old_root=roots[name], cache=empty, cold=True, repeat=1,
                                                   fraction=args.fraction, timeout=args.timeout)
                repeat = 1 if args.quick or length > 100 else 3
                point = run_point(length, old_root=roots[name], cache=caches[name], cold=False, repeat=repeat,
                                  fraction=args.fraction, timeout=args.timeout)
                point["length"] = length
                rows[name].append(point)
                print(f"{name} L={length}: warm {point['wall']:.3f} s wall, {point['cpu']:.3f} s CPU, peak RSS "
                      f"{point['rss_peak_kb'] / 1024:.0f} MiB (+{(point['rss_peak_kb'] - point['rss_before_kb']) / 1024:.0f}), "
                      f"makespan {point['makespan']!r}", file=sys.stderr, flush=True)

    by = {name: {p["length"]: p for p in rows[name]} for name in SERIES}
    new, old = by["new"], by["dense"]
    for name in ("lean", "dense"):
        for length, p in by[name].items():
            if p["dp_makespan"] != new[length]["dp_makespan"]:
                raise SystemExit(f"L = {length}: the tables disagree: {name} {p['dp_makespan']!r}, new {new[length]['dp_makespan']!r}")

    def cell(p: dict | None, key: str, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
        return "—" if p is None or p.get(key) is None else fmt.format(p[key] / scale)

    def rise_of(p: dict | None) -> str:
        return "—" if p is None else f"{(p['rss_peak_kb'] - p['rss_before_kb']) / 1024:.0f}"

    def ratio(q: dict | None, p: dict) -> str:
        return "—" if q is None else f"{q['cpu'] / p['cpu']:.1f}x"

    def cold_cell(c: dict | None) -> str:
        return "—" if c is None else f"{c['wall']:.1f} / {c['cpu']:.1f}"

    lines = [
        "# rotor at scale: time and memory against the chain's length",
        "",
        f"`python benchmarks/scaling_remat.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`, {datetime.date.today()}, "
        f"{os.cpu_count()} CPU cores (1-minute load average {load:.1f} at the start: the cores are shared, so CPU "
        f"time is the figure to compare; wall time is shown too). Random chains of `benchmarks/remat.py`, S = {SLOTS} "
        f"slots, memory {int(100 * args.fraction)} % of the way from the least any stage needs to the keep-all peak. "
        "new: this checkout (uint32 table of bounds, exact entries on demand); lean: the float64 lean table in tiles, at "
        f"{args.lean_ref[:7]}; dense: `rotor` at {args.old_ref[:7]} (dense (L + 2)^2 (S + 1) table and a choice per "
        "entry); the earlier two run from temporary copies. Each point is a fresh process; warm = Numba cache filled "
        "and kernels loaded first; cold = empty Numba cache, the first call (compile + run), wall / CPU seconds. "
        "Peak = `ru_maxrss`; rise = peak minus the process's peak before the call (imports and warm-up).",
        "",
        "| L | new warm CPU (s) | new warm wall (s) | new cold wall / CPU (s) | new peak RSS (MiB) | new rise (MiB) "
        "| new table (MiB) | new exact entries | lean warm CPU (s) | lean cold wall / CPU (s) | lean peak RSS (MiB) "
        "| CPU lean / new | dense warm CPU (s) | dense cold wall / CPU (s) | dense peak RSS (MiB) | CPU dense / new "
        "| table makespan |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length in sorted(new):
        p, u, q = new[length], by["lean"].get(length), old.get(length)
        lines.append(
            f"| {length} | {p['cpu']:.3f} | {p['wall']:.3f} | {cold_cell(cold['new'].get(length))} | "
            f"{p['rss_peak_kb'] / 1024:.0f} | {rise_of(p)} | {cell(p, 'table_bytes', 2**20, '{:.1f}')} | "
            f"{cell(p, 'exact_entries', 1, '{:.0f}')} | {cell(u, 'cpu')} | {cold_cell(cold['lean'].get(length))} | "
            f"{cell(u, 'rss_peak_kb', 1024, '{:.0f}')} | {ratio(u, p)} | "
            f"{cell(q, 'cpu')} | {cold_cell(cold['dense'].get(length))} | {cell(q, 'rss_peak_kb', 1024, '{:.0f}')} | "
            f"{ratio(q, p)} | {p['dp_makespan']!r} |"
        )
    lengths = sorted(new)

    def slopes(points: dict) -> tuple[float, float]:
        ls = sorted(points)
        return (slope(ls, [points[n]["cpu"] for n in ls]),
                slope(ls, [(points[n]["rss_peak_kb"] - points[n]["rss_before_kb"]) * 1024 for n in ls]))

    ts, ms = slopes(new)
    everywhere = (slope(lengths, [new[n]["cpu"] for n in lengths], least=0),
                  slope(lengths, [new[n]["rss_peak_kb"] for n in lengths], least=0))
    lines += [
        "",
        f"Growth exponents (log-log slope over L >= 100): new: CPU time {ts:.2f}, memory rise {ms:.2f}"
        + (", dense: CPU time {:.2f}, memory rise {:.2f}".format(*slopes(old)) if len([n for n in old if n >= 100]) >= 2 else "")
        + f". Over every L measured (L = {lengths[0]}..{lengths[-1]}): new CPU time {everywhere[0]:.2f}, new peak RSS "
        f"{everywhere[1]:.2f} (flattened by the ~160 MiB of the interpreter, NumPy and Numba). Where several ran, "
        "their tables' makespans are equal (checked by the script).",
    ]
    if 1000 in new:
        p = new[1000]
        lines += [
            "",
            f"Target at L = 1000 (under 10 s and 1 GiB): CPU time {p['cpu']:.1f} s ({'met' if p['cpu'] < 10 else 'missed'}), "
            f"peak RSS {p['rss_peak_kb'] / 1024:.0f} MiB ({'met' if p['rss_peak_kb'] < 2**20 else 'missed'}).",
        ]
    if args.quick:
        print("\n".join(lines))
        return
    sys.path.insert(0, str(HERE))
    from _common import write_report

    write_report(lines, RESULTS / "scaling-remat.md")
    plot({name: [by[name][n] for n in sorted(by[name])] for name in SERIES}, RESULTS / "scaling-remat.png")


if __name__ == "__main__":
    main()
