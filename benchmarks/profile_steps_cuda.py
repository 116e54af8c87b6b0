"""Does the one-step profile of offload() hold on a GPU? (NOTE [ how many profiling steps ])

    python benchmarks/profile_steps_cuda.py [--device cuda] [--out FILE]

For each model, built fresh on the device (nothing has run on it yet, as when offload() is
called before training), in this order:

1. **auto, cold**: ``profile_full(repeats=None, warmup=None, nosave=False)``, what offload()
   runs: the model's forwards and backwards counted, the wall time;
2. **fixed**: ``repeats=3, warmup=1`` (the old default: a warm-up step, the median of three);
3. **auto, warm**: the adaptive profile again;
4. a plain training step, the median of 5 after 3 warm-up steps.

It reports each profile's compute time (sum of fwd and bwd) and the largest per-stage
difference of the cold adaptive profile from the fixed one (a one-time cost in the first
backward would show there), whether act / saved / fwd_tmp / bwd_tmp (the CUDA allocator's
transients) are equal in all three, and the profiles' wall time over a plain step (no link, no
solve: the profiling alone). Writes ``benchmarks/results/profile_steps_cuda.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
from _common import write_report  # noqa: E402
from offload_time import Calls, plain_step  # noqa: E402
from torch_models import ResNet, _transformers, gpt2  # noqa: E402


def build(name: str, device: torch.device) -> tuple[nn.Module, object, str]:
    torch.manual_seed(0)
    if name == "gpt2-256x6":
        ids = torch.randint(0, 8192, (8, 512), device=device)
        return gpt2(6, 256, 4, 8192, 512).to(device), {"input_ids": ids, "labels": ids}, "hf"
    if name == "mistral-6m":
        tf = _transformers()
        config = tf.MistralConfig(
            num_hidden_layers=6, hidden_size=256, intermediate_size=688, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=4000, max_position_embeddings=512, use_cache=False,
        )
        ids = torch.randint(0, 4000, (8, 512), device=device)
        return tf.MistralForCausalLM(config).to(device), {"input_ids": ids, "labels": ids}, "hf"
    if name == "resnet50-layout":
        x, y = torch.randn(32, 3, 128, 128, device=device), torch.randint(0, 10, (32,), device=device)
        return ResNet([3, 4, 6, 3], width=32, classes=10).to(device), (x, y), "xent"
    raise ValueError(f"name: {name!r}")


def profiled(model: nn.Module, sample: object, device: torch.device, **kw) -> tuple[object, float, str]:
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    t = time.perf_counter()
    with warnings.catch_warnings(), Calls(model) as calls:
        warnings.simplefilter("ignore")
        prof = ct.profile_full(model, sample, measure_platform=False, nosave=False, **kw)
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return prof, time.perf_counter() - t, f"{calls.grad}/{calls.nograd}/{calls.backward}"


def run(name: str, device: torch.device) -> dict:
    model, sample, kind = build(name, device)
    call = sample if kind == "hf" else sample[0]
    cold, t_cold, c_cold = profiled(model, call, device, repeats=None, warmup=None)
    fixed, t_fixed, c_fixed = profiled(model, call, device, repeats=3, warmup=1)
    warm, t_warm, c_warm = profiled(model, call, device, repeats=None, warmup=None)
    for _ in range(3):
        plain_step(model, sample, kind)
    steps = []
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        plain_step(model, sample, kind)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        steps.append(time.perf_counter() - t)
    step = statistics.median(steps)

    def worst(a, b) -> float:
        return max(abs(x - y) / max(y, 1e-9) for x, y in zip(a, b, strict=True))

    same = all(
        getattr(p.chain, f).tolist() == getattr(fixed.chain, f).tolist()
        for p in (cold, warm) for f in ("act", "saved", "fwd_tmp", "bwd_tmp")
    ) and cold.sizes == fixed.sizes == warm.sizes
    return {
        "model": name, "step": step, "stages": fixed.chain.length,
        "compute": (cold.chain.compute_time, fixed.chain.compute_time, warm.chain.compute_time),
        "fwd_diff": worst(cold.chain.fwd, fixed.chain.fwd), "bwd_diff": worst(cold.chain.bwd, fixed.chain.bwd),
        "same": same, "walls": (t_cold / step, t_fixed / step, t_warm / step), "calls": (c_cold, c_fixed, c_warm),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", nargs="*", default=["gpt2-256x6", "mistral-6m", "resnet50-layout"])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "profile_steps_cuda.md")
    a = ap.parse_args()
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows = [run(m, device) for m in a.models]
    lines = [
        f"## The adaptive profile on {name} (torch {torch.__version__})",
        "",
        "Per model, built fresh on the device: the adaptive profile cold (what offload() runs first), the fixed one",
        "(repeats=3, warmup=1), the adaptive one again warm; then a plain step (median of 5 after 3). Compute: sum of",
        "fwd and bwd of each profile. Worst stage: the largest relative difference of the cold adaptive profile's",
        "fwd[i] / bwd[i] from the fixed one's. Sizes equal: act, saved, fwd_tmp, bwd_tmp and Sizes in all three.",
        "Wall: profile_full (no link, no solve) over a plain step. Calls: forwards with autograd / without / backwards.",
        "",
        "| model | stages | plain step | compute: cold / fixed / warm | worst stage fwd | worst stage bwd | sizes equal | wall in steps: cold / fixed / warm | calls: cold / fixed / warm |",
        "|---|---:|---:|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        comp = " / ".join(f"{c * 1e3:.2f}" for c in r["compute"])
        walls = " / ".join(f"{w:.2f}" for w in r["walls"])
        lines.append(
            f"| {r['model']} | {r['stages']} | {r['step'] * 1e3:.2f} ms | {comp} ms | {100 * r['fwd_diff']:.1f} % | "
            f"{100 * r['bwd_diff']:.1f} % | {'yes' if r['same'] else 'NO'} | {walls} | {' / '.join(r['calls'])} |"
        )
    write_report(lines, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
