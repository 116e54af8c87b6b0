"""Zero-length ops (issue 33): how many random small instances each pure-offloading method solves.

Random chains of 2-4 stages where some F_i / B_i take 0 s, at a memory drawn between the offload
memory floor and the keep-all peak. The reference is CP-SAT (one worker, a time limit) and, on
chains of at most 3 stages, the brute force (``chainoffload.exact``). Each method runs twice, in
child processes: on this tree and on an older revision (``--before``, exported with
``git archive``), so the report shows what changed. Every schedule a method reports is replayed
by the simulator and its makespan compared with the reported one.

    python benchmarks/zero_length.py --instances 300 --before 0993de4

The old revision runs with ``NUMBA_DISABLE_JIT=1`` (its kernels interpreted: no compile for a
throwaway tree; on these tiny chains the answers are those of the compiled kernels).
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
METHODS = ("keep-all", "offload-all", "first-k", "largest-first", "lp", "dp", "best")
CPSAT_LIMIT = 20.0


def make_instances(count: int, seed: int) -> list[dict]:
    """``count`` instances with at least one zero-length op, as JSON-ready dicts."""
    import numpy as np

    import chainoffload as co
    from chainoffload.bounds import offload_memory_floor

    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        length = int(rng.integers(2, 5))

        # 0 s with probability 0.4, else a multiple of 1/8 s (CP-SAT's grid holds it exactly)
        fwd, bwd = ([0.0 if rng.random() < 0.4 else float(rng.integers(1, 17)) / 8 for _ in range(length)] for _ in range(2))
        if min(fwd + bwd) > 0:
            continue
        act = [int(x) for x in rng.integers(0, 33, length + 1)]
        saved = [act[i + 1] + int(rng.integers(0, 49)) for i in range(length)]
        chain = co.Chain(name=f"z{len(out)}", fwd=fwd, bwd=bwd, act=act, saved=saved)
        floor, peak = offload_memory_floor(chain), co.keep_all_peak(chain)
        if peak <= floor:
            continue
        memory = int(rng.integers(floor, peak))  # below keep-all: something must move
        platform = co.Platform(
            memory=memory,
            bandwidth_d2h=float(rng.choice([10.0, 20.0, 40.0, 80.0])),
            bandwidth_h2d=float(rng.choice([10.0, 20.0, 40.0, 80.0])),
            latency=float(rng.choice([0.0, 0.25, 0.5])),
            duplex=bool(rng.random() < 0.8),
        )
        out.append({"chain": chain.to_dict(), "platform": platform.to_dict()})
    return out


def child(path: Path, reference: bool) -> list[dict]:
    """Run every method (and the references) on the instances in ``path``."""
    import chainoffload as co

    rows = []
    for item in json.loads(path.read_text()):
        chain, platform = co.Chain.from_dict(item["chain"]), co.Platform.from_dict(item["platform"])
        row: dict = {}
        for method in METHODS:
            t0 = time.perf_counter()
            res = co.solve(chain, platform, method)
            entry = {"status": res.status.value, "seconds": time.perf_counter() - t0}
            if res.schedule is not None:
                tl = co.simulate(chain, platform, res.schedule)
                entry["makespan"] = res.makespan
                entry["agrees"] = bool(tl.feasible and tl.makespan == res.makespan)
            row[method] = entry
        if reference:
            if not all(found(row[m]) for m in METHODS if m != "keep-all"):
                row["unit_sets"] = fitting_unit_sets(chain, platform)
            res = co.solve(chain, platform, "cpsat", time_limit=CPSAT_LIMIT, workers=1)
            row["cpsat"] = {"status": res.status.value, "makespan": res.makespan if res.schedule is not None else None}
            if chain.length <= 3:
                from chainoffload.exact import brute_force

                bf = brute_force(chain, platform)
                row["brute"] = {"status": bf.status.value, "makespan": bf.makespan if bf.schedule is not None else None}
        rows.append(row)
    return rows


def fitting_unit_sets(chain, platform) -> list[list[int]]:
    """Every set of units 1..L-1 whose plan by the shared planner the simulator accepts.

    The pure-offloading methods other than ``best`` choose such a set and time it with the
    planner: on a chain they miss, this is their whole family (2^(L-1) sets, at most 8 here).
    """
    import itertools

    import chainoffload as co
    from chainoffload.planner import plan_transfers

    units = range(1, chain.length)
    return [
        list(s)
        for k in range(chain.length)
        for s in itertools.combinations(units, k)
        if co.simulate(chain, platform, plan_transfers(chain, platform, list(s))).feasible
    ]


def run_tree(tree: Path, path: Path, out: Path, reference: bool, interpreted: bool) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "CHAINOFFLOAD_PROGRESS": ""}
    if interpreted:
        env["NUMBA_DISABLE_JIT"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), "--out", str(out)]
    if reference:
        cmd.append("--reference")
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    return json.loads(out.read_text())


def found(entry: dict | None) -> bool:
    return entry is not None and entry["status"] in ("optimal", "feasible")


def report(instances: list[dict], before: list[dict], after: list[dict], args, load: tuple[str, str], rev: str) -> list[str]:
    n = len(instances)
    ref = [found(r.get("cpsat")) or found(r.get("brute")) for r in after]
    n_ref = sum(ref)
    n_brute = sum(1 for r in after if "brute" in r)
    disagree = sum(1 for r in after if "brute" in r and found(r["cpsat"]) != found(r["brute"]))
    proven_none = sum(1 for r in after if r["cpsat"]["status"] == "infeasible" or r.get("brute", {}).get("status") == "infeasible")
    lines = [
        "## Zero-length ops: instances solved by each pure-offloading method, before and after",
        "",
        f"Command: `python benchmarks/zero_length.py --instances {args.instances} --seed {args.seed} --before {args.before}`"
        f" — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load (1-minute average,"
        f" `/proc/loadavg`) {load[0]} at the start, {load[1]} at the end (the machine is shared).",
        "",
        f"{n} random chains of 2-4 stages, each with at least one zero-length F_i or B_i (every time 0 s with"
        " probability 0.4, else a multiple of 1/8 s up to 2 s), sizes up to 80 B, memory drawn between the"
        " offload memory floor and the keep-all peak, links of 10-80 B/s per direction, latency 0-0.5 s,"
        " duplex 80 %. Reference: CP-SAT (one worker, "
        f"{CPSAT_LIMIT:g} s limit) and, on the {n_brute} chains of at most 3 stages, the brute force. "
        f"A schedule exists on {n_ref} instances; on {proven_none} none does (proven); CP-SAT and the brute force"
        f" disagree on {disagree}. `before` is revision {rev} (kernels interpreted), `after` this tree.",
        "",
        "| method | solved before (of the instances with a schedule) | solved after | missed after | schedules the simulator disagrees with (before / after) | mean seconds after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in METHODS:
        b = sum(1 for r, ok in zip(before, ref, strict=True) if ok and found(r[m]))
        a = sum(1 for r, ok in zip(after, ref, strict=True) if ok and found(r[m]))
        bad_b = sum(1 for r in before if found(r[m]) and not r[m]["agrees"])
        bad_a = sum(1 for r in after if found(r[m]) and not r[m]["agrees"])
        secs = sum(r[m]["seconds"] for r in after) / n
        lines.append(f"| {m} | {b} / {n_ref} | {a} / {n_ref} | {n_ref - a} | {bad_b} / {bad_a} | {secs:.3f} |")
    wrong = [i for i, (r, ok) in enumerate(zip(after, ref, strict=True)) if not ok and any(found(r[m]) for m in METHODS)]
    lines += ["", f"Instances where a method found a schedule the references did not: {len(wrong)}."]
    lines += [
        "",
        "Instances with a schedule that a method misses after, and the unit sets whose plan by the shared planner"
        " fits there (all 2^(L-1) sets enumerated). Every method here but `best` chooses a unit set and times it"
        " with that planner, so `[]` proves that its family holds no schedule on that chain (CP-SAT's schedule"
        " there moves an activation alone, or times the transfers otherwise).",
        "",
    ]
    for m in METHODS:
        if m in ("keep-all", "best"):
            continue
        gone = [i for i, (r, ok) in enumerate(zip(after, ref, strict=True)) if ok and not found(r[m])]
        sets = "; ".join(f"{i}: {after[i].get('unit_sets', '?')}" for i in gone)
        lines.append(f"* {m}: {sets if gone else 'none'}")
    missed = [i for i, (r, ok) in enumerate(zip(after, ref, strict=True)) if ok and not found(r["best"])]
    if missed:
        lines.append(f"Instances with a schedule that `best` still misses: {', '.join(map(str, missed))}.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=300)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--before", default="0993de4", help="the revision to compare with (git)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "zero_length.md")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        args.out.write_text(json.dumps(child(args.child, args.reference)))
        return
    sys.path.insert(0, str(ROOT))
    instances = make_instances(args.instances, args.seed)
    load0 = Path("/proc/loadavg").read_text().split()[0]
    rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = tmp / "instances.json"
        path.write_text(json.dumps(instances))
        old = tmp / "before"
        old.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        before = run_tree(old, path, tmp / "before.json", reference=False, interpreted=True)
        after = run_tree(ROOT, path, tmp / "after.json", reference=True, interpreted=False)
    load1 = Path("/proc/loadavg").read_text().split()[0]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import write_report

    write_report(report(instances, before, after, args, (load0, load1), rev), args.out)


if __name__ == "__main__":
    main()
