"""How close ``offload()``'s profile is to the step it profiles, on CPU.

    python benchmarks/profile_accuracy.py [--rounds 5] [--src PATH] [--out FILE] [name ...]

For each model of ``benchmarks/checkpointing.py`` (Llama-, BERT- and T5-like, 8 + 8 blocks,
width 256), ``--rounds`` times in one process: a plain training step's forward (with the loss)
and backward, timed apart on the thread's CPU clock (the median of 3 after a warm-up step),
then ``handle = ct.offload(model, batch)`` as a user calls it (the adaptive profile,
``repeats=None``) and the sums of its chain's ``fwd`` and ``bwd``. The table gives, per model,
the median over the rounds of each sum over the plain step's time (1.000: the profile predicts
the step plain training takes), with the least and the most. The chain's times are what every
plan is priced with: a forward measured high makes every recomputation look dearer than it is.

``--src PATH`` imports the library from another checkout (an earlier revision, for before /
after). Writes ``benchmarks/results/profile_accuracy.md`` (``--out``) when every model runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

# --src PATH: the library from another checkout (an earlier revision, for before / after).
_src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _src)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
from _common import library  # noqa: E402
from checkpointing import MODELS, build  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def plain_times(model: torch.nn.Module, batch: dict, steps: int = 3) -> tuple[float, float]:
    """The median forward (with the loss) and backward seconds of ``steps`` plain training steps
    after a warm-up one, on the thread's CPU clock."""
    fwd, bwd = [], []
    for k in range(steps + 1):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(k)
        start = time.thread_time()
        loss = model(**batch).loss
        mid = time.thread_time()
        loss.backward()
        end = time.thread_time()
        if k:
            fwd.append(mid - start)
            bwd.append(end - mid)
    model.zero_grad(set_to_none=True)
    return statistics.median(fwd), statistics.median(bwd)


def run(name: str, rounds: int) -> dict:
    """Model ``name``: per round, the plain step's forward and backward and offload()'s profile."""
    model, batch = build(name)
    rows = []
    for _ in range(rounds):
        fwd, bwd = plain_times(model, batch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle = ct.offload(model, batch)
        chain = handle.plan.chain
        rows.append((fwd, bwd, float(sum(chain.fwd)), float(sum(chain.bwd))))
        handle.remove()
    return {"model": name, "rows": rows}


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def table(results: list[dict]) -> str:
    lines = [
        "| model | plain step: forward / backward (median) | profile: forward / backward (median) | forward: profile / plain | backward: profile / plain | step: profile / plain |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows = r["rows"]
        pf, pb = statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows)
        cf, cb = statistics.median(x[2] for x in rows), statistics.median(x[3] for x in rows)
        lines.append(
            f"| {r['model']} | {pf * 1e3:.1f} / {pb * 1e3:.1f} ms | {cf * 1e3:.1f} / {cb * 1e3:.1f} ms | "
            f"{_cell([x[2] / x[0] for x in rows])} | {_cell([x[3] / x[1] for x in rows])} | "
            f"{_cell([(x[2] + x[3]) / (x[0] + x[1]) for x in rows])} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(MODELS)})")
    ap.add_argument("--rounds", type=int, default=5, help="plain steps and a profile, this many times per model")
    ap.add_argument("--src", default=None, help="import the library from this checkout (default: this one)")
    ap.add_argument("--out", type=Path, default=RESULTS / "profile_accuracy.md", help="the report")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds} must be at least 1")
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}: choose among {', '.join(MODELS)}")
    torch.set_num_threads(1)
    start_load = os.getloadavg()
    results = [run(name, args.rounds) for name in (args.names or MODELS)]
    end_load = os.getloadavg()
    command = "python benchmarks/profile_accuracy.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")
    command += f" --src {args.src}" if args.src else ""
    text = "\n".join([
        f"`{command}`",
        "",
        f"Code: {library(ct.__file__, _src)}; torch {torch.__version__}, CPU, torch.set_num_threads(1); {args.rounds} rounds per model; "
        f"load average {start_load[0]:.2f} at the start, {end_load[0]:.2f} at the end.",
        "",
        table(results),
        "",
    ])
    print(text)
    if not args.names:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
