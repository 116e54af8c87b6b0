"""The joint DP's slot-rounding gap, and what its lifted table (NOTE [ joint: lifted plans ]) closes.

Per instance and memory: ``joint`` as it was (``lift=0``) and as it is (the lifted table's plans
walked too), both given the same pure-offloading result (``best``, run once per point, its time
apart) so that they differ by the paper's DP alone; the reference, the same DP (``joint_dp``)
at 4x the slots with the grid rows it gets at the default slots and no lift; and the wall time
of each (warm: the kernels are loaded before the first point). Instances: the V100 twins of the
shipped networks on a 12 GB/s duplex link, 10 us a copy (the paper's platform), and random
chains (:func:`chainoffload.generators.random_chain`) with both links at half the balance rate;
memory a fraction of the way from the stage floor to the keep-all peak. A second table times
``joint`` (``offload`` given) in a fresh process: the first call (cold: the kernels loaded from
Numba's cache on disk) and the second (warm), before and after.

    python benchmarks/joint_gap.py                       # benchmarks/results/joint_gap.md
    python benchmarks/joint_gap.py --networks resnet50 --random 0 --fractions 0.3   # smoke run
    python benchmarks/joint_gap.py --long 100 1000 --out benchmarks/results/joint_gap_long.md

``--long L ...`` times ``joint_dp`` alone, before and after, on the random chains of
``benchmarks/joint_dp_time.py`` (25 GB/s, 30 % of the way from the floor to the peak), warm,
twice each, instead of the tables above.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's chainoffload, imported below

from _common import write_report  # noqa: E402
from chainoffload import Platform, simulate  # noqa: E402
from chainoffload.generators import random_chain  # noqa: E402
from chainoffload.networks import network, network_names  # noqa: E402
from chainoffload.simulate import keep_all_peak  # noqa: E402
from chainoffload.solvers.best import best  # noqa: E402
from chainoffload.solvers.joint import joint, joint_dp  # noqa: E402
from chainoffload.solvers.rotor import DEFAULT_SLOTS  # noqa: E402

FRACTIONS = (0.1, 0.3, 0.5, 0.7)
LINK = 12e9
LATENCY = 1e-5
FINER = 4

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from chainoffload import Platform
from chainoffload.networks import network
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers.joint import joint
from chainoffload.solvers.rotor import rotor
chain = network(sys.argv[2], gpu="V100")
floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
p = Platform(memory=int(floor + float(sys.argv[3]) * (peak - floor)), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
lift = None if sys.argv[4] == "default" else int(sys.argv[4])
stand_in = rotor(chain, p)
out = []
for _ in range(2):
    w = time.perf_counter()
    r = joint(chain, p, offload=stand_in, lift=lift)
    out.append(time.perf_counter() - w)
print(json.dumps(out))
"""


def instances(names: list[str], randoms: int, fractions: tuple[float, ...]):
    for name in names:
        chain = network(name, gpu="V100")
        for f in fractions:
            yield chain, f, LINK
    for seed in range(randoms):
        chain = random_chain(seed, (12, 24)[seed % 2])
        bw = 0.5 * float(chain.saved.sum()) / chain.compute_time
        for f in fractions:
            yield chain, f, bw


def point(chain, fraction: float, bw: float) -> dict:
    floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
    p = Platform(memory=int(floor + fraction * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=LATENCY)
    w = time.perf_counter()
    off = best(chain, p)
    t_best = time.perf_counter() - w
    row = {"chain": chain.name, "L": chain.length, "fraction": fraction, "memory": p.memory, "best_s": t_best,
           "best": off.makespan}
    rows = None
    for key, lift in (("before", 0), ("after", None)):
        w = time.perf_counter()
        r = joint(chain, p, offload=off, lift=lift)
        row[f"{key}_s"] = time.perf_counter() - w
        row[key] = r.makespan
        row[f"{key}_source"] = r.info.get("source")
        if r.status.has_schedule:
            assert simulate(chain, p, r.schedule).makespan == r.makespan
        if key == "after":
            row["lifted_by"] = r.info.get("lifted_by") if r.info.get("source") == "joint-dp" else None
            rows = r.info.get("rows")
    w = time.perf_counter()
    ref = joint_dp(chain, p, slots=FINER * DEFAULT_SLOTS, rows=rows, lift=0) if rows else None
    row["ref_s"] = time.perf_counter() - w
    row["ref"] = ref.makespan if ref is not None else float("nan")
    return row


def timing(name: str, fraction: float, lift: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(HERE.parent), name, str(fraction), lift], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def long_chains(lengths: list[int], out: Path, argv) -> int:
    """joint_dp alone, before (lift=0) and after, warm, twice each, on joint_dp_time.py's chains."""
    import numpy as np

    from remat import random_chain as remat_chain

    load0 = open("/proc/loadavg").read().strip()
    lines_rows = []
    for length in lengths:
        chain = remat_chain(np.random.default_rng(length), length)
        floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
        p = Platform(memory=int(floor + 0.3 * (peak - floor)), bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=LATENCY)
        joint_dp(chain, p, lift=0)  # kernels loaded, windows' sizes seen once
        got = {}
        for _ in range(2):
            for key, lift in (("before", 0), ("after", None)):
                w = time.perf_counter()
                r = joint_dp(chain, p, lift=lift)
                got.setdefault(key, []).append(time.perf_counter() - w)
                got[key + "_r"] = r
        b, a = got["before_r"], got["after_r"]
        lines_rows.append(
            f"| {length} | {1e3 * b.makespan:.3f} | {1e3 * a.makespan:.3f} | {a.info.get('lifted_by') or ''} | "
            f"{a.info['lift_slots']} | {' / '.join(f'{x:.2f}' for x in got['before'])} | "
            f"{' / '.join(f'{x:.2f}' for x in got['after'])} |"
        )
    load1 = open("/proc/loadavg").read().strip()
    cmd = " ".join(["python", "benchmarks/joint_gap.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# joint_dp on long random chains: before and after the lifted table",
        "",
        f"`{cmd}`, {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPU cores shared with other jobs; load "
        f"(/proc/loadavg) {load0} at the start, {load1} at the end.",
        "",
        "Chains and platform of `benchmarks/joint_dp_time.py` (remat.py's random chains, 500 slots, 25 GB/s, memory "
        "30 % of the way from the floor to the keep-all peak). Makespans in ms, simulated; wall seconds of two warm "
        "calls each, before (`lift=0`) and after alternating.",
        "",
        "| L | before | after | lifted by | lift slots | s before | s after |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *lines_rows,
    ]
    write_report(lines, out)
    return 0


def ms(x: float) -> str:
    return "—" if x != x or x == float("inf") else f"{1e3 * x:.3f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", default=list(network_names()))
    parser.add_argument("--random", type=int, default=4, help="random chains (lengths 12 and 24 in turn)")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--timing", nargs="+", default=["resnet50", "resnet101", "gpt2_48"],
                        help="networks of the cold / warm table (at fraction 0.3)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "joint_gap.md")
    parser.add_argument("--long", type=int, nargs="+", default=None, help="time joint_dp alone at these lengths instead")
    args = parser.parse_args(argv)
    if args.long:
        return long_chains(args.long, args.out, argv)
    load0 = open("/proc/loadavg").read().strip()
    t0 = time.perf_counter()
    # Load the kernels before the first point (their load is the cold table's business).
    small = random_chain(99, 6)
    floor, peak = small.stage_memory_floor(), keep_all_peak(small)
    joint(small, Platform(memory=int(floor + 0.5 * (peak - floor)), bandwidth_d2h=1e9, bandwidth_h2d=1e9))
    rows = []
    for chain, fraction, bw in instances(args.networks, args.random, tuple(args.fractions)):
        rows.append(point(chain, fraction, bw))
        r = rows[-1]
        print(f"{r['chain']} {fraction}: {r['before']:.6g} -> {r['after']:.6g} (ref {r['ref']:.6g})", file=sys.stderr,
              flush=True)
    timings = [(name, lift, timing(name, 0.3, lift)) for name in args.timing for lift in ("0", "default")]
    load1 = open("/proc/loadavg").read().strip()
    cmd = " ".join(["python", "benchmarks/joint_gap.py", *(argv if argv is not None else sys.argv[1:])])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    lines = [
        "# joint: the slot-rounding gap of the paper's DP, and the lifted table",
        "",
        f"`{cmd}`, {time.strftime('%Y-%m-%d %H:%M')} UTC at commit {commit}, {os.cpu_count()} CPU cores shared with "
        f"other jobs; load (/proc/loadavg) {load0} at the start, {load1} at the end; {time.perf_counter() - t0:.0f} s.",
        "",
        "Networks: V100 twins, 12 GB/s duplex, 10 us a copy; random chains: `random_chain(seed, 12 or 24)`, links at "
        "half the balance rate. Memory: floor + fraction x (keep-all peak - floor), floor = `stage_memory_floor()`. "
        "Makespans in ms, simulated. `before`: `joint(lift=0)` (the method before the lifted table); `after`: "
        f"`joint()`; both given the same `best` result. `{FINER}x slots`: `joint_dp(slots={FINER * DEFAULT_SLOTS}, "
        "rows=<the default's>, lift=0)`, the DP alone. `lifted by`: slots above the rounded budget of the plan "
        "`after` returns, when it is the DP's. Times: wall seconds, warm kernels; `best` is run once per point and "
        "counted apart (joint runs it once more inside when not given one).",
        "",
        f"| chain | L | fraction | best (offload) | joint before | joint after | gain | {FINER}x slots (DP) | "
        "source before → after | lifted by | s best | s before | s after | s {FINER}x |".replace("{FINER}", str(FINER)),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        gain = (r["before"] - r["after"]) / r["before"] if r["before"] == r["before"] and r["before"] < float("inf") else 0.0
        lines.append(
            f"| {r['chain']} | {r['L']} | {r['fraction']} | {ms(r['best'])} | {ms(r['before'])} | {ms(r['after'])} | "
            f"{100 * gain:.3f} % | {ms(r['ref'])} | {r['before_source']} → {r['after_source']} | "
            f"{r['lifted_by'] if r['lifted_by'] is not None else ''} | {r['best_s']:.1f} | {r['before_s']:.1f} | "
            f"{r['after_s']:.1f} | {r['ref_s']:.1f} |"
        )
    finite = [r for r in rows if r["before"] < float("inf")]
    better = [r for r in finite if r["after"] < r["before"]]
    worse = [r for r in finite if r["after"] > r["before"]]
    beats_ref = [r for r in finite if r["after"] <= r["ref"]]
    dp_ref = [r for r in finite if r["ref"] < r["after"]]
    lines += [
        "",
        "## Summary",
        "",
        f"- joint after strictly faster than before on {len(better)}/{len(finite)} points, slower on {len(worse)}; "
        f"largest gain {100 * max([(r['before'] - r['after']) / r['before'] for r in finite] or [0]):.2f} %.",
        f"- joint after at or below the {FINER}x-slot DP on {len(beats_ref)}/{len(finite)}; the {FINER}x-slot DP "
        f"faster on {len(dp_ref)}: " + ", ".join(f"{r['chain']} @{r['fraction']}" for r in dp_ref) + ".",
        f"- wall time of joint (best given): before {sum(r['before_s'] for r in rows):.1f} s, after "
        f"{sum(r['after_s'] for r in rows):.1f} s over all points; the {FINER}x-slot DP alone "
        f"{sum(r['ref_s'] for r in rows):.1f} s.",
        "",
        "## Cold and warm: joint in a fresh process (fraction 0.3, rotor's result as `offload`)",
        "",
        "First call: the kernels loaded from Numba's cache on disk; second: warm. Wall seconds.",
        "",
        "| network | lift | first call | second call |",
        "|---|---|---:|---:|",
    ]
    for name, lift, (first, second) in timings:
        lines.append(f"| {name} | {'0 (before)' if lift == '0' else 'default (after)'} | {first:.2f} | {second:.2f} |")
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
