"""The relaxation heuristics against the lower bound and the baselines, on random chains.

    python benchmarks/relaxations.py           # 200 chains x 3 memories x 2 bandwidths, runtimes at L=100/1000
    python benchmarks/relaxations.py --quick   # 20 chains, L <= 30, runtimes at L = 100 only

Instances: chains from :func:`chainoffload.generators.random_chain` (L uniform in 5..60, seeds
0..N-1), each at three memory limits 25 %, 50 % and 75 % of the way from the least memory any
pure-offloading schedule needs (:func:`chainoffload.bounds.offload_memory_floor`, "fits nothing
extra") to the keep-all peak, and at two bandwidths, 0.5x and 2x the chain's "balance" rate
(total saved bytes / compute time: the rate at which offloading everything would just keep up).
Latency 10 us, duplex. The lower bound is the larger of :func:`chainoffload.bounds.lower_bound`
(max(sum(fwd)+sum(bwd), fluid LP)) and :func:`chainoffload.bounds.volume_lower_bound` (both
proven; the tables also give the ratio to the LP bound alone, the figure reported before).
With ``--bound-time S``, also "after": the larger of that and
:func:`chainoffload.bounds.stronger_bound` (the whole-unit relaxation, S seconds per instance),
with a table by chain length and where the bound came from. Writes a Markdown report to
benchmarks/results/.

    python benchmarks/relaxations.py --chains 40 --bound-time 5 --shard 0 2 --out s0.json   # and 1 2
    python benchmarks/relaxations.py --chains 40 --bound-time 5 --merge s0.json s1.json --out results/relaxations-stronger.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import chainoffload as co
from _common import write_report
from chainoffload.bounds import lower_bound, offload_memory_floor, stronger_bound, volume_lower_bound
from chainoffload.generators import random_chain

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ["keep-all", "offload-all", "first-k", "largest-first"]
HEURISTICS = ["lp", "dp", "best"]
LEVELS = (0.25, 0.5, 0.75)
RATES = (0.5, 2.0)
LATENCY = 10e-6


def instances(count: int, max_length: int, seeds: range | None = None):
    """(label, chain, platform) for every chain x memory level x bandwidth."""
    for seed in seeds if seeds is not None else range(count):
        length = int(np.random.default_rng(seed).integers(5, max_length + 1))
        chain = random_chain(seed, length)
        floor, peak = offload_memory_floor(chain), co.keep_all_peak(chain)
        balance = float(chain.saved.sum()) / chain.compute_time
        for level in LEVELS:
            for rate in RATES:
                memory = int(floor + level * (peak - floor))
                bw = rate * balance
                yield (seed, level, rate), chain, co.Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=LATENCY)


def quality(count: int, max_length: int, seeds: range | None = None, bound_time: float | None = None) -> dict:
    methods = BASELINES + HEURISTICS
    records = []
    for label, chain, platform in instances(count, max_length, seeds):
        lp_bound = lower_bound(chain, platform)
        bound = max(lp_bound, volume_lower_bound(chain, platform))
        rec = {"label": label, "L": chain.length, "bound": bound, "lp_bound": lp_bound, "trivial": chain.compute_time}
        if bound_time:
            after = stronger_bound(chain, platform, time_limit=bound_time)
            rec.update(after=max(bound, after.value), kind=after.kind, bound_t=after.seconds, load=os.getloadavg()[0])
        for m in methods:
            r = co.solve(chain, platform, m)
            rec[m] = r.makespan if r.feasible else math.inf
            rec[m + "_t"] = r.runtime
        records.append(rec)
        if bound_time:
            print(f"{label} L={chain.length} best/before={rec['best'] / bound:.4f} best/after={rec['best'] / rec['after']:.4f} "
                  f"({rec['kind']}, {rec['bound_t']:.1f} s)", file=sys.stderr, flush=True)
    return {"records": records, "methods": methods, "bound_time": bound_time}


def _stats(xs: list[float]) -> tuple[float, float]:
    return (float(np.mean(xs)), float(np.max(xs))) if xs else (math.nan, math.nan)


def quality_tables(data: dict) -> list[str]:
    recs, methods = data["records"], data["methods"]
    n = len(recs)
    lines = [
        f"### Makespan / lower bound ({n} instances)",
        "",
        "Bound: the larger of the fluid LP bound and the closed-form volume bound; the LP bound alone",
        "in the next column (the figure reported before the volume bound existed).",
        "",
        "| method | feasible | mean | max | mean / LP bound alone | mean runtime (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in methods:
        ratios = [r[m] / r["bound"] for r in recs if math.isfinite(r[m])]
        lp_ratios = [r[m] / r["lp_bound"] for r in recs if math.isfinite(r[m])]
        mean, mx = _stats(ratios)
        rt = 1e3 * float(np.mean([r[m + "_t"] for r in recs]))
        lines.append(f"| {m} | {len(ratios)} | {mean:.4f} | {mx:.4f} | {_stats(lp_ratios)[0]:.4f} | {rt:.1f} |")
    lb_gain = [r.get("lp_bound", r["bound"]) / r["trivial"] for r in recs]
    lines += stronger_tables(data)
    lines += [
        "",
        f"The volume bound is above the LP bound on {sum(r['bound'] > r['lp_bound'] * (1 + 1e-9) for r in recs)} of {n} instances. "
        f"The LP bound is above the trivial bound sum(fwd)+sum(bwd) on {sum(g > 1 + 1e-9 for g in lb_gain)} of {n} "
        f"instances (mean bound / trivial {np.mean(lb_gain):.4f}, max {np.max(lb_gain):.4f}).",
        "",
        "### Heuristics against each baseline (where both are feasible)",
        "",
        "| heuristic | baseline | both feasible | mean ratio | max ratio | worse than the baseline | feasible only for the baseline |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for h in HEURISTICS:
        for b in BASELINES:
            both = [r for r in recs if math.isfinite(r[h]) and math.isfinite(r[b])]
            ratios = [r[h] / r[b] for r in both]
            mean, mx = _stats(ratios)
            worse = sum(x > 1 + 1e-9 for x in ratios)
            only_b = sum(1 for r in recs if math.isfinite(r[b]) and not math.isfinite(r[h]))
            lines.append(f"| {h} | {b} | {len(both)} | {mean:.4f} | {mx:.4f} | {worse} | {only_b} |")
    return lines


def _bucket(length: int) -> str:
    for lo, hi in ((5, 12), (13, 20), (21, 30), (31, 40), (41, 60)):
        if lo <= length <= hi:
            return f"{lo}-{hi}"
    return f"{length}"


def stronger_tables(data: dict) -> list[str]:
    """Before (max of fluid LP and volume) and after (also ``stronger_bound``), when measured."""
    recs, methods = data["records"], data["methods"]
    if not recs or "after" not in recs[0]:
        return []
    lines = [
        "",
        f"### Makespan / lower bound, before and after the stronger bound ({len(recs)} instances)",
        "",
        "Before: the bound above (fluid LP, volume). After: the larger of it and `stronger_bound` with "
        f"`time_limit={data['bound_time']:g}` (the whole-unit relaxation, NOTE [ unit MILP lower bound ]).",
        "",
        "| method | feasible | mean, before | mean, after | max, after |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in methods:
        rs = [r for r in recs if math.isfinite(r[m])]
        (mb, _), (ma, xa) = _stats([r[m] / r["bound"] for r in rs]), _stats([r[m] / r["after"] for r in rs])
        lines.append(f"| {m} | {len(rs)} | {mb:.4f} | {ma:.4f} | {xa:.4f} |")
    lines += [
        "",
        "`best` / bound by chain length:",
        "",
        "| L | instances | mean, before | mean, after | max, after | unit MILP optimal | unit MILP stopped by its limit | mean bound time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for bucket in sorted({_bucket(r["L"]) for r in recs}, key=lambda b: int(b.split("-")[0])):
        rs = [r for r in recs if _bucket(r["L"]) == bucket and math.isfinite(r["best"])]
        if not rs:
            continue
        before = [r["best"] / r["bound"] for r in rs]
        after = [r["best"] / r["after"] for r in rs]
        opt = sum(r["kind"] == "unit MILP, optimal" for r in rs)
        limit = sum(r["kind"] == "unit MILP" for r in rs)
        lines.append(
            f"| {bucket} | {len(rs)} | {np.mean(before):.4f} | {np.mean(after):.4f} | {np.max(after):.4f} | {opt} | {limit} | "
            f"{np.mean([r['bound_t'] for r in rs]):.2f} |"
        )
    gain = [r["after"] / r["bound"] for r in recs]
    kinds: dict[str, int] = {}
    for r in recs:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    lines += [
        "",
        f"The stronger bound is above the bound before on {sum(g > 1 + 1e-9 for g in gain)} of {len(recs)} instances "
        f"(mean after / before {np.mean(gain):.4f}, max {np.max(gain):.4f}); `stronger_bound`'s answer came from: "
        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ". 1-minute load average during the run "
        f"{min(r['load'] for r in recs):.1f}-{max(r['load'] for r in recs):.1f} (the machine is shared).",
    ]
    return lines


_TIMING = r"""
import json, sys, time
sys.path.insert(0, {bench!r})
import chainoffload as co
from chainoffload.generators import random_chain
from chainoffload.solvers import spec
from _common import mid_instance
out = {{}}
for length in {lengths!r}:
    chain, platform = mid_instance(length)
    for m in {methods!r}:
        func = spec(m).load()
        times = {{"solve": [], "method": []}}
        for _ in range({repeat}):
            # A fresh (equal) chain each time: the LP cache is keyed on the object, and a
            # warm time must still solve the LP. "method": the registered function alone;
            # "solve": solve(), which adds the LP bound every result carries and the judging.
            for what in ("method", "solve"):
                fresh = random_chain(1000 + length, length)
                t0 = time.perf_counter()
                co.solve(fresh, platform, m) if what == "solve" else func(fresh, platform)
                times[what].append(time.perf_counter() - t0)
        out[f"{{m}}-{{length}}"] = times
print(json.dumps(out))
"""


def timing(lengths, methods, repeat: int, env_extra: dict) -> dict:
    """Run the timing loop in a fresh process (so cold JIT is measured for real)."""
    code = _TIMING.format(bench=str(Path(__file__).resolve().parent), lengths=list(lengths), methods=list(methods), repeat=repeat)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env_extra}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"timing child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def runtime_tables(quick: bool) -> list[str]:
    lengths = (100,) if quick else (100, 1000)
    with tempfile.TemporaryDirectory() as cache:
        cold = timing(lengths[:1], ["lp", "dp"], 1, {"NUMBA_CACHE_DIR": cache})
        warm = timing(lengths, ["lp", "dp", "best"], 3, {"NUMBA_CACHE_DIR": cache})
    lines = [
        "### Runtime (seconds; a random chain, memory halfway, bandwidth 0.5x balance)",
        "",
        "`method`: the registered function alone (its LP or DP, planning, simulation); `solve()`: what a user",
        "calls, which adds the LP lower bound every pure-offloading result carries and the re-simulation.",
        "",
        "| method | L | method, warm (best of 3) | solve(), warm (best of 3) | method, first call in a fresh process, empty Numba cache |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, times in warm.items():
        m, length = key.rsplit("-", 1)
        c = cold.get(key)
        cold_cell = "" if c is None else f"{c['method'][0]:.2f}"
        lines.append(f"| {m} | {length} | {min(times['method']):.3f} | {min(times['solve']):.3f} | {cold_cell} |")
    small = (30,)
    jit = timing(small, ["dp"], 3, {})
    nojit = timing(small, ["dp"], 2, {"NUMBA_DISABLE_JIT": "1"})
    tj, tn = min(jit["dp-30"]["method"][1:]), min(nojit["dp-30"]["method"])
    lines += [
        "",
        f"Numba speed-up, method dp at L = 30 (kernels jitted vs NUMBA_DISABLE_JIT=1, the method alone): "
        f"{tj:.4f} s vs {tn:.3f} s, {tn / tj:.0f}x.",
    ]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 chains of L <= 30; runtime at L = 100 only")
    parser.add_argument("--chains", type=int, default=None, help="number of random chains (default 200, quick 20)")
    parser.add_argument("--out", type=Path, default=None, help="Markdown report path")
    parser.add_argument("--runtime-only", action="store_true", help="only the runtime tables (results/relaxations-runtime.md)")
    parser.add_argument("--shard", type=int, nargs=2, metavar=("I", "N"), help="only chains i with i %% N == I; write their records (JSON) to --out")
    parser.add_argument("--merge", type=Path, nargs="+", help="records of every shard: write the report from them (no runtime tables)")
    parser.add_argument("--from", dest="first", type=int, default=0, help="first seed (with --shard: chains first..chains-1)")
    parser.add_argument("--bound-time", type=float, default=None, help="also stronger_bound, this many seconds per instance")
    args = parser.parse_args(argv)
    count = args.chains or (20 if args.quick else 200)
    max_length = 30 if args.quick else 60
    t0 = time.perf_counter()
    if args.runtime_only:
        lines = [
            "# Relaxation heuristics: runtime",
            "",
            f"`python benchmarks/relaxations.py --runtime-only{' --quick' if args.quick else ''}`, "
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores (shared).",
            "",
        ] + runtime_tables(args.quick)
        return _write(lines, t0, args.out or RESULTS / "relaxations-runtime.md")
    if args.shard:
        i, n = args.shard
        data = quality(count, max_length, range(args.first + i, count, n), args.bound_time)
        for rec in data["records"]:
            rec["label"] = list(rec["label"])
        (args.out or Path(f"relaxations-shard{i}.json")).write_text(json.dumps(data))
        return 0
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        data = {"methods": parts[0]["methods"], "bound_time": parts[0].get("bound_time"),
                "records": sorted((r for p in parts for r in p["records"]), key=lambda r: r["label"])}
        count = len({r["label"][0] for r in data["records"]})
    else:
        data = quality(count, max_length, None, args.bound_time)
    load = os.getloadavg()[0]
    lines = [
        "# Relaxation heuristics, lower bound and baselines",
        "",
        f"`python benchmarks/relaxations.py{' --quick' if args.quick else ''}"
        f"{f' --chains {args.chains}' if args.chains else ''}{f' --bound-time {args.bound_time:g}' if args.bound_time else ''}"
        f"{' --shard I N, then --merge' if args.merge else ''}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores (shared; 1-minute load average {load:.1f} when the report was written). {count} random chains, L in 5..{max_length}, memory at "
        f"{', '.join(f'{int(100 * x)} %' for x in LEVELS)} from the offload floor to keep-all, bandwidth "
        f"{' and '.join(f'{x}x' for x in RATES)} the balance rate; see the script's docstring.",
        "",
    ]
    lines += quality_tables(data)
    if args.merge:
        lines += ["", f"Run in {len(args.merge)} shards (`--shard I N`, then `--merge`); runtimes: `--runtime-only`."]
    else:
        lines += [""] + runtime_tables(args.quick)
    return _write(lines, t0, args.out or RESULTS / ("relaxations-quick.md" if args.quick else "relaxations.md"))


def _write(lines: list[str], t0: float, out: Path) -> int:
    lines += ["", f"Total benchmark time {time.perf_counter() - t0:.0f} s."]
    write_report(lines, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
