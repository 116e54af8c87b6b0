"""Evaluations per second of ``best``'s search: this checkout against another revision (default ``main``).

    python benchmarks/search_speed.py                 # L = 100 and 1000, against main
    python benchmarks/search_speed.py --base REV --lengths 1000

Each revision runs in its own fresh process (the other one exported with ``git archive`` to a
temporary folder), on the same instance (a random chain, memory halfway between the offload
floor and the keep-all peak, bandwidth 0.5x the balance rate, latency 10 us). ``best`` is run
twice (on equal but fresh chain objects: the LP is cached per object) with no time limit to
speak of and ``max_evals`` A and B; the search's rate is (B - A) / (time of the second run -
time of the first): the starting points cancel out, and
since both revisions find the same candidates in the same order, they make the same
evaluations. Times are CPU seconds of the process (the machine is shared), wall in brackets.
Kernels are compiled (or loaded) before timing, and an untimed run at each size comes first. Writes ``benchmarks/results/search_speed.md``.
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

_CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(1, {bench!r})
import chainoffload as co
from chainoffload.generators import random_chain
from chainoffload.solvers import spec
from _common import mid_instance
best = spec("best").load()
warm = random_chain(7, 8)
best(warm, co.Platform(memory=co.keep_all_peak(warm) // 2, bandwidth_d2h=1e9, bandwidth_h2d=1e9), max_evals=50)
out = {{}}
for length in {lengths!r}:
    chain, platform = mid_instance(length)
    # An untimed run first: anything compiled or loaded on first use at this size is paid here.
    best(random_chain(1000 + length, length), platform, time_limit=3600.0, max_evals={evals!r}[0])
    runs = []
    for evals in {evals!r}:
        # A fresh (equal) chain each run: the LP is cached per chain object.
        chain = random_chain(1000 + length, length)
        c, w = time.process_time(), time.perf_counter()
        r = best(chain, platform, time_limit=3600.0, max_evals=evals)
        runs.append((r.info["evals"], time.process_time() - c, time.perf_counter() - w, r.makespan))
    out[str(length)] = runs
print(json.dumps(out))
"""


def run(root: Path, lengths: list[int], evals: tuple[int, int], cache: str) -> dict:
    code = _CHILD.format(root=str(root), bench=BENCH, lengths=lengths, evals=list(evals))
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(root))
    if out.returncode != 0:
        raise SystemExit(f"child for {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="git revision to compare with (default main)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--evals", type=int, nargs=2, default=[200, 1000], metavar=("A", "B"))
    parser.add_argument("--out", type=Path, default=None, help="default results/search_speed-BASE.md")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = RESULTS / f"search_speed-{args.base}.md"
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    cache_root = Path(tempfile.gettempdir()) / "chainoffload-bench-cache"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        base = run(Path(tmp), args.lengths, tuple(args.evals), str(cache_root / base_rev))
    head = run(ROOT, args.lengths, tuple(args.evals), str(cache_root / "head"))
    lines = [
        "# Search speed: evaluations per second of `best`",
        "",
        f"`python benchmarks/search_speed.py --base {args.base}`, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPU cores shared (load average {load:.1f} at the start). {args.base} = {base_rev}, "
        f"this checkout = {head_rev} (with uncommitted changes, if any). Rate = evaluations between "
        f"max_evals {args.evals[0]} and {args.evals[1]} / CPU seconds between the two runs (wall in brackets).",
        "",
        "| L | evaluations | base: evals / CPU s | this: evals / CPU s | speed-up (CPU) | speed-up (wall) | same makespan |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for length in args.lengths:
        (ea, ca, wa, ma), (eb, cb, wb, mb) = base[str(length)]
        (fa, xa, ya, na), (fb, xb, yb, nb) = head[str(length)]
        rate_base = (eb - ea) / (cb - ca)
        rate_head = (fb - fa) / (xb - xa)
        wall_base = (eb - ea) / (wb - wa)
        wall_head = (fb - fa) / (yb - ya)
        same = "yes" if (ma == na and mb == nb) else f"no ({mb:.6g} vs {nb:.6g})"
        lines.append(
            f"| {length} | {eb - ea} / {fb - fa} | {rate_base:.0f} ({wall_base:.0f}) | {rate_head:.0f} ({wall_head:.0f}) | "
            f"{rate_head / rate_base:.1f}x | {wall_head / wall_base:.1f}x | {same} |"
        )
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
