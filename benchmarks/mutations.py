"""Mutation check: flip one memory or timing rule in a copy of the simulator's kernels and show
that the fast example tests of the simulator fail.

Each mutation below changes one rule of ``docs/model.md`` in a copy of the ``chainoffload``
package (the real files are never edited): the copy is written to a temporary directory, put
first on ``PYTHONPATH``, and the fast subset (``tests/test_simulate.py``,
``tests/test_remat_sim.py``) runs against it with ``NUMBA_DISABLE_JIT=1`` (the kernels as plain
Python: no compile per mutant). The unmutated copy must pass the subset; every mutant must fail
it. Each mutation's text must occur exactly once in its file, so a rewrite of the kernels that
silently disarms a mutation stops this script instead.

    python benchmarks/mutations.py           # table on stdout and in benchmarks/results/mutations.md
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import Mutation, mutate  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
SUBSET = ("tests/test_simulate.py", "tests/test_remat_sim.py")
SIM = "_kernels/simulate.py"
STRUCT = "_kernels/structure.py"


MUTATIONS = (
    Mutation(
        "allocations before frees",
        "frees before allocations at one instant",
        SIM,
        (("    if ca != cb:\n        return ca < cb", "    if ca != cb:\n        return ca > cb"),),
    ),
    Mutation(
        "offload frees at the end of its copy",
        "an offloaded unit is released at max(end of O_i, end of F_{i+1})",
        SIM,
        (("            if op_end[hold_op[h]] > t_free:", "            if False:"),),
    ),
    Mutation(
        "prefetch allocates at its end",
        "a prefetch allocates at its start",
        SIM,
        (("cb, tr_start[t], 1, -1, sizes[tr_size[t]]", "cb, tr_end[t], 1, -1, sizes[tr_size[t]]"),),
    ),
    Mutation(
        "no g_L at B_L",
        "B_L also allocates g_L (act[L])",
        STRUCT,
        (("            if i == length:\n                alloc_size[na] = length  # g_L", "            if False:\n                alloc_size[na] = length  # g_L"),),
    ),
    Mutation(
        "a_0 freed at the end of B_L",
        "a_0 is resident from time 0 to the end of B_1",
        STRUCT,
        (("            if i == 1:\n                free_size[nf] = 0  # a_0", "            if i == length:\n                free_size[nf] = 0  # a_0"),),
    ),
    Mutation(
        "a_0 never allocated",
        "a_0 is resident from time 0 to the end of B_1",
        SIM,
        (("0, 0.0, 1, -2, sizes[0], 0)", "0, 0.0, 1, -2, 0, 0)"),),
    ),
    Mutation(
        "zero-length transient freed first",
        "a zero-length op's transient memory is counted (freed after its own allocation)",
        SIM,
        (("            c0 = e > s and e > alloc_t", "            c0 = e >= s and e >= alloc_t"),),
    ),
    Mutation(
        "zero-length op frees its inputs first",
        "a zero-length B_i still holds its unit and g_i while it allocates",
        SIM,
        (("            c0 = e > s and e > alloc_t", "            c0 = e > alloc_t"),),
    ),
    Mutation(
        "zero-length reader releases first",
        "a zero-length F_{i+1} still reads a_i when it allocates",
        SIM,
        (("            cls = 1\n            seq = 2 * zl + 1", "            cls = 0\n            seq = 2 * zl + 1"),),
    ),
    Mutation(
        "prefetch allocates after zero-length frees",
        "a prefetch allocation at an instant counts before a zero-length op's frees",
        SIM,
        (("cb, tr_start[t], 1, -1, sizes[tr_size[t]]", "cb, tr_start[t], 1, 4 * n + 9, sizes[tr_size[t]]"),),
    ),
    Mutation(
        "no implicit waits",
        "B_j waits for the prefetches of units j and j-1",
        STRUCT,
        (("                else:\n                    wait_tr[nw] = inst_pre[u]\n                    nw += 1", "                else:\n                    pass"),),
    ),
    Mutation(
        "B_j ignores the prefetch of unit j-1",
        "B_j waits for the prefetch of unit j-1 (its input a_{j-1})",
        STRUCT,
        (("                else:\n                    wait_tr[nw] = inst_pre[u]", "                elif not (kind == OP_B and side == 1):\n                    wait_tr[nw] = inst_pre[u]"),),
    ),
    Mutation(
        "B_j ignores the prefetch of unit j",
        "B_j waits for the prefetch of unit j",
        STRUCT,
        (("                else:\n                    wait_tr[nw] = inst_pre[u]", "                elif not (kind == OP_B and side == 0):\n                    wait_tr[nw] = inst_pre[u]"),),
    ),
    Mutation(
        "next forward waits for the prefetch",
        "F_{i+1} reads the original copy of a_i, without waiting for P_i",
        STRUCT,
        (("                if kind != OP_B and not frees and k < next_bwd[(tr_event[o] + 1) // 2]:", "                if False:"),),
    ),
    Mutation(
        "prefetch does not wait for its offload",
        "a prefetch starts after its offload ends",
        SIM,
        (("                    if end_off > start:", "                    if False:"),),
    ),
    Mutation(
        "half duplex uses two channels",
        "without duplex, offloads and prefetches share one FIFO channel",
        SIM,
        (("                    c = 1 if duplex else 0", "                    c = 1"),),
    ),
    Mutation(
        "no latency",
        "a transfer takes latency + bytes / bandwidth",
        SIM,
        (("                end = start + (latency + size / bw)", "                end = start + (size / bw)"),),
    ),
    Mutation(
        "offload before its data: no violation",
        "an offload triggered before its data is made is a read violation",
        SIM,
        (("                    if event < 2 * tr_src[t] + 1:", "                    if False:"),),
    ),
    Mutation(
        "late prefetch: no violation",
        "a prefetch triggered at or after its reader's start is a read violation",
        SIM,
        (("            if tr_event[t] >= 2 * k:\n                # triggered", "            if False:\n                # triggered"),),
    ),
    Mutation(
        "Fn keeps its input",
        "Fn_i frees its input a_{i-1}",
        STRUCT,
        (("                u = cur[i - 1]\n                use_frees[2 * k] = True", "                u = cur[i - 1]\n                use_frees[2 * k] = False"),),
    ),
    Mutation(
        "F over a lone a_i keeps it",
        "F_i run over a lone a_i frees it at its end",
        STRUCT,
        (("                use_inst[2 * k + 1] = u\n                use_frees[2 * k + 1] = True\n                inst_free[u] = k", "                use_inst[2 * k + 1] = u\n                use_frees[2 * k + 1] = False\n                inst_free[u] = k"),),
    ),
    Mutation(
        "a lone a_i moves as its whole unit",
        "a transfer moves the instance's bytes (act[i] for a lone a_i)",
        STRUCT,
        (("        tr_size[t] = inst_unit[u] if inst_kind[u] == INST_ACT else length + inst_unit[u]", "        tr_size[t] = length + inst_unit[u]"),),
    ),
)


def mutated_copy(dest: Path, mutation: Mutation | None) -> None:
    shutil.copytree(ROOT / "chainoffload", dest / "chainoffload", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    if mutation is not None:
        path = dest / "chainoffload" / mutation.file
        path.write_text(mutate(path.read_text(), mutation))


def run_subset(mutation: Mutation | None) -> tuple[int, list[str], float]:
    """Exit status and failing tests of the fast subset against a (mutated) copy."""
    with tempfile.TemporaryDirectory() as tmp:
        mutated_copy(Path(tmp), mutation)
        env = dict(os.environ, PYTHONPATH=tmp, NUMBA_DISABLE_JIT="1", NUMBA_CACHE_DIR=str(Path(tmp) / "cache"))
        # `python -m` puts the working directory first on sys.path: run from the copy's directory.
        where = subprocess.run([sys.executable, "-c", "import chainoffload; print(chainoffload.__file__)"],
                               cwd=tmp, env=env, capture_output=True, text=True, check=True).stdout
        if not where.startswith(tmp):
            raise SystemExit(f"the copy is not what gets imported: {where}")
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=no", "-rf", "--rootdir", str(ROOT),
             *(str(ROOT / s) for s in SUBSET)],
            cwd=tmp, env=env, capture_output=True, text=True,
        )
        failed = re.findall(r"^FAILED (\S+)", out.stdout, re.M)
        if out.returncode not in (0, 1):
            raise SystemExit(f"pytest could not run for {mutation.name if mutation else 'the unmutated copy'}:\n{out.stdout}\n{out.stderr}")
        return out.returncode, failed, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    args = parser.parse_args(argv)
    for m in MUTATIONS:  # every mutation still applies, before anything runs
        mutate((ROOT / "chainoffload" / m.file).read_text(), m)
    code, failed, secs = run_subset(None)
    if code != 0:
        raise SystemExit(f"the unmutated copy fails the subset: {failed}")
    print(f"unmutated copy: the subset passes ({secs:.0f} s)")
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(run_subset, MUTATIONS))
    lines = ["| mutation | rule it breaks | killed by | tests failing |", "|---|---|---|---:|"]
    survivors = []
    for m, (code, failed, _secs) in zip(MUTATIONS, outcomes, strict=True):
        if code == 0:
            survivors.append(m.name)
        names = [f"`{f.split('::')[-1]}`" for f in failed[:3]] + ([f"+{len(failed) - 3} more"] if len(failed) > 3 else [])
        lines.append(f"| {m.name} | {m.rule} | {', '.join(names) or 'SURVIVED'} | {len(failed)} |")
    text = "\n".join(lines)
    verdict = (
        f"{len(MUTATIONS) - len(survivors)} of {len(MUTATIONS)} mutations killed"
        + (f"; survived: {', '.join(survivors)}" if survivors else "")
    )
    print(text)
    print(verdict)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mutations.md").write_text(
        "# Mutation check of the simulator's rules\n\n"
        f"`python benchmarks/mutations.py`, {time.strftime('%Y-%m-%d')}: each mutation flips one rule in a copy of "
        f"the kernels; the fast subset ({', '.join(f'`{s}`' for s in SUBSET)}, run with `NUMBA_DISABLE_JIT=1`) "
        "must fail. *Killed by* names the first failing tests.\n\n"
        f"{text}\n\n{verdict}.\n"
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
