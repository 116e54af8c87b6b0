"""The paper's DP (``joint_dp``) at L = 100 and 1000: cold, first call and warm, with the load.

    python benchmarks/joint_dp_time.py [--lengths 100 1000] [--out results/joint_dp_time.md]

The chains and platform of ``benchmarks/remat.py``'s runtime section (random chains, 500 slots,
25 GB/s, memory 30 % of the way from the floor to the keep-all peak). Each length runs in two
fresh processes: one on an empty Numba cache (``NUMBA_CACHE_DIR`` a new folder), whose first
call on a 6-stage chain compiles the kernels (reported apart), one on the warm cache, whose
first call loads them. In each, the call at L is then timed once (the first) and three more
times (warm: the best and the median). Wall and CPU seconds of this process; the load average
before and after each process.
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

from _common import BENCH, write_report

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ENV = {**os.environ, "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}

_CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import numpy as np
sys.path.insert(0, sys.argv[2])
from remat import random_chain
from chainoffload import Platform
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers.joint import joint_dp
t_import = time.perf_counter() - t_import

def instance(length):
    chain = random_chain(np.random.default_rng(length), length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    return chain, Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)

def timed(chain, p):
    w, c = time.perf_counter(), time.process_time()
    r = joint_dp(chain, p)
    return time.perf_counter() - w, time.process_time() - c, r

out = {"import": t_import}
w, c, _ = timed(*instance(6))
out["kernels"] = {"wall": w, "cpu": c}  # compile (empty cache) or load (warm cache)
chain, p = instance(int(sys.argv[1]))
w, c, r = timed(chain, p)
out["first"] = {"wall": w, "cpu": c, "rows": r.info.get("rows"), "status": r.status.value}
out["warm"] = [dict(zip(("wall", "cpu"), timed(chain, p)[:2])) for _ in range(3)]
print(json.dumps(out))
"""


def run(length: int, cache: str | None) -> dict:
    env = dict(ENV)
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = cache
    load0 = os.getloadavg()[0]
    w = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(length), BENCH], env=env, capture_output=True, text=True, check=True)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data.update(process_wall=time.perf_counter() - w, load=(load0, os.getloadavg()[0]))
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--out", type=Path, default=RESULTS / "joint_dp_time.md")
    args = parser.parse_args(argv)
    rows = []
    for length in args.lengths:
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cold:
            rows.append((length, "empty cache", run(length, cold)))
        run(length, None)  # the default cache filled, if it was not
        rows.append((length, "warm cache", run(length, None)))
    lines = [
        "# joint_dp at L = 100 and 1000: cold, first call, warm",
        "",
        f"`python benchmarks/joint_dp_time.py {' '.join(argv if argv is not None else sys.argv[1:])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores shared with other work. Seconds of wall / CPU.",
        "",
        "| L | Numba cache | load before-after | process wall | imports | kernels (compile or load) | first call at L | warm: best | warm: median | grid rows |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length, cache, d in rows:
        warm = sorted(d["warm"], key=lambda x: x["wall"])
        lines.append(
            f"| {length} | {cache} | {d['load'][0]:.1f}-{d['load'][1]:.1f} | {d['process_wall']:.2f} | {d['import']:.2f} | "
            f"{d['kernels']['wall']:.2f} / {d['kernels']['cpu']:.2f} | {d['first']['wall']:.2f} / {d['first']['cpu']:.2f} | "
            f"{warm[0]['wall']:.2f} / {warm[0]['cpu']:.2f} | {warm[1]['wall']:.2f} / {warm[1]['cpu']:.2f} | {d['first']['rows']} |"
        )
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
