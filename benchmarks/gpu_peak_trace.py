"""Where does the measured peak leave the simulated one? The allocator's peak between every two
boundary events of one offloaded step, against the simulator's peak over the same interval.

    python benchmarks/gpu_peak_trace.py                  # CUDA: GPT-2 small at gpu_check's lowest limit
    python benchmarks/gpu_peak_trace.py --device cpu --quick   # the dry run (no allocator: no figures)

Prints one row per interval where the measured peak is above the simulated one by more than 1 %
(and the five largest intervals), with the op names and what the executor did at its start.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from gpu_check import limits  # noqa: E402
from torch_models import gpt2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--which", type=int, default=2, help="0: keep-all limit, 1: halfway, 2: the lowest")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    layers, d, heads, vocab, seq, batch = (6, 32, 4, 64, 32, 2) if args.quick else (12, 768, 12, 50257, 1024, 8)
    model = gpt2(layers, d, heads, vocab, seq).to(dev)
    ids = torch.randint(0, vocab, (batch, seq), device=dev)
    sample = {"input_ids": ids, "labels": ids}
    prof = ct.profile_full(model, sample, repeats=1 if args.quick else 3)
    memory = limits(prof)[args.which]
    handle = ct.offload(model, sample, memory=memory, platform=prof.platform, repeats=1 if args.quick else 3)
    run = handle._run
    tl = run.timeline
    sched = run.schedule
    cuda = dev.type == "cuda"
    rows: list[tuple] = []
    real_fire = type(run)._fire
    state = {"base": 0, "last": None}

    def times(event: int) -> float:
        k, end = divmod(event, 2)
        return float(tl.op_end[k] if end else tl.op_start[k])

    def fire(self, step, event):
        if cuda:
            torch.cuda.synchronize(dev)
            peak = torch.cuda.max_memory_allocated(dev) - state["base"]
            now = torch.cuda.memory_allocated(dev) - state["base"]
            rows.append((state["last"], event, peak, now))
            torch.cuda.reset_peak_memory_stats(dev)
        state["last"] = event
        return real_fire(self, step, event)

    for i in range(3):
        traced = i == 2
        if traced:
            type(run)._fire = fire
            if cuda:
                torch.cuda.synchronize(dev)
                state["base"] = torch.cuda.memory_allocated(dev)
                torch.cuda.reset_peak_memory_stats(dev)
        torch.manual_seed(i)
        loss = model(**sample).loss
        loss.backward()
        if traced and cuda:
            torch.cuda.synchronize(dev)
            rows.append((state["last"], None, torch.cuda.max_memory_allocated(dev) - state["base"], None))
        type(run)._fire = real_fire
        for p in model.parameters():
            p.grad = None if traced else p.grad
    print(f"limit {format_bytes(memory)}; predicted peak {format_bytes(tl.peak_memory)}; measured {format_bytes(handle.measured_peak or 0)}")
    print(f"offloaded units: {sorted(run.offloaded)}; a_0 {format_bytes(int(prof.chain.act[0]))}")
    mt, mb = np.asarray(tl.memory_time), np.asarray(tl.memory_bytes)

    def sim_peak(t0: float, t1: float) -> int:
        # The simulated memory is a step function: its value at t0 and every step inside [t0, t1].
        i0 = max(0, int(np.searchsorted(mt, t0, side="right")) - 1)
        i1 = int(np.searchsorted(mt, t1, side="right"))
        return int(mb[i0:max(i1, i0 + 1)].max())

    a0 = int(prof.chain.act[0])
    out = []
    for a, b, peak, _now in rows:
        if a is None:
            continue
        t0 = times(a)
        t1 = times(b) if b is not None else float(tl.makespan)
        sp = sim_peak(t0, t1)
        meas = peak + a0  # the step's input ids are allocated before it; the chain counts a_0
        name = lambda e: "end" if e is None else f"{'end' if e % 2 else 'start'} of {sched.op_name(e // 2)}"  # noqa: E731
        trig = [f"{t.kind[0].upper()}{t.unit}" for t in run._triggers[a]] + [f"R{u}" for u in run._release_at[a]]
        out.append((meas - sp, name(a), name(b), meas, sp, " ".join(trig)))
    print("| from | to | measured peak | simulated peak | over | fired at 'from' |")
    print("|---|---|---:|---:|---:|---|")
    over = [r for r in out if r[0] > 0.01 * max(r[4], 1)]
    for r in (over or sorted(out, reverse=True)[:5]):
        print(f"| {r[1]} | {r[2]} | {format_bytes(r[3])} | {format_bytes(r[4])} | {format_bytes(max(r[0], 0))} | {r[5]} |")
    print("largest five:")
    for r in sorted(out, key=lambda r: -r[3])[:5]:
        print(f"| {r[1]} | {r[2]} | {format_bytes(r[3])} | {format_bytes(r[4])} | {r[0] / 2**20:+.1f} MiB | {r[5]} |")


if __name__ == "__main__":
    main()
