"""The paper-style comparison: every registered method on chains of real networks.

For each network and link class it runs :func:`chainoffload.tradeoff` (every method of the
registry at memory limits from the least any schedule needs, ``stage_memory_floor``, through the
proven pure-offloading floor, to what keep-all needs) and records the makespan normalised by
sum(fwd) + sum(bwd), the lower bound, the smallest memory of the sweep at which each method is
feasible, and the solver's runtime. The tables (compare.md), the figures (one per network and
link, drawn by :func:`chainoffload.plot.plot_tradeoff`) and the raw data (compare.json) come
from one run; ``--replot`` redraws the tables and figures from compare.json without solving.

    python benchmarks/compare.py              # full sweep, writes benchmarks/results/compare.{md,json} and PNGs
    python benchmarks/compare.py --links PCIe4  # one link class (what the README's Results table quotes)
    python benchmarks/compare.py --quick      # CI-sized: 2 networks, 4 memory points, 1 bandwidth
    python benchmarks/compare.py --replot     # tables and PNGs again from benchmarks/results/compare.json

By default no method but ``cpsat`` reads a clock (NOTE [ a sweep without a clock ] in
``chainoffload/tradeoff.py``), so every figure but the runtimes and CP-SAT's is the same on any
machine; ``cpsat``, whose only stop is a wall clock, gets ``--cpsat-time`` seconds per point.
``--time-limit S`` gives every method that takes one S seconds per point instead.

Bandwidths are per direction, effective (what pinned-memory copies reach, not the signalling
rate): PCIe 3.0 x16 ~12 GB/s, PCIe 4.0 x16 ~25 GB/s, PCIe 5.0 x16 ~50 GB/s, and NVLink-C2C
(GH200) 450 GB/s per direction (900 GB/s total).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import chainoffload as co
from chainoffload.plot import plot_tradeoff
from chainoffload.solvers import spec
from chainoffload.tradeoff import Tradeoff
from chainoffload.units import format_bytes

RESULTS = Path(__file__).resolve().parent / "results"
BANDWIDTHS = {"PCIe3": 12e9, "PCIe4": 25e9, "PCIe5": 50e9, "NVLink-C2C": 450e9}
LATENCY = 10e-6  # a typical cudaMemcpyAsync launch-to-start latency
SLOW = {"cpsat": 30}  # methods run only up to this many stages (exact, exponential worst case)
HEADLINE_LINK = "PCIe4"
BASELINES = ("offload-all", "first-k", "largest-first")


def chains(names: list[str] | None, quick: bool) -> list[co.Chain]:
    """Shipped network chains if the package has them, else the shipped examples."""
    try:
        from chainoffload.networks import network, network_names

        available = list(network_names())
        loader = network
    except ImportError:
        from chainoffload.examples import example

        available, loader = ["resnet18-formula"], example
    if names:
        unknown = sorted(set(names) - set(available))
        if unknown:
            raise SystemExit(f"compare: unknown network(s) {', '.join(unknown)}; known: {', '.join(available)}")
        available = names
    if quick:
        available = available[:2]
    return [loader(n) for n in available]


def run(
    chain: co.Chain, bandwidth: float, points: int, methods: list[str], time_limit: float | None, cpsat_time: float
) -> Tradeoff:
    """One network on one link: the library's sweep, less the methods too slow for its length.

    ``time_limit`` ``None``: no method reads a clock (NOTE [ a sweep without a clock ]), so every
    figure but the runtimes and ``cpsat``'s is the same on any machine; ``cpsat``, whose only
    stop is a wall clock, runs in a sweep of its own with ``cpsat_time`` seconds per point.
    """
    link = co.Platform(memory=0, bandwidth_d2h=bandwidth, bandwidth_h2d=bandwidth, latency=LATENCY)
    runnable = [m for m in methods if not (m in SLOW and chain.length > SLOW[m])]
    clocked = [m for m in runnable if m == "cpsat"] if time_limit is None else []
    plain = [m for m in runnable if m not in clocked]
    tr = co.tradeoff(chain, link, plain, points=points, time_limit=time_limit)
    if not clocked:
        return tr
    exact = co.tradeoff(chain, link, clocked, tr.memories, time_limit=cpsat_time)
    # One table: the curves side by side; a bound either sweep proved holds for both.
    # (Both are non-increasing in memory, so their larger one is too.)
    return dataclasses.replace(
        tr,
        lower_bound=tuple(max(a, b) for a, b in zip(tr.lower_bound, exact.lower_bound, strict=True)),
        curves={**tr.curves, **exact.curves},
        remat={**tr.remat, **exact.remat},
        clocked=tr.clocked + exact.clocked,
    )


def table(tr: Tradeoff, label: str, methods: list[str]) -> list[str]:
    mem = tr.memories
    base = tr.compute_time
    head = (
        "| method | "
        + " | ".join(("offload floor " if m == tr.offload_floor else "") + format_bytes(m) for m in mem)
        + " | min memory | mean runtime |"
    )
    lines = [
        f"### {tr.chain_name}, {label}",
        "",
        f"makespan / (sum fwd + sum bwd); `-` = infeasible at that memory; offload floor {format_bytes(tr.offload_floor)}, "
        f"keep-all peak {format_bytes(tr.keep_all_peak)}",
        "",
        head,
        "|---|" + "---:|" * (len(mem) + 2),
    ]
    for m in methods:
        if m not in tr.curves:
            lines.append(f"| {m} | " + " | ".join("n/a" for _ in mem) + " | n/a | n/a |")
            continue
        cells = []
        for p in tr.curves[m]:
            if p.feasible:
                cells.append(f"{p.makespan / base:.3f}" + ("*" if p.status == co.Status.OPTIMAL else ""))
            else:
                cells.append("-")
        least = tr.min_memory(m)
        mm = format_bytes(least) if least is not None else "> sweep"
        rt = f"{1e3 * float(np.mean([p.runtime for p in tr.curves[m]])):.1f} ms"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {mm} | {rt} |")
    lines.append(
        "| *lower bound (pure offload)* | " + " | ".join("-" if not math.isfinite(x) else f"{x / base:.3f}" for x in tr.lower_bound) + " | | |"
    )
    lines += ["", "`*` proven optimal. Remat methods (rotor, joint, ...) recompute, so the pure-offloading bound does not bind them.", ""]
    return lines


def headline(runs: dict[str, dict[str, Tradeoff]], methods: list[str]) -> list[str]:
    """The README's table: each network at the middle memory of its sweep on the headline link."""
    shown = [m for m in methods if m not in ("keep-all", "sqrt-checkpoint", "recompute-all")]
    pure = [m for m in shown if not spec(m).remat]
    remat = [m for m in shown if spec(m).remat]
    cols = pure + ["lower bound"] + remat
    lines = [
        f"## Headline: the middle of each sweep, {HEADLINE_LINK} ({BANDWIDTHS[HEADLINE_LINK] / 1e9:g} GB/s per direction, "
        f"{LATENCY * 1e6:g} us latency)",
        "",
        "| network | memory | " + " | ".join(cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for name, links in runs.items():
        tr = links.get(HEADLINE_LINK)
        if tr is None:
            continue
        j = len(tr.memories) // 2
        cells = []
        for m in cols:
            if m == "lower bound":
                x = tr.lower_bound[j]
                cells.append(f"{x / tr.compute_time:.3f}" if math.isfinite(x) else "-")
            elif m not in tr.curves:
                cells.append("n/a")
            else:
                p = tr.curves[m][j]
                cells.append(f"{p.makespan / tr.compute_time:.3f}" if p.feasible else "-")
        lines.append(f"| {name} | {format_bytes(tr.memories[j])} | " + " | ".join(cells) + " |")
    return lines + [""]


def best_against(runs: dict[str, dict[str, Tradeoff]], time_limit: float | None) -> list[str]:
    """How best compares with the exact method and with the baselines, over every sweep point."""
    both = optimal = equal = better = worse = 0
    worst = 0.0
    ratios = {b: (0.0, "") for b in BASELINES}
    for name, links in runs.items():
        for label, tr in links.items():
            if "best" not in tr.curves:
                continue
            for j, p in enumerate(tr.curves["best"]):
                if not p.feasible:
                    continue
                if "cpsat" in tr.curves and tr.curves["cpsat"][j].feasible:
                    q = tr.curves["cpsat"][j]
                    both += 1
                    optimal += q.status == co.Status.OPTIMAL
                    gap = p.makespan / q.makespan - 1
                    if abs(gap) <= 1e-9:
                        equal += 1
                    elif gap < 0:
                        better += 1
                    else:
                        worse += 1
                        worst = max(worst, gap)
                if tr.memories[j] >= tr.keep_all_peak:
                    continue  # nothing needs to move there: no contest
                for b in BASELINES:
                    if b in tr.curves and tr.curves[b][j].feasible:
                        r = tr.curves[b][j].makespan / p.makespan
                        if r > ratios[b][0]:
                            ratios[b] = (r, f"{name}, {label}, {format_bytes(tr.memories[j])}")
    lines = ["## best against the exact method and the baselines", ""]
    if both:
        limit = f"{time_limit:g} s per point"
        text = (
            f"Of the {both} sweep points where CP-SAT ({limit}) found a schedule ({optimal} of them proven optimal), "
            f"best's makespan equals CP-SAT's on {equal}"
        )
        if better:
            text += f", is shorter on {better} (where CP-SAT's time ran out)"
        text += f", and is longer on {worse}" + (f", by at most {100 * worst:.1f}%." if worse else ".")
        lines.append(text)
        lines.append("")
    lines.append("Largest ratio of a baseline's makespan to best's, below the keep-all peak:")
    lines.append("")
    for b, (r, where) in ratios.items():
        if r > 0:
            lines.append(f"- {b}: {r:.2f}x ({where})")
    return lines + [""]


def report(
    runs: dict[str, dict[str, Tradeoff]], methods: list[str], out: Path, quick: bool, stamp: str, time_limit: float | None,
    cpsat_time: float = 5.0, command: str = "",
) -> str:
    if time_limit is None:
        stop = (f"no method but cpsat reads a clock (each stops by its own work budget), so every figure but the runtimes "
                f"and cpsat's is the same on any machine; cpsat {cpsat_time:g} s per point")
    else:
        stop = f"every method that takes one under a time limit of {time_limit:g} s per point (figures may depend on the machine)"
    lines = [
        "# Method comparison",
        "",
        f"`{command or 'python benchmarks/compare.py' + (' --quick' if quick else '')}`, {stamp} (runtimes are from that machine; makespans are "
        f"from the chains' time model). Stopping: {stop}. Raw data: {'compare-quick' if quick else 'compare'}.json.",
        "",
    ]
    if not quick:
        lines += headline(runs, methods) + best_against(runs, time_limit or cpsat_time)
    for name, links in runs.items():
        for label, tr in links.items():
            bw = BANDWIDTHS[label]
            lines += table(tr, f"{label} ({bw / 1e9:g} GB/s)", methods)
            png = f"compare-{name}-{label}.png".replace("/", "_")
            plot_tradeoff(tr, out / png, title=f"{name}, {label} ({bw / 1e9:g} GB/s per direction, {LATENCY * 1e6:g} us latency)")
            lines += [f"![{name} {label}]({png})", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 networks, 4 memory points, PCIe4 only, no exact method")
    parser.add_argument("--networks", nargs="*", help="network names (default: all shipped)")
    parser.add_argument("--points", type=int, default=None, help="memory points per sweep, besides the offload floor (default 10; quick 4)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for every method that takes a time limit (default: none; every method but cpsat stops by its own work budget, and the figures do not depend on the machine)")
    parser.add_argument("--cpsat-time", type=float, default=5.0, help="seconds per point for cpsat when --time-limit is not given (default 5)")
    parser.add_argument("--links", nargs="+", choices=list(BANDWIDTHS), default=None, help="link classes to sweep (default: all four; quick: PCIe4)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder")
    parser.add_argument("--replot", action="store_true", help="redraw tables and PNGs from OUT/compare.json (or compare-quick.json) without solving")
    args = parser.parse_args(argv)
    stem = "compare-quick" if args.quick else "compare"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        data = json.loads((args.out / f"{stem}.json").read_text())
        methods = data["methods"]
        runs = {n: {lb: Tradeoff.from_dict(d) for lb, d in links.items()} for n, links in data["runs"].items()}
        stamp, time_limit = data["stamp"], data.get("time_limit")
        cpsat_time, command = data.get("cpsat_time", time_limit), data.get("command", "")
    else:
        points = args.points or (4 if args.quick else 10)
        links = args.links or ([HEADLINE_LINK] if args.quick else list(BANDWIDTHS))
        bandwidths = {label: BANDWIDTHS[label] for label in links}
        methods = [m for m in co.methods() if not (args.quick and m in SLOW)]
        time_limit = args.time_limit
        cpsat_time, command = args.cpsat_time, "python benchmarks/compare.py " + " ".join(argv if argv is not None else sys.argv[1:])
        load0 = os.getloadavg()[0]
        runs: dict[str, dict[str, Tradeoff]] = {}
        t0 = time.perf_counter()
        for chain in chains(args.networks, args.quick):
            for label, bw in bandwidths.items():
                runs.setdefault(chain.name, {})[label] = run(chain, bw, points, methods, time_limit, args.cpsat_time)
                print(f"{chain.name} {label}: done ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        stamp = (f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPU cores shared, 1-minute load average "
                 f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, {time.perf_counter() - t0:.0f} s")
        raw = {"stamp": stamp, "command": command.strip(), "time_limit": time_limit, "cpsat_time": cpsat_time, "methods": methods, "runs": {n: {lb: tr.to_dict() for lb, tr in links.items()} for n, links in runs.items()}}
        (args.out / f"{stem}.json").write_text(json.dumps(raw) + "\n")
    text = report(runs, methods, args.out, args.quick, stamp, time_limit, cpsat_time, command.strip())
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
