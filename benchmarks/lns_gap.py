"""What NOTE [ exact improver's gap ] costs: ``best`` with and without the stall-share rule.

    python benchmarks/lns_gap.py

At compare.py's points (PCIe4: 25 GB/s per direction, 10 us, duplex) on chains of at most 24
stages that are within ``LNS_GAP`` of their bound and whose stall share is the largest, and at the
README's main job (resnet50 in 4 GiB): ``solve(chain, platform)`` (the default ``best``) once with
``STALL_SHARE`` at infinity (the rule before it: skip within ``LNS_GAP``) and once as shipped; wall
and CPU seconds of the call (kernels and OR-Tools warmed first, a fresh chain object each call so
that the ladder's cache does not carry over), makespan / compute time, status, what the
improver did, the share of the stall the bound leaves open, and the load. Writes
``benchmarks/results/lns_gap.md``.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import chainoffload as co
from _common import write_report
from chainoffload.bounds import offload_memory_floor
from chainoffload.networks import network
from chainoffload.solvers import best as _best
from chainoffload.units import format_bytes

POINTS = [("vgg19", 4480070087), ("inception_v3", 5955899591), ("gpt2_12", 6685431325), ("resnet50", 4 * 2**30)]
OUT = Path(__file__).resolve().parent / "results" / "lns_gap.md"


def one(chain, platform) -> tuple:
    load = os.getloadavg()[0]
    c, w = time.process_time(), time.perf_counter()
    r = co.solve(chain, platform)
    return r, time.perf_counter() - w, time.process_time() - c, load


def main() -> None:
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    # Warm-up: compiled kernels and OR-Tools loaded (resnet18 at half memory runs the improver).
    warm = network("resnet18")
    lo, hi = offload_memory_floor(warm), co.keep_all_peak(warm)
    co.solve(warm, co.Platform(memory=(lo + hi) // 2, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5))
    rows = []
    for name, memory in POINTS:
        platform = co.Platform(memory=memory, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)
        for label, share in (("before (skip within LNS_GAP)", math.inf), ("after (stall share)", _best.STALL_SHARE)):
            old, _best.STALL_SHARE = _best.STALL_SHARE, share
            chain = network(name)  # a fresh object: the ladder's cache is per chain object
            try:
                r, wall, cpu, load = one(chain, platform)
            finally:
                _best.STALL_SHARE = old
            lns = r.info.get("lns", {})
            rows.append(f"| {name} | {format_bytes(memory)} | {label} | {r.makespan / chain.compute_time:.4f} | {r.status.value} "
                        f"| {r.lower_bound / chain.compute_time:.4f} | {lns.get('mode')} {lns.get('work', 0):.2f} | {wall:.2f} / {cpu:.2f} | {load:.1f} |")
    lines = [
        "# The exact improver's gap rule: cost and gain (NOTE [ exact improver's gap ])",
        "",
        f"`python benchmarks/lns_gap.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU cores shared "
        f"with other sessions' work, 1-minute load average {load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, "
        f"{time.perf_counter() - t0:.0f} s. PCIe4 (25 GB/s per direction, 10 us, duplex); ratios to the compute time; "
        "improver: its mode and the deterministic seconds it used; wall / CPU seconds of one `solve()`; load before the call.",
        "",
        "| network | memory | rule | best | status | bound | improver | wall / CPU (s) | load |",
        "|---|---:|---|---:|---|---:|---|---:|---:|",
        *rows,
    ]
    write_report(lines, OUT)


if __name__ == "__main__":
    main()
