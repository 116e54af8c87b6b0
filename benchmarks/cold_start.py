"""Cold and warm start of the README's main job, each in a fresh process.

    python benchmarks/cold_start.py

The main job: ``chainoffload example resnet50 -o resnet50.json`` then ``chainoffload solve
resnet50.json --memory 4GiB --bandwidth 25GB/s``. Measured, with ``NUMBA_CACHE_DIR`` pointed at
a fresh temporary folder (an empty Numba cache):

1. **cold** (the CLI's default): the solve on the empty cache; it runs the kernels
   interpreted and starts a background compile (``NOTE [ lazy kernels ]`` in
   ``chainoffload/_compile.py``); its CPU is not the solve's and is reported apart;
2. **cold, waiting for the compile** (``CHAINOFFLOAD_COLD=compile``): what the first call costs
   when it compiles in process (a library call's default), on another empty cache;
3. **warm**: the same solve in a new process once the cache is filled;
4. **compile-or-load**: a fresh process that only makes the default method's kernels ready
   (imports Numba and loads them from the warm cache), against the target of 1 s.

Wall and CPU seconds (user + system of the process, from ``resource``) for each; the machine
is shared, so CPU is the steadier figure. Writes ``benchmarks/results/cold_start.md``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_report

RESULTS = Path(__file__).resolve().parent / "results"
CLI = [sys.executable, "-m", "chainoffload"]
JOB = ["solve", "resnet50.json", "--memory", "4GiB", "--bandwidth", "25GB/s"]


def timed(cmd: list[str], env: dict, cwd: str) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall, cpu, out.stdout + out.stderr


def lock_of(env: dict) -> str:
    code = "from chainoffload._compile import _lock_path; print(_lock_path())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as cache2:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        env.pop("CHAINOFFLOAD_COLD", None)
        subprocess.run(CLI + ["example", "resnet50", "-o", "resnet50.json"], cwd=work, env=env, check=True, capture_output=True)
        wall, cpu, text = timed(CLI + JOB + ["--json"], env, work)
        cold = json.loads(text[text.index("{"):text.rindex("}") + 1])
        rows.append(("cold (CLI default: interpreted, compile in the background)", wall, cpu, cold))
        # the background compile of that run fills `cache`; wait for it
        lock = lock_of(env)
        w = time.perf_counter()
        while os.path.exists(lock) and time.perf_counter() - w < 1800:
            time.sleep(1.0)
        background = time.perf_counter() - w
        env2 = {**os.environ, "NUMBA_CACHE_DIR": cache2, "CHAINOFFLOAD_COLD": "compile"}
        wall, cpu, text = timed(CLI + JOB + ["--json"], env2, work)
        rows.append(("cold, waiting for the compile (CHAINOFFLOAD_COLD=compile)", wall, cpu, json.loads(text[text.index("{"):text.rindex("}") + 1])))
        wall, cpu, text = timed(CLI + JOB + ["--json"], env, work)
        rows.append(("warm (second process, cache filled)", wall, cpu, json.loads(text[text.index("{"):text.rindex("}") + 1])))
        code = (
            "import time; import chainoffload; w, c = time.perf_counter(), time.process_time(); "
            "from chainoffload._compile import _warm_up; _warm_up(('structure', 'simulate', 'planner', 'dp')); "
            "print(time.perf_counter() - w, time.process_time() - c)"
        )
        wall, cpu, text = timed([sys.executable, "-c", code], env, work)
        load_only, load_cpu = (float(x) for x in text.strip().splitlines()[-1].split())
    load1 = os.getloadavg()[0]
    lines = [
        "# Cold and warm start of the main job",
        "",
        f"`python benchmarks/cold_start.py`, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores shared "
        f"(load average {load0:.1f} at the start, {load1:.1f} at the end). Main job: `chainoffload solve resnet50.json "
        "--memory 4GiB --bandwidth 25GB/s` (ResNet-50, 18 stages). Targets (issue 13): cold under 10 s on an empty "
        "Numba cache; under 1 s of compile-or-load in a second process.",
        "",
        "| run | wall (s) | CPU (s) | status | makespan (ms) | runtime field (s) | compile_time (s) | kernels |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for name, wall, cpu, res in rows:
        info = res.get("info") or {}
        lines.append(
            f"| {name} | {wall:.2f} | {cpu:.2f} | {res['status']} | {1e3 * res['makespan']:.3f} | {res['runtime']:.2f} | "
            f"{info.get('compile_time') or 0:.2f} | {info.get('kernels', '')} |"
        )
    lines += [
        "",
        f"The background compile started by the cold run finished {background:.0f} s after that run returned.",
        f"Compile-or-load in a fresh process with the cache filled (after `import chainoffload`: Numba's import and the "
        f"loading of the four kernels of the default method): {load_cpu:.2f} s CPU ({load_only:.2f} s wall); the whole "
        f"process, Python and numpy imports included: {cpu:.2f} s CPU ({wall:.2f} s wall).",
        "",
        f"Total benchmark time {time.perf_counter() - t0:.0f} s.",
    ]
    write_report(lines, RESULTS / "cold_start.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
