"""Where a CPU training step of offload()'s executor spends its time, itemized, beside HF's checkpointing.

On CPU the executor's host work (saved-tensor hooks, call records, the states a recomputation
puts back, the ledger of what is offloaded, the copies) runs on the step's only thread, and the
chain a plan is solved on charges only part of it: the profile's stage times and, per
recomputation, ``recompute_overhead`` (NOTE [ what a recomputation costs the executor ] in
chainoffload_torch/_recompute.py). This script measures all of it, so that the gap between a
plan's simulated and measured step can be read off per item.

For each model of ``benchmarks/checkpointing.py`` (the same builds) and each of

* HF checkpointing (``gradient_checkpointing_enable``, non-reentrant),
* ``offload()`` at checkpointing's memory (its own choice of method),
* ``offload(method="rotor")`` at that memory (recomputation alone),
* ``offload()`` halfway from there to the keep-all peak,

it first times ``--steps`` steps, the variants interleaved step by step (the thread's CPU time,
median), then runs ``--steps`` more with timers around the executor's methods and the blocks'
forwards (exclusive time: a timed call's time less that of the timed calls inside it) and
prints the median per step of each item. The timers cost about 1 us per call, so the itemized
steps run a little longer than the untimed ones; the untimed medians are the figures to compare.

    python benchmarks/host_work.py [--steps 9] [--warmup 2] [name ...]

Writes ``benchmarks/results/host_work.md`` when every model runs (no names given).
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import os
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
from chainoffload_torch import _instrument, _recompute, executor  # noqa: E402
from chainoffload_torch.plans import step_time  # noqa: E402
from checkpointing import MODELS, build, plan_summary  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("HF checkpointing", "offload() at checkpointing's memory", "offload(method='rotor') there", "offload() halfway")

#: The items: which methods' exclusive time each one is.
ITEMS: dict[str, list[tuple[type, str]]] = {
    "saved-tensor pack hook": [(executor.ScheduleRun, "pack")],
    "saved-tensor unpack hook": [(executor.ScheduleRun, "unpack")],
    "call records (per recomputed block, in the forward)": [(_recompute.CallRecord, "__init__")],
    "a recomputation's states and arguments (around the block's call)": [(_recompute.CallRecord, "call")],
    "stage boundaries (executor)": [(executor.ScheduleRun, "stage_start"), (executor.ScheduleRun, "stage_end")],
    "instrument hooks (boundaries, gradient marks)": [
        (_instrument.Instrument, n) for n in ("_block_pre", "_block_post", "_grad_hook", "_root_pre", "_root_post")
    ],
    "schedule events (backward marks)": [(executor.ScheduleRun, "backward_mark"), (executor.ScheduleRun, "_fire")],
    "copies and their bookkeeping": [
        (executor.ScheduleRun, n) for n in ("_offload_entry", "_prefetch_entry", "_await_prefetch", "_release_entry", "_drop_unit", "_give_back")
    ],
    "step start and end (ledger, resident storages)": [
        (executor.ScheduleRun, n) for n in ("forward_start", "forward_end", "backward_end")
    ],
}
MODEL_ITEM = "the blocks' forwards (Python and kernels; recomputations included)"
REST = "the rest (backward kernels, the code outside the blocks, the loss)"


class Timers:
    """Exclusive thread-CPU seconds per item: wrappers that push and pop a stack."""

    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.stack: list[list[float]] = []  # per open call: [children's seconds]
        self.undo: list = []

    def wrap(self, owner: object, name: str, item: str) -> None:
        original = getattr(owner, name)
        timers = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            timers.stack.append([0.0])
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                children = timers.stack.pop()[0]
                timers.seconds[item] += spent - children
                if timers.stack:
                    timers.stack[-1][0] += spent

        self.undo.append((owner, name, original, name in vars(owner)))
        setattr(owner, name, timed)

    def remove(self) -> None:
        for owner, name, original, own in reversed(self.undo):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self.undo.clear()


def step(model: torch.nn.Module, batch: dict, seed: int) -> float:
    """One step (forward, loss, backward), gradients zeroed before: the thread's CPU seconds."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    start = time.thread_time()
    model(**batch).loss.backward()
    return time.thread_time() - start


def run(name: str, steps: int, warmup: int) -> list[dict]:
    base, batch = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probed = copy.deepcopy(base)
        probe = ct.offload(probed, batch)
    plan = probe.plan
    chain, link, resident, keep_all = plan.chain, plan.platform, plan.resident_bytes, plan.keep_all_peak
    whole = ({1} if probe.blocks.prefix else set()) | {probe.blocks.stage_of(b) + 1 for b in probe.blocks.tails}
    paths = {id(m): n for n, m in probed.named_modules()}
    block_paths = [paths[id(b)] for b in probe.blocks.modules]
    probe.remove()
    unlimited = link.with_memory(2**62)
    ck = co.simulate(chain.replace(fwd_nosave=chain.fwd), unlimited, checkpoint_all_schedule(chain.length, whole=whole))
    memory_ck = int(ck.peak_memory) + resident
    memory_half = (memory_ck + keep_all) // 2
    models = {v: copy.deepcopy(base) for v in VARIANTS}
    models[VARIANTS[0]].gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    handles = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v, memory, method in ((VARIANTS[1], memory_ck, None), (VARIANTS[2], memory_ck, "rotor"), (VARIANTS[3], memory_half, None)):
            handles[v] = ct.offload(models[v], batch, memory=memory, method=method)
    for s in range(warmup):
        for m in models.values():
            step(m, batch, s)
    untimed: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for s in range(steps):
        for v, m in models.items():
            untimed[v].append(step(m, batch, 100 + s))
    rows = []
    for v, m in models.items():
        timers = Timers()
        for item, methods in ITEMS.items():
            for owner, meth in methods:
                timers.wrap(owner, meth, item)
        for path in block_paths:
            timers.wrap(m.get_submodule(path), "forward", MODEL_ITEM)
        per_step: dict[str, list[float]] = collections.defaultdict(list)
        try:
            for s in range(steps):
                timers.seconds.clear()
                total = step(m, batch, 200 + s)
                for item in [*ITEMS, MODEL_ITEM]:
                    per_step[item].append(timers.seconds.get(item, 0.0))
                per_step[REST].append(total - sum(timers.seconds.values()))
                per_step["total"].append(total)
        finally:
            timers.remove()
        h = handles.get(v)
        simulated = ck.makespan if h is None else step_time(co.simulate(chain, unlimited, h.plan.schedule), h.plan.overlap)
        rows.append({
            "model": name, "variant": v, "untimed": statistics.median(untimed[v]), "simulated": simulated,
            "items": {k: statistics.median(x) for k, x in per_step.items()},
            "does": "every block recomputed (torch.utils.checkpoint)" if h is None else plan_summary(h),
        })
    for h in handles.values():
        h.remove()
    return rows


def table(rows: list[dict]) -> str:
    items = [*ITEMS, MODEL_ITEM, REST, "total"]
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        hf = mine[0]
        out += [f"### {name}", "", "| | " + " | ".join(r["variant"] for r in mine) + " |", "|---|" + "---:|" * len(mine)]
        out.append("| what it does | " + " | ".join(r["does"] for r in mine) + " |")
        out.append("| step, untimed (thread CPU, median) | " + " | ".join(
            f"{1000 * r['untimed']:.1f} ms ({r['untimed'] / hf['untimed']:.3f}x HF)" for r in mine) + " |")
        out.append("| simulated step (the probe's chain) | " + " | ".join(
            f"{1000 * r['simulated']:.1f} ms ({r['simulated'] / hf['simulated']:.3f}x HF)" for r in mine) + " |")
        for item in items:
            label = f"**{item}** (timed steps)" if item == "total" else item
            out.append(f"| {label} | " + " | ".join(
                "-" if r is hf and item in ITEMS else f"{1000 * r['items'][item]:.2f} ms" for r in mine) + " |")
        host = [sum(r["items"][i] for i in ITEMS) for r in mine]
        out.append("| executor and instrument, all items above the blocks' forwards | " + " | ".join(
            "-" if r is hf else f"{1000 * x:.2f} ms" for r, x in zip(mine, host, strict=True)) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"models (default: all): {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=9, help="untimed steps, then timed steps, per variant (default 9)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default 2)")
    opts = parser.parse_args(argv)
    for n in opts.names:
        if n not in MODELS:
            parser.error(f"name: {n!r} is not one of {', '.join(MODELS)}")
    if opts.steps < 1 or opts.warmup < 0:
        parser.error(f"--steps, --warmup: {opts.steps}, {opts.warmup} must be >= 1 and >= 0")
    torch.set_num_threads(1)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    rows = []
    for name in opts.names or MODELS:
        rows += run(name, opts.steps, opts.warmup)
        print(f"{name}: done", flush=True)
    end = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    text = "\n".join([
        table(rows),
        f"Per step, the median of {opts.steps} steps (after {opts.warmup} warm-up steps, then {opts.steps} untimed ones); "
        f"thread CPU time; CPU, torch.set_num_threads(1), torch {torch.__version__}; load average (/proc/loadavg) "
        f"{' '.join(load)} at the start, {' '.join(end)} at the end. An item's figure is the exclusive time of its "
        "methods. HF checkpointing runs none of them: its forward hooks fall in the blocks' forwards, and its "
        "recomputations (torch.utils.checkpoint calls the forward it wrapped, not the timed one) in the rest.",
    ])
    print(text)
    if not opts.names:
        RESULTS.mkdir(exist_ok=True)
        command = f"python benchmarks/host_work.py --steps {opts.steps} --warmup {opts.warmup}"
        title = "# Where a CPU step's time goes: the executor's host work, item by item"
        (RESULTS / "host_work.md").write_text(f"{title}\n\n`{command}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
