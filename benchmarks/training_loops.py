"""Training loops people write, plain against offloaded in one run (issue 32).

Each loop trains a model plain (an untouched deep copy) and offloaded (``offload()`` included in
its time), seeding the same way, and reports whether every loss and every parameter is
``torch.equal`` at the end, how many plans were profiled (``replans``: after the first), how
many were solved on a new shape's measured sizes with a profiled shape's times scaled
(``rescaled``) and how many borrowed a larger shape's schedule (``reuses``), and the time ratio
offloaded / plain over the whole run. The Trainer-like loop runs its plain and offloaded steps
in turn, so that the machine's load weighs on both alike. The loops: an optimizer stepped from gradient hooks (torchtune's optimizer in
backward), stochastic depth drawn with Python's ``random``, a NumPy mask, a forward driven by a
call counter, a parent that writes through ``.data``, ``remove()`` between a forward and its
backward, forwards from two threads, LayerDrop, two forwards before one backward, and a Hugging
Face ``Trainer``-like loop (GPT-2, AdamW, gradient clipping, dynamic padding: a length per step,
labels padded with -100, ``num_items_in_batch`` passed as an int).

    python benchmarks/training_loops.py                    # -> benchmarks/results/training_loops.md
    python benchmarks/training_loops.py --steps 20 --hf-steps 50

CPU, one intra-op thread; memory 0.6 of each shape's keep-all peak.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from torch import nn

import chainoffload_torch as ct
from _common import write_report

RESULTS = Path(__file__).resolve().parent / "results"
#: The Trainer-like loop's plain seconds and its offloaded steps' seconds (offload() apart).
HF_TIMES: list[float] = [0.0, 0.0]
#: The Trainer-like loop's plain and offloaded seconds and step counts, split by whether the
#: step's shape had a plan already ("known") or brought a new one ("new").
HF_SPLIT: dict[str, list[float]] = {"known": [0.0, 0.0, 0], "new": [0.0, 0.0, 0]}
#: Steps of the Trainer-like loop that measured their new length's sizes with their own forward
#: (``handle.measured``: every tensor they saved kept, nothing moved).
HF_MEASURED: list[int] = [0]
MEMORY = 0.6
D = 128


class Block(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.norm = nn.LayerNorm(D)
        self.f = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.calls = 0

    def forward(self, x):
        y = self.f(self.norm(x))
        if self.mode == "python_random":  # stochastic depth drawn with Python's random
            y = y * (0.0 if random.random() < 0.2 else 1.25)
        elif self.mode == "numpy_mask":
            y = y * torch.from_numpy((np.random.rand(D) > 0.3).astype(np.float32))
        elif self.mode == "counter":
            self.calls += 1
            y = y * (1.0 + 0.1 * (self.calls % 3))
        return x + y


class Net(nn.Module):
    def __init__(self, mode: str = "plain", n: int = 8) -> None:
        super().__init__()
        self.mode = mode
        self.inp = nn.Linear(D, D)
        self.blocks = nn.ModuleList(Block(mode) for _ in range(n))
        self.head = nn.Linear(D, 8)

    def forward(self, x):
        h = self.inp(x)
        self.skipped = 0
        for k, b in enumerate(self.blocks):
            if self.mode == "layerdrop" and self.training and random.random() < 0.2:
                self.skipped += 1
                continue  # LayerDrop: the block is skipped this step (the first and last too)
            h = b(h)
            if self.mode == "data_write" and k in (2, 5):
                h.data.mul_(0.9)
        return self.head(h)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def batch(k: int, t: int = 64) -> torch.Tensor:
    return torch.randn(8, t, D, generator=torch.Generator().manual_seed(k))


def optimizer_in_backward(model: nn.Module) -> None:
    opts = {p: torch.optim.AdamW([p], lr=1e-3) for p in model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)


#: Per side (offloaded or not): steps that skipped blocks, and the most bytes such a step moved.
SKIPS: dict[bool, list[int]] = {}


def train(model, steps, *, mode, offloaded):
    """(losses, seconds, handle or error, seconds of offload()): ``steps`` steps of ``mode``'s
    loop, offload() first when ``offloaded`` (in the time)."""
    seed_all(7)
    opt = None if mode == "optimizer_in_hooks" else torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, handle, setup = [], None, 0.0
    SKIPS[offloaded] = [0, 0]
    start = time.perf_counter()
    try:
        if offloaded:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                handle = ct.offload(model, batch(0), memory=MEMORY)
            setup = time.perf_counter() - start
        for k in range(steps):
            torch.manual_seed(1000 + k)
            if mode == "siamese":  # two forwards, one backward (a contrastive pair)
                a, b = model(batch(k)), model(batch(k + 500))
                loss = (a - b).square().mean()
            else:
                loss = model(batch(k)).square().mean()
            if mode == "remove_mid_step" and handle is not None and k == steps - 1:
                handle.remove()  # the last step's backward runs under its plan
            loss.backward()
            losses.append(loss.detach())
            if getattr(model, "skipped", 0):  # a LayerDrop step that skipped blocks
                SKIPS[offloaded][0] += 1
                if handle is not None and handle.last_step is not None:
                    SKIPS[offloaded][1] = max(SKIPS[offloaded][1], handle.last_step.offloaded_bytes)
            if opt is not None:
                opt.step()
                opt.zero_grad()
    except Exception as exc:  # noqa: BLE001 - an outcome to report
        return losses, time.perf_counter() - start, exc, setup
    return losses, time.perf_counter() - start, handle, setup


def loop_row(mode: str, steps: int) -> list[str]:
    seed_all(1)
    model = Net(mode)
    ref = copy.deepcopy(model)
    if mode == "optimizer_in_hooks":
        optimizer_in_backward(model)
        optimizer_in_backward(ref)
    want, plain_s, _, _ = train(ref, steps, mode=mode, offloaded=False)
    got, off_s, handle, setup = train(model, steps, mode=mode, offloaded=True)
    if isinstance(handle, Exception):
        msg = str(handle).replace("|", "/").splitlines()[0][:160]
        return [mode, str(steps), f"raised after {len(got)} steps: {type(handle).__name__}: {msg}", "", "", "", "", ""]
    equal = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    equal = equal and all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    moved = handle.last_step.offloaded_bytes if handle.last_step is not None else 0
    if mode == "layerdrop":
        skipping, most = SKIPS[True]
        assert skipping == SKIPS[False][0]  # both sides skipped in the same steps
        name = (
            f"layerdrop ({skipping} of {steps} steps skip blocks; plan {handle.plan.offloaded_bytes / 2**20:.2f} MiB, "
            f"a skipping step moved at most {most / 2**20:.2f} MiB)"
        )
        return _row(name, steps, equal, handle, moved, plain_s, off_s, setup)
    return _row(mode, steps, equal, handle, moved, plain_s, off_s, setup)


def _row(name, steps, equal, handle, moved, plain_s, off_s, setup) -> list[str]:
    return [
        name, str(steps), "equal" if equal else "DIFFERENT", f"{handle.replans} / {handle.rescaled} / {handle.reuses}", f"{moved / 2**20:.2f} MiB",
        f"{1e3 * plain_s / steps:.1f}", f"{setup:.2f}", f"{(off_s - setup) / plain_s:.2f}x", f"{off_s / plain_s:.2f}x",
    ]


def threads_row() -> list[str]:
    seed_all(1)
    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.offload(model, batch(0), memory=MEMORY)
    entered, go, box = threading.Event(), threading.Event(), {}

    def hold(*_):
        if threading.current_thread().name == "first":
            entered.set()
            go.wait(20)

    model.blocks[3].register_forward_pre_hook(hold)

    def first():
        model(batch(0)).square().mean().backward()

    th = threading.Thread(target=first, name="first")
    th.start()
    entered.wait(20)
    try:
        model(batch(1))
        box["second"] = "ran"
    except RuntimeError as exc:
        box["second"] = f"refused: {str(exc)[:110]}..."
    go.set()
    th.join(20)
    return ["two threads at once", "1", box["second"], "", "", "", "", "", ""]


# -- a Hugging Face Trainer-like loop -------------------------------------------------------------


#: Seconds and calls of the planner's work inside the steps of the Trainer-like loop.
PLANNER: dict[str, list[float]] = {"measure": [0.0, 0], "plan": [0.0, 0], "rescale": [0.0, 0]}


def _time_planner(handle) -> None:
    """Count the seconds the handle's planner spends measuring a new shape's sizes (one
    forward), solving on them with a profiled shape's times scaled, and profiling and solving a
    new plan, inside the training steps."""
    planner = handle._planner
    for name in PLANNER:
        fn = getattr(planner, name)

        def timed(*a, _fn=fn, _name=name, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                PLANNER[_name][0] += time.perf_counter() - t0
                PLANNER[_name][1] += 1

        setattr(planner, name, timed)


def hf_loop(steps: int) -> list[str]:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = GPT2Config(vocab_size=512, n_positions=128, n_embd=128, n_layer=8, n_head=4, use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.train()
    ref = copy.deepcopy(model)
    lengths = [int(t) for t in np.random.default_rng(3).integers(16, 97, size=steps)]

    def data(k):
        g = torch.Generator().manual_seed(k)
        t = lengths[k]
        ids = torch.randint(0, 512, (4, t), generator=g)
        real = torch.randint(t // 2, t + 1, (4,), generator=g)  # dynamic padding: each row's length
        mask = (torch.arange(t)[None, :] < real[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        n = int((labels[:, 1:] != -100).sum())
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}, n

    def step(m, opt, k):
        b, n = data(k)
        torch.manual_seed(2000 + k)
        loss = m(**b, num_items_in_batch=n).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss.detach()

    # The two run side by side, a step of each in turn, so that a change of the machine's load
    # (shared by other jobs) weighs on both alike; offload() is timed apart, before the first.
    opts = [torch.optim.AdamW(m.parameters(), lr=5e-4) for m in (ref, model)]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b, n = data(0)
        handle = ct.offload(model, {**b, "num_items_in_batch": n}, memory=MEMORY)
    setup = time.perf_counter() - start
    _time_planner(handle)
    seconds = [0.0, 0.0]
    want, got = [], []
    for k in range(steps):
        known = len(handle._known)
        took = [0.0, 0.0]
        for i, (m, out) in enumerate(((ref, want), (model, got))):
            t0 = time.perf_counter()
            out.append(step(m, opts[i], k))
            took[i] = time.perf_counter() - t0
            seconds[i] += took[i]
        # Steps whose shape the handle had a plan for, and steps that brought a new one.
        split = HF_SPLIT["new" if len(handle._known) != known else "known"]
        split[0] += took[0]
        split[1] += took[1]
        split[2] += 1
    plain_s, off_s = seconds[0], seconds[1] + setup
    HF_TIMES[:] = [plain_s, off_s - setup]
    HF_MEASURED[0] = handle.measured
    equal = all(torch.equal(a, b) for a, b in zip(got, want, strict=True)) and all(
        torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True)
    )
    moved = handle.last_step.offloaded_bytes if handle.last_step is not None else 0
    name = f"HF Trainer-like GPT-2 (8 layers), dynamic padding, {len(set(lengths))} lengths in 16..96"
    return _row(name, steps, equal, handle, moved, plain_s, off_s, setup)


#: Said of a Trainer-like run shorter than the issue's 200 steps.
SHORT = "The run is short on this shared 2-core machine (the issue asks 200 Trainer steps; pass `--hf-steps 200`). "

LOOPS = ("plain", "optimizer_in_hooks", "python_random", "numpy_mask", "counter", "data_write", "remove_mid_step", "layerdrop", "siamese")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per loop (default 20)")
    parser.add_argument("--hf-steps", type=int, default=50, help="steps of the Trainer-like loop (default 50)")
    parser.add_argument("--out", type=Path, default=RESULTS / "training_loops.md")
    parser.add_argument(
        "--only", default="", help="comma-separated loops to rerun; their rows replace those of --out, the others stay"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    if args.only:
        rerun_rows(args, load)
        return
    rows = [loop_row(mode, args.steps) for mode in LOOPS]
    rows.append(threads_row())
    rows.append(hf_loop(args.hf_steps))
    hf_plain, hf_off = HF_TIMES
    load_after = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    lines = [
        "# Training loops, plain against offloaded",
        "",
        f"`python benchmarks/training_loops.py --steps {args.steps} --hf-steps {args.hf_steps}` on {platform.machine()} CPU "
        f"(torch {torch.__version__}, 1 intra-op thread), memory {MEMORY} of each shape's keep-all peak; load average "
        f"{' '.join(load)} before, {' '.join(load_after)} after (a machine shared with other jobs: time ratios are noisy).",
        "",
        "Each loop trains a model plain (an untouched deep copy) and offloaded, seeded alike; *numbers* is `torch.equal` "
        "of every loss and every parameter at the end; *profiled / rescaled / borrowed* counts the plans "
        "profiled after the first (`handle.replans`), those solved on a new shape's measured sizes with a close profiled "
        "shape's times scaled (`handle.rescaled`) and those that run a larger shape's schedule (`handle.reuses`); the time ratio is over the "
        "whole run, `offload()` included (its seconds apart, and the ratio of the steps alone: replans and borrowed "
        "plans are inside the steps). The first loop's `offload()` also measures the link (once per process). The block model: 8 pre-norm MLP blocks of width 128, batch (8, 64, 128).",
        "",
        "| loop | steps | numbers | profiled / rescaled / borrowed | moved per step | plain ms/step | offload() s | steps offloaded / plain | whole run offloaded / plain |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [
        "",
        f"In the Trainer-like loop's offloaded steps ({hf_off:.1f} s against {hf_plain:.1f} s plain), "
        f"{HF_MEASURED[0]} steps of a new length measured their sizes with their own forward (`handle.measured`: "
        "every tensor they saved kept on the device, nothing moved; the plan, borrowed from a longer length or solved "
        f"on scaled times, made when the forward returned), {PLANNER['measure'][0]:.1f} s went to "
        f"{PLANNER['measure'][1]} measuring forwards of their own (a length whose measuring step skipped blocks), "
        f"{PLANNER['rescale'][0]:.1f} s "
        f"to {PLANNER['rescale'][1]} solves on a new longest length's measured sizes and a profiled length's times, and "
        f"{PLANNER['plan'][0]:.1f} s to {PLANNER['plan'][1]} profiles and solves (a new longest length over twice the "
        f"volume of every profiled one); the rest, "
        f"{hf_off - PLANNER['measure'][0] - PLANNER['plan'][0] - PLANNER['rescale'][0]:.1f} s, is the offloaded steps "
        "themselves.",
        "",
        f"Split by step: {HF_SPLIT['known'][2]} steps at a length that had a plan took "
        f"{HF_SPLIT['known'][1]:.1f} s offloaded against {HF_SPLIT['known'][0]:.1f} s plain "
        f"({HF_SPLIT['known'][1] / max(HF_SPLIT['known'][0], 1e-9):.2f}x: the executor's own work per step), "
        f"{HF_SPLIT['new'][2]} steps at a new length {HF_SPLIT['new'][1]:.1f} s against {HF_SPLIT['new'][0]:.1f} s "
        f"({HF_SPLIT['new'][1] / max(HF_SPLIT['new'][0], 1e-9):.2f}x: the measuring step and the plan).",
        "",
        f"{SHORT if args.hf_steps < 200 else ''}"
        + LAYERDROP_NOTE
        + " Two forwards before one backward (siamese): the second runs outside the plan, what it saves resident.",
    ]
    write_report(lines, args.out)


#: What the results say of the LayerDrop loop.
LAYERDROP_NOTE = (
    "LayerDrop (each block skipped with probability 0.2, the first and the last too): a step that skips blocks "
    "collapses their stages, moves nothing for them and never calls them (not even to recompute), so it moves at most "
    "the plan's bytes."
)


def rerun_rows(args: argparse.Namespace, load: list[str]) -> None:
    """Rerun the loops named by ``--only`` and put their rows in place of the old ones in
    ``--out``, saying which rows were rerun, with what command and load."""
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOOPS]
    if unknown:
        raise SystemExit(f"--only: unknown loop(s) {unknown}; known: {', '.join(LOOPS)}")
    lines = args.out.read_text().splitlines()
    while lines and (lines[-1].startswith("Row(s) ") or not lines[-1].strip()):
        lines.pop()  # the note of an earlier rerun: replaced by this one's
    for name in names:
        row = "| " + " | ".join(loop_row(name, args.steps)) + " |"
        at = [k for k, line in enumerate(lines) if line.startswith(f"| {name} ")]
        if at:
            lines[at[0]] = row
        else:
            raise SystemExit(f"--only: no row of {name} in {args.out} to replace")
    load_after = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    text = "\n".join(lines)
    old_note = (
        "LayerDrop is not carried out (the executor runs every block once per step): `offload()` refuses when its "
        "profiling forward skips a block, and a step that skips one is refused."
    )
    text = text.replace(old_note, LAYERDROP_NOTE)
    text += (
        f"\n\nRow(s) {', '.join(names)} rerun alone with `python benchmarks/training_loops.py --only {args.only} "
        f"--steps {args.steps}` (load average {' '.join(load)} before, {' '.join(load_after)} after); the other rows are "
        "from the run above, not rerun."
    )
    write_report(text.splitlines(), args.out)


if __name__ == "__main__":
    main()
