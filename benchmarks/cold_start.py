"""Cold and warm start of the README's main job, exactly as the README writes it.

    python benchmarks/cold_start.py [--repeats N]

The command is read from README.md (the ``bash`` block that runs ``chainoffload solve``), so it
cannot drift from what a new user runs: ``chainoffload example resnet50 -o resnet50.json &&
chainoffload solve ... --min-memory --out schedule.json && chainoffload simulate ... &&
chainoffload plot ...``. Each ``&&`` part runs as its own process, ``.venv/bin/chainoffload``
replaced by this interpreter's ``-m chainoffload`` on this checkout, in a fresh folder.

Each repeat:

1. **cold**: ``NUMBA_CACHE_DIR`` a fresh empty folder, the whole job; the CLI runs a short
   chain's kernels interpreted and starts one low-priority background compile
   (``NOTE [ lazy kernels ]`` in ``chainoffload/_compile.py``), which keeps running while
   ``simulate`` and ``plot`` do, as it would for a user;
2. the wait for that background compile to finish (its CPU is a detached process's and is not
   counted in the job's);
3. **warm**: the whole job again on the cache it filled (the user's second run).

Wall and CPU seconds (user + system of each part's process, from ``resource``) per part and
for the job, the load average before and after each run, and the cold runs' stderr lines (the
one message a cold start prints). The machine may be shared, so CPU is the steadier figure.
Writes ``benchmarks/results/cold_start.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 15.0  # seconds of wall time for the cold job (issue 22)


def main_job(text: str) -> str:
    """The main job's command line in README text: the ``chainoffload`` parts of the first ``bash``
    block that runs ``chainoffload solve`` (after the set-up parts, ``pip`` and ``venv``), its
    continued lines joined, as one ``&&``-joined line."""
    for block in re.findall(r"```bash\n(.*?)\n```", text, re.S):
        if "chainoffload solve" not in block:
            continue
        line = " ".join(block.replace("\\\n", " ").split())
        parts = [part.strip() for part in line.split("&&")]
        return " && ".join(part for part in parts if part.split()[0].endswith("/chainoffload"))
    raise SystemExit("no bash block that runs `chainoffload solve`")


def readme_job(readme: Path = ROOT / "README.md") -> str:
    """The main job's command line, as README.md writes it."""
    return main_job(readme.read_text())


def job_parts(line: str) -> list[list[str]]:
    """The ``&&`` parts of ``line``, each as an argv for this interpreter's ``-m chainoffload``."""
    parts = []
    for part in line.split("&&"):
        argv = shlex.split(part)
        if not argv or not argv[0].endswith("chainoffload"):
            raise SystemExit(f"main job: expected every part to run chainoffload, got {part.strip()!r}")
        parts.append([sys.executable, "-m", "chainoffload", *argv[1:]])
    return parts


def run_job(parts: list[list[str]], env: dict, cwd: str) -> dict:
    """Run ``parts`` in order; wall and CPU seconds of each, the load around, cold stderr."""
    load0 = os.getloadavg()[0]
    rows, stderr = [], []
    for argv in parts:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w = time.perf_counter()
        out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - w
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            raise SystemExit(f"{shlex.join(argv)} exited {out.returncode}:\n{out.stderr[-2000:]}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rows.append((argv[3], wall, cpu))
        stderr += [f"{argv[3]}: {line}" for line in out.stderr.splitlines()]
    return {"parts": rows, "load": (load0, os.getloadavg()[0]), "stderr": stderr}


def wait_background(env: dict, cwd: str, limit: float = 1800.0) -> float:
    """Seconds until the background compile of this cache ends (its lock file is removed)."""
    code = "from chainoffload._compile import _lock_path; print(_lock_path())"
    lock = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    w = time.perf_counter()
    while os.path.exists(lock) and time.perf_counter() - w < limit:
        time.sleep(0.5)
    return time.perf_counter() - w


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold-then-warm repeats (default 3)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: expected at least 1")
    line = readme_job()
    parts = job_parts(line)
    t0 = time.perf_counter()
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            env.pop("CHAINOFFLOAD_COLD", None)  # the CLI's default
            env.pop("CHAINOFFLOAD_BACKGROUND_COMPILE", None)
            cold = run_job(parts, env, work)
            background = wait_background(env, work)
            warm = run_job(parts, env, work)
            runs.append((cold, background, warm))

    names = [p[3] for p in parts]
    lines = [
        "# Cold and warm start of the README's main job",
        "",
        f"`python benchmarks/cold_start.py --repeats {args.repeats}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPU cores shared with other sessions' work; load average (1 min) before and after each run in "
        "the table. The job, read from README.md (each part a fresh process, `.venv/bin/chainoffload` run as "
        "`python -m chainoffload` on this checkout):",
        "",
        "```bash",
        line,
        "```",
        "",
        "**cold**: `NUMBA_CACHE_DIR` a fresh empty folder (no compiled kernel anywhere); the CLI's default (short chains run "
        "interpreted, one low-priority background process compiles the kernels meanwhile). **warm**: the job again once "
        "that background compile has finished, on the cache it filled. CPU = user + system of the part's own process "
        f"(the detached background compile is not in it). Target (issue 22): the cold job under {TARGET:.0f} s.",
        "",
        "| repeat | run | load | " + " | ".join(f"{n} wall / CPU (s)" for n in names) + " | job wall (s) | job CPU (s) |",
        "|---:|---|---|" + "---:|" * (len(names) + 2),
    ]
    totals = {"cold": [], "warm": []}
    for i, (cold, _background, warm) in enumerate(runs, 1):
        for name, run in (("cold", cold), ("warm", warm)):
            wall = sum(r[1] for r in run["parts"])
            cpu = sum(r[2] for r in run["parts"])
            totals[name].append((wall, cpu))
            cells = " | ".join(f"{r[1]:.2f} / {r[2]:.2f}" for r in run["parts"])
            lines.append(f"| {i} | {name} | {run['load'][0]:.2f}-{run['load'][1]:.2f} | {cells} | **{wall:.2f}** | {cpu:.2f} |")
    lines += [""]
    for name in ("cold", "warm"):
        walls = [w for w, _ in totals[name]]
        cpus = [c for _, c in totals[name]]
        lines.append(
            f"* {name}: job wall {min(walls):.2f}-{max(walls):.2f} s (median {statistics.median(walls):.2f}), "
            f"CPU {min(cpus):.2f}-{max(cpus):.2f} s (median {statistics.median(cpus):.2f})"
        )
    backgrounds = [b for _, b, _ in runs]
    lines += [
        f"* the background compile ended {min(backgrounds):.0f}-{max(backgrounds):.0f} s after the cold job did",
        "",
        "What the cold runs printed on stderr (every line, first repeat; the others alike):",
        "",
        "```",
        *runs[0][0]["stderr"],
        "```",
        "",
        f"Total benchmark time {time.perf_counter() - t0:.0f} s.",
    ]
    for _, _, warm in runs:
        if warm["stderr"]:
            lines += ["", "A warm run printed on stderr (it should print nothing):", "", "```", *warm["stderr"], "```"]
            break
    write_report(lines, RESULTS / "cold_start.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
