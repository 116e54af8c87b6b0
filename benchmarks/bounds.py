"""Lower bounds against CP-SAT's proven optimum on small random chains: how loose each one is.

    python benchmarks/bounds.py            # L = 6, 8, 10, 12; 6 chains each; 6 platforms each
    python benchmarks/bounds.py --quick    # L = 6, 8; 2 chains each

The instances are those of benchmarks/relaxations.py (memory 25/50/75 % of the way from the
offload floor to keep-all, bandwidth 0.5x and 2x the balance rate, latency 10 us, duplex) on
chains short enough for CP-SAT to prove the optimum. For each it reports the fluid LP bound
(:func:`chainoffload.bounds.lower_bound`), the whole-unit relaxation
(:func:`chainoffload.bounds.unit_milp`), the optimum, and ``best``. CP-SAT runs with
``bound=False`` so that its optimum does not lean on the bound under test. Writes
``benchmarks/results/bounds.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import chainoffload as co
from chainoffload.bounds import lower_bound, offload_memory_floor, unit_milp
from chainoffload.generators import random_chain

RESULTS = Path(__file__).resolve().parent / "results"
LEVELS = (0.25, 0.5, 0.75)
RATES = (0.5, 2.0)
LATENCY = 10e-6


def instances(lengths, count):
    for length in lengths:
        for seed in range(count):
            chain = random_chain(seed, length)
            floor, peak = offload_memory_floor(chain), co.keep_all_peak(chain)
            balance = float(chain.saved.sum()) / chain.compute_time
            for level in LEVELS:
                for rate in RATES:
                    bw = rate * balance
                    platform = co.Platform(memory=int(floor + level * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=LATENCY)
                    yield (length, seed, level, rate), chain, platform


def run(lengths, count, cpsat_time: float, unit_time: float) -> list[dict]:
    rows = []
    for label, chain, platform in instances(lengths, count):
        exact = co.solve(chain, platform, "cpsat", time_limit=cpsat_time, bound=False)
        unit = unit_milp(chain, platform, time_limit=unit_time)
        best = co.solve(chain, platform, "best")
        row = {
            "label": label,
            "status": exact.status.value,
            "optimum": exact.makespan,
            "lp": lower_bound(chain, platform),
            "unit": unit.bound,
            "unit_status": unit.status,
            "unit_t": unit.solve_time,
            "best": best.makespan,
        }
        rows.append(row)
        if row["status"] == "optimal":
            print(f"{label}: optimum/LP {row['optimum'] / row['lp']:.4f}  optimum/unit {row['optimum'] / max(row['unit'], row['lp']):.4f}  "
                  f"best/optimum {row['best'] / row['optimum']:.4f}", file=sys.stderr, flush=True)
        else:
            print(f"{label}: CP-SAT {row['status']}", file=sys.stderr, flush=True)
    return rows


def tables(rows: list[dict]) -> list[str]:
    lines = [
        "| L | instances | CP-SAT optimal | mean optimum / LP | max optimum / LP | mean optimum / unit | max optimum / unit "
        "| unit = optimum (1e-4) | unit solved (optimal) | mean unit time (s) | mean best / optimum | max best / optimum |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups = sorted({r["label"][0] for r in rows}) + ["all"]
    for length in groups:
        rs = [r for r in rows if length == "all" or r["label"][0] == length]
        opt = [r for r in rs if r["status"] == "optimal"]
        if not opt:
            lines.append(f"| {length} | {len(rs)} | 0 | - | - | - | - | - | - | - | - | - |")
            continue
        lp = [r["optimum"] / r["lp"] for r in opt]
        unit = [r["optimum"] / max(r["lp"], r["unit"] if math.isfinite(r["unit"]) else 0.0) for r in opt]
        best = [r["best"] / r["optimum"] for r in opt]
        equal = sum(u <= 1 + 1e-4 for u in unit)
        solved = sum(r["unit_status"] in ("optimal", "trivial") for r in opt)
        lines.append(
            f"| {length} | {len(rs)} | {len(opt)} | {statistics.mean(lp):.4f} | {max(lp):.4f} | {statistics.mean(unit):.4f} | "
            f"{max(unit):.4f} | {equal} | {solved} | {statistics.mean(r['unit_t'] for r in opt):.2f} | "
            f"{statistics.mean(best):.4f} | {max(best):.4f} |"
        )
    unsound = [r for r in rows if r["status"] == "optimal" and r["unit"] > r["optimum"] * (1 + 1e-9)]
    lines += ["", f"Unit bound above a proven optimum: {len(unsound)} instance(s) (must be 0)."]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[6, 8, 10, 12])
    parser.add_argument("--chains", type=int, default=6)
    parser.add_argument("--cpsat-time", type=float, default=120.0)
    parser.add_argument("--unit-time", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="L = 6, 8; 2 chains each")
    parser.add_argument("--out", type=Path, default=RESULTS / "bounds.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.chains = [6, 8], 2
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    rows = run(args.lengths, args.chains, args.cpsat_time, args.unit_time)
    command = "python benchmarks/bounds.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Lower bounds against the proven optimum",
        "",
        f"`{command.strip()}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores (shared; 1-minute load average "
        f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end). Random chains of L = {args.lengths}, "
        f"seeds 0..{args.chains - 1}, each at memory {', '.join(f'{int(100 * x)} %' for x in LEVELS)} of the way from the "
        f"offload floor to keep-all and bandwidth {' and '.join(f'{x}x' for x in RATES)} the balance rate (latency 10 us): "
        f"the family of benchmarks/relaxations.py. CP-SAT {args.cpsat_time:g} s (without the bound under test), unit MILP "
        f"{args.unit_time:g} s.",
        "",
        "LP: `lower_bound` (the fluid LP). Unit: `unit_milp` (the whole-unit relaxation, NOTE [ unit MILP lower bound ] in "
        "chainoffload/bounds.py), taken as max(LP, unit). Ratios over the instances where CP-SAT proves the optimum.",
        "",
    ] + tables(rows) + ["", f"Total benchmark time {time.perf_counter() - t0:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
