"""Does the executor do on a GPU what the simulator says? Measured against predicted, per plan.

Four workloads, each trained under three memory limits (the keep-all peak, a limit near the
least at which offloading fits, and halfway between), with plain training and
``torch.autograd.graph.save_on_cpu`` measured alongside:

* ``resnet-like`` and ``gpt-like``: chains written as ``nn.Sequential`` stages, profiled once;
  each limit is solved (``chainoffload.solve``) and run with ``ct.Offloader`` (a plan of your own).
* ``resnet50`` (torchvision's ResNet-50 layout, batch 64 at 224 px) and ``gpt2`` (Hugging Face
  GPT-2 small: 12 layers, d 768, batch 8 x 1024 tokens): real models offloaded in place with the
  one-liner ``ct.offload(model, batch, memory=...)``, trained as their documentation shows.
  These two are also run at the memory that checkpointing every block holds (the simulated
  peak, on the model's profile, of the core's ``checkpoint-all`` schedule with the stage of the
  code before the first block, when the chain has one, run once and kept whole -- what
  checkpointing every block does -- plus what stays resident outside the chain; every
  simulated time there on that one profile), side by side: checkpointing every block (GPT-2's
  ``gradient_checkpointing_enable()``, non-reentrant; ``torch.utils.checkpoint`` around every
  block of the ResNet), and ``ct.offload`` with ``method=`` ``"rotor"`` (recomputation),
  ``"joint"`` (recomputation and offloading) and ``"offload-all"`` (torchtune's policy).

One Markdown table: measured step time against the simulated makespan, measured peak
(``max_memory_allocated`` during the step, as the executor reports it) against the predicted
one, bytes moved against the plan's, and the largest gradient difference from plain training.

    python benchmarks/gpu_check.py                        # CUDA, every workload: about 3-5 minutes on one H100/H200
    python benchmarks/gpu_check.py --only gpt2,resnet50   # the real models only
    python benchmarks/gpu_check.py --device cpu --quick   # the dry run the test suite runs (tiny models)
    python benchmarks/gpu_check.py --fuzz 500             # then the differential fuzz profile on the GPU

The CUDA command needs ``pip install -e '.[torch,dev]'`` (transformers for GPT-2) and no download.
Targets (CUDA): step time <= 1.05 x the simulated makespan; peak within 2 % of the prediction
(``--strict`` exits 1 when one is missed). On CPU there is no allocator peak and no copy
engine, so the targets are not judged there; every other code path runs.

What a step is: the forward of the model, its loss (``y.sum()`` for the chains, the model's own
loss for GPT-2, cross-entropy for ResNet-50) and the backward, without an optimizer step.
Gradients persist between steps (zeroed, not freed), so the measured peak is activation
memory, as the chain model counts it. Dropout masks come from a seed per step, so every run
computes the same gradients.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Deterministic kernels, so that "gradients equal plain training" is a fair check on a GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402
from chainoffload.solvers.remat_baselines import checkpoint_all_schedule  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from torch_models import ResNet, gpt2, gpt_like, resnet_like  # noqa: E402

STEP_TARGET = 1.05
#: The label of the rows at the memory checkpointing every block holds.
AT_CK = "at checkpointing's memory"
#: The methods run there with ct.offload(method=...), beside checkpointing every block.
AT_CK_METHODS = ("rotor", "joint", "offload-all")
PEAK_TARGET = 0.02
WORKLOADS = ("resnet-like", "gpt-like", "resnet50", "gpt2")


class Workload:
    """A model, a batch, and how one training step runs on it."""

    def __init__(self, name: str, model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], torch.Tensor], in_place: bool):
        self.name = name
        self.model = model
        self.batch = batch
        self.loss = loss
        self.in_place = in_place  # offloaded with ct.offload (else: a chain and ct.Offloader)

    def step(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.loss(self.model, self.batch).backward()


def _sum_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).sum()


def _hf_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def _ce_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def workloads(names: list[str], quick: bool, device: torch.device) -> list[Workload]:
    """The workloads named, on ``device``; tiny for --quick."""
    out = []
    for name in names:
        torch.manual_seed(0)
        if name == "resnet-like":
            model, x = (resnet_like(8, 1, 10), torch.randn(2, 3, 32, 32)) if quick else (resnet_like(64, 2, 1000), torch.randn(64, 3, 224, 224))
            out.append(Workload(name, model.to(device), x.to(device), _sum_loss, False))
        elif name == "gpt-like":
            args = (64, 16, 32, 4, 2) if quick else (8192, 1024, 1024, 16, 12)
            model = gpt_like(*args)
            x = torch.randint(0, args[0], (2, 16) if quick else (8, 1024))
            out.append(Workload(name, model.to(device), x.to(device), _sum_loss, False))
        elif name == "resnet50":
            layers, width, classes, batch, px = ([3, 4, 6, 3], 4, 10, 2, 32) if quick else ([3, 4, 6, 3], 64, 1000, 64, 224)
            model = ResNet(layers, width, classes)
            data = (torch.randn(batch, 3, px, px, device=device), torch.randint(0, classes, (batch,), device=device))
            out.append(Workload(name, model.to(device), data, _ce_loss, True))
        elif name == "gpt2":
            layers, d, heads, vocab, seq, batch = (6, 32, 4, 64, 32, 2) if quick else (12, 768, 12, 50257, 1024, 8)
            model = gpt2(layers, d, heads, vocab, seq)
            ids = torch.randint(0, vocab, (batch, seq), device=device)
            out.append(Workload(name, model.to(device), {"input_ids": ids, "labels": ids}, _hf_loss, True))
        else:
            raise SystemExit(f"gpu_check: unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return out


# -- measuring ----------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(w: Workload, device: torch.device, steps: int, warmup: int, a0_before: int) -> tuple[float, int | None]:
    """Median step seconds, and the activation peak (CUDA) of plain steps over ``steps`` runs.

    The peak is the allocator's peak above what was allocated when the step began, plus the
    input a_0 when the model's input is a_0 (allocated before the step, counted by the chain).
    """
    times, peaks = [], []
    for i in range(warmup + steps):
        for p in w.model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t0 = time.perf_counter()
        w.step(i)
        _sync(device)
        elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
            if device.type == "cuda":
                peaks.append(torch.cuda.max_memory_allocated(device) - base + a0_before)
    return statistics.median(times), (max(peaks) if peaks else None)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True))


def limits(prof: ct.Profile) -> list[int]:
    """The keep-all peak, halfway, and (2 % above) the peak of offloading every unit that may
    move as soon as it is made: a limit at which a pure-offloading schedule is known to exist."""
    chain, platform = prof.chain, prof.platform
    full = co.keep_all_peak(chain)
    units = [u for u in range(1, chain.length) if u not in prof.sizes.resident]
    eager = plan_transfers(chain, platform.with_memory(2**62), units) if units else co.Schedule.keep_all(chain.length)
    low = min(full, int(1.02 * co.simulate(chain, platform.with_memory(2**62), eager).peak_memory))
    return [int(low + frac * (full - low)) for frac in (1.0, 0.5, 0.0)]


def check(w: Workload, device: torch.device, steps: int, warmup: int, repeats: int) -> list[dict]:
    """All rows for one workload."""
    rows = []
    sample = w.batch[0] if isinstance(w.batch, tuple) else w.batch  # what the model is called with
    prof = ct.profile_full(w.model, sample, repeats=repeats, name=w.name)
    chain = prof.chain
    full = co.keep_all_peak(chain)
    a0_before = int(chain.act[0]) if not w.in_place else 0  # a chain's input is its a_0

    t_plain, peak_plain = run_steps(w, device, steps, warmup, a0_before)
    plain_grads = grads_of(w.model)
    keep_all = co.simulate(chain, prof.platform.with_memory(full), co.Schedule.keep_all(chain.length))
    rows.append(_row(w.name, "plain training", None, keep_all.makespan, t_plain, full, peak_plain, 0.0, 0))
    # Plain training against itself: the floor of the grad-diff column. A kernel without a
    # deterministic implementation (warn_only below) differs from run to run by itself.
    for p in w.model.parameters():
        if p.grad is not None:
            p.grad.zero_()
    w.step(warmup + steps - 1)  # the seed of the step plain_grads come from
    rows.append(_row(w.name, "plain training, again", None, None, None, None, None, max_diff(grads_of(w.model), plain_grads), None))

    soc = Workload(w.name, w.model, w.batch, w.loss, w.in_place)

    def soc_step(seed: int) -> None:
        with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
            torch.manual_seed(seed)
            loss = w.loss(w.model, w.batch)
        loss.backward()

    soc.step = soc_step  # type: ignore[method-assign]
    t_soc, peak_soc = run_steps(soc, device, steps, warmup, a0_before)
    rows.append(_row(w.name, "save_on_cpu", None, None, t_soc, None, peak_soc, max_diff(grads_of(w.model), plain_grads), None))

    if w.in_place:
        rows += at_checkpointing_memory(w, device, steps, warmup, repeats, prof, plain_grads)
    for memory in limits(prof):
        try:
            if w.in_place:
                # The one-liner, as a user writes it (it profiles again, with the measured link).
                handle = ct.offload(w.model, sample, memory=memory, platform=prof.platform, repeats=repeats)
                method = handle.result.method
            else:
                plat = prof.platform.with_memory(memory)
                result = ct.plans.solve_for(chain, plat, None, (), prof.sizes, {})
                handle = ct.Offloader(w.model, chain, result.schedule, platform=plat, blocks=prof.blocks)
                method = result.method
        except ValueError as exc:
            rows.append({"workload": w.name, "run": f"limit {format_bytes(memory)}", "note": str(exc)})
            continue
        try:
            t_off, _ = run_steps(w, device, steps, warmup, 0)
            plan = handle.plan
            rows.append(
                _row(
                    w.name,
                    f"{method} @ {format_bytes(memory)}",
                    plan.offloaded_bytes,
                    plan.makespan,
                    t_off,
                    plan.predicted_peak,
                    handle.measured_peak,
                    max_diff(grads_of(w.model), plain_grads),
                    handle.offloaded_bytes,
                )
            )
        finally:
            handle.remove()
    return rows


def checkpoint_every_block(model: nn.Module, blocks: list[nn.Module]) -> object:
    """Checkpoint every block of ``model``: Hugging Face's ``gradient_checkpointing_enable()``
    (non-reentrant) where the model has it, else ``torch.utils.checkpoint`` (non-reentrant)
    around each of ``blocks``. Returns a function that undoes it."""
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.gradient_checkpointing_disable
    from torch.utils.checkpoint import checkpoint

    def wrap(block: nn.Module) -> None:
        forward = block.forward
        block.forward = lambda *a, **k: checkpoint(forward, *a, use_reentrant=False, **k)

    for block in blocks:
        wrap(block)

    def undo() -> None:
        for block in blocks:
            del block.forward  # the instance attribute: the class's forward again

    return undo


def at_checkpointing_memory(
    w: Workload, device: torch.device, steps: int, warmup: int, repeats: int, prof: ct.Profile, plain_grads: list[torch.Tensor],
) -> list[dict]:
    """Rows at the memory that checkpointing every block holds: checkpointing itself, then
    ``ct.offload`` with each method of :data:`AT_CK_METHODS` there."""
    chain = prof.chain
    resident = prof.sizes.resident_bytes
    # What checkpointing every block does to this chain: the code before the first block (a
    # stage when the chain makes it one) is not wrapped, so it runs once and is kept whole.
    whole = {1} if prof.blocks.prefix else set()
    ck = co.simulate(chain, prof.platform.with_memory(2**62), checkpoint_all_schedule(chain.length, whole=whole))
    ck_peak = int(ck.peak_memory)
    memory = ck_peak + resident
    modules = list(prof.blocks.modules)
    undo = checkpoint_every_block(w.model, modules)
    try:
        t_ck, peak_ck = run_steps(w, device, steps, warmup, 0)
    finally:
        undo()
    how = "gradient_checkpointing_enable()" if hasattr(w.model, "gradient_checkpointing_enable") else "torch.utils.checkpoint per block"
    rows = [_row(w.name, f"{AT_CK}: {how}", None, ck.makespan, t_ck, memory, peak_ck, max_diff(grads_of(w.model), plain_grads), None)]
    sample = w.batch[0] if isinstance(w.batch, tuple) else w.batch
    for method in AT_CK_METHODS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                handle = ct.offload(w.model, sample, memory=memory, method=method, platform=prof.platform, repeats=repeats)
        except ValueError as exc:
            rows.append({"workload": w.name, "run": f"{AT_CK}: {method} @ {format_bytes(memory)}", "note": str(exc).split("; least memory", 1)[0]})
            continue
        try:
            t_off, _ = run_steps(w, device, steps, warmup, 0)
            plan = handle.plan
            recomputed = sum(r["decision"].startswith("recompute") for r in handle.decisions())
            rows.append(_row(
                w.name, f"{AT_CK}: {method} @ {format_bytes(memory)}, {recomputed} blocks recomputed", plan.offloaded_bytes,
                # On the profile checkpointing's time is simulated on (another profile's times differ).
                co.simulate(chain, prof.platform.with_memory(2**62), plan.schedule).makespan
                if plan.chain.length == chain.length else plan.makespan,
                t_off, plan.predicted_peak, handle.measured_peak, max_diff(grads_of(w.model), plain_grads),
                handle.offloaded_bytes,
            ))
        finally:
            handle.remove()
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
                verdict = f"step {'ok' if _step_ok(r) else 'MISSED'}, peak {'ok' if _peak_ok(r) else 'MISSED'}"
        off = "-" if r["offloaded"] is None else f"{_fmt_b(r['offloaded'])} / {_fmt_b(r['moved'])}"
        ratio_s = "-" if ratio is None else f"{ratio:.3f}x"
        err_s = "-" if err is None else f"{err * 100:+.2f} %"
        diff_s = "-" if r["grad_diff"] is None else f"{r['grad_diff']:.3g}"
        lines.append(
            f"| {r['workload']} | {r['run']} | {off} | {_fmt_t(r['simulated'])} | {_fmt_t(r['measured'])} | "
            f"{ratio_s} | {_fmt_b(r['predicted_peak'])} | {_fmt_b(r['measured_peak'])} | {err_s} | {diff_s} | {verdict} |"
        )
    return "\n".join(lines)


def _step_ok(r: dict) -> bool:
    return bool(r["simulated"]) and r["measured"] / r["simulated"] <= STEP_TARGET


def _peak_ok(r: dict) -> bool:
    return r["measured_peak"] is not None and bool(r["predicted_peak"]) and abs(r["measured_peak"] / r["predicted_peak"] - 1) <= PEAK_TARGET


def _report(rows: list[dict], cuda: bool, name: str, steps: int, seconds: float) -> str:
    torch_line = f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if cuda else "")
    return (
        f"## gpu_check on {name} ({torch_line}; {steps} steps per run, median step time; {seconds:.0f} s in all)\n\n"
        + table(rows, cuda)
        + f"\n\nTargets: step time <= {STEP_TARGET:.2f}x the simulated makespan; measured peak within "
        + f"{PEAK_TARGET * 100:.0f} % of the predicted peak"
        + ("" if cuda else " (not judged on CPU)")
        + "."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps (a dry run)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated workloads (default: {','.join(WORKLOADS)})")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 20; 3 with --quick)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is missed (CUDA)")
    parser.add_argument("--out", default=None, help="also write the report to this Markdown file (rewritten after each workload)")
    parser.add_argument(
        "--fuzz",
        type=int,
        default=0,
        metavar="MODELS",
        help="then run the differential fuzz profile (benchmarks/torch_fuzz.py) on the same device for MODELS random models",
    )
    parser.add_argument("--fuzz-out", default=None, help="the fuzz table (default: benchmarks/results/torch_fuzz_<device>.md)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    steps = args.steps or (3 if args.quick else 20)
    warmup = 1 if args.quick else 3
    repeats = 1 if args.quick else 5
    if device.type == "cpu" and args.quick:
        torch.set_num_threads(1)  # tiny models: threads only contend
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    # An op without a deterministic kernel warns at every call; the grad-diff column says it.
    warnings.filterwarnings("ignore", message=".*deterministic.*")
    rows: list[dict] = []
    t0 = time.perf_counter()
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    for w in workloads(names, args.quick, device):
        rows.extend(check(w, device, steps, warmup, repeats))
        # Written after each workload, so a run stopped at its time limit still leaves what it measured.
        report = _report(rows, cuda, name, steps, time.perf_counter() - t0)
        if args.out:
            Path(args.out).write_text(report + "\n")
        print(f"gpu_check: {w.name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(report)
    if args.fuzz:
        # The adapter's promise on this device: random block models trained plain and offloaded,
        # bitwise (benchmarks/torch_fuzz.py; on CUDA with deterministic kernels and a control).
        import torch_fuzz

        out = args.fuzz_out or str(Path(__file__).resolve().parent / "results" / f"torch_fuzz_{device.type}.md")
        torch_fuzz.main(["--models", str(args.fuzz), "--device", str(device), "--shrink", "3", "--out", out])
    if args.strict and cuda:
        missed = [r for r in rows if r.get("offloaded") is not None and not (_step_ok(r) and _peak_ok(r))]
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
