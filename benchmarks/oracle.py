"""The simulator against the naive oracle on many random schedules of both kinds.

The property test ``property_tests/test_prop_oracle.py`` draws a few hundred cases per run; this
script draws ``--examples`` of each kind (default 10^4: fixed-order and rematerializing) with the
same strategy, holds the simulator to ``tests/naive.py`` on every one, and reports what was
covered: verdicts, zero-length ops, instants shared by several events, offloads of a lone a_i,
reads of an offloaded original.

    python benchmarks/oracle.py                   # table on stdout and in benchmarks/results/oracle.md
    python benchmarks/oracle.py --examples 500    # a quick run
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "property_tests")]

from chainoffload import simulate  # noqa: E402
from naive import assert_agrees, simulate_naive  # noqa: E402
from test_prop_oracle import cases  # noqa: E402

RESULTS = HERE / "results"


def run(remat: bool, count: int) -> collections.Counter:
    seen: collections.Counter = collections.Counter()

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(remat=remat))
    def check(case):
        chain, platform, schedule = case
        timeline = simulate(chain, platform, schedule)
        naive = simulate_naive(chain, platform, schedule)
        assert_agrees(timeline, naive)
        seen["schedules"] += 1
        seen[f"verdict: {timeline.violation.rule if timeline.violation else 'feasible'}"] += 1
        if any(e <= s for s, e in zip(timeline.op_start, timeline.op_end, strict=True)):
            seen["with a zero-length op"] += 1
        op_times = set(timeline.op_start.tolist()) | set(timeline.op_end.tolist())
        if op_times & set(timeline.transfer_end.tolist()):
            seen["a transfer ends when an op starts or ends"] += 1
        if schedule.transfers:
            seen["with transfers"] += 1
            if timeline.violation is None:
                seen["with transfers, feasible"] += 1
        if timeline.offloaded_bytes != sum(int(chain.saved[u - 1]) for u in schedule.offloaded_units):
            seen["offloading a lone a_i"] += 1

    check()
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="schedules of each kind")
    args = parser.parse_args(argv)
    rows = []
    for remat in (False, True):
        t0 = time.perf_counter()
        seen = run(remat, args.examples)
        rows.append(("rematerializing" if remat else "fixed order", seen, time.perf_counter() - t0))
    keys = sorted({k for _, seen, _ in rows for k in seen if k != "schedules"})
    lines = [
        "| | " + " | ".join(label for label, _, _ in rows) + " |",
        "|---|" + "---:|" * len(rows),
        "| schedules held to the oracle (all agree) | " + " | ".join(f"{seen['schedules']:,}" for _, seen, _ in rows) + " |",
    ]
    lines += [f"| {k} | " + " | ".join(f"{seen[k]:,}" for _, seen, _ in rows) + " |" for k in keys]
    lines.append("| seconds | " + " | ".join(f"{secs:.0f}" for _, _, secs in rows) + " |")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "oracle.md").write_text(
        "# The simulator against the naive oracle\n\n"
        f"`python benchmarks/oracle.py --examples {args.examples}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores. "
        "Every op and transfer time, the memory after every instant, the peak and the first violation "
        "of `chainoffload.simulate` equal those of `tests/naive.py` (written from docs/model.md alone) "
        "on every schedule drawn.\n\n" + text + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
