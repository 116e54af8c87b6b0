"""``best`` here against ``best`` of another checkout, on benchmarks/_common.py's scaling instances.

    git archive 8e80388 | tar -x -C /tmp/base
    python benchmarks/best_vs_base.py --base /tmp/base --lengths 1000 10000 100000

Each point is ``solve(chain, platform)`` with default options (the default method, ``best``) in a
fresh process with the kernels compiled beforehand (a warm-up process per tree); base and this
tree alternate at each length so that both meet the same load. Records wall and CPU seconds,
status, makespan / compute time, the search's evaluations and why it stopped, and whether the two
schedules are the same. Writes ``benchmarks/results/best_vs_base.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import BENCH, write_report

RESULTS = Path(__file__).resolve().parent / "results"
HERE = str(Path(__file__).resolve().parents[1])

_CHILD = r"""
import hashlib, json, sys, time
import chainoffload as co
sys.path.insert(0, sys.argv[2])
from _common import mid_instance
length = int(sys.argv[1])
chain, platform = mid_instance(length)
c, w = time.process_time(), time.perf_counter()
r = co.solve(chain, platform)
wall, cpu = time.perf_counter() - w, time.process_time() - c
digest = hashlib.sha256(json.dumps(r.schedule.to_dict(), sort_keys=True).encode()).hexdigest()[:16] if r.schedule else None
print(json.dumps({"wall": wall, "cpu": cpu, "status": r.status.value, "ratio": r.makespan / chain.compute_time if r.feasible else None,
                  "evals": r.info.get("evals"), "stopped": r.info.get("stopped"), "schedule": digest, "bound": r.lower_bound / chain.compute_time}))
"""


def run(tree: str, length: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(length), BENCH], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other checkout's root")
    parser.add_argument("--base-label", default="8e80388")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    for tree in (args.base, HERE):  # warm-up: compile the kernels of each tree
        run(tree, 50, args.timeout)
    lines = [
        "# `best` against the base commit at 10^3-10^5 stages (issue 33, item 4)",
        "",
        (f"`python benchmarks/best_vs_base.py --base <checkout of {args.base_label}> --lengths {' '.join(map(str, args.lengths))}`, "
         f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} CPU cores shared with other sessions' work. "
         "Default options (no time limit: both stop by their work budget). Instance: benchmarks/_common.py's mid_instance."),
        "",
        "| L | tree | status | makespan / compute | bound / compute | evals | stopped | wall s | CPU s | schedule (sha256, 16) | load before / after |",
        "|---:|---|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for length in args.lengths:
        for label, tree in ((args.base_label, args.base), ("this tree", HERE)):
            before = os.getloadavg()[0]
            r = run(tree, length, args.timeout)
            after = os.getloadavg()[0]
            if "error" in r:
                lines.append(f"| {length} | {label} | error: {r['error']} | | | | | | | | {before:.1f} / {after:.1f} |")
                continue
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.6f}"
            lines.append(f"| {length} | {label} | {r['status']} | {ratio} | {r['bound']:.6f} | {r['evals']} | {r['stopped']} | "
                         f"{r['wall']:.1f} | {r['cpu']:.1f} | {r['schedule']} | {before:.1f} / {after:.1f} |")
            print(lines[-1], flush=True)
    write_report(lines, RESULTS / "best_vs_base.md")


if __name__ == "__main__":
    main()
