"""Real models offloaded with one line, on CPU: what the user writes, what moves, and whether
training is unchanged.

Every architecture of ``torch_models.FAMILIES`` (Hugging Face decoders with their default
key/value cache and without, encoders, encoder-decoders, CLIP's two towers, Mamba, ALBERT's
shared layer, CNNs in stages; tiny configs, random weights, 8 blocks per stack), a model whose
parent adds the residual (``h = h + block(h)``), a U-Net (8 down blocks whose outputs a list in
its forward keeps for the up path) and a ResNet with torchvision's
ResNet-50 layout: one line, ``handle = ct.offload(model, batch, memory=0.6)``, then the
training loop as the model's documentation writes it, 3 AdamW steps beside an untouched deep
copy. Prints one Markdown table (and writes it to ``benchmarks/results/offload_models.md``):
the blocks found, the keep-all peak, the share of it the chain can move, the least memory a
schedule is known to fit in (largest-first, keeping resident what offload() keeps, the figure
offload() suggests when nothing fits) as a share of the keep-all peak, the bytes moved per step
(measured, and whether they are the plan's), whether losses, gradients and weights are
``torch.equal`` to the copy's at every step, and how long ``offload()`` took.

    python benchmarks/offload_models.py [name ...] [--device cuda]

Sizes are those of these tiny models (bytes the executor really moves). ``--device`` (default
``cpu``) trains them in place on another device with the same checks, and on CUDA also reports
the allocator's peak of the last step beside the plan's predicted peak; the whole table is
written to ``benchmarks/results/offload_models.md`` on CPU and ``offload_models-<device>.md``
elsewhere. For larger models on a GPU see ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from chainoffload_torch.plans import coverage, resident_units, step_peak  # noqa: E402
from offload_time import warm_kernels  # noqa: E402
from torch_models import FAMILIES, ParentResidual, ResNet, UNet, UNetShapes, hf_family  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = 3
FRACTION = 0.6
LINE = "handle = ct.offload(model, batch, memory={fraction})"


def hf_step(model: nn.Module, batch: dict, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)  # the same dropout masks for the model and its copy
    loss = model(**batch).loss
    loss.backward()
    return loss


def tensor_step(model: nn.Module, batch: tuple, seed: int) -> torch.Tensor:
    x, y = batch
    torch.manual_seed(seed)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _to(obj: object, device: torch.device) -> object:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def build(name: str, device: torch.device = torch.device("cpu")) -> tuple[nn.Module, object, object, object]:
    """(model, batch, step, what offload() is given), on ``device``."""
    model, batch, step, sample = _build(name)
    model.to(device)
    batch = _to(batch, device)
    sample = batch[0] if isinstance(batch, tuple) else batch
    return model, batch, step, sample


def _build(name: str) -> tuple[nn.Module, object, object, object]:
    torch.manual_seed(0)
    if name == "resnet50-layout":
        model, batch = ResNet([3, 4, 6, 3], width=4, classes=5), (torch.randn(2, 3, 32, 32), torch.tensor([1, 4]))
        return model, batch, tensor_step, batch[0]
    if name == "parent-residual":
        model = ParentResidual(layers=8)
        batch = (torch.randn(64, 8), torch.randint(0, 3, (64,)))
        return model, batch, tensor_step, batch[0]
    if name.startswith("unet"):
        model = {
            "unet": lambda: UNet(depth=8),
            "unet-indexed-add": lambda: UNetShapes(depth=8, skips="index", merge="add"),
            "unet-skip-argument": lambda: UNetShapes(depth=8, skips="arg"),
        }[name]()
        x = torch.randn(2, 3, 16, 16)
        return model, (x, torch.randint(0, 3, (2, 16, 16))), tensor_step, x
    model, batch = hf_family(name)
    return model, batch, hf_step, batch


def run(name: str, device: torch.device = torch.device("cpu")) -> dict:
    model, batch, step, sample = build(name, device)
    ref = copy.deepcopy(model)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            handle = ct.offload(model, sample, memory=FRACTION)
        except ValueError as err:  # nothing fits at this memory: the row says so, with offload()'s figures
            prof = ct.profile_full(model, sample, repeats=1, warmup=0, measure_platform=False)
            least = re.search(r"least memory known to work: (\d+) B", str(err))
            return {
                "model": name, "blocks": _blocks(prof.blocks),
                "keep_all": step_peak(prof.chain, prof.sizes), "cover": prof.coverage.share, "least": int(least.group(1)) if least else None,
                "memory": None, "moved": None, "moved_is_plan": True, "equal": None, "setup": time.perf_counter() - t0,
                "said": [str(err)], "measured": None, "predicted": None,
            }
    setup = time.perf_counter() - t0
    said = [str(w.message).removeprefix("chainoffload_torch: ") for w in caught if "chainoffload_torch" in str(w.message)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    equal, moved_is_plan, measured = True, True, None
    for s in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        la, lb = step(model, batch, s), step(ref, batch, s)
        grads = all((p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)) for p, q in zip(model.parameters(), ref.parameters()))
        equal &= bool(torch.equal(la, lb)) and grads
        moved_is_plan &= handle.offloaded_bytes == handle.plan.offloaded_bytes
        measured = handle.last_step.measured_peak  # the allocator's (CUDA); None on CPU
        for opt in opts:
            opt.step()
    equal &= all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    plan = handle.plan
    # Whole-step figures: the chain's plus what stays resident outside it (NOTE [ resident outside the chain ]).
    keep_all = plan.keep_all_peak
    least = co.minimum_memory(plan.chain, plan.platform, "largest-first", keep=sorted(resident_units(plan.chain, plan.sizes)))
    least = None if least is None else least + plan.resident_bytes
    cover = coverage(plan.chain, plan.sizes, handle.blocks)
    row = {
        "model": name,
        "blocks": _blocks(handle.blocks),
        "keep_all": keep_all,
        "cover": cover.share,
        "least": least,
        "memory": plan.memory,
        "moved": handle.offloaded_bytes,
        "moved_is_plan": moved_is_plan,
        "equal": equal,
        "setup": setup,
        "said": said,
        "measured": measured,
        "predicted": handle.predicted_peak,
    }
    handle.remove()
    return row


def _blocks(blocks: object) -> str:
    """The blocks found, and whether the code before them is a stage of its own."""
    stem = " (+ the code before them as stage 1)" if blocks.prefix else ""
    return f"{len(blocks)}: {blocks.names[0]} .. {blocks.names[-1]}{stem}"


def table(rows: list[dict], peaks: bool = False) -> str:
    """The Markdown table; ``peaks``: with the allocator's peak of the last step beside the prediction (CUDA)."""
    lines = [
        f"Each model: 1 line, `{LINE.format(fraction=FRACTION)}`, then {STEPS} AdamW steps of its documented training loop beside an untouched copy.",
        "",
        "| model | blocks found | keep-all peak | chain can move | least memory known to fit | bytes moved per step at 60 % | losses, grads, weights | offload() |"
        + (" measured / predicted peak |" if peaks else ""),
        "|---|---|---:|---:|---:|---:|---|---:|" + ("---:|" if peaks else ""),
    ]
    for r in rows:
        if r["equal"] is None:
            moved, equal = "refused: nothing fits", "(not trained)"
        else:
            moved = format_bytes(r["moved"]) + (" (the plan's)" if r["moved_is_plan"] else " (NOT the plan's)")
            equal = f"torch.equal, {STEPS} steps" if r["equal"] else "NOT EQUAL"
        least = "none" if r["least"] is None else f"{r['least']} B, {100 * r['least'] / r['keep_all']:.0f} %"
        lines.append(
            f"| {r['model']} | {r['blocks']} | {format_bytes(r['keep_all'])} | {100 * r['cover']:.0f} % | {least} | {moved} | {equal} | {1000 * r['setup']:.0f} ms |"
            + (f" {_peaks(r)} |" if peaks else "")
        )
    if any(r["model"].endswith("-narrow") for r in rows):
        lines += [
            "",
            "The `-narrow` rows are the CNN configs of the first version of this table: every stage as wide as the stem "
            "(ResNet), or two blocks per stage (ConvNeXt [2, 2, 2, 2], Swin [2, 2, 4]), so the stem or the first stage holds "
            "about half the activations. The chain model makes B_{i+1} wait for the whole of unit i (docs/model.md: P_i ends "
            "before B_{i+1}), so the two largest neighbouring units bound every pure-offloading schedule: the proven floor is "
            "the least memory here (resnet-narrow 62 %, convnext-narrow 54 %, swin-narrow 56 %). The `resnet`, `convnext` and "
            "`swin` rows keep the proportions of the models people train (ResNet-50's stages 4x its stem's width, ConvNeXt-T's "
            "depths [3, 3, 9, 3], Swin-T's [2, 2, 6, 2]).",
        ]
    notes = [f"- {r['model']}: {m}" for r in rows for m in r["said"]]
    if notes:
        lines += ["", "What offload() said:", ""] + notes
    return "\n".join(lines)


def _peaks(r: dict) -> str:
    if r["measured"] is None or r["predicted"] is None:
        return "-"
    return f"{format_bytes(r['measured'])} / {format_bytes(r['predicted'])}" + (" (ABOVE)" if r["measured"] > r["predicted"] else "")


#: Every row of the table: the families, then the hand-written models.
NAMES = list(FAMILIES) + ["parent-residual", "unet", "unet-indexed-add", "unet-skip-argument", "resnet50-layout"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"rows to run (default: all): {', '.join(NAMES)}")
    parser.add_argument("--device", default="cpu", help="where to train, e.g. cuda or cuda:1 (default: cpu)")
    opts = parser.parse_args(argv)
    unknown = [n for n in opts.names if n not in NAMES]
    if unknown:
        parser.error(f"name: {unknown[0]!r} is not one of {', '.join(NAMES)}")
    try:
        device = torch.device(opts.device)
    except RuntimeError:
        parser.error(f"--device: {opts.device!r} is not a torch device")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device: {opts.device!r}, but CUDA is not available here")
    if device.type == "cpu":
        torch.set_num_threads(1)
    load = os.getloadavg()[0]
    cold, warm = warm_kernels()  # the first offload() in a process loads or compiles them
    rows = []
    for name in opts.names or NAMES:
        rows.append(run(name, device))
        r = rows[-1]
        print(f"{name}: {r['blocks']}, least {r['least']} of {r['keep_all']}, equal {r['equal']}, moved is plan {r['moved_is_plan']}, {r['setup']:.2f} s", flush=True)
    text = table(rows, peaks=device.type == "cuda")
    timing = (
        f"offload(): wall time of the one line, the solver's kernels made ready before the table (the first offload()"
        f" of a small model in the process took {cold:.2f} s, a second {warm:.2f} s). torch {torch.__version__},"
        f" load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end."
    )
    said = "\n\nWhat offload() said:"
    text = text.replace(said, f"\n\n{timing}{said}", 1) if said in text else f"{text}\n\n{timing}"
    print(text)
    if not opts.names:
        RESULTS.mkdir(exist_ok=True)
        if device.type == "cpu":
            command, out = "python benchmarks/offload_models.py   # CPU, torch.set_num_threads(1)", "offload_models.md"
        else:
            command, out = f"python benchmarks/offload_models.py --device {opts.device}", f"offload_models-{device.type}.md"
        (RESULTS / out).write_text(f"`{command}`\n\n{text}\n")
    return 0 if all(r["equal"] is not False and r["moved_is_plan"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
