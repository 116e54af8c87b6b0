"""Where the executor's host time goes in a step of a recomputing plan, on CPU (issue 31).

Builds ``benchmarks/checkpointing.py``'s model ``name`` (default llama), plans ``offload()`` at the
memory that checkpointing every block holds (as that script does), and runs ``--steps`` steps
after two warm-up steps, interleaved with Hugging Face's ``gradient_checkpointing_enable()``.
Every hook of the instrument (the root's and the blocks' module hooks, the tensor hooks that
mark a backward), the saved-tensor hooks and the functions named on the command line are
wrapped with a timer of the thread's CPU time (``time.thread_time``: the machine's load moves
it far less than wall time); each reports its *self* time (less the wrapped functions it calls
and the blocks' own forwards), per step. The blocks' forwards are reported too.

    python benchmarks/executor_host.py [--model llama] [--steps 7] [module:Class.method ...]

e.g. ``_recompute:CallRecord.call _stages:UnitLedger.pack _recompute:Slot.__init__`` (modules of
``chainoffload_torch``). Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import importlib
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.solvers.remat_baselines import checkpoint_all_schedule  # noqa: E402
from chainoffload_torch import _instrument, api  # noqa: E402
from checkpointing import MODELS, build  # noqa: E402

_acc: collections.Counter = collections.Counter()
_calls: collections.Counter = collections.Counter()
_stack: list[float] = []


def _timed(f, tag: str):
    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.thread_time()
        _stack.append(0.0)
        try:
            return f(*a, **k)
        finally:
            dt = time.thread_time() - t0
            _acc[tag] += dt - _stack.pop()
            _calls[tag] += 1
            if _stack:
                _stack[-1] += dt
    return g


def _wrap(owner, attr: str, tag: str) -> None:
    setattr(owner, attr, _timed(getattr(owner, attr), tag))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="module:Class.method")
    parser.add_argument("--model", default="llama", choices=MODELS)
    parser.add_argument("--steps", type=int, default=7)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    base, batch = build(opts.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = ct.offload(copy.deepcopy(base), batch)
    plan = probe.plan
    whole = ({1} if probe.blocks.prefix else set()) | {probe.blocks.stage_of(b) + 1 for b in probe.blocks.tails}
    probe.remove()
    # checkpointing.py's memory_ck: the schedule on the profile less the executor's charge.
    ck = co.simulate(
        plan.chain.replace(fwd_nosave=plan.chain.fwd), plan.platform.with_memory(2**62),
        checkpoint_all_schedule(plan.chain.length, whole=whole),
    )
    for attr in ("_root_pre", "_root_post", "_block_pre", "_block_post", "_grad_hook"):
        _wrap(_instrument.Instrument, attr, attr)  # before offload(): the hooks bind them at install
    _wrap(api.Offloader, "pack", "saved-tensor pack")
    _wrap(api.Offloader, "unpack", "saved-tensor unpack")
    for target in opts.targets:
        mod, _, rest = target.partition(":")
        cls, _, attr = rest.partition(".")
        _wrap(getattr(importlib.import_module(f"chainoffload_torch.{mod}"), cls), attr, target)
    model = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = ct.offload(model, batch, memory=int(ck.peak_memory) + plan.resident_bytes)
    for layer in handle.blocks.modules:
        layer.forward = _timed(layer.forward, "blocks' forwards (compute)")
    hf = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def step(m: torch.nn.Module, seed: int) -> float:
        m.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        t0 = time.thread_time()
        m(**batch).loss.backward()
        return time.thread_time() - t0

    for s in range(2):
        step(hf, s)
        step(model, s)
    _acc.clear()
    _calls.clear()
    ours, theirs = [], []
    for s in range(opts.steps):
        theirs.append(step(hf, 100 + s))
        ours.append(step(model, 100 + s))
    n = opts.steps
    print(f"{opts.model}, {handle.plan.result.method} plan at checkpointing's memory; thread CPU time per step "
          f"(median of {n}): HF checkpointing {1000 * statistics.median(theirs):.1f} ms, offload() {1000 * statistics.median(ours):.1f} ms")
    print("| self time of | ms / step | calls / step | us / call |\n|---|---:|---:|---:|")
    host = 0.0
    for tag, sec in _acc.most_common():
        print(f"| {tag} | {1000 * sec / n:.2f} | {_calls[tag] // n} | {1e6 * sec / max(1, _calls[tag]):.1f} |")
        host += 0 if tag.startswith("blocks'") else sec
    print(f"\nexecutor host time (all but the blocks' forwards): {1000 * host / n:.2f} ms / step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
