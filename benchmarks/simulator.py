"""Simulator speed: schedules per second at L = 100 and L = 1000.

Reports, for each L, the throughput of the public ``simulate()`` (validation + kernel +
Timeline) and of the jitted kernel alone on prepared arrays (what a search loop calls), the
pure-Python kernel (NUMBA_DISABLE_JIT=1) for the speed-up, and the first-call time of a fresh
process with an empty Numba cache (cold: compile) and with the cache filled (warm: load).

    python benchmarks/simulator.py            # table on stdout, benchmarks/results/simulator.md
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

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def instance(length: int, seed: int = 0):
    from chainoffload import Chain, Platform
    from chainoffload.planner import eager_plan

    rng = np.random.default_rng(seed)
    act = rng.integers(1 << 20, 1 << 26, size=length + 1)
    saved = act[1:] * rng.integers(1, 5, size=length)
    fwd = saved * 1e-12 * rng.uniform(0.5, 2.0, size=length)
    chain = Chain(fwd=fwd, bwd=2 * fwd, act=act, saved=saved, fwd_tmp=act[1:] // 2, bwd_tmp=act[1:], name=f"bench-{length}")
    platform = Platform(memory=int(saved.sum()), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
    schedule = eager_plan(chain, range(1, length, 2))
    return chain, platform, schedule


def throughput(func, min_time: float = 1.0) -> float:
    func()
    n, t0 = 0, time.perf_counter()
    while True:
        func()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time and n >= 5:
            return n / elapsed


def measure(length: int, min_time: float) -> dict:
    from chainoffload import simulate
    from chainoffload._kernels.simulate import simulate_kernel

    chain, platform, schedule = instance(length)
    arrays = schedule.arrays()
    args = (
        chain.fwd, chain.bwd, chain.fwd_nosave, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp,
        platform.memory, platform.bandwidth_d2h, platform.bandwidth_h2d, platform.latency, platform.duplex, *arrays,
    )
    kernel = getattr(simulate_kernel, "py_func", simulate_kernel) if os.environ.get("NUMBA_DISABLE_JIT") == "1" else simulate_kernel
    return {
        "L": length,
        "transfers": len(schedule.transfers),
        "simulate_per_s": throughput(lambda: simulate(chain, platform, schedule), min_time),
        "kernel_per_s": throughput(lambda: kernel(*args), min_time),
    }


def first_call(cache_dir: str, jit: bool) -> float:
    code = (
        "import time; t0=time.perf_counter();"
        "import sys; sys.path.insert(0, %r);" % str(Path(__file__).resolve().parent)
        + "from simulator import instance; from chainoffload import simulate;"
        "c,p,s=instance(100); t1=time.perf_counter(); simulate(c,p,s); print(time.perf_counter()-t1)"
    )
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per throughput measurement")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    lengths = (100, 1000)
    if args.child:  # pure-Python figures, run in a process with NUMBA_DISABLE_JIT=1
        print(json.dumps([measure(L, args.min_time) for L in lengths]))
        return 0
    with tempfile.TemporaryDirectory() as cache:
        cold = first_call(cache, jit=True)
        warm = first_call(cache, jit=True)
    jitted = [measure(L, args.min_time) for L in lengths]
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, __file__, "--child", "--min-time", str(args.min_time)], env=env, capture_output=True, text=True, check=True)
    plain = json.loads(out.stdout)
    lines = [
        "| L | transfers | simulate() / s | kernel / s | kernel, NUMBA_DISABLE_JIT=1 / s | kernel speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for j, p in zip(jitted, plain):
        lines.append(
            f"| {j['L']} | {j['transfers']} | {j['simulate_per_s']:,.0f} | {j['kernel_per_s']:,.0f} | "
            f"{p['kernel_per_s']:,.1f} | {j['kernel_per_s'] / p['kernel_per_s']:,.0f}x |"
        )
    lines += [
        "",
        f"first simulate() of a fresh process, L=100: cold (empty Numba cache, compiles) {cold:.2f} s; "
        f"warm (cache filled by the previous process) {warm:.3f} s",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "simulator.md").write_text(
        f"# Simulator speed\n\n`python benchmarks/simulator.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores\n\n{text}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
