"""Mutation check of the copier's synchronization: drop one wait or move one copy in a copy of
``chainoffload_torch`` and show that the copy-engine tests fail on the threaded engine.

Each mutation below removes one ordering rule of NOTE [ stream discipline ]
(``chainoffload_torch/_copy.py``), of the host pool (``_pool.py``) or of the executor's calls
into the copier and pool, in a copy of the ``chainoffload_torch`` package (the real files are
never edited): the copy is written to a temporary directory, put first on ``PYTHONPATH`` (the
core ``chainoffload`` still comes from this checkout), and ``tests/test_torch_copy_engine.py``
runs against it. The unmutated copy must pass;
every mutant must fail. Each mutation's text must occur exactly once in its file, so a rewrite
that silently disarms a mutation stops this script instead.

    python benchmarks/copy_mutations.py       # table on stdout and in benchmarks/results/copy_mutations.md
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import Mutation, mutate  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
SUBSET = ("tests/test_torch_copy_engine.py",)
COPY = "_copy.py"
POOL = "_pool.py"
EXEC = "executor.py"
REMAT = "_recompute.py"
#: Tests of the subset that train through the executor (the others drive the engine, copier and pool).
#: How a test failed, by the exception it ended with.
HOW = {"CopyEngineError": "reported (CopyEngineError)", "AssertionError": "assertion failed (wrong data or state)"}
EXECUTOR_TESTS = (
    "test_offloaded_training",
    "test_a_prefetch_during_the_forward",
    "test_a_forward_that_fails",
    "test_adapter_tests",
    "test_recomputing_training",
)


_PREFETCH_TAIL = """        engine.wait_stream(self.h2d, compute)
        if after is not None:
            engine.wait_event(self.h2d, after)
        engine.copy(self.h2d, dev, host)
        return dev, engine.record(self.h2d)"""

_OFFLOAD_TAIL = """        engine.wait_stream(self.d2h, compute)
        if guard is not None:
            engine.wait_event(self.d2h, guard)
        engine.copy(self.d2h, host, src)
        return engine.record(self.d2h)"""

MUTATIONS = (
    Mutation(
        "prefetch on the D2H stream",
        "prefetches go on the H2D stream (duplex: one direction per stream)",
        COPY,
        ((_PREFETCH_TAIL, _PREFETCH_TAIL.replace("self.h2d", "self.d2h")),),
    ),
    Mutation(
        "offload on the H2D stream",
        "offloads go on the D2H stream",
        COPY,
        ((_OFFLOAD_TAIL, _OFFLOAD_TAIL.replace("self.d2h", "self.h2d")),),
    ),
    Mutation(
        "no wait before a prefetched tensor is read",
        "compute waits on a prefetch's event before its data is read",
        COPY,
        (
            (
                "        if event is not None:\n            self.engine.wait_event(self.engine.current_stream(self.device), event)\n        self.engine.reading(dev)",
                "        self.engine.reading(dev)",
            ),
        ),
    ),
    Mutation(
        "no wait before a device source is freed",
        "compute waits on an offload's event before its source is let go",
        COPY,
        (
            (
                "        if event is not None:\n            self.engine.wait_event(self.engine.current_stream(self.device), event)\n        self.engine.freed(src)",
                "        self.engine.freed(src)",
            ),
        ),
    ),
    Mutation(
        "host buffer given back without its guard",
        "a host buffer goes back to the pool with the event of the copy that still reads it",
        EXEC,
        (("        self.pool.give(e.host, e.h2d_event)", "        self.pool.give(e.host)"),),
    ),
    Mutation(
        "pool buffer reused without waiting for its guard",
        "the copy into a reused host buffer waits for its guard",
        COPY,
        (("        if guard is not None:\n            engine.wait_event(self.d2h, guard)\n", ""),),
    ),
    Mutation(
        "idle pool buffer freed before its guard",
        "the pool frees a buffer only after the copy that reads it",
        POOL,
        (("                if guard is not None:\n                    guard.synchronize()  # the copy that reads it must end before it is freed\n", ""),),
    ),
    Mutation(
        "offload without waiting for compute at its trigger",
        "the D2H stream waits for the compute stream at the trigger (the data is made there)",
        COPY,
        (("        engine.wait_stream(self.d2h, compute)\n", ""),),
    ),
    Mutation(
        "prefetch without waiting for compute at its trigger",
        "the H2D stream waits for the compute stream at the trigger (the destination was allocated there)",
        COPY,
        (("        engine.wait_stream(self.h2d, compute)\n", ""),),
    ),
    Mutation(
        "prefetch without waiting for its offload",
        "a prefetch waits on its offload's event (the D2H copy fills the buffer it reads)",
        COPY,
        (("        if after is not None:\n            engine.wait_event(self.h2d, after)\n", ""),),
    ),
    Mutation(
        "abort without synchronizing",
        "an aborted step waits for every copy in flight before its buffers go back",
        COPY,
        (
            (
                "        self.engine.synchronize_stream(self.d2h)\n        self.engine.synchronize_stream(self.h2d)",
                "        pass",
            ),
        ),
    ),
    Mutation(
        "an on-demand prefetch read at once",
        "unpack waits for a prefetch it had to start itself (a late one) before reading it",
        EXEC,
        (
            (
                "            if e.state is S.PREFETCHING:\n                self.copier.await_prefetch(e.h2d_event, e.dev)\n                e.state = S.RESTORED\n            if e.state is not S.RESTORED:",
                "            if e.state is S.PREFETCHING:\n                e.state = S.RESTORED\n            if e.state is not S.RESTORED:",
            ),
        ),
    ),
    # Recomputation (NOTE [ recomputation ] in _recompute.py): each is killed by a training run that
    # must stay bitwise equal to plain training (dropout and batch norm in every block).
    Mutation(
        "recompute from the wrong checkpoint",
        "a recomputation starts from the a_{i-1} instance the schedule names (the executor checks which it holds)",
        EXEC,
        (
            (
                "        held = step.acts.get(i - 1)\n        if held is None or held[0] != maker:",
                "        held = step.acts.get(i - 2) or step.acts.get(i - 1)\n        if held is None:",
            ),
        ),
    ),
    Mutation(
        "a prefetched checkpoint not awaited",
        "a recomputation that starts from a prefetched checkpoint waits for its copy",
        EXEC,
        (
            (
                "        if e.state is S.PREFETCHING:\n            self.copier.await_prefetch(e.h2d_event, e.dev)\n"
                "            e.state = S.RESTORED\n        if e.state is not S.RESTORED:\n            raise RuntimeError(f\"chainoffload_torch: the a_{rec.stage - 1} block",
                "        if e.state is S.PREFETCHING:\n"
                "            e.state = S.RESTORED\n        if e.state is not S.RESTORED:\n            raise RuntimeError(f\"chainoffload_torch: the a_{rec.stage - 1} block",
            ),
        ),
    ),
    Mutation(
        "RNG state not restored",
        "a recomputation runs under the CPU RNG state of the original call (dropout masks)",
        REMAT,
        (("            torch.set_rng_state(self.cpu_rng)\n", ""),),
    ),
    Mutation(
        "BatchNorm statistics updated twice",
        "a recomputation sees the buffers as the original call did and leaves them as it left them",
        REMAT,
        (("        restore = [(b, snap) for _, b, _, snap in self.buffers if snap is not None]", "        restore = []"),),
    ),
)


def mutated_copy(dest: Path, mutation: Mutation | None) -> None:
    shutil.copytree(ROOT / "chainoffload_torch", dest / "chainoffload_torch", ignore=shutil.ignore_patterns("__pycache__"))
    if mutation is not None:
        path = dest / "chainoffload_torch" / mutation.file
        path.write_text(mutate(path.read_text(), mutation))


# pytest puts the directory of every conftest.py it loads first on sys.path (the checkout's own
# conftest.py at its root included), which would hide the copy behind the checkout's package.
# This plugin, loaded before any test module, puts the copy first again once every conftest has
# been collected, and records which package the tests imported, so that a run against the
# checkout instead of the copy stops the script rather than calling every mutant a survivor.
_COPY_FIRST = """
import sys
COPY = {copy!r}
def pytest_collection(session):
    sys.path.insert(0, COPY)
def pytest_sessionfinish(session):
    module = sys.modules.get("chainoffload_torch._copy")
    with open({where!r}, "w") as out:
        out.write(module.__file__ if module else "")
"""


def run_subset(mutation: Mutation | None, timeout: float) -> tuple[int, list[tuple[str, str]], float]:
    """Exit status and failing tests (name, exception type) of the subset against a (mutated) copy."""
    with tempfile.TemporaryDirectory() as tmp:
        mutated_copy(Path(tmp), mutation)
        where_file = Path(tmp) / "imported_from.txt"
        (Path(tmp) / "_copy_first.py").write_text(_COPY_FIRST.format(copy=tmp, where=str(where_file)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]))
        env.pop("CHAINOFFLOAD_COPY_ENGINE", None)  # the tests choose their engines themselves
        # `python -m` puts the working directory first on sys.path: run from the copy's directory.
        where = subprocess.run([sys.executable, "-c", "import chainoffload_torch, chainoffload; print(chainoffload_torch.__file__); print(chainoffload.__file__)"],
                               cwd=tmp, env=env, capture_output=True, text=True, check=True).stdout.split()
        if not where[0].startswith(tmp) or not where[1].startswith(str(ROOT)):
            raise SystemExit(f"the copy is not what gets imported: {where}")
        probe = Path(tmp) / "test_which_copy.py"
        probe.write_text(
            "import chainoffload_torch\n\n\ndef test_the_copy_is_imported():\n"
            f"    assert chainoffload_torch.__file__.startswith({tmp!r}), chainoffload_torch.__file__\n"
        )
        seen = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "--rootdir", str(ROOT), str(probe)],
            cwd=tmp, env=env, capture_output=True, text=True,
        )
        if seen.returncode != 0:
            raise SystemExit(f"under pytest the copy is not what gets imported:\n{seen.stdout[-2000:]}")
        report = Path(tmp) / "report.xml"
        t0 = time.perf_counter()
        try:
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_copy_first", "--tb=no", "--junitxml", str(report),
                 "--rootdir", str(ROOT), *(str(ROOT / s) for s in SUBSET)],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return -1, [("(timed out)", "deadlock")], time.perf_counter() - t0
        imported = where_file.read_text() if where_file.exists() else ""
        if imported and not imported.startswith(tmp):
            raise SystemExit(f"the tests imported {imported}, not the copy in {tmp}")
        failed = []
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                bad = case.find("failure")
                if bad is None:
                    bad = case.find("error")
                if bad is not None:
                    message = bad.get("message") or ""
                    # pytest reports a failed assert as "assert ...", other exceptions as "module.Type: ..."
                    kind = "AssertionError" if message.startswith("assert") else message.split(":")[0].split(".")[-1] or "?"
                    failed.append((case.get("name", "?"), kind))
        if out.returncode not in (0, 1):
            if mutation is None:
                raise SystemExit(f"pytest could not run the unmutated copy:\n{out.stdout}\n{out.stderr}")
            failed = failed or [(f"(pytest exited {out.returncode})", "crash")]
        return out.returncode, failed, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one run of the subset may take")
    args = parser.parse_args(argv)
    for m in MUTATIONS:  # every mutation still applies, before anything runs
        mutate((ROOT / "chainoffload_torch" / m.file).read_text(), m)
    load = os.getloadavg()
    code, failed, secs = run_subset(None, args.timeout)
    if code != 0:
        raise SystemExit(f"the unmutated copy fails the subset: {failed}")
    print(f"unmutated copy: the subset passes ({secs:.0f} s)")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda m: run_subset(m, args.timeout), MUTATIONS))
    wall = time.perf_counter() - t0
    lines = [
        "| mutant | what it changes | file | killed by (executor tests first) | failing: executor / engine tests | how |",
        "|---|---|---|---|---:|---|",
    ]
    survivors = []
    for m, (code, failed, _secs) in zip(MUTATIONS, outcomes, strict=True):
        if code == 0:
            survivors.append(m.name)
        tests = [name for name, _ in failed]
        on_executor = [t for t in tests if t.startswith(EXECUTOR_TESTS)]
        ordered = on_executor + [t for t in tests if t not in on_executor]
        names = [f"`{t}`" for t in ordered[:3]] + ([f"+{len(ordered) - 3} more"] if len(ordered) > 3 else [])
        kinds = collections.Counter(HOW.get(kind, kind) for _, kind in failed)
        how = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        lines.append(
            f"| {m.name} | drops: {m.rule} | `{m.file}` | {', '.join(names) or 'SURVIVED'} | "
            f"{len(on_executor)} / {len(tests) - len(on_executor)} | {how or '-'} |"
        )
    text = "\n".join(lines)
    verdict = (
        f"{len(MUTATIONS) - len(survivors)} of {len(MUTATIONS)} mutants killed"
        + (f"; survived: {', '.join(survivors)}" if survivors else "")
    )
    print(text)
    print(verdict)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "copy_mutations.md").write_text(
        "# Mutation check of the copier's synchronization\n\n"
        f"`python benchmarks/copy_mutations.py`, {time.strftime('%Y-%m-%d')}: each mutant removes one ordering rule "
        "from a copy of `chainoffload_torch` (`_copy.py`: the copier; `_pool.py`: the host pool; `executor.py`: its calls into "
        f"them and its recomputations; `_recompute.py`: the state a recomputation runs under); {', '.join(f'`{s}`' for s in SUBSET)} must fail against it. *Killed by* names the first failing "
        f"tests. The unmutated copy passed in {secs:.0f} s; the {len(MUTATIONS)} mutants took {wall:.0f} s "
        f"({args.jobs} at a time; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores).\n\n"
        f"{text}\n\n{verdict}.\n"
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
