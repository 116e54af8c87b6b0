"""Simulator speed: schedules per second at L = 100 and L = 1000, optionally against another revision.

For each L, on a fixed-order schedule that offloads every other unit (``instance``):

* ``simulate()``: the public call on one schedule object, replayed again and again (its
  validation and resolution are cached on the object, as in a caller that re-simulates);
* ``simulate(), new object``: a new :class:`Schedule` each call (validation and resolution paid
  every time, as for every candidate of a search that builds objects);
* ``kernel``: the compiled code alone on prepared arrays, from the schedule's arrays to the
  timeline (resolution and replay; before the one-kernel rewrite, the one kernel did both);
* ``replay``: the replay kernel alone on a resolved structure (what a search pays per candidate
  whose structure it already holds; absent before the rewrite);
* the kernel as plain Python (``NUMBA_DISABLE_JIT=1``), and the first ``simulate()`` of a fresh
  process with an empty Numba cache (cold: compile) and with the cache filled (warm: load).

Each figure is measured in a child process; the jitted throughputs are the best of ``--rounds``
rounds, alternating between the trees, so that a change in a shared machine's load hits both.

``--compare REV`` measures the code of git revision REV (extracted to a temporary directory and
put first on ``PYTHONPATH`` of a child process) in the same run, one after the other, and adds
the ratios: this is how the rewrite was checked not to slow the fixed order down.

    python benchmarks/simulator.py                      # this tree only
    python benchmarks/simulator.py --compare 7c0c600    # this tree against a revision
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

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent
LENGTHS = (100, 1000)


def instance(length: int, seed: int = 0):
    from chainoffload import Chain, Platform, Schedule, Transfer

    rng = np.random.default_rng(seed)
    act = rng.integers(1 << 20, 1 << 26, size=length + 1)
    saved = act[1:] * rng.integers(1, 5, size=length)
    fwd = saved * 1e-12 * rng.uniform(0.5, 2.0, size=length)
    chain = Chain(fwd=fwd, bwd=2 * fwd, act=act, saved=saved, fwd_tmp=act[1:] // 2, bwd_tmp=act[1:], name=f"bench-{length}")
    platform = Platform(memory=int(saved.sum()), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
    # Every other unit: offloaded at the end of its forward, prefetched at the end of the backward
    # two stages above it (built here, not by a planner, so that every revision replays the same).
    transfers = []
    for u in range(1, length, 2):
        transfers.append(Transfer("offload", u, u - 1, "end"))
        reader = 2 * length - (u + 1)  # B_{u+1}
        transfers.append(Transfer("prefetch", u, max(u, reader - 2), "end"))
    schedule = Schedule.from_units(length, transfers)
    return chain, platform, schedule


def throughput(func, min_time: float = 1.0, batch: float = 0.05) -> float:
    """Calls per second of ``func``: the best batch of about ``batch`` seconds within ``min_time``
    (the least disturbed one, on a machine shared with other work)."""
    func()
    t0 = time.perf_counter()
    per_batch = 1
    while True:
        b0 = time.perf_counter()
        for _ in range(per_batch):
            func()
        if time.perf_counter() - b0 >= batch / 4:
            break
        per_batch *= 2
    best = 0.0
    while True:
        b0 = time.perf_counter()
        for _ in range(per_batch):
            func()
        best = max(best, per_batch / (time.perf_counter() - b0))
        if time.perf_counter() - t0 >= min_time:
            return best


def _kernels(chain, platform, schedule):
    """``(kernel, replay)`` callables for the code that is imported (any revision)."""
    import chainoffload._kernels.simulate as ks

    plain = os.environ.get("NUMBA_DISABLE_JIT") == "1"

    def py(f):
        return getattr(f, "py_func", f) if plain else f

    arrays = schedule.arrays()
    head = (platform.memory, platform.bandwidth_d2h, platform.bandwidth_h2d, platform.latency, platform.duplex)
    if hasattr(ks, "replay_kernel"):
        from chainoffload._kernels import structure as kst

        sizes = kst.size_table(chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp)
        resolve, replay = py(kst.resolve_kernel), py(ks.replay_kernel)
        names = ("alloc_ptr", "alloc_size", "free_ptr", "free_size", "free_src", "wait_ptr", "wait_tr", "hold_ptr", "hold_op")
        tail = ("tr_event", "tr_size", "tr_src", "tr_after", "tr_order")

        def run(resolved):
            d = dict(zip(names + tail, resolved[3:], strict=True))
            args = (arrays[0], arrays[1], *(d[k] for k in names), arrays[2], *(d[k] for k in tail))
            return replay(chain.fwd, chain.bwd, chain.fwd_nosave, sizes, *head, *args)

        resolved = resolve(chain.length, *arrays)
        return (lambda: run(resolve(chain.length, *arrays))), (lambda: run(resolved))
    kernel = py(ks.simulate_kernel)
    args = (chain.fwd, chain.bwd, chain.fwd_nosave, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp, *head, *arrays)
    return (lambda: kernel(*args)), None


def measure(length: int, min_time: float, plain: bool) -> dict:
    from chainoffload import Schedule, simulate

    chain, platform, schedule = instance(length)
    kernel, replay = _kernels(chain, platform, schedule)
    row = {"L": length, "transfers": len(schedule.transfers), "kernel_per_s": throughput(kernel, min_time)}
    if replay is not None:
        row["replay_per_s"] = throughput(replay, min_time)
    if not plain:
        compute, transfers = schedule.compute, schedule.transfers
        row["simulate_per_s"] = throughput(lambda: simulate(chain, platform, schedule), min_time)
        row["fresh_per_s"] = throughput(lambda: simulate(chain, platform, Schedule(compute, transfers)), min_time)
        row["makespan"] = simulate(chain, platform, schedule).makespan
        row["peak"] = simulate(chain, platform, schedule).peak_memory
    return row


def first_call(env: dict, cache_dir: str) -> float:
    code = (
        f"import time, sys; sys.path.insert(0, {str(HERE)!r});"
        + "from simulator import instance; from chainoffload import simulate;"
        "c,p,s=instance(100); t1=time.perf_counter(); simulate(c,p,s); print(time.perf_counter()-t1)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, NUMBA_CACHE_DIR=cache_dir), capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def child(env: dict, min_time: float, plain: bool = False) -> list:
    """The throughput figures of the code ``env`` imports, measured in a child process."""
    extra = {"NUMBA_DISABLE_JIT": "1"} if plain else {}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--min-time", str(min_time)],
        env=dict(env, **extra), capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def best_of(rounds: list[list[dict]]) -> list[dict]:
    """Per L, the highest throughput of each figure over the rounds (the least disturbed one)."""
    out = []
    for rows in zip(*rounds, strict=True):
        merged = dict(rows[0])
        for key in merged:
            if key.endswith("_per_s"):
                merged[key] = max(r[key] for r in rows)
        out.append(merged)
    return out


def measure_trees(envs: list[dict], min_time: float, rounds: int) -> list[dict]:
    """Every figure for each tree; the jitted throughputs alternate between trees, round by round,
    so that a change in the machine's load hits every tree alike."""
    results = []
    for env in envs:
        with tempfile.TemporaryDirectory() as cache:
            cold = first_call(env, cache)
            warm = first_call(env, cache)
        results.append({"cold": cold, "warm": warm, "plain": child(env, min_time, plain=True), "rounds": []})
    for _ in range(rounds):
        for env, res in zip(envs, results, strict=True):
            res["rounds"].append(child(env, min_time))
    for res in results:
        res["jit"] = best_of(res.pop("rounds"))
    return results


def extract(rev: str, dest: str) -> str:
    """The ``chainoffload`` package of git revision ``rev`` under ``dest``; returns its commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", rev, "chainoffload"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return commit


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def table(label: str, tree: dict) -> list[str]:
    lines = [
        f"**{label}**",
        "",
        "| L | transfers | simulate() / s | simulate(), new object / s | kernel / s | replay / s | kernel, NUMBA_DISABLE_JIT=1 / s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for j, p in zip(tree["jit"], tree["plain"], strict=True):
        lines.append(
            f"| {j['L']} | {j['transfers']} | {_fmt(j['simulate_per_s'])} | {_fmt(j['fresh_per_s'])} | "
            f"{_fmt(j['kernel_per_s'])} | {_fmt(j.get('replay_per_s'))} | {_fmt(p['kernel_per_s'], 1)} |"
        )
    lines += ["", f"first simulate() of a fresh process, L=100: cold (empty Numba cache, compiles) {tree['cold']:.2f} s; "
              f"warm (cache filled by the previous process) {tree['warm']:.3f} s", ""]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per throughput measurement")
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV, in the same run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the jitted figures (best kept)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        plain = os.environ.get("NUMBA_DISABLE_JIT") == "1"
        print(json.dumps([measure(L, args.min_time, plain) for L in LENGTHS]))
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory() as tmp:
        envs = [env]
        if args.compare:
            commit = extract(args.compare, tmp)
            envs.append(dict(os.environ, PYTHONPATH=tmp))
        measured = measure_trees(envs, args.min_time, args.rounds)
    here = measured[0]
    lines = table("this tree", here)
    if args.compare:
        other = measured[1]
        lines = table(f"revision {args.compare} ({commit})", other) + lines
        lines += [
            f"**this tree / {args.compare}** (above 1: faster now)",
            "",
            "| L | simulate() | simulate(), new object | kernel | same makespan and peak |",
            "|---:|---:|---:|---:|:---|",
        ]
        for a, b in zip(here["jit"], other["jit"], strict=True):
            same = a["makespan"] == b["makespan"] and a["peak"] == b["peak"]
            lines.append(
                f"| {a['L']} | {a['simulate_per_s'] / b['simulate_per_s']:.2f}x | {a['fresh_per_s'] / b['fresh_per_s']:.2f}x | "
                f"{a['kernel_per_s'] / b['kernel_per_s']:.2f}x | {'yes' if same else 'NO'} |"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    command = "python benchmarks/simulator.py" + (f" --compare {args.compare}" if args.compare else "")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    (RESULTS / "simulator.md").write_text(
        f"# Simulator speed\n\n`{command}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average "
        f"{load:.1f} at the end (shared: compare ratios measured in one run, not absolute figures across runs; "
        f"the jitted figures are the best of {args.rounds} rounds that alternate between the trees)\n\n{text}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
