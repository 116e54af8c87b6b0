"""Does ``best`` with default options return the same schedule whatever the machine's load?

    python benchmarks/best_determinism.py                 # L = 10,000 and 100,000
    python benchmarks/best_determinism.py --lengths 10000

Issue 21: by default ``best`` reads no clock (``NOTE [ best's work budget ]`` in
``chainoffload/solvers/best.py``). Each point is one ``co.solve(chain, platform)`` with default
options in a fresh process on the instance of ``benchmarks/scaling.py`` (``mid_instance``), run
twice: as the machine is, and with extra load (``--busy`` processes spinning on the CPU, started
and stopped by this script by their PIDs). Writes ``benchmarks/results/best_determinism.md``:
the makespan over compute, the bound, the evaluations, why the search stopped, a hash of the
schedule, wall and CPU time and the load average at the start and end of each run.
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
ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[2])
import chainoffload as co
from _common import mid_instance
chain, platform = mid_instance(int(sys.argv[1]))
w, c = time.perf_counter(), time.process_time()
r = co.solve(chain, platform)
wall, cpu = time.perf_counter() - w, time.process_time() - c
digest = hashlib.sha256(json.dumps(r.schedule.to_dict(), sort_keys=True).encode()).hexdigest()[:16] if r.schedule else None
print(json.dumps({"status": r.status.value, "ratio": r.makespan / chain.compute_time if r.feasible else None,
                  "bound_ratio": r.lower_bound / chain.compute_time, "bound": r.info.get("bound"),
                  "evals": r.info.get("evals"), "stopped": r.info.get("stopped"), "start": r.info.get("start"),
                  "schedule": digest, "wall": wall, "cpu": cpu}))
"""


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run(length: int, busy: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        before = _load()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAINOFFLOAD_PROGRESS": ""}
        out = subprocess.run([sys.executable, "-c", _CHILD, str(length), str(BENCH)], env=env, text=True,
                             capture_output=True, check=True).stdout
        data = json.loads(out.strip().splitlines()[-1])
        data.update(length=length, busy=busy, load_before=before, load_after=_load())
        return data
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--busy", type=int, default=2, help="spinning processes in the loaded run")
    ap.add_argument("--out", type=Path, default=RESULTS / "best_determinism.md")
    args = ap.parse_args(argv)
    rows = []
    for length in args.lengths:
        for busy in (0, args.busy):
            rows.append(run(length, busy))
            print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [
        "# best with default options, as the machine is and under extra load",
        "",
        f"`python benchmarks/best_determinism.py --lengths {' '.join(map(str, args.lengths))} --busy {args.busy}`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}; one `co.solve(chain, platform)` per row in a fresh process on "
        "`mid_instance(L)`; `busy`: processes spinning on the CPU during the run (2-core machine shared with "
        "other sessions). Wall and CPU times depend on the machine; every other column must not.",
        "",
        "| L | busy | load before / after | makespan / compute | bound / compute (rung) | evals | stopped | start | schedule sha256 | wall s | CPU s |",
        "|---:|---:|---|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['length']:,} | {r['busy']} | {r['load_before']} / {r['load_after']} | {r['ratio']:.6f} | "
            f"{r['bound_ratio']:.6f} ({r['bound']}) | {r['evals']} | {r['stopped']} | {r['start']} | `{r['schedule']}` | "
            f"{r['wall']:.1f} | {r['cpu']:.1f} |"
        )
    same = all(
        {k: a[k] for k in ("ratio", "bound_ratio", "evals", "stopped", "schedule")}
        == {k: b[k] for k in ("ratio", "bound_ratio", "evals", "stopped", "schedule")}
        for a, b in zip(rows[::2], rows[1::2], strict=True)
    )
    lines += ["", f"Same schedule, makespan, bound and evaluations with and without the load at every L: **{'yes' if same else 'NO'}**."]
    write_report(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
