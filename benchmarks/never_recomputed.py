"""Which stages ``offload()`` never recomputes in rows of ``benchmarks/offload_models.py``, and why:
what keeps a row's least memory above the floor for any schedule (which assumes every stage may
be recomputed)::

    python benchmarks/never_recomputed.py t5 bart convnext
"""

from __future__ import annotations

import collections
import sys
import warnings

import torch

import chainoffload_torch as ct
from chainoffload.units import format_bytes
from offload_models import NAMES, build


def row(name: str) -> str:
    """One line for row ``name``: its stages never recomputed, grouped by reason, with the bytes of their units."""
    model, _, _, sample = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, sample, memory=1.0, repeats=1, warmup=0)
    chain, banned = handle.chain, handle.plan.not_recomputable
    handle.remove()
    why: dict[str, list[int]] = collections.defaultdict(list)
    for i, reason in sorted(banned.items()):
        why[reason.split(" (")[0] if "argument" in reason else reason].append(i)
    parts = [
        f"{reason}: stage{'s' if len(st) > 1 else ''} {', '.join(map(str, st))} ({format_bytes(sum(int(chain.saved[i - 1]) for i in st))})"
        for reason, st in why.items()
    ]
    return f"- {name} ({chain.length} stages): " + "; ".join(parts)


def main(argv: list[str]) -> int:
    """Print one line per row named (all rows by default)."""
    unknown = [n for n in argv if n not in NAMES]
    if unknown:
        print(f"name: {unknown[0]!r} is not one of {', '.join(NAMES)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for name in argv or NAMES:
        print(row(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
