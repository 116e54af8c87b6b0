"""The paper-style comparison: every registered method on chains of real networks.

For each network, memory limits from the least any schedule needs (``stage_memory_floor``) to
what keep-all needs, and link bandwidths of PCIe 3/4/5 and NVLink-C2C class, it runs every method
of the registry and records the makespan normalised by sum(fwd) + sum(bwd), the lower bound, the
smallest memory of the sweep at which each method is feasible, and the solver's runtime.

    python benchmarks/compare.py            # full sweep, writes benchmarks/results/compare.md and PNGs
    python benchmarks/compare.py --quick    # CI-sized: 2 networks, 4 memory points, 1 bandwidth

Bandwidths are per direction, effective (what pinned-memory copies reach, not the signalling
rate): PCIe 3.0 x16 ~12 GB/s, PCIe 4.0 x16 ~25 GB/s, PCIe 5.0 x16 ~50 GB/s, and NVLink-C2C
(GH200) 450 GB/s per direction (900 GB/s total).
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import chainoffload as co
from chainoffload.solvers import spec
from chainoffload.units import format_bytes

RESULTS = Path(__file__).resolve().parent / "results"
BANDWIDTHS = {"PCIe3": 12e9, "PCIe4": 25e9, "PCIe5": 50e9, "NVLink-C2C": 450e9}
LATENCY = 10e-6  # a typical cudaMemcpyAsync launch-to-start latency
SLOW = {"cpsat": 30}  # methods run only up to this many stages (exact, exponential worst case)


def chains(names: list[str] | None, quick: bool) -> list[co.Chain]:
    """Shipped network chains if the package has them, else the shipped examples."""
    try:
        from chainoffload.networks import network, network_names

        available = list(network_names())
        loader = network
    except ImportError:
        from chainoffload.examples import example

        available, loader = ["resnet18"], example
    if names:
        unknown = sorted(set(names) - set(available))
        if unknown:
            raise SystemExit(f"compare: unknown network(s) {', '.join(unknown)}; known: {', '.join(available)}")
        available = names
    if quick:
        available = available[:2]
    return [loader(n) for n in available]


def run_method(name: str, chain: co.Chain, platform: co.Platform, time_limit: float) -> co.Result:
    func = spec(name).load()
    params = inspect.signature(func).parameters
    options = {"time_limit": time_limit} if "time_limit" in params else {}
    return co.solve(chain, platform, name, **options)


def sweep(chain: co.Chain, bandwidth: float, points: int, methods: list[str], time_limit: float) -> dict:
    floor, peak = chain.stage_memory_floor(), co.keep_all_peak(chain)
    memories = sorted({int(m) for m in np.linspace(floor, max(peak, floor), points)})
    rows: dict[str, list[co.Result | None]] = {m: [] for m in methods}
    for memory in memories:
        platform = co.Platform(memory=memory, bandwidth_d2h=bandwidth, bandwidth_h2d=bandwidth, latency=LATENCY)
        for m in methods:
            if m in SLOW and chain.length > SLOW[m]:
                rows[m].append(None)
                continue
            rows[m].append(run_method(m, chain, platform, time_limit))
    return {"memories": memories, "rows": rows, "base": chain.compute_time}


def overhead(r: co.Result | None, base: float) -> float:
    return math.nan if r is None or not r.feasible else r.makespan / base


def table(chain: co.Chain, label: str, data: dict) -> list[str]:
    mem = data["memories"]
    base = data["base"]
    pure = [m for m in data["rows"] if not spec(m).remat]
    lbs = [max((r.lower_bound for r in (data["rows"][m][j] for m in pure) if r is not None and r.feasible), default=math.nan) for j in range(len(mem))]
    head = "| method | " + " | ".join(format_bytes(m) for m in mem) + " | min memory | mean runtime |"
    lines = [f"### {chain.name}, {label}", "", "makespan / (sum fwd + sum bwd); `-` = infeasible at that memory", "", head, "|---|" + "---:|" * (len(mem) + 2)]
    for m, results in data["rows"].items():
        cells, feasible_mem, runtimes = [], None, []
        for j, r in enumerate(results):
            if r is None:
                cells.append("n/a")
                continue
            runtimes.append(r.runtime)
            if r.feasible:
                cells.append(f"{r.makespan / base:.3f}" + ("*" if r.status == co.Status.OPTIMAL else ""))
                feasible_mem = mem[j] if feasible_mem is None else feasible_mem
            else:
                cells.append("-")
        mm = format_bytes(feasible_mem) if feasible_mem is not None else "> sweep"
        rt = f"{1e3 * float(np.mean(runtimes)):.1f} ms" if runtimes else "n/a"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {mm} | {rt} |")
    lines.append("| *lower bound (pure offload)* | " + " | ".join("-" if math.isnan(x) else f"{x / base:.3f}" for x in lbs) + " | | |")
    lines += ["", "`*` proven optimal. Remat methods (rotor, joint, ...) recompute, so the pure-offloading bound does not bind them.", ""]
    return lines


def plot(chain: co.Chain, label: str, data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mem = np.array(data["memories"], dtype=float) / 2**30
    base = data["base"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    pure = [m for m in data["rows"] if not spec(m).remat]
    lbs = np.array(
        [max((r.lower_bound for r in (data["rows"][m][j] for m in pure) if r is not None and r.feasible), default=math.nan) for j in range(len(mem))]
    )
    ax.fill_between(mem, 0, 100 * (lbs / base - 1), color="#999999", alpha=0.25, label="below the lower bound (pure offload)")
    markers = "os^vD<>pPX*h"
    for i, (m, results) in enumerate(data["rows"].items()):
        y = 100 * (np.array([overhead(r, base) for r in results]) - 1)
        # tab20 and a marker per method: a dozen lines stay distinguishable in print.
        ax.plot(mem, y, marker=markers[i % len(markers)], markersize=3.5, linewidth=1.2, color=plt.cm.tab20(i % 20),
                linestyle="--" if spec(m).remat else "-", label=m)
    ax.set_xlabel("GPU memory for activations (GiB)")
    ax.set_ylabel("overhead over compute (%)")
    ax.set_title(f"{chain.name}, {label}", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 networks, 4 memory points, PCIe4 only, no exact method")
    parser.add_argument("--networks", nargs="*", help="network names (default: all shipped)")
    parser.add_argument("--points", type=int, default=None, help="memory points per sweep (default 10; quick 4)")
    parser.add_argument("--time-limit", type=float, default=5.0, help="seconds for methods that take a time limit")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    args = parser.parse_args(argv)
    points = args.points or (4 if args.quick else 10)
    bandwidths = {"PCIe4": BANDWIDTHS["PCIe4"]} if args.quick else BANDWIDTHS
    methods = [m for m in co.methods() if not (args.quick and m in SLOW)]
    time_limit = min(args.time_limit, 1.0) if args.quick else args.time_limit
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lines = [
        "# Method comparison",
        "",
        f"`python benchmarks/compare.py{' --quick' if args.quick else ''}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores (runtimes are from this machine; makespans are from the chains' time model).",
        "",
    ]
    for chain in chains(args.networks, args.quick):
        for label, bw in bandwidths.items():
            data = sweep(chain, bw, points, methods, time_limit)
            lines += table(chain, f"{label} ({bw / 1e9:g} GB/s)", data)
            name = f"compare-{chain.name}-{label}.png".replace("/", "_")
            plot(chain, f"{label} ({bw / 1e9:g} GB/s)", data, args.out / name)
            lines += [f"![{chain.name} {label}]({name})", ""]
            print(f"{chain.name} {label}: done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    text = "\n".join(lines)
    (args.out / ("compare-quick.md" if args.quick else "compare.md")).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
