"""How many of a fuzz run's models that trained equal with a recomputing plan recomputed the code
before the first block (stage 1, when it is a stage of its own).

The fuzz's record (``<out>.jsonl`` of ``benchmarks/torch_fuzz.py``) keeps each model's spec, memory
and method but not its plan; each such model is planned again here at its first shape, as the
fuzz planned it, and its schedule read::

    python benchmarks/fuzz_recomputed_stages.py benchmarks/results/torch_fuzz_prefix.jsonl
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

import chainoffload_torch as ct
from chainoffload_torch.plans import _recomputed
from chainoffload_torch.testing import BlockSpec, HookSpec, ModelCase, ModelSpec

NAMES = {"BlockSpec": BlockSpec, "HookSpec": HookSpec, "ModelSpec": ModelSpec}


def main(argv: list[str]) -> int:
    """Print the count for the fuzz record ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python benchmarks/fuzz_recomputed_stages.py FUZZ.jsonl", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line]
    recomputing = [r for r in rows if r["kind"] == "equal" and r["recomputations"] > 0]
    prefix = 0
    for r in recomputing:
        case = ModelCase(eval(r["spec"], {"__builtins__": {}}, NAMES))  # the fuzz's own repr of a spec
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle = ct.offload(case.build(None), case.batch(None, 0), memory=r["memory"], method=r["method"], repeats=1, warmup=0)
        prefix += bool(handle.blocks.prefix and 1 in _recomputed(handle.schedule))
        handle.remove()
    print(f"{len(recomputing)} models trained equal with a recomputing plan; {prefix} of them recompute stage 1, the code before the first block")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
