"""Real models offloaded with one line, on CPU: what the user writes, what moves, and whether
training is unchanged.

For Hugging Face GPT-2, Llama, BERT and ViT (tiny configs, random weights) and a ResNet with
torchvision's ResNet-50 layout (4 channels wide), at 50 % and 80 % of each model's keep-all
peak: one line, ``handle = ct.offload(model, batch, memory=fraction)``, then the training
loop as the model's documentation writes it, 3 AdamW steps beside an untouched deep copy.
Prints one Markdown table (and writes it to ``benchmarks/results/offload_models.md``): the
keep-all peak, the memory given, the predicted peak, the bytes moved per step (measured, and
whether they are the plan's), and whether losses and gradients are ``torch.equal`` to the copy's
at every step.

    python benchmarks/offload_models.py

Sizes are those of these tiny models on CPU (bytes the executor really moves); for times and
peaks on a GPU see ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from torch_models import ResNet, hf_tiny  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = 3
LINE = "handle = ct.offload(model, batch, memory={fraction})"


def hf_step(model: nn.Module, batch: dict, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)  # the same dropout masks for the model and its copy
    loss = model(**batch).loss
    loss.backward()
    return loss


def resnet() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return ResNet([3, 4, 6, 3], width=4, classes=5), (torch.randn(2, 3, 32, 32), torch.tensor([1, 4]))


def resnet_step(model: nn.Module, batch: tuple, seed: int) -> torch.Tensor:
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def run(name: str, fraction: float) -> dict:
    if name == "resnet50-layout":
        model, batch = resnet()
        step, sample = resnet_step, batch[0]
    else:
        model, batch = hf_tiny(name)
        step, sample = hf_step, batch
    ref = copy.deepcopy(model)
    t0 = time.perf_counter()
    handle = ct.offload(model, sample, memory=fraction)
    setup = time.perf_counter() - t0
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    equal, moved_is_plan = True, True
    for s in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        la, lb = step(model, batch, s), step(ref, batch, s)
        equal &= torch.equal(la, lb) and all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
        moved_is_plan &= handle.offloaded_bytes == handle.plan.offloaded_bytes
        for opt in opts:
            opt.step()
    row = {
        "model": name,
        "line": LINE.format(fraction=fraction),
        "blocks": f"{len(handle.blocks)}: {handle.blocks.names[0]} .. {handle.blocks.names[-1]}",
        "keep_all": co.keep_all_peak(handle.chain),
        "memory": handle.platform.memory,
        "predicted": handle.predicted_peak,
        "moved": handle.offloaded_bytes,
        "moved_is_plan": moved_is_plan,
        "equal": equal,
        "setup": setup,
    }
    handle.remove()
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | lines the user writes | blocks found | keep-all peak | memory given | predicted peak | bytes moved per step | gradients equal |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        moved = format_bytes(r["moved"]) + (" (the plan's)" if r["moved_is_plan"] else " (NOT the plan's)")
        equal = f"yes, {STEPS} steps (torch.equal)" if r["equal"] else "NO"
        lines.append(
            f"| {r['model']} | 1: `{r['line']}` | {r['blocks']} | {format_bytes(r['keep_all'])} | {format_bytes(r['memory'])} | "
            f"{format_bytes(r['predicted'])} | {moved} | {equal} |"
        )
    return "\n".join(lines)


def main() -> int:
    torch.set_num_threads(1)
    rows = [run(name, fraction) for name in ("gpt2", "llama", "bert", "vit", "resnet50-layout") for fraction in (0.5, 0.8)]
    text = table(rows)
    print(text)
    print(f"\nThe training loop is the model's own, unchanged; offload() took {min(r['setup'] for r in rows):.1f}-{max(r['setup'] for r in rows):.1f} s per model (profile and solve).")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "offload_models.md").write_text(text + "\n")
    return 0 if all(r["equal"] and r["moved_is_plan"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
