"""The transfer planner's verdict against the simulator's, on random unit sets, before and after.

The planner's safe sweep says whether every memory check passed (``fits``); the simulator judges
the plan. A sweep that says "fits" where the simulator rejects is optimistic; one that says "does
not fit" where the simulator accepts is pessimistic. Random chains of 2-8 stages (times 0 s with
probability 0.2 on a half-second grid in 70 % of them), random unit sets, links of 10-80 B/s or
infinitely fast, latency 0-0.5 s. Also: how :func:`chainoffload.planner.plan_units` (the best of
the planner's three plans, what every pure-offloading method scores) changes. Each tree runs in a
child process (``--before``: a revision, exported with ``git archive``, its kernels compiled).

    python benchmarks/planner_verdict.py --instances 3000 --seed 1 --before main
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def instances(count: int, seed: int):
    import numpy as np

    from chainoffload import Chain, Platform
    from chainoffload.simulate import keep_all_peak

    rng = np.random.default_rng(seed)
    for _ in range(count):
        length = int(rng.integers(2, 9))
        grid = rng.random() < 0.7

        def times(grid=grid, length=length):
            if grid:
                return (rng.integers(0, 5, length) * 0.5).tolist()
            return rng.uniform(0, 2, length).tolist()

        act = rng.integers(0, 40, length + 1).tolist()
        saved = [int(act[i + 1] + rng.integers(0, 40)) for i in range(length)]
        tmp = rng.random() < 0.3
        chain = Chain(fwd=times(), bwd=times(), act=act, saved=saved,
                      fwd_tmp=rng.integers(0, 10, length).tolist() if tmp else None,
                      bwd_tmp=rng.integers(0, 10, length).tolist() if tmp else None)
        lo, hi = chain.stage_memory_floor(), keep_all_peak(chain)
        memory = int(lo + (hi - lo) * rng.uniform(0, 1.0))
        links = [10.0, 20.0, 40.0, 80.0, float("inf")]
        d2h, h2d = links[int(rng.integers(5))], links[int(rng.integers(5))]
        latency = [0.0, 0.0, 0.25, 0.5][int(rng.integers(4))]
        platform = Platform(memory=memory, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=latency, duplex=bool(rng.integers(2)))
        k = int(rng.integers(1, length + 1))
        units = np.sort(rng.choice(np.arange(1, length + 1), size=k, replace=False)).astype(np.int64)
        yield chain, platform, units


def child(count: int, seed: int) -> list:
    import numpy as np

    from chainoffload.planner import _kplan, fixed_arrays, plan_arrays, plan_units, saved_table, score

    rows = []
    for chain, platform, units in instances(count, seed):
        ops, saved = fixed_arrays(chain.length), saved_table(chain)
        safe = plan_arrays(chain, platform, units)[0]
        offload = np.zeros(chain.length + 1, dtype=np.int64)
        offload[units] = 1
        d_time = platform.latency + chain.saved / platform.bandwidth_d2h
        h_time = platform.latency + chain.saved / platform.bandwidth_h2d
        fits = bool(_kplan.plan_kernel(chain.fwd, chain.bwd, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp,
                                       platform.memory, d_time, h_time, platform.duplex, offload, False, chain.saved.copy())[3])
        judged = score(chain, platform, tuple(units.tolist()), safe, ops, saved).feasible
        best = plan_units(chain, platform, units, ops, saved)
        rows.append([fits, judged, best.feasible, best.makespan])
    return rows


def run_tree(tree: Path, args, out: Path) -> list:
    env = {**os.environ, "PYTHONPATH": str(tree), "CHAINOFFLOAD_PROGRESS": ""}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--instances", str(args.instances),
           "--seed", str(args.seed), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--before", default="main", help="the revision to compare with (git)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "planner_verdict.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.out.write_text(json.dumps(child(args.instances, args.seed)))
        return
    load0 = Path("/proc/loadavg").read_text().split()[0]
    rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = tmp / "before"
        old.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        rows = {"before": run_tree(old, args, tmp / "before.json"), "after": run_tree(ROOT, args, tmp / "after.json")}
    load1 = Path("/proc/loadavg").read_text().split()[0]
    n = args.instances
    lines = [
        "## The planner's verdict against the simulator's, before and after",
        "",
        f"Command: `python benchmarks/planner_verdict.py --instances {n} --seed {args.seed} --before {args.before}`"
        f" — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load (1-minute average)"
        f" {load0} at the start, {load1} at the end. `before` is revision {rev}, `after` this tree.",
        "",
        f"{n} random unit sets on random chains (see the script's docstring). Safe sweep: its own verdict"
        " (every memory check passed) against the simulator's on its plan.",
        "",
        "| tree | says fits | simulator accepts | optimistic (fits, rejected) | pessimistic (does not fit, accepted) | best of three plans feasible |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {sum(x[0] for x in r)} | {sum(x[1] for x in r)} | {sum(x[0] and not x[1] for x in r)}"
                     f" | {sum(x[1] and not x[0] for x in r)} | {sum(x[2] for x in r)} |")
    b, a = rows["before"], rows["after"]
    gained = sum(1 for x, y in zip(b, a, strict=True) if y[2] and not x[2])
    lost = sum(1 for x, y in zip(b, a, strict=True) if x[2] and not y[2])
    both = [(x[3], y[3]) for x, y in zip(b, a, strict=True) if x[2] and y[2]]
    shorter = [(x - y) for x, y in both if y < x - 1e-9]
    longer = [(y - x) for x, y in both if y > x + 1e-9]
    lines += [
        "",
        f"Best of the planner's three plans (`plan_units`), after against before: feasible on {gained} more"
        f" and {lost} fewer; of the {len(both)} feasible in both, shorter on {len(shorter)}"
        + (f" (by {min(shorter):.3g}-{max(shorter):.3g} s)" if shorter else "")
        + f", longer on {len(longer)}" + (f" (by {min(longer):.3g}-{max(longer):.3g} s)" if longer else "") + ".",
    ]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import write_report

    write_report(lines, args.out)


if __name__ == "__main__":
    main()
