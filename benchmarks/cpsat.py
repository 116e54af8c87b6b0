"""CP-SAT: time to a proven optimum by chain length, and the heuristics' gap to that optimum.

For each length L, ``--chains`` random chains (``chainoffload.generators.random_chain(seed, L)``,
seeds 0..n-1), memory midway between the chain's stage floor and its keep-all peak, and a
bandwidth of ``--ratio`` times sum(saved) / sum(fwd) in both directions: at ratio 0.3, copying
every unit out once takes 3.3 times the forward pass, so transfers cannot all be hidden (the
role a 12 GB/s PCIe link plays for a GPU that computes ~10x faster than it copies). Run::

    python benchmarks/cpsat.py            # L = 10, 20, 30, 40; 10 chains; 60 s; every core
    python benchmarks/cpsat.py --quick    # L = 6, 8; 2 chains; 10 s (smoke test)

Prints Markdown tables and writes them to ``benchmarks/results/cpsat.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform as pyplatform
import statistics
import sys
import time
from pathlib import Path

from chainoffload import Platform, keep_all_peak, solve
from chainoffload.generators import random_chain
from chainoffload.solvers import methods
from chainoffload.solvers.cpsat import default_workers

HEURISTICS = ("keep-all", "offload-all", "first-k", "largest-first", "lp", "dp", "best")


def instance(seed: int, length: int, ratio: float):
    chain = random_chain(seed, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    bw = float(chain.saved.sum()) / float(chain.fwd.sum()) * ratio
    return chain, Platform(memory=(floor + top) // 2, bandwidth_d2h=bw, bandwidth_h2d=bw)


def available_heuristics() -> list[str]:
    """The heuristics that are registered and whose module imports here."""
    from chainoffload.solvers import spec

    out = []
    for name in HEURISTICS:
        if name not in methods():
            continue
        try:
            spec(name).load()
        except ImportError:
            continue
        out.append(name)
    return out


def run_one(seed: int, length: int, args, heuristics: list[str]) -> dict:
    chain, platform = instance(seed, length, args.ratio)
    options = {} if args.workers is None else {"workers": args.workers}
    exact = solve(chain, platform, "cpsat", time_limit=args.time_limit, **options)
    row = {
        "L": length,
        "seed": seed,
        "status": exact.status.value,
        "runtime": exact.runtime,
        "makespan": exact.makespan,
        "lower_bound": exact.lower_bound,
        "bound_kind": exact.info.get("bound"),
        "load": os.getloadavg()[0],
        "compute": chain.compute_time,
        "heuristics": {},
    }
    for name in heuristics:
        t0 = time.perf_counter()
        try:
            res = solve(chain, platform, name)
        except Exception as exc:  # noqa: BLE001 - a broken heuristic is reported, not fatal
            row["heuristics"][name] = {"status": "error", "makespan": math.inf, "message": str(exc)[:80]}
            continue
        row["heuristics"][name] = {"status": res.status.value, "makespan": res.makespan, "runtime": time.perf_counter() - t0}
    return row


def _fmt_time(values: list[float], limit: float, unproven: int, total: int) -> str:
    # Unproven runs count as "> limit" in the median.
    if unproven * 2 >= total and unproven:
        return f"> {limit:g}"
    vals = sorted(values + [math.inf] * unproven)
    med = statistics.median(vals)
    return f"{med:.1f}" if math.isfinite(med) else f"> {limit:g}"


def tables(rows: list[dict], args, heuristics: list[str]) -> str:
    lines = []
    lengths = sorted({r["L"] for r in rows})
    lines.append("### CP-SAT time to a proven answer")
    lines.append("")
    lines.append("| L | chains | proven optimal | proven infeasible | unproven (time limit) | median time to proof, optimal or infeasible (s) | max time to proof (s) | median gap of unproven (bound) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for L in lengths:
        rs = [r for r in rows if r["L"] == L]
        opt = [r for r in rs if r["status"] == "optimal"]
        inf = [r for r in rs if r["status"] == "infeasible"]
        unproven = [r for r in rs if r["status"] not in ("optimal", "infeasible")]
        times = [r["runtime"] for r in opt + inf]
        gaps = [r["makespan"] / r["lower_bound"] - 1 for r in unproven if r["status"] == "feasible" and r["lower_bound"] > 0]
        lines.append(
            f"| {L} | {len(rs)} | {len(opt)} | {len(inf)} | {len(unproven)} | "
            f"{_fmt_time(times, args.time_limit, len(unproven), len(rs))} | "
            f"{(f'{max(times):.1f}' if times else '-')} | "
            f"{(f'{100 * statistics.median(gaps):.3f}%' if gaps else '-')} |"
        )
    lines.append("")
    lines.append("### Heuristics' gap to the proven optimum (chains CP-SAT solved to optimality)")
    lines.append("")
    lines.append("Each cell: mean / median / max of makespan / optimum - 1, and in brackets how many of those chains the method found feasible.")
    lines.append("")
    lines.append("| L | optimal chains | " + " | ".join(heuristics) + " |")
    lines.append("|---|---|" + "---|" * len(heuristics))
    for L in lengths:
        opt = [r for r in rows if r["L"] == L and r["status"] == "optimal"]
        cells = []
        for name in heuristics:
            gaps = []
            for r in opt:
                h = r["heuristics"].get(name)
                if h and h["status"] in ("optimal", "feasible") and math.isfinite(h["makespan"]):
                    gaps.append(max(0.0, h["makespan"] / r["makespan"] - 1))
            if gaps:
                cells.append(
                    f"{100 * statistics.mean(gaps):.2f}% / {100 * statistics.median(gaps):.2f}% / {100 * max(gaps):.2f}% ({len(gaps)}/{len(opt)})"
                )
            else:
                cells.append(f"- (0/{len(opt)})")
        lines.append(f"| {L} | {len(opt)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("### Per chain")
    lines.append("")
    lines.append("| L | seed | CP-SAT status | time (s) | makespan / compute | bound / compute | " + " | ".join(heuristics) + " | load |")
    lines.append("|---|---|---|---|---|---|" + "---|" * len(heuristics) + "---|")
    for r in rows:
        c = r["compute"]
        ms = f"{r['makespan'] / c:.4f}" if math.isfinite(r["makespan"]) else "-"
        lb = f"{r['lower_bound'] / c:.4f}" if isinstance(r["lower_bound"], float) and math.isfinite(r["lower_bound"]) else "-"
        cells = []
        for name in heuristics:
            h = r["heuristics"].get(name, {})
            cells.append(f"{h['makespan'] / c:.4f}" if h and math.isfinite(h.get("makespan", math.inf)) else h.get("status", "-"))
        lines.append(f"| {r['L']} | {r['seed']} | {r['status']} | {r['runtime']:.1f} | {ms} | {lb} | " + " | ".join(cells) + f" | {r['load']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 30, 40])
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=None, help="CP-SAT workers (default: every core)")
    parser.add_argument("--ratio", type=float, default=0.3, help="bandwidth / (sum(saved) / sum(fwd))")
    parser.add_argument("--quick", action="store_true", help="L = 6, 8; 2 chains; 10 s: a smoke test")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cpsat.md"))
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.chains, args.time_limit = [6, 8], 2, 10.0
    heuristics = available_heuristics()
    command = "python benchmarks/cpsat.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = []
    load_start = os.getloadavg()[0]
    workers = args.workers or default_workers()
    header = (
        "## CP-SAT: time to proven optimum and the heuristics' gap\n\n"
        f"Command: `{command.strip()}` — {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs ({pyplatform.machine()}), Python {pyplatform.python_version()}, "
        f"OR-Tools {_ortools_version()}. Lengths {args.lengths}, {args.chains} chains each (seeds 0..{args.chains - 1}), "
        f"memory midway between stage floor and keep-all peak, bandwidth {args.ratio:g} x sum(saved)/sum(fwd), "
        f"duplex, latency 0; CP-SAT time limit {args.time_limit:g} s, {workers} workers. Times include "
        "the warm start (the baselines and `best`), the bound stated in the model (`stronger_bound`, a fifth of the "
        "time limit, at most 5 s) and model building. The machine is shared: 1-minute load average "
        f"{load_start:.1f} at the start, {{load_end}} at the end (per chain in the last column); with a load above the "
        "core count, CP-SAT's workers get a fraction of a core each, so times are longer than on an idle machine.\n"
    )
    for L in args.lengths:
        for seed in range(args.chains):
            row = run_one(seed, L, args, heuristics)
            rows.append(row)
            print(
                f"L={L} seed={seed} {row['status']} {row['runtime']:.1f}s makespan/compute="
                f"{row['makespan'] / row['compute']:.4f}",
                file=sys.stderr,
                flush=True,
            )
        text = header.replace("{load_end}", f"{os.getloadavg()[0]:.1f}") + "\n" + tables(rows, args, heuristics) + "\n"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)  # after every length, so a long run leaves results
    print(text)
    return 0


def _ortools_version() -> str:
    try:
        import ortools

        return ortools.__version__
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
