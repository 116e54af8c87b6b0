"""The NeurIPS 2021 paper's two claims, reproduced on the shipped networks; joint against the previous one; DP runtimes.

Beaumont, Eyraud-Dubois, Shilova, "Efficient Combination of Rematerialization and Offloading
for Training DNNs" (NeurIPS 2021) claim that (1) the possibility to offload removes about one
third of rematerialization's overhead, and (2) together they cut the memory used for
activations by a factor 4 to 6 with an overhead below 20 %. On the ten shipped networks, with
A100-roofline times and their V100-era twins (``network(name, gpu="V100")``), at 12, 25 and 64
GB/s each way (10 us per copy, duplex):

1. the share of rotor's overhead that ``joint`` removes at 30 % and 50 % of the keep-all peak
   (overhead = makespan / (sum fwd + sum bwd) - 1, simulated), its median over the networks;
2. the largest activation-memory reduction factor (keep-all peak / memory) at which joint's
   overhead stays below 20 % (a geometric scan from 1 to peak / floor, then bisection), and
   rotor's, for comparison;
3. joint against the joint of main at commit ``OLD_COMMIT`` (its DP is copied out of git into a
   temporary directory, never into the tree) on every network x GPU x link x memory point:
   points where the new one is slower (the target is none), and the paper's DP alone against
   that DP alone;
4. the paper's DP alone (``joint_dp``) at L = 100 with 500 slots (warm, and cold in a fresh
   process with an empty Numba cache) and from L = 25 to 1000 (CPU time, peak memory, growth
   exponent), on random chains.

    python benchmarks/remat.py              # all: benchmarks/results/remat.md, remat.png, remat.json
    python benchmarks/remat.py --quick      # two networks, one link, for a smoke run
    python benchmarks/remat.py --timing     # rerun section 4 only, into the saved remat.json
    python benchmarks/remat.py --report     # rewrite remat.md and remat.png from remat.json

Section 4 runs each size in a fresh process (peak memory is its own VmHWM).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"

#: The commit of main whose joint the new one is measured against (the one-in-flight DP).
OLD_COMMIT = "c9e63eca37ad16466893273cf8864c7a00717387"

GPUS = ("V100", "A100")
LINKS = (12e9, 25e9, 64e9)
LATENCY = 1e-5
FRACTIONS = (0.3, 0.5)
OVERHEAD_CAP = 0.20
COMPARE_POINTS = 4
# The paper's platform and today's, where the issue sets its targets.
TARGETS = {("V100", 12e9): (1 / 3, 4.0), ("A100", 25e9): (0.2, None)}


def platform_for(memory: int, bandwidth: float):
    from chainoffload import Platform

    return Platform(memory=int(memory), bandwidth_d2h=bandwidth, bandwidth_h2d=bandwidth, latency=LATENCY)


# -- the previous joint, from git -----------------------------------------------------------------


def load_old_joint(workdir: Path):
    """Import ``joint_dp`` of commit :data:`OLD_COMMIT` from a copy written under ``workdir``."""
    pkg = workdir / "chainoffload_old_joint"
    pkg.mkdir(parents=True, exist_ok=True)
    files = {"solver.py": "chainoffload/solvers/joint.py", "kernel.py": "chainoffload/_kernels/joint.py"}
    for name, path in files.items():
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        text = text.replace("from .._kernels.joint import", "from .kernel import")
        text = text.replace("from .config import", "from chainoffload._kernels.config import")
        text = re.sub(r"from \.\.(\w)", r"from chainoffload.\1", text)
        text = text.replace("from .rotor import", "from chainoffload.solvers.rotor import")
        text = text.replace("from . import solve", "from chainoffload.solvers import solve")
        (pkg / name).write_text(text)
    (pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(workdir))
    from chainoffload_old_joint import solver

    return solver.joint_dp


# -- one point -----------------------------------------------------------------------------------


class Runner:
    """Runs rotor, pure offloading, joint (and the previous joint's DP) once per point."""

    def __init__(self, old_dp=None):
        self.old_dp = old_dp
        self.cache: dict[tuple, dict] = {}

    def rotor_only(self, chain, memory: int, bandwidth: float) -> dict:
        """Rotor's overhead alone (claim 2's scan of rotor needs nothing else)."""
        for (name, mem, bw, _), row in self.cache.items():
            if (name, mem, bw) == (chain.name, int(memory), bandwidth):
                return row
        from chainoffload.solvers.rotor import rotor

        r = rotor(chain, platform_for(memory, bandwidth))
        return {"rotor": r.makespan / chain.compute_time - 1 if r.status.has_schedule else math.inf}

    def point(self, chain, memory: int, bandwidth: float, compare: bool = False) -> dict:
        key = (chain.name, int(memory), bandwidth, compare)
        if key in self.cache:
            return self.cache[key]
        if not compare and (chain.name, int(memory), bandwidth, True) in self.cache:
            return self.cache[(chain.name, int(memory), bandwidth, True)]
        from chainoffload.bounds import offload_memory_floor
        from chainoffload.result import Result, Status
        from chainoffload.solvers.best import best
        from chainoffload.solvers.joint import joint
        from chainoffload.solvers.rotor import rotor

        p = platform_for(memory, bandwidth)
        t0 = time.process_time()
        r = rotor(chain, p)
        if memory >= offload_memory_floor(chain):
            o = best(chain, p)
        else:  # no pure-offloading schedule fits below this proven floor
            o = Result("best", Status.INFEASIBLE, None)
        j = joint(chain, p, offload=o)
        oh = lambda x: x / chain.compute_time - 1 if math.isfinite(x) else math.inf  # noqa: E731
        row = {
            "memory": int(memory),
            "rotor": oh(r.makespan if r.status.has_schedule else math.inf),
            "offload": oh(o.makespan if o.status.has_schedule else math.inf),
            "joint": oh(j.makespan if j.status.has_schedule else math.inf),
            "joint_dp": oh(j.info.get("joint-dp_makespan", math.inf)),
            "dp_model": oh(j.info.get("dp_makespan", math.inf)),
            "joint_exact": oh(j.info.get("joint-exact_makespan", math.inf)),
            "source": j.info.get("source"),
            # whether the plan joint returns moves some a_i alone out of a whole unit (moves: "act")
            "act_alone": bool(j.info.get("source") == "joint-dp" and j.info.get("act_alone")),
            "cpu": time.process_time() - t0,
        }
        if compare and self.old_dp is not None:
            old = self.old_dp(chain, p)
            row["old_dp"] = oh(old.makespan if old.status.has_schedule else math.inf)
            row["old_joint"] = min(row["old_dp"], row["rotor"], row["offload"])
        self.cache[key] = row
        return row


def share(row: dict) -> float | None:
    """Share of rotor's overhead that joint removes (None where rotor does not recompute or cannot run)."""
    ro, jo = row["rotor"], row["joint"]
    if not math.isfinite(ro) or ro <= 1e-9:
        return None
    return (ro - min(jo, ro)) / ro


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


# -- claim (2): the largest reduction factor ------------------------------------------------------


def largest_factor(runner: Runner, chain, bandwidth: float, key: str) -> tuple[float, list[tuple[float, float]]]:
    """Largest keep-all peak / memory with ``key``'s overhead below the cap; and the scanned curve."""
    from chainoffload.simulate import keep_all_peak

    peak, floor = keep_all_peak(chain), chain.stage_memory_floor()
    top = peak / floor
    grid = sorted(set([1.0] + list(np.geomspace(1.0, top, 9)[1:])))
    curve = []
    good = 1.0
    bad = None
    run = runner.rotor_only if key == "rotor" else runner.point
    for f in grid:
        row = run(chain, max(floor, int(peak / f)), bandwidth)
        curve.append((f, row[key]))
        if row[key] < OVERHEAD_CAP:
            good = f
        else:
            bad = f
            break
    if bad is not None:
        for _ in range(3):  # bisection between the last good and the first bad factor
            mid = math.sqrt(good * bad)
            row = run(chain, max(floor, int(peak / mid)), bandwidth)
            curve.append((mid, row[key]))
            if row[key] < OVERHEAD_CAP:
                good = mid
            else:
                bad = mid
    return good, sorted(curve)


# -- runtimes ------------------------------------------------------------------------------------

_TIMING = r"""
import json, sys, time, numpy as np
sys.path.insert(0, {bench!r})
from remat import random_chain
from chainoffload import Platform
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers.joint import joint_dp
out = {{}}
for length, rows, repeat in {sizes!r}:
    chain = random_chain(np.random.default_rng(length), length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    p = Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)
    cpu, wall = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = joint_dp(chain, p, rows=rows)
        wall.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
    # VmHWM: this process's own peak (getrusage's maxrss keeps the spawning parent's after exec).
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
    out[f"{{length}}-{{rows}}"] = {{"cpu": cpu, "wall": wall, "rows": res.info.get("rows"), "rss": hwm * 1024}}
print(json.dumps(out))
"""


def random_chain(rng, length: int):
    """The random chains of the runtime section: units of 1-64 MiB times 1-5, ~2 ps per byte forward."""
    from chainoffload import Chain

    act = rng.integers(1 << 20, 1 << 26, size=length + 1)
    saved = act[1:] * rng.integers(1, 6, size=length)
    fwd = saved * 2e-12 * rng.uniform(0.5, 2.0, size=length)
    return Chain(fwd, 2 * fwd, act, saved, act[1:] // 2, act[1:], name=f"random-{length}")


def timing(sizes, env_extra: dict | None = None) -> dict:
    """Run ``joint_dp`` in a fresh process for each (L, rows, repeats); CPU, wall times and peak RSS."""
    out = {}
    for size in sizes:
        code = _TIMING.format(bench=str(HERE), sizes=[size])
        env = {**os.environ, **(env_extra or {})}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        out.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def slope(xs, ys) -> float:
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


# -- report --------------------------------------------------------------------------------------


def pct(v) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{100 * v:.1f} %"


def shr(v) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def link_name(bw: float) -> str:
    return f"{bw / 1e9:g} GB/s"


def platform_key(key: str) -> tuple[str, float]:
    """("V100", 12e9) from a saved key "V100 1.2e+10"."""
    gpu, bw = key.split()
    return gpu, float(bw)


def plot(path: Path, data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    axes = axes.ravel()
    markers = {12e9: "o", 25e9: "s", 64e9: "^"}
    colours = {12e9: "tab:blue", 25e9: "tab:orange", 64e9: "tab:green"}
    names = data["names"]
    for ax, want in zip(axes[:2], GPUS, strict=True):
        for key, rows in data["claim1"].items():
            gpu, bw = platform_key(key)
            if gpu != want:
                continue
            for k, frac in enumerate(FRACTIONS):
                xs = [i + (k - 0.5) * 0.25 for i in range(len(names))]
                ys = [100 * rows[n][str(frac)]["share"] if rows[n][str(frac)] and rows[n][str(frac)]["share"] is not None
                      else np.nan for n in names]
                ax.scatter(xs, ys, marker=markers.get(bw, "x"), s=34, edgecolors=colours.get(bw, "k"),
                           facecolors=colours.get(bw, "k") if k else "none",
                           label=f"{link_name(bw)}, {int(100 * frac)} % of the peak")
        ax.axhline(100 / 3, color="grey", ls="--", lw=0.8)
        ax.text(len(names) - 0.6, 100 / 3 + 1.5, "the paper: one third", fontsize=8, color="grey", ha="right")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("share of rotor's overhead removed by joint (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"claim 1, {want} times (no point: below the network's floor)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=3, loc="upper left")

    ax = axes[2]
    for name, (rot, jnt) in data["curves"].items():
        line = ax.plot([f for f, _ in jnt], [100 * min(v, 1.0) for _, v in jnt], "-", lw=1.2, label=f"{name} joint")
        ax.plot([f for f, _ in rot], [100 * min(v, 1.0) for _, v in rot], ":", lw=1.2, color=line[0].get_color(),
                label=f"{name} rotor")
    ax.axhline(100 * OVERHEAD_CAP, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("activation memory reduction factor (keep-all peak / memory)")
    ax.set_ylabel("overhead (%), clipped at 100")
    ax.set_title("claim 2: V100 twins at 12 GB/s (the paper's platform)", fontsize=9)
    ax.set_ylim(-1, 60)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)

    ax = axes[3]
    scale = data["scale"]
    for rows_key, label in (("None", "default rows (chosen from L)"), ("2", "2 rows per queue")):
        pts = sorted((int(k.split("-")[0]), min(v["cpu"])) for k, v in scale.items() if k.split("-")[1] == rows_key)
        if pts:
            ax.loglog([p for p, _ in pts], [t for _, t in pts], "o-", label=label)
    ax.axhline(10, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("chain length L (random chains, S = 500 slots)")
    ax.set_ylabel("joint_dp CPU time (s)")
    ax.set_title("the paper's DP at scale", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two networks, the V100 twins at 12 GB/s, short timings")
    parser.add_argument("--networks", nargs="*", help="network names (default: all shipped)")
    parser.add_argument("--timing", action="store_true", help="rerun the runtime section only, into remat.json")
    parser.add_argument("--report", action="store_true", help="rewrite remat.md and remat.png from remat.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    raw = RESULTS / "remat.json"
    if args.report or args.timing:
        data = json.loads(raw.read_text())
        if args.timing:
            data.update(runtimes(data["quick"]))
    else:
        data = sweeps(args)
        data.update(runtimes(args.quick))
    RESULTS.mkdir(exist_ok=True)
    raw.write_text(json.dumps(data, indent=0, allow_nan=True) + "\n")
    write_report(data)


def sweeps(args) -> dict:
    """Sections 1-3: the claims and the comparison; a JSON-ready dict."""
    from chainoffload.networks import network, network_names
    from chainoffload.simulate import keep_all_peak

    names = args.networks or (["resnet50", "inception_v3"] if args.quick else list(network_names()))
    platforms = [("V100", 12e9)] if args.quick else [(g, b) for g in GPUS for b in LINKS]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runner = Runner(load_old_joint(Path(tmp)))

        # (1) share of rotor's overhead removed, and (3) the comparison, on the same points.
        claim1: dict = {}
        compare: list[dict] = []
        for gpu, bw in platforms:
            rows = claim1.setdefault(f"{gpu} {bw:g}", {})
            for name in names:
                chain = network(name, gpu=gpu)
                peak, floor = keep_all_peak(chain), chain.stage_memory_floor()
                rows[name] = {}
                for frac in FRACTIONS:
                    memory = int(frac * peak)
                    if memory < floor:
                        rows[name][str(frac)] = None
                        continue
                    row = runner.point(chain, memory, bw, compare=True)
                    rows[name][str(frac)] = {**row, "share": share(row)}
                    compare.append({**row, "network": name, "gpu": gpu, "bw": bw})
                for memory in np.linspace(floor, peak, COMPARE_POINTS).astype(np.int64):
                    row = runner.point(chain, int(memory), bw, compare=True)
                    compare.append({**row, "network": name, "gpu": gpu, "bw": bw})
                print(f"claim 1 {gpu} {link_name(bw)} {name}: " + ", ".join(
                    f"{frac}: {shr(rows[name][str(frac)]['share']) if rows[name][str(frac)] else 'below floor'}"
                    for frac in FRACTIONS), flush=True)

        # (2) largest reduction factor under 20 % overhead.
        claim2: dict = {}
        curves: dict = {}
        for gpu, bw in platforms:
            rows = claim2.setdefault(f"{gpu} {bw:g}", {})
            for name in names:
                chain = network(name, gpu=gpu)
                f_joint, c_joint = largest_factor(runner, chain, bw, "joint")
                f_rotor, c_rotor = largest_factor(runner, chain, bw, "rotor")
                cap = keep_all_peak(chain) / chain.stage_memory_floor()
                rows[name] = {"joint": f_joint, "rotor": f_rotor, "cap": cap}
                if (gpu, bw) == ("V100", 12e9) and name in ("resnet50", "resnet152", "densenet121", "gpt2_48", "inception_v3"):
                    curves[name] = (c_rotor, c_joint)
                print(f"claim 2 {gpu} {link_name(bw)} {name}: joint {f_joint:.2f}x rotor {f_rotor:.2f}x (cap {cap:.2f}x)",
                      flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "quick": bool(args.quick),
        "date": str(datetime.date.today()),
        "commit": commit or None,
        "names": names,
        "platforms": [f"{g} {b:g}" for g, b in platforms],
        "claim1": claim1,
        "claim2": claim2,
        "compare": compare,
        "curves": curves,
        "sweep_minutes": (time.perf_counter() - started) / 60,
        "sweep_load": os.getloadavg()[0],
    }


def runtimes(quick: bool) -> dict:
    """Section 4: the paper's DP alone, in fresh processes."""
    load = os.getloadavg()[0]
    lengths = (25, 50, 100) if quick else (25, 50, 100, 200, 400, 1000)
    scale = timing([(n, None, 1) for n in lengths] + [(n, 2, 1) for n in lengths])
    warm = timing([(100, None, 3)])
    with tempfile.TemporaryDirectory() as cache:
        cold = timing([(100, None, 1)], {"NUMBA_CACHE_DIR": cache})
    return {"scale": scale, "warm": warm, "cold": cold, "timing_load": load}


def explanation(data: dict) -> list[str]:
    """Why our figures differ from the paper's, with the numbers that say so."""
    from chainoffload.networks import network
    from chainoffload.simulate import keep_all_peak

    names = data["names"]
    movable = {}
    for gpu in GPUS:
        chains = [network(n, gpu=gpu) for n in names]
        movable[gpu] = median([12e9 * float(c.fwd.sum()) / keep_all_peak(c) for c in chains])
    caps = {n: keep_all_peak(network(n)) / network(n).stage_memory_floor() for n in names}
    capped = sorted(n for n, c in caps.items() if c < 4.0)
    errors = [abs(r["dp_model"] - r["joint_dp"]) / (1 + r["joint_dp"]) for r in data["compare"]
              if math.isfinite(r.get("dp_model", math.inf)) and math.isfinite(r["joint_dp"])]
    lines = [
        "Why the figures differ from the paper's:",
        "",
        f"- **Link against compute.** What offloading can hide is the bytes the link moves while the GPU computes. At "
        f"12 GB/s the link moves, during one forward pass, {100 * movable['V100']:.0f} % of the keep-all peak on the V100 "
        f"twins but {100 * movable['A100']:.0f} % on the A100 roofline (median over the networks): an A100 computes a "
        "float32 convolution about ten times faster (TF32), so the same link hides a tenth as much behind it. The paper's "
        "claims are for a V100 at 12 GB/s; our A100 shares are correspondingly smaller, and grow with the link.",
        f"- **The floor.** No schedule of any kind runs below the memory a single stage's own forward and backward need, so "
        f"the reduction factor is capped at keep-all peak / floor: under 4x for {', '.join(capped) or 'none'} "
        "(the cap column), which puts a 4x factor out of reach of the median network whatever the method. The paper's "
        "chains (ResNet, DenseNet and Inception at batch 16, 500 x 500 images, split into many more stages than our "
        "block-level chains) have lower floors relative to their peaks; the deep chains here (ResNet-101/152, "
        "DenseNet-121, the 48-block GPT-2) are the ones that reach 4x and more.",
        "- **Large first units.** ResNet's first stages keep units of 0.5-0.8 GB (45-70 ms each at 12 GB/s, most of a "
        "V100 forward pass), so they cannot leave the GPU in time to make room for the deep part, and at 30 % of the peak "
        "rotor must recompute them whatever is offloaded.",
        f"- **Whole transfers.** The paper's DP moves bytes as fluids; our simulator frees an offloaded unit only when its "
        f"whole copy has ended and charges a prefetch's whole size from its start. The DP's estimate of its own plan is "
        f"off by {100 * median(errors):.1f} points of overhead at the median point (at most "
        f"{100 * max(errors):.1f}); joint reports the simulator's figure, after turning memory excess into waits."
        if errors else "- **Whole transfers.** (no DP plan was simulated)",
    ]
    return lines


def write_report(data: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    names = data["names"]
    quick = data["quick"]
    lines = [
        "# Rematerialization and offloading: the NeurIPS 2021 claims",
        "",
        f"`python benchmarks/remat.py{' --quick' if quick else ''}`, {data['date']}"
        + (f" at commit {data['commit']}" if data.get("commit") else "")
        + f", {os.cpu_count()} CPU cores shared "
        f"with other jobs (load {data['sweep_load']:.1f}); {data['sweep_minutes']:.0f} min for the sweeps (raw results: "
        f"`remat.json`). Links {', '.join(link_name(b) for b in LINKS)} each way, {LATENCY * 1e6:.0f} us per copy, "
        "duplex; S = 500 slots. Overhead = makespan / (sum fwd + sum bwd) - 1, simulated. `joint` is the best of the "
        "paper's DP, the exact one-in-flight DP, rotor and `best` (pure offloading, run where memory is above its proven "
        "floor). — : below the chain's floor (no schedule of any kind fits).",
        "",
        "## Claim 1: share of rotor's overhead that offloading removes",
        "",
        "The paper: about **one third**. Share = (rotor - joint) / rotor, overheads; n/a where rotor does not recompute.",
        "",
    ]
    summary1 = {}
    for key, rows in data["claim1"].items():
        gpu, bw = platform_key(key)
        lines += [f"### {gpu} times, {link_name(bw)}", "",
                  "| network | rotor @30 % | joint @30 % | share @30 % | rotor @50 % | joint @50 % | share @50 % |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name in names:
            cells = []
            for frac in FRACTIONS:
                r = rows[name][str(frac)]
                cells += ["—", "—", "—"] if r is None else [pct(r["rotor"]), pct(r["joint"]), shr(r["share"])]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        meds = {f: median([rows[n][str(f)]["share"] if rows[n][str(f)] else None for n in names]) for f in FRACTIONS}
        both = median([rows[n][str(f)]["share"] if rows[n][str(f)] else None for n in names for f in FRACTIONS])
        summary1[key] = (meds, both)
        lines += ["", f"Median share over the networks: {shr(meds[0.3])} at 30 %, {shr(meds[0.5])} at 50 %, "
                  f"{shr(both)} over both.", ""]
    lines += ["## Claim 2: largest memory reduction with joint's overhead below 20 %", "",
              "The paper: a factor **4 to 6**. Factor = keep-all peak / memory; the cap is peak / floor, where a single "
              "stage's own forward and backward no longer fit (no schedule goes below it).", ""]
    summary2 = {}
    for key, rows in data["claim2"].items():
        gpu, bw = platform_key(key)
        lines += [f"### {gpu} times, {link_name(bw)}", "", "| network | joint | rotor | cap (peak / floor) |", "|---|---:|---:|---:|"]
        for name in names:
            r = rows[name]
            lines.append(f"| {name} | {r['joint']:.2f}x | {r['rotor']:.2f}x | {r['cap']:.2f}x |")
        med_j = median([rows[n]["joint"] for n in names])
        med_r = median([rows[n]["rotor"] for n in names])
        med_c = median([rows[n]["cap"] for n in names])
        summary2[key] = (med_j, max(rows[n]["joint"] for n in names))
        lines += ["", f"Median network: joint {med_j:.2f}x, rotor {med_r:.2f}x, cap {med_c:.2f}x.", ""]

    lines += ["## Against the targets and the paper", "",
              "| platform | median share @30 % | @50 % | both | target | median factor (joint) | best network | target |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in data["claim1"]:
        gpu, bw = platform_key(key)
        meds, both = summary1[key]
        mj, mx = summary2[key]
        t_share, t_factor = TARGETS.get((gpu, bw), (None, None))
        lines.append(
            f"| {gpu} {link_name(bw)} | {shr(meds[0.3])} | {shr(meds[0.5])} | {shr(both)} | "
            f"{'—' if t_share is None else ('met' if both is not None and both >= t_share else 'missed') + f' (>= {100 * t_share:.0f} %)'} | "
            f"{mj:.2f}x | {mx:.2f}x | {'—' if t_factor is None else ('met' if mj >= t_factor else 'missed') + f' (>= {t_factor:g}x)'} |"
        )
    lines += ["", *explanation(data), ""]

    # (3) comparison with main's joint.
    rows = [r for r in data["compare"] if "old_joint" in r]
    worse = [r for r in rows if r["joint"] > r["old_joint"] * (1 + 1e-9) + 1e-12]
    better = [r for r in rows if r["joint"] < r["old_joint"] - 1e-9]
    gains = [r["old_joint"] - r["joint"] for r in better]
    dp_better = sum(1 for r in rows if r["joint_dp"] < r["old_dp"] - 1e-9)
    dp_worse = sum(1 for r in rows if r["joint_dp"] > r["old_dp"] + 1e-9)
    lines += [
        "## joint against main's joint",
        "",
        f"On {len(rows)} points (each network x GPU x link at 30 % and 50 % of its peak and at {COMPARE_POINTS} memories "
        f"from its floor to its peak), `joint` is slower than main's (commit {OLD_COMMIT[:7]}, its DP read from git into a "
        f"temporary directory) on **{len(worse)}** and faster on {len(better)}"
        + (f" (by {100 * np.mean(gains):.1f} points of overhead on average, at most {100 * max(gains):.1f})" if gains else "")
        + f". The paper's DP alone against main's DP alone: faster on {dp_better} points, slower on {dp_worse} "
        "(there the exact DP, which is main's, is the one joint keeps).",
        "",
    ]
    if worse:
        lines += ["| network | GPU | link | memory | main's joint | joint |", "|---|---|---|---:|---:|---:|"]
        for r in worse:
            lines.append(f"| {r['network']} | {r['gpu']} | {link_name(r['bw'])} | {r['memory'] / 2**30:.2f} GiB | "
                         f"{pct(r['old_joint'])} | {pct(r['joint'])} |")
        lines.append("")
    sources: dict = {}
    for r in rows:
        sources[r["source"]] = sources.get(r["source"], 0) + 1
    lines += ["Which candidate joint returned: " + ", ".join(f"{k}: {v}" for k, v in sorted(sources.items(), key=str)) + ".", ""]
    if any("act_alone" in r for r in rows):
        lone = sum(1 for r in rows if r.get("act_alone"))
        lines += [f"Offload granularity: the plan joint returned moves some a_i alone out of a whole unit (transfers with "
                  f"`moves: \"act\"`, the rest of the unit staying on the GPU) on {lone} of these {len(rows)} points.", ""]

    # (4) runtimes.
    scale, w, c = data["scale"], data["warm"]["100-None"], data["cold"]["100-None"]
    lines += [
        "## Runtime of the paper's DP (`joint_dp`, random chains, 25 GB/s, memory 30 % of the way from floor to peak)",
        "",
        f"Each size in a fresh process (load {data['timing_load']:.1f}). L = 100, S = 500: warm {min(w['cpu']):.2f} s CPU "
        f"({min(w['wall']):.2f} s wall, best of 3; the target is 2 s), {w['rows']} grid rows per queue; cold (fresh "
        f"process, empty Numba cache) {c['wall'][0]:.1f} s wall.",
        "",
        "| L | rows (default) | CPU (s) | peak memory (MiB) | CPU with 2 rows (s) | peak memory (MiB) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lengths = sorted({int(k.split("-")[0]) for k in scale})
    for n in lengths:
        d, f = scale[f"{n}-None"], scale[f"{n}-2"]
        lines.append(f"| {n} | {d['rows']} | {d['cpu'][0]:.2f} | {d['rss'] / 2**20:.0f} | {f['cpu'][0]:.2f} | {f['rss'] / 2**20:.0f} |")
    big = [n for n in lengths if n >= 100]
    s_def = slope(big, [scale[f"{n}-None"]["cpu"][0] for n in big]) if len(big) > 1 else math.nan
    s_two = slope(big, [scale[f"{n}-2"]["cpu"][0] for n in big]) if len(big) > 1 else math.nan
    lines += ["", f"Growth exponent of the CPU time over L = {big[0]}..{big[-1]} (log-log slope): {s_def:.2f} with the default "
              f"rows (they shrink as L grows, to hold the table near its cell budget), {s_two:.2f} at a fixed 2 rows per queue.", ""]
    text = "\n".join(lines) + "\n"
    (RESULTS / "remat.md").write_text(text)
    plot(RESULTS / "remat.png", data)
    print(text)


if __name__ == "__main__":
    main()
