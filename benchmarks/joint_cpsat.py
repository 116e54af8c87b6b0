"""``joint``'s CP-SAT improver (NOTE [ joint: CP-SAT re-timing ]): before and after, per point.

Per instance and memory: ``joint(cpsat_work=0)`` (the method without the improver) and
``joint()`` (default work), both given the same ``best`` result (run once per point, its time
apart), and optionally ``joint(cpsat_work=W)`` for a larger budget (``--more W``). Instances as
``benchmarks/joint_gap.py``: the V100 twins on a 12 GB/s duplex link, 10 us a copy, and random
chains with both links at half the balance rate; memory a fraction of the way from the stage
floor to the keep-all peak. Times: wall seconds, warm kernels.

    python benchmarks/joint_cpsat.py --networks resnet18 inception_v3 --random 2 --more 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's chainoffload, imported below

from _common import write_report  # noqa: E402
from chainoffload import Platform, simulate  # noqa: E402
from chainoffload.simulate import keep_all_peak  # noqa: E402
from chainoffload.solvers.best import best  # noqa: E402
from chainoffload.solvers.joint import joint  # noqa: E402
from chainoffload.solvers.joint_cpsat import JOINT_CPSAT_WORK  # noqa: E402
from joint_gap import FRACTIONS, instances  # noqa: E402

LATENCY = 1e-5


def point(chain, fraction: float, bw: float, more: float | None) -> dict:
    floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
    p = Platform(memory=int(floor + fraction * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=LATENCY)
    w = time.perf_counter()
    off = best(chain, p)
    row = {"chain": chain.name, "L": chain.length, "fraction": fraction, "best_s": time.perf_counter() - w}
    runs = [("before", 0.0), ("after", None)] + ([("more", more)] if more else [])
    for key, work in runs:
        w = time.perf_counter()
        r = joint(chain, p, offload=off, cpsat_work=work)
        row[f"{key}_s"] = time.perf_counter() - w
        row[key] = r.makespan
        if r.status.has_schedule:
            assert simulate(chain, p, r.schedule).makespan == r.makespan
        c = r.info.get("cpsat", {})
        row[f"{key}_info"] = (f"{c.get('edits', 0)}/{c.get('edits_improved', 0)} {c.get('retime', c.get('why', ''))} "
                              f"w={c.get('work', 0):.2f}") if c else ""
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="*", default=["resnet18", "resnet50", "vgg16", "inception_v3", "gpt2_12"])
    parser.add_argument("--random", type=int, default=2)
    parser.add_argument("--fractions", type=float, nargs="*", default=list(FRACTIONS))
    parser.add_argument("--more", type=float, default=None, help="a third run with this cpsat_work")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "joint_cpsat.md")
    args = parser.parse_args(argv)
    load0 = open("/proc/loadavg").read().strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    t0 = time.perf_counter()
    rows = []
    for chain, f, bw in instances(args.networks, args.random, tuple(args.fractions)):
        row = point(chain, f, bw, args.more)
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    load1 = open("/proc/loadavg").read().strip()
    cmd = "python benchmarks/joint_cpsat.py " + " ".join(argv if argv is not None else sys.argv[1:])
    more = f" | joint(cpsat_work={args.more:g}) | gain | s |" if args.more else " |"
    lines = [
        "# joint: the CP-SAT improver of its plans (NOTE [ joint: CP-SAT re-timing ])",
        "",
        f"`{cmd.strip()}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {commit} (+ the working tree), "
        f"2 CPU cores shared with other jobs; load (/proc/loadavg) {load0} at the start, {load1} at the end; "
        f"{time.perf_counter() - t0:.0f} s.",
        "",
        "Instances as `benchmarks/joint_gap.py` (V100 twins, 12 GB/s duplex, 10 us a copy; random chains at half the "
        "balance rate); memory = floor + fraction x (keep-all peak - floor). Makespans in ms, simulated. `before`: "
        f"`joint(cpsat_work=0)`; `after`: `joint()` (default `cpsat_work` = {JOINT_CPSAT_WORK:g} deterministic s); "
        "all given the same `best` result. `what`: structural moves solved / improving, the re-timing's verdict on "
        "the incumbent's own sequence, deterministic seconds spent. Times: wall seconds, warm kernels.",
        "",
        "| chain | L | fraction | joint before | joint after | gain | s before | s after | what (after)" + more,
        "|---|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|---:|" if args.more else ""),
    ]
    for r in rows:
        gain = (r["before"] - r["after"]) / r["before"] * 100 if r["before"] == r["before"] else 0.0
        line = (f"| {r['chain']} | {r['L']} | {r['fraction']:g} | {1e3 * r['before']:.3f} | {1e3 * r['after']:.3f} | "
                f"{gain:.3f} % | {r['before_s']:.1f} | {r['after_s']:.1f} | {r['after_info']} |")
        if args.more:
            g2 = (r["before"] - r["more"]) / r["before"] * 100
            line += f" {1e3 * r['more']:.3f} | {g2:.3f} % | {r['more_s']:.1f} |"
        lines.append(line)
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
