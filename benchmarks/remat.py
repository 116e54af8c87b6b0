"""Rematerialization and its combination with offloading: rotor vs joint vs pure offload vs keep-all.

For two network chains (ResNet-18 from ``chainoffload.examples`` and a GPT-2-medium-like
transformer built below by formula) and a set of random chains, at memory limits from the
least any method fits in to the keep-all peak: the overhead (makespan / (sum fwd + sum bwd)
- 1) of each method, and the share of rotor's overhead that joint removes; that share
against the link's bandwidth at one memory per chain. Then the DP
runtimes at L = 50 and 100 with S = 500 slots (warm, and cold in a fresh process with an
empty Numba cache) and the Numba speed-up over NUMBA_DISABLE_JIT=1 (subprocess).

    python benchmarks/remat.py            # table: benchmarks/results/remat.md, plot: remat.png
    python benchmarks/remat.py --quick    # fewer points, for a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

# The pure-offloading method compared with (set by main: "best" where it runs).
PURE = "largest-first"
# Load average of the machine when the timings start (set by main).
LOAD = math.nan

# PCIe 4.0 x16 as measured by pinned cudaMemcpy (about 25 GB/s each way), 10 us per copy.
BANDWIDTH = 25e9
LATENCY = 1e-5


def gpt_like(layers: int = 24, hidden: int = 1024, heads: int = 16, seq: int = 1024, batch: int = 8):
    """A GPT-2-medium-like chain, bf16, one stage per transformer block plus an embedding stage.

    Sizes from Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models" (2022): a block saves s*b*h*(34 + 5*a*s/h) bytes, its output is 2*s*b*h bytes.
    Times: 24*b*s*h^2*(1 + s/(6h)) FLOPs per block forward at 125e12 FLOP/s (an A100 at 40 % of
    its bf16 peak), backward twice the forward. fwd_tmp is one attention score matrix
    (2*b*a*s^2 bytes), bwd_tmp two block outputs. Estimates, not measurements.
    """
    from chainoffload import Chain

    sbh = seq * batch * hidden
    out = 2 * sbh
    block_saved = int(sbh * (34 + 5 * heads * seq / hidden))
    block_fwd = 24 * batch * seq * hidden**2 * (1 + seq / (6 * hidden)) / 125e12
    embed_fwd = 2 * out / 1.5e12  # memory bound: read the table rows, write the output
    fwd = [embed_fwd] + [block_fwd] * layers
    act = [batch * seq * 8] + [out] * (layers + 1)  # int64 token ids in
    saved = [out] + [block_saved] * layers
    fwd_tmp = [0] + [2 * batch * heads * seq * seq] * layers
    bwd_tmp = [out] + [2 * out] * layers
    return Chain(fwd, [2 * t for t in fwd], act, saved, fwd_tmp, bwd_tmp, name=f"gpt-like-{layers}x{hidden}-s{seq}-b{batch}")


def random_chain(rng, length: int):
    from chainoffload import Chain

    act = rng.integers(1 << 20, 1 << 26, size=length + 1)
    saved = act[1:] * rng.integers(1, 6, size=length)
    fwd = saved * 2e-12 * rng.uniform(0.5, 2.0, size=length)
    return Chain(fwd, 2 * fwd, act, saved, act[1:] // 2, act[1:], name=f"random-{length}")


def offload_method() -> str:
    """The pure-offloading method joint compares with: ``best`` when it runs here, else ``largest-first``."""
    from chainoffload import Platform
    from chainoffload.examples import tiny
    from chainoffload.solvers import _REGISTRY, solve

    spec = _REGISTRY.get("best")
    if spec is None or spec.remat:
        return "largest-first"
    try:
        solve(tiny(), Platform(memory=190, bandwidth_d2h=10.0, bandwidth_h2d=10.0), method="best")
    except ImportError:  # registered, but a module it needs is missing from this checkout
        return "largest-first"
    return "best"


def sweep(chain, points: int) -> list[dict]:
    from chainoffload import Platform
    from chainoffload.simulate import keep_all_peak
    from chainoffload.solvers import solve
    from chainoffload.solvers.remat_baselines import recompute_all_schedule
    from chainoffload.simulate import simulate

    free = Platform(memory=2**62, bandwidth_d2h=BANDWIDTH, bandwidth_h2d=BANDWIDTH, latency=LATENCY)
    least = max(chain.stage_memory_floor(), simulate(chain, free, recompute_all_schedule(chain.length)).peak_memory)
    top = keep_all_peak(chain)
    pure = PURE
    rows = []
    for memory in np.linspace(least, top, points).astype(np.int64):
        platform = free.with_memory(int(memory))
        row = {"memory": int(memory), "fraction": float(memory) / top}
        for method in ("keep-all", "rotor", "joint", pure, "sqrt-checkpoint"):
            res = solve(chain, platform, method=method)
            row[method] = res.makespan / chain.compute_time - 1 if res.status.has_schedule else math.inf
            if method == "joint":
                row["joint_source"] = res.info.get("source")
                row["joint_offloaded"] = int(res.offloaded_bytes)
                dp = res.info.get("joint-dp_makespan", math.inf)
                row["joint-dp"] = dp / chain.compute_time - 1 if math.isfinite(dp) else math.inf
        rows.append(row)
    return rows


def share_removed(rows: list[dict], key: str = "joint") -> float | None:
    """Mean over the points where rotor recomputes of (rotor - key) / rotor overhead (key no worse than rotor there)."""
    shares = [(r["rotor"] - min(r[key], r["rotor"])) / r["rotor"] for r in rows if math.isfinite(r["rotor"]) and r["rotor"] > 1e-9]
    return float(np.mean(shares)) if shares else None


def random_set(count: int, length: int, points: int) -> dict:
    rng = np.random.default_rng(2021)
    shares, dp_shares, rotor_oh, joint_oh = [], [], [], []
    for _ in range(count):
        rows = sweep(random_chain(rng, length), points)
        s = share_removed(rows)
        if s is not None:
            shares.append(s)
            dp_shares.append(share_removed(rows, "joint-dp"))
        rotor_oh += [r["rotor"] for r in rows if math.isfinite(r["rotor"])]
        joint_oh += [r["joint"] for r in rows if math.isfinite(r["joint"])]
    return {
        "chains": count,
        "length": length,
        "points": points,
        "share_mean": float(np.mean(shares)) if shares else None,
        "share_min": float(np.min(shares)) if shares else None,
        "share_max": float(np.max(shares)) if shares else None,
        "dp_share_mean": float(np.mean(dp_shares)) if dp_shares else None,
        "rotor_overhead_mean": float(np.mean(rotor_oh)),
        "joint_overhead_mean": float(np.mean(joint_oh)),
    }


def bandwidth_sweep(chain, bandwidths, fraction: float = 0.5) -> list[dict]:
    """Share of rotor's overhead the joint DP alone removes, per link bandwidth, at one memory.

    The memory is ``fraction`` of the way from the least rotor fits in to the keep-all peak.
    """
    from chainoffload import Platform
    from chainoffload.simulate import keep_all_peak, simulate
    from chainoffload.solvers.joint import joint_dp
    from chainoffload.solvers.remat_baselines import recompute_all_schedule
    from chainoffload.solvers.rotor import rotor

    free = Platform(memory=2**62, bandwidth_d2h=BANDWIDTH, bandwidth_h2d=BANDWIDTH, latency=LATENCY)
    least = max(chain.stage_memory_floor(), simulate(chain, free, recompute_all_schedule(chain.length)).peak_memory)
    memory = int(least + fraction * (keep_all_peak(chain) - least))
    out = []
    for bw in bandwidths:
        platform = Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=LATENCY)
        r, j = rotor(chain, platform), joint_dp(chain, platform)
        ro = r.makespan / chain.compute_time - 1
        jo = j.makespan / chain.compute_time - 1 if j.status.has_schedule else math.inf
        out.append({"bandwidth": bw, "rotor": ro, "joint-dp": jo, "share": (ro - min(jo, ro)) / ro if ro > 1e-9 else None,
                    "offloads": len(j.info.get("offloaded_units", []))})
    return out


_TIMING = r"""
import json, sys, time, numpy as np
sys.path.insert(0, {bench!r})
from remat import random_chain
from chainoffload import Platform
from chainoffload.solvers.rotor import rotor
from chainoffload.solvers.joint import joint_dp
from chainoffload.simulate import keep_all_peak
out = {{}}
for length, slots in {sizes!r}:
    chain = random_chain(np.random.default_rng(length), length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)
    for name, func in (("rotor", rotor), ("joint", joint_dp)):
        times, cpu = [], []
        for _ in range({repeat}):
            t0, c0 = time.perf_counter(), time.process_time()
            func(chain, platform, slots=slots)
            times.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
        out[f"{{name}}-{{length}}-{{slots}}"] = times
        out[f"{{name}}-{{length}}-{{slots}}-cpu"] = cpu
print(json.dumps(out))
"""


def timing(sizes, repeat: int, env_extra: dict) -> dict:
    code = _TIMING.format(bench=str(Path(__file__).resolve().parent), sizes=sizes, repeat=repeat)
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(curves: dict, path: Path, bw_rows: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(curves) + (1 if bw_rows else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2))
    axes = np.atleast_1d(axes)
    if bw_rows:
        ax = axes[-1]
        for name, rows in bw_rows.items():
            ax.semilogx([r["bandwidth"] / 1e9 for r in rows], [100 * (r["share"] or 0.0) for r in rows], "o-", label=name, markersize=4)
        ax.set_xlabel("link bandwidth each way (GB/s)")
        ax.set_ylabel("share of rotor's overhead removed by the joint DP (%)")
        ax.set_title("memory halfway from rotor's least to keep-all", fontsize=9)
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax, (name, rows) in zip(axes, curves.items()):
        x = [r["fraction"] for r in rows]
        for method, style in (("rotor", "o-"), ("joint", "s-"), (PURE, "^-"), ("keep-all", "x"), ("sqrt-checkpoint", "d:")):
            y = [100 * r[method] if math.isfinite(r[method]) else np.nan for r in rows]
            ax.plot(x, y, style, label=method, markersize=4)
        ax.set_xlabel("memory limit / keep-all peak")
        ax.set_ylabel("overhead over sum(fwd)+sum(bwd) (%)")
        # Pure offloading and rotor's least-memory point run into the hundreds of %; clip
        # to where rotor and joint differ (beyond the second point, rotor's worst x 1.5).
        top = max([100 * r["rotor"] for r in rows[1:] if math.isfinite(r["rotor"])] or [1.0])
        ax.set_title(f"{name} (y clipped at {1.5 * top:.0f} %)", fontsize=9)
        ax.set_ylim(-0.5, 1.5 * top)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"rematerialization + offloading, {BANDWIDTH / 1e9:.0f} GB/s each way, {LATENCY * 1e6:.0f} us latency", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def fmt(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{100 * v:.1f} %"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer memory points and random chains")
    args = parser.parse_args(argv)
    points = 6 if args.quick else 12
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from chainoffload.examples import resnet18

    global PURE
    pure = PURE = offload_method()
    chains = {c.name: c for c in (gpt_like(), resnet18())}
    curves = {name: sweep(chain, points) for name, chain in chains.items()}
    rnd = random_set(4 if args.quick else 12, 30, 6 if args.quick else 8)
    bandwidths = [12.5e9, 25e9, 50e9, 100e9, 250e9, 1e12]
    bw_chains = {"gpt-like": gpt_like(), "resnet18": resnet18(), "random-30": random_chain(np.random.default_rng(7), 30)}
    bw_rows = {name: bandwidth_sweep(chain, bandwidths) for name, chain in bw_chains.items()}

    sizes = [(50, 500), (100, 500)]
    global LOAD
    LOAD = os.getloadavg()[0]
    warm = timing(sizes, 3, {})
    with tempfile.TemporaryDirectory() as cache:
        cold = timing(sizes[:1], 1, {"NUMBA_CACHE_DIR": cache})
    small = [(20, 100)]
    jit_small = timing(small, 3, {})
    py_small = timing(small, 1, {"NUMBA_DISABLE_JIT": "1"})

    RESULTS.mkdir(exist_ok=True)
    lines = [
        "# Rematerialization and offloading",
        "",
        f"`python benchmarks/remat.py{' --quick' if args.quick else ''}`, {datetime.date.today()}, "
        f"{os.cpu_count()} CPU cores; platform {BANDWIDTH / 1e9:.0f} GB/s each way, {LATENCY * 1e6:.0f} us latency, duplex; "
        f"S = 500 slots; pure offload = `{pure}`. Overhead = makespan / (sum fwd + sum bwd) - 1 (simulated); "
        "— = infeasible.",
        "",
    ]
    for name, rows in curves.items():
        lines += [f"## {name}", "", f"| memory (MiB) | / keep-all | keep-all | rotor | joint | joint DP alone | {pure} | sqrt-checkpoint | joint's pick | joint offloads (MiB) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for r in rows:
            lines.append(
                f"| {r['memory'] / 2**20:,.0f} | {r['fraction']:.2f} | {fmt(r['keep-all'])} | {fmt(r['rotor'])} | {fmt(r['joint'])} | "
                f"{fmt(r['joint-dp'])} | {fmt(r[pure])} | {fmt(r['sqrt-checkpoint'])} | {r['joint_source']} | {r['joint_offloaded'] / 2**20:,.0f} |"
            )
        s = share_removed(rows)
        lines += ["", f"Share of rotor's overhead that joint removes (mean over the points where rotor recomputes): "
                  f"{'n/a' if s is None else f'{100 * s:.0f} %'}", ""]
    lines += [
        f"## Random chains ({rnd['chains']} chains, L = {rnd['length']}, {rnd['points']} memory points each)",
        "",
        f"Share of rotor's overhead that joint removes: mean {100 * rnd['share_mean']:.0f} % "
        f"(per chain from {100 * rnd['share_min']:.0f} % to {100 * rnd['share_max']:.0f} %); mean overhead "
        f"rotor {100 * rnd['rotor_overhead_mean']:.1f} %, joint {100 * rnd['joint_overhead_mean']:.1f} %; "
        f"the joint DP alone removes {100 * rnd['dp_share_mean']:.0f} % on average.",
        "",
        "## Link bandwidth (memory halfway from the least rotor fits in to keep-all; joint DP alone vs rotor)",
        "",
        "Share of rotor's overhead the joint DP removes; in brackets, the units it offloads. Moving a unit takes "
        "10-40x its forward at 25 GB/s on these chains, so the gain grows with the link.",
        "",
        "| chain | " + " | ".join(f"{bw / 1e9:g} GB/s" for bw in bandwidths) + " |",
        "|---|" + "---:|" * len(bandwidths),
    ]
    for name, rows in bw_rows.items():
        cells = ["n/a" if r["share"] is None else f"{100 * r['share']:.0f} % ({r['offloads']})" for r in rows]
        lines.append(f"| {name} (rotor {fmt(rows[0]['rotor'])}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## DP runtime (random chain, memory 30 % of the way from the floor to keep-all; includes rebuild and simulation)",
        "",
        f"The 2 cores are shared with other jobs (1-minute load average {LOAD:.1f} when the warm timings ran): wall "
        "times vary with the load, the CPU time is the process's own.",
        "",
        "| method | L | S | warm (s, best of 3) | warm CPU time (s, best of 3) | cold: fresh process, empty Numba cache (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("rotor", "joint"):
        for length, slots in sizes:
            key = f"{name}-{length}-{slots}"
            c = cold.get(key, [math.nan])[0]
            lines.append(f"| {name} | {length} | {slots} | {min(warm[key]):.3f} | {min(warm[key + '-cpu']):.3f} | "
                         f"{'' if math.isnan(c) else f'{c:.2f}'} |")
    lines += ["", "Numba speed-up (L = 20, S = 100; the pure-Python kernels are too slow at L = 100):", "",
              "| method | jitted (s) | NUMBA_DISABLE_JIT=1 (s) | speed-up |", "|---|---:|---:|---:|"]
    for name in ("rotor", "joint"):
        key = f"{name}-20-100"
        j, p = min(jit_small[key]), py_small[key][0]
        lines.append(f"| {name} | {j:.4f} | {p:.2f} | {p / j:,.0f}x |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "remat.md").write_text(text)
    plot(curves, RESULTS / "remat.png", bw_rows)
    print(text)


if __name__ == "__main__":
    main()
