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
from chainoffload_torch.plans import coverage, resident_units, stage_floor, step_peak  # noqa: E402
from offload_time import warm_kernels  # noqa: E402
from torch_models import FAMILIES, ParentResidual, ResNet, UNet, UNetShapes, hf_family  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = 3
FRACTION = 0.6
#: The least memory offload() accepts is searched to within this share of it.
BISECT_TOL = 0.005
#: "Within 2 %": the least memory found against the proven floor for any schedule.
FLOOR_TOL = 0.02
LINE = "handle = ct.offload(model, batch, memory={fraction})"
#: Where build() and run() put the model unless told otherwise.
CPU = torch.device("cpu")


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


def build(name: str, device: torch.device = CPU) -> tuple[nn.Module, object, object, object]:
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


def train(handle: object, model: nn.Module, ref: nn.Module, batch: object, step: object) -> tuple[bool, bool, int | None]:
    """``STEPS`` AdamW steps of ``model`` (offloaded by ``handle``) beside ``ref``: whether losses,
    gradients and weights are ``torch.equal`` at every step, whether the bytes moved were the
    plan's at every step, and the allocator's peak of the last step (CUDA; ``None`` on CPU)."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    equal, moved_is_plan, measured = True, True, None
    for s in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        la, lb = step(model, batch, s), step(ref, batch, s)
        grads = all((p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
        equal &= bool(torch.equal(la, lb)) and grads
        moved_is_plan &= handle.offloaded_bytes == handle.plan.offloaded_bytes
        measured = handle.last_step.measured_peak
        for opt in opts:
            opt.step()
    equal &= all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    return equal, moved_is_plan, measured


def least_accepted(accepts: object, floor: int, top: int, tol: float = BISECT_TOL) -> int | None:
    """The least memory in [``floor``, ``top``] bytes that ``accepts(bytes) -> bool`` takes, to
    within ``tol`` of it (bisection; ``accepts`` is assumed monotone). ``floor`` is tried first,
    then ``floor * (1 + FLOOR_TOL)``, so that a floor reached is found in one or two calls.
    ``None`` when not even ``top`` is accepted."""
    if floor < 1 or top < floor:
        raise ValueError(f"floor, top: {floor}, {top} must satisfy 1 <= floor <= top")
    if accepts(floor):
        return floor
    near = min(top, int(floor * (1 + FLOOR_TOL)))
    lo, hi = floor, None
    if accepts(near):
        hi = near
    elif near < top and accepts(top):
        lo, hi = near, top
    if hi is None:
        return None
    while hi - lo > max(1, tol * lo):
        mid = (lo + hi) // 2
        if accepts(mid):
            hi = mid
        else:
            lo = mid
    return hi


def recompute_columns(name: str, device: torch.device, keep_all: int, floor: int) -> dict:
    """Issue 31's columns of row ``name``: the least memory ``offload()`` (every method it
    carries out: best, rotor, joint) accepts, against ``floor`` (the proven floor for any
    schedule, whole-step bytes), and training at 30 % of ``keep_all`` and at that least + 5 %."""
    model, batch, step, sample = build(name, device)
    chosen: dict[int, str] = {}

    def accepts(memory: int) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                handle = ct.offload(model, sample, memory=memory)
            except ValueError as err:
                if "no schedule fits" not in str(err):
                    raise
                return False
        chosen[memory] = handle.plan.result.method
        handle.remove()
        return True

    least = least_accepted(accepts, floor, keep_all)
    out = {"floor": floor, "least_any": least, "least_method": chosen.get(least), "trained": {}}
    for label, memory in (("30 %", int(0.3 * keep_all)), ("least + 5 %", None if least is None else int(least * 1.05))):
        if memory is None:
            continue
        model, batch, step, sample = build(name, device)
        ref = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                handle = ct.offload(model, sample, memory=memory)
            except ValueError as err:
                if "no schedule fits" not in str(err):
                    raise
                out["trained"][label] = {"memory": memory, "refused": True}
                continue
        try:
            equal, moved_is_plan, _ = train(handle, model, ref, batch, step)
        except Exception as err:  # the row says what the executor raised; the table goes on
            out["trained"][label] = {"memory": memory, "refused": False, "error": f"{type(err).__name__}: {err}",
                                     "method": handle.plan.result.method, "equal": False, "moved_is_plan": False}
            handle.remove()
            continue
        out["trained"][label] = {
            "memory": memory, "refused": False, "method": handle.plan.result.method, "equal": equal,
            "moved_is_plan": moved_is_plan, "moved": handle.offloaded_bytes,
            "recomputes": handle.plan.schedule.has_remat,
        }
        handle.remove()
    return out


def run(name: str, device: torch.device = CPU) -> dict:
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
            floor = int(re.search(r"(\d+) B(?: \([^)]*\))? for any schedule at all", str(err)).group(1))
            keep_all = step_peak(prof.chain, prof.sizes)
            return recompute_columns(name, device, keep_all, floor) | {
                "model": name, "blocks": _blocks(prof.blocks),
                "keep_all": keep_all, "cover": prof.coverage.share, "least": int(least.group(1)) if least else None,
                "memory": None, "moved": None, "moved_is_plan": True, "equal": None, "setup": time.perf_counter() - t0,
                "said": [str(err)], "measured": None, "predicted": None,
            }
    setup = time.perf_counter() - t0
    said = [str(w.message).removeprefix("chainoffload_torch: ") for w in caught if "chainoffload_torch" in str(w.message)]
    equal, moved_is_plan, measured = train(handle, model, ref, batch, step)
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
    return recompute_columns(name, device, keep_all, stage_floor(plan.chain, plan.sizes) + plan.resident_bytes) | row


def _blocks(blocks: object) -> str:
    """The blocks found, and whether the code before them is a stage of its own."""
    stem = " (+ the code before them as stage 1)" if blocks.prefix else ""
    return f"{len(blocks)}: {blocks.names[0]} .. {blocks.names[-1]}{stem}"


def table(rows: list[dict], peaks: bool = False) -> str:
    """The Markdown table; ``peaks``: with the allocator's peak of the last step beside the prediction (CUDA)."""
    lines = [
        f"Each model: 1 line, `{LINE.format(fraction=FRACTION)}`, then {STEPS} AdamW steps of its documented training loop beside an untouched copy.",
        "",
        "| model | blocks found | keep-all peak | chain can move | least memory known to fit | bytes moved per step at 60 % | losses, grads, weights | offload() "
        "| least memory offload() accepts | against the floor for any schedule | at 30 % | at that least + 5 % |"
        + (" measured / predicted peak |" if peaks else ""),
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|---|" + ("---:|" if peaks else ""),
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
            f" {_least_any(r)} | {_against_floor(r)} | {_trained(r, '30 %')} | {_trained(r, 'least + 5 %')} |"
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


def _least_any(r: dict) -> str:
    if r["least_any"] is None:
        return "none up to the keep-all peak"
    return f"{r['least_any']} B, {100 * r['least_any'] / r['keep_all']:.1f} % ({r['least_method']})"


def _against_floor(r: dict) -> str:
    if r["least_any"] is None:
        return "-"
    over = r["least_any"] / r["floor"] - 1
    return f"{r['floor']} B: +{100 * over:.1f} %" + (" (within 2 %)" if over <= FLOOR_TOL else " (NOT within 2 %)")


def _trained(r: dict, label: str) -> str:
    t = r["trained"].get(label)
    if t is None:
        return "-"
    if t["refused"]:
        below = t["memory"] < r["floor"]
        return f"{t['memory']} B: refused" + (" (below the floor for any schedule)" if below else "")
    if "error" in t:
        return f"{t['method']}: RAISED {t['error'].splitlines()[0][:120]}"
    equal = "torch.equal" if t["equal"] else "NOT EQUAL"
    moved = format_bytes(t["moved"]) + (" moved (the plan's)" if t["moved_is_plan"] else " moved (NOT the plan's)")
    return f"{t['method']}{', recomputes' if t['recomputes'] else ''}: {equal}, {moved}"


def summary(rows: list[dict]) -> str:
    """Issue 31's columns counted over ``rows``: floors reached, and how training went at each memory."""
    within = [r["model"] for r in rows if r["least_any"] is not None and r["least_any"] <= r["floor"] * (1 + FLOOR_TOL)]
    parts = [f"Least memory with recomputation within 2 % of the floor for any schedule: {len(within)} of {len(rows)} rows."]
    for label in ("30 %", "least + 5 %"):
        done = [r["trained"][label] for r in rows if label in r["trained"]]
        refused = sum(t["refused"] for t in done)
        below = sum(r["trained"][label]["refused"] and r["trained"][label]["memory"] < r["floor"]
                    for r in rows if label in r["trained"])
        raised = [r["model"] for r in rows if "error" in r["trained"].get(label, {})]
        equal = sum(not t["refused"] and "error" not in t and t["equal"] and t["moved_is_plan"] for t in done)
        recomputes = sum(not t["refused"] and "error" not in t and t["recomputes"] for t in done)
        parts.append(_counted(label, equal, recomputes, refused, below, raised))
    return " ".join(parts)


def _counted(label: str, equal: int, recomputes: int, refused: int, below: int, raised: list[str]) -> str:
    """One memory's sentence of the summary (the same whether counted from rows or from the table)."""
    return (
        f"At {label}: {equal} trained torch.equal with the plan's bytes moved ({recomputes} of them recomputing), "
        f"{refused} refused ({below} of them below the floor for any schedule, where no schedule fits), "
        f"{len(raised)} raised" + (f" ({', '.join(raised)})" if raised else "") + "."
    )


def splice(text: str, rows: list[dict], note: str) -> str:
    """``text`` (the results file) with the table lines and notes of ``rows`` replaced by theirs,
    the summary counted again from the table's cells, and ``note`` (which rows were rerun, how)
    after it: a rerun of some rows keeps the others' figures as they were measured."""
    fresh = table(rows).split("\n")
    rerun = {r["model"] for r in rows}
    lines = text.rstrip("\n").split("\n")
    for i, line in enumerate(lines):
        name = line.split("|")[1].strip() if line.startswith("| ") else None
        if name in rerun:
            lines[i] = next(f for f in fresh if f.startswith(f"| {name} |"))
    # The notes of "What offload() said:": the rerun rows' own, in the table's order.
    said = [f"- {r['model']}: {m}" for r in rows for m in r["said"]]
    kept = [ln for ln in lines if ln.startswith("- ") and ln[2:].split(":")[0] not in rerun]
    notes = sorted(kept + said, key=lambda ln: NAMES.index(ln[2:].split(":")[0]))
    body = [ln for ln in lines if not ln.startswith("- ")]
    if notes:
        at = body.index("What offload() said:") + 2
        body[at:at] = notes
    cells = [ln.split("|")[1:-1] for ln in body if ln.startswith("| ") and ln.split("|")[1].strip() in NAMES]
    within = sum("(within 2 %)" in c[9] for c in cells)
    parts = [f"Least memory with recomputation within 2 % of the floor for any schedule: {within} of {len(cells)} rows."]
    for label, col in (("30 %", 10), ("least + 5 %", 11)):
        trained = [c[col] for c in cells]
        raised = [c[0].strip() for c in cells if "RAISED" in c[col]]
        equal = sum("torch.equal" in t and "(the plan's)" in t for t in trained)
        recomputes = sum("recomputes" in t and "torch.equal" in t for t in trained)
        refused = sum("refused" in t for t in trained)
        below = sum("below the floor for any schedule" in t for t in trained)
        parts.append(_counted(label, equal, recomputes, refused, below, raised))
    at = next(i for i, ln in enumerate(body) if ln.startswith("Least memory with recomputation within 2 %"))
    body[at] = " ".join(parts) + " (Counted from the table's cells.)"
    body[at + 1:at + 1] = ["", note]
    return "\n".join(body) + "\n"


def ok(r: dict) -> bool:
    """Whether row ``r`` trained as plain PyTorch would, moving the plan's bytes, everywhere it trained."""
    trained = [t for t in r["trained"].values() if not t["refused"]]
    return r["equal"] is not False and r["moved_is_plan"] and all(t["equal"] and t["moved_is_plan"] for t in trained)


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
    parser.add_argument("--shard", metavar="K/N", help="run rows K, K+N, ... of the table (0-based) and dump them to --rows")
    parser.add_argument("--rows", metavar="PATH", help="with --shard or names: where to dump the rows (JSON)")
    parser.add_argument("--merge", nargs="+", metavar="PATH", help="write the table of the dumped shards' rows")
    parser.add_argument(
        "--splice", nargs="+", metavar="PATH",
        help="put the dumped rows (of a run of some names with --rows) into the results file in place of theirs",
    )
    opts = parser.parse_args(argv)
    if opts.splice:
        import json
        import subprocess

        dumped = [json.loads(Path(f).read_text()) for f in opts.splice]
        rows = [r for d in dumped for r in d["rows"]]
        for r in rows:
            r["trained"] = dict(r["trained"])
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
        note = (
            f"Rows rerun at {head or 'this tree'}: {', '.join(r['model'] for r in rows)}; "
            f"`{' ; '.join(d['command'] for d in dumped)}`. "
            + " ".join(d["timing"] for d in dumped)
            + " The other rows are the run above, as it was."
        )
        out = RESULTS / "offload_models.md"
        out.write_text(splice(out.read_text(), rows, note))
        print(note)
        return 0 if all(ok(r) for r in rows) else 1
    if opts.merge:
        import json

        dumped = [json.loads(Path(f).read_text()) for f in opts.merge]
        rows = sorted((r for d in dumped for r in d["rows"]), key=lambda r: NAMES.index(r["model"]))
        for r in rows:
            r["trained"] = dict(r["trained"])
        text = table(rows) + "\n\n" + summary(rows) + "\n\n" + " ".join(d["timing"] for d in dumped)
        command = " & ".join(d["command"] for d in dumped) + f"; python benchmarks/offload_models.py --merge {' '.join(opts.merge)}"
        (RESULTS / "offload_models.md").write_text(f"`{command}`   # CPU, torch.set_num_threads(1), shards in parallel\n\n{text}\n")
        print(text)
        return 0 if all(ok(r) for r in rows) and len(rows) == len(NAMES) else 1
    if opts.shard:
        k, n = (int(v) for v in opts.shard.split("/"))
        opts.names = NAMES[k::n]
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
        print(
            f"{name}: {r['blocks']}, least {r['least']} of {r['keep_all']}, equal {r['equal']}, moved is plan {r['moved_is_plan']},"
            f" {r['setup']:.2f} s; least with recomputation {_least_any(r)}, {_against_floor(r)};"
            f" 30 %: {_trained(r, '30 %')}; least + 5 %: {_trained(r, 'least + 5 %')}",
            flush=True,
        )
    text = table(rows, peaks=device.type == "cuda")
    timing = (
        f"offload(): wall time of the one line, the solver's kernels made ready before the table (the first offload()"
        f" of a small model in the process took {cold:.2f} s, a second {warm:.2f} s). torch {torch.__version__},"
        f" load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end."
    )
    said = "\n\nWhat offload() said:"
    text = text.replace(said, f"\n\n{timing}{said}", 1) if said in text else f"{text}\n\n{timing}"
    print(text)
    if opts.rows:
        import json

        which = f"--shard {opts.shard}" if opts.shard else " ".join(opts.names)
        Path(opts.rows).write_text(json.dumps({
            "rows": rows, "command": f"python benchmarks/offload_models.py {which} --rows {opts.rows}",
            "timing": f"{'Shard ' + opts.shard if opts.shard else 'Rows ' + ', '.join(opts.names)}: {timing}",
        }))
    elif not opts.names:
        RESULTS.mkdir(exist_ok=True)
        if device.type == "cpu":
            command, out = "python benchmarks/offload_models.py   # CPU, torch.set_num_threads(1)", "offload_models.md"
        else:
            command, out = f"python benchmarks/offload_models.py --device {opts.device}", f"offload_models-{device.type}.md"
        (RESULTS / out).write_text(f"`{command}`\n\n{text}\n")
    return 0 if all(ok(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
