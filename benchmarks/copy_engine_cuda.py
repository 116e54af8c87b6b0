"""The copier's CUDA engine on a GPU: offloaded training, bitwise against an untouched copy.

The CPU tests run the copier's ordering logic on the threaded test engine
(``tests/test_torch_copy_engine.py``); this runs the same logic on CUDA streams and events. Two
chains (``gpt-like``, ``resnet-like``), each on a duplex and a half-duplex platform at two memory
limits between the least at which offloading every movable unit fits and the keep-all peak, are
trained for three SGD steps next to an untouched ``copy.deepcopy`` (``torch.manual_seed`` before
each forward, deterministic kernels). A control pair of two plain copies shows that plain
training is itself bitwise reproducible, so a difference means wrong data.

    python benchmarks/copy_engine_cuda.py                     # CUDA: about a minute on one H100/H200
    python benchmarks/copy_engine_cuda.py --device cpu --quick    # the dry run

One Markdown table on stdout (and ``--out``): per run, the bytes moved against the plan's, whether
the loss, every gradient and every parameter stayed bitwise equal, the step time against the
simulated makespan, and the measured peak against the predicted one. Exit 1 if a run is not
bitwise equal or moves other bytes than its plan.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from chainoffload_torch._engine_choice import engine_for  # noqa: E402
from torch_models import gpt_like, resnet_like  # noqa: E402


def workloads(quick: bool, device: torch.device):
    torch.manual_seed(0)
    if quick:
        yield "gpt-like", gpt_like(64, 16, 32, 4, 8), torch.randint(0, 64, (2, 16))
        yield "resnet-like", resnet_like(8, 2, 10), torch.randn(2, 3, 32, 32)
    else:
        yield "gpt-like", gpt_like(8192, 512, 1024, 16, 8), torch.randint(0, 8192, (8, 512))
        yield "resnet-like", resnet_like(64, 2, 1000), torch.randn(32, 3, 224, 224)


def step(model: nn.Module, x: torch.Tensor, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    loss = model(x).float().square().mean()
    loss.backward()
    return loss


def train_pair(a: nn.Module, b: nn.Module, x: torch.Tensor, steps: int, device: torch.device) -> tuple[bool, list[float]]:
    """Train ``a`` and ``b`` side by side; whether every step stayed bitwise equal, and ``a``'s step seconds."""
    opt_a = torch.optim.SGD(a.parameters(), lr=0.01, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.01, momentum=0.9)
    equal, times = True, []
    for s in range(steps):
        opt_a.zero_grad(set_to_none=False)
        opt_b.zero_grad(set_to_none=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        la = step(a, x, s)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        lb = step(b, x, s)
        equal &= torch.equal(la, lb)
        equal &= all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters(), strict=True))
        opt_a.step()
        opt_b.step()
        equal &= all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
        equal &= all(torch.equal(p, q) for p, q in zip(a.buffers(), b.buffers(), strict=True))
    return equal, times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models (a dry run)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        # The math attention kernel: the fused ones' backward is not bitwise reproducible.
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
    rows = [
        "| workload | duplex | memory | plan moves | moved | bitwise equal | control equal | step s (median) | makespan s | peak measured / predicted |",
        "|---|---|---|---:|---:|---|---|---:|---:|---|",
    ]
    failed = 0
    for name, model, x in workloads(args.quick, device):
        model, x = model.to(device), x.to(device)
        prof = ct.profile_full(model, x, repeats=1, warmup=1, name=name)
        chain = prof.chain
        full = co.keep_all_peak(chain)
        units = [u for u in range(1, chain.length) if u not in prof.sizes.resident]
        for duplex in (True, False):
            plat = prof.platform.replace(duplex=duplex)
            eager = plan_transfers(chain, plat.with_memory(2**62), units)
            low = int(1.02 * co.simulate(chain, plat.with_memory(2**62), eager).peak_memory)
            for frac in (0.0, 0.5):
                memory = int(low + frac * (full - low))
                platm = plat.with_memory(memory)
                result = co.solve(chain, platm, keep=sorted(prof.sizes.resident), time_limit=5)
                if not result.feasible or not result.schedule.offloaded_units:
                    rows.append(f"| {name} | {duplex} | {format_bytes(memory)} | no offloading plan ({result.status}) | | | | | | |")
                    continue
                sched = result.schedule
                work, ref, control = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
                off = ct.Offloader(work, chain, sched, platform=platm)
                equal, times = train_pair(work, ref, x, args.steps, device)
                control_equal, _ = train_pair(copy.deepcopy(model), control, x, 1, device)
                stats = off.last_step
                plan_bytes = sched.offloaded_bytes(chain)
                ok = equal and stats.offloaded_bytes == plan_bytes == stats.prefetched_bytes
                failed += not ok
                peak = (
                    f"{format_bytes(stats.measured_peak)} / {format_bytes(stats.predicted_peak)}"
                    if stats.measured_peak is not None
                    else f"- / {format_bytes(stats.predicted_peak)}"
                )
                rows.append(
                    f"| {name} | {duplex} | {format_bytes(memory)} | {format_bytes(plan_bytes)} | {format_bytes(stats.offloaded_bytes)} | "
                    f"{'yes' if equal else 'NO'} | {'yes' if control_equal else 'no'} | {statistics.median(times):.4f} | "
                    f"{result.makespan:.4f} | {peak} |"
                )
                off.remove()
                del work, ref, control, off
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    table = "\n".join(rows)
    engine = engine_for(device).name
    head = f"copy engine: {engine}; device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}"
    print(head)
    print(table)
    print(f"{failed} run(s) not bitwise equal or moving other bytes than planned")
    if args.out:
        Path(args.out).write_text(f"{head}\n\n{table}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
