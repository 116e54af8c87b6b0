"""Does the executor do on a GPU what the simulator says? Measured against predicted, per schedule.

For a ResNet-like and a GPT-like chain it profiles the chain on the device, solves with the
default method at three memory limits (the keep-all peak, the peak of offloading every unit
that may be offloaded, and halfway between), trains 20 steps under each schedule, and prints one Markdown table:
measured step time against the simulated makespan, measured peak (``max_memory_allocated``)
against the predicted one, and the largest gradient difference from plain training. Plain
training and ``torch.autograd.graph.save_on_cpu`` are measured alongside for comparison.

    python benchmarks/gpu_check.py                      # CUDA (the default device when present)
    python benchmarks/gpu_check.py --device cpu --quick # a dry run: small models, few steps

Targets (CUDA): step time <= 1.05 x the simulated makespan; peak within 2 % of the prediction.
On CPU there is no allocator peak and no copy engine, so the targets are not judged there.

What a step is: forward of the chain, ``y.sum()`` as the loss, backward: the F_1..F_L, B_L..B_1
of the chain model, without an optimizer step. Gradients persist between steps (zeroed, not
freed), so the measured peak is activation memory, as the model counts it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

# Deterministic kernels, so that "gradients equal plain training" is a fair check on a GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402

STEP_TARGET = 1.05
PEAK_TARGET = 0.02


# -- models ----------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a residual."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet_like(width: int, blocks_per_stage: int, classes: int) -> nn.Sequential:
    """A ResNet-18-shaped chain: stem, four stages of basic blocks, pooled linear head."""
    stages: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1))]
    cin = width
    for level in range(4):
        cout = width * 2**level
        for b in range(blocks_per_stage):
            stages.append(BasicBlock(cin, cout, 2 if (b == 0 and level > 0) else 1))
            cin = cout
    stages.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)))
    return nn.Sequential(*stages)


class GPTBlock(nn.Module):
    """A pre-norm causal transformer block."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    """Token and position embeddings."""

    def __init__(self, vocab: int, seq: int, d: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos


def gpt_like(vocab: int, seq: int, d: int, heads: int, layers: int) -> nn.Sequential:
    """Embedding, ``layers`` blocks, final norm and vocabulary head."""
    return nn.Sequential(Embed(vocab, seq, d), *[GPTBlock(d, heads) for _ in range(layers)], nn.Sequential(nn.LayerNorm(d), nn.Linear(d, vocab)))


def workloads(quick: bool, device: torch.device):
    """(name, model, sample) pairs; small for --quick."""
    torch.manual_seed(0)
    if quick:
        res = resnet_like(8, 1, 10), torch.randn(2, 3, 32, 32)
        gpt = gpt_like(64, 16, 32, 4, 2), torch.randint(0, 64, (2, 16))
    else:
        res = resnet_like(64, 2, 1000), torch.randn(64, 3, 224, 224)
        gpt = gpt_like(8192, 1024, 1024, 16, 12), torch.randint(0, 8192, (8, 1024))
    return [("resnet-like", res[0].to(device), res[1].to(device)), ("gpt-like", gpt[0].to(device), gpt[1].to(device))]


# -- measuring ----------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(step, model: nn.Module, device: torch.device, steps: int, warmup: int) -> tuple[float, int | None]:
    """Median step seconds and the activation peak (CUDA) of ``step()`` over ``steps`` runs."""
    times, peaks = [], []
    for i in range(warmup + steps):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
            if device.type == "cuda":
                peaks.append(torch.cuda.max_memory_allocated(device) - base)
    return statistics.median(times), (max(peaks) if peaks else None)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def check(name: str, model: nn.Module, sample: torch.Tensor, device: torch.device, steps: int, warmup: int, repeats: int) -> list[dict]:
    """All rows for one workload."""
    rows = []
    prof = ct.profile_full(model, sample, repeats=repeats, name=name)
    chain, platform = prof.chain, prof.platform
    full = co.keep_all_peak(chain)
    # The low end: the peak of offloading every unit that may be offloaded (vDNN timing), a
    # memory at which a pure-offloading schedule is known to exist.
    units = [u for u in range(1, chain.length) if u not in prof.sizes.aliased]
    eager = plan_transfers(chain, platform, units) if units else co.Schedule.keep_all(chain.length)
    low = co.simulate(chain, platform.with_memory(2**62), eager).peak_memory
    a0 = int(chain.act[0])

    def plain_step() -> None:
        model(sample).sum().backward()

    # Activation peak = allocator peak above the step's start + the input a_0 (resident before).
    t_plain, peak_plain = run_steps(plain_step, model, device, steps, warmup)
    plain_grads = grads_of(model)
    keep_all = co.simulate(chain, platform.with_memory(full), co.Schedule.keep_all(chain.length))
    rows.append(_row(name, "plain training", None, keep_all.makespan, t_plain, full, None if peak_plain is None else peak_plain + a0, 0.0, 0))

    def soc_step() -> None:
        with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
            y = model(sample)
        y.sum().backward()

    t_soc, peak_soc = run_steps(soc_step, model, device, steps, warmup)
    rows.append(_row(name, "save_on_cpu", None, None, t_soc, None, None if peak_soc is None else peak_soc + a0, max_diff(grads_of(model), plain_grads), None))

    for frac in (1.0, 0.5, 0.0):
        memory = int(low + frac * (full - low))
        plat = platform.with_memory(memory)
        try:
            result = ct.choose_schedule(chain, plat, keep=prof.sizes.aliased)
        except ValueError as exc:
            rows.append({"workload": name, "run": f"limit {format_bytes(memory)}", "note": str(exc)})
            continue
        off = ct.Offloader(model, chain, result.schedule, platform=plat, result=result, aliased=prof.sizes.aliased)

        def off_step() -> None:
            off(sample).sum().backward()

        t_off, _ = run_steps(off_step, off, device, steps, warmup)
        measured_peak = off.measured_peak
        rows.append(
            _row(
                name,
                f"{result.method} @ {format_bytes(memory)}",
                result.schedule.offloaded_bytes(chain),
                result.makespan,
                t_off,
                result.peak_memory,
                measured_peak,
                max_diff(grads_of(off), plain_grads),
                off.offloaded_bytes,
            )
        )
    return rows


def _row(workload, run, offloaded, simulated, measured, predicted_peak, measured_peak, grad_diff, moved) -> dict:
    return {
        "workload": workload,
        "run": run,
        "offloaded": offloaded,
        "moved": moved,
        "simulated": simulated,
        "measured": measured,
        "predicted_peak": predicted_peak,
        "measured_peak": measured_peak,
        "grad_diff": grad_diff,
    }


def _fmt_t(t) -> str:
    return "-" if t is None else f"{t * 1e3:.2f} ms"


def _fmt_b(b) -> str:
    return "-" if b is None else format_bytes(b)


def table(rows: list[dict], cuda: bool) -> str:
    """The Markdown table, with a verdict on the targets for offloading rows on CUDA."""
    head = (
        "| workload | run | offloaded (plan / moved) | simulated makespan | measured step | step / simulated "
        "| predicted peak | measured peak | peak error | max abs grad diff vs plain | targets |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['workload']} | {r['run']} | {r['note']} |  |  |  |  |  |  |  |  |")
            continue
        ratio = r["measured"] / r["simulated"] if r["simulated"] else None
        err = None
        if r["predicted_peak"] and r["measured_peak"] is not None:
            err = r["measured_peak"] / r["predicted_peak"] - 1
        verdict = ""
        if r["offloaded"] is not None:
            if not cuda:
                verdict = "not judged on CPU"
            else:
                ok_t = ratio is not None and ratio <= STEP_TARGET
                ok_m = err is not None and abs(err) <= PEAK_TARGET
                verdict = f"step {'ok' if ok_t else 'MISSED'}, peak {'ok' if ok_m else 'MISSED'}"
        off = "-" if r["offloaded"] is None else f"{_fmt_b(r['offloaded'])} / {_fmt_b(r['moved'])}"
        ratio_s = "-" if ratio is None else f"{ratio:.3f}x"
        err_s = "-" if err is None else f"{err * 100:+.2f} %"
        diff_s = "-" if r["grad_diff"] is None else f"{r['grad_diff']:.3g}"
        lines.append(
            f"| {r['workload']} | {r['run']} | {off} | {_fmt_t(r['simulated'])} | {_fmt_t(r['measured'])} | "
            f"{ratio_s} | {_fmt_b(r['predicted_peak'])} | {_fmt_b(r['measured_peak'])} | {err_s} | {diff_s} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small models, few steps (a dry run)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 20; 3 with --quick)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is missed (CUDA)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    steps = args.steps or (3 if args.quick else 20)
    warmup = 1 if args.quick else 3
    repeats = 3 if args.quick else 5
    if device.type == "cpu" and args.quick:
        torch.set_num_threads(1)  # tiny models: threads only contend
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    # An op without a deterministic kernel warns at every call; the grad-diff column says it.
    warnings.filterwarnings("ignore", message=".*deterministic.*")
    rows: list[dict] = []
    for name, model, sample in workloads(args.quick, device):
        rows.extend(check(name, model, sample, device, steps, warmup, repeats))
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(f"## gpu_check on {name} ({steps} steps per run, median step time)\n")
    print(table(rows, cuda))
    print(
        f"\nTargets: step time <= {STEP_TARGET:.2f}x the simulated makespan; measured peak within "
        f"{PEAK_TARGET * 100:.0f} % of the predicted peak" + ("" if cuda else " (not judged on CPU)") + "."
    )
    if args.strict and cuda:
        missed = [r for r in rows if r.get("offloaded") is not None and r["simulated"] and (
            r["measured"] / r["simulated"] > STEP_TARGET
            or r["measured_peak"] is None
            or abs(r["measured_peak"] / r["predicted_peak"] - 1) > PEAK_TARGET
        )]
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
