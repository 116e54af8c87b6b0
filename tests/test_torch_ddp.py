"""The executor inside DistributedDataParallel: 2 CPU processes, gloo, gradients bitwise equal."""

import copy
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402

STEPS = 3


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.Tanh(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )


def _worker(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        base = _model()
        torch.manual_seed(100 + rank)  # each rank its own data
        x = torch.randn(4, 3, 8, 8)
        target = torch.randint(0, 10, (4,))
        sizes = ct.measure_sizes(base, x)
        L = len(base)
        # Times do not matter here (no platform: release points come from the schedule alone).
        chain = co.Chain([1.0] * L, [1.0] * L, list(sizes.act), list(sizes.saved))
        units = [u for u in range(1, L) if u not in sizes.aliased]
        platform = co.Platform(memory=10**12, bandwidth_d2h=1e9, bandwidth_h2d=1e9)
        schedule = plan_transfers(chain, platform, units)
        wrapped = nn.parallel.DistributedDataParallel(ct.Offloader(copy.deepcopy(base), chain, schedule))
        plain = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
        opt_w = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
        for step in range(STEPS):
            opt_w.zero_grad()
            opt_p.zero_grad()
            lw = nn.functional.cross_entropy(wrapped(x), target)
            lw.backward()
            lp = nn.functional.cross_entropy(plain(x), target)
            lp.backward()
            if not torch.equal(lw, lp):
                raise AssertionError(f"rank {rank} step {step}: loss {lw.item()} != {lp.item()}")
            for (name, p), q in zip(wrapped.module.module.named_parameters(), plain.module.parameters()):
                if not torch.equal(p.grad, q.grad):
                    raise AssertionError(f"rank {rank} step {step}: gradient of {name} differs")
            stats = wrapped.module.last_step
            if stats.offloaded_bytes != schedule.offloaded_bytes(chain) or stats.prefetched_bytes != stats.offloaded_bytes:
                raise AssertionError(f"rank {rank}: moved {stats} but the schedule offloads {schedule.offloaded_bytes(chain)} B")
            opt_w.step()
            opt_p.step()
        # The all-reduce really happened: both ranks hold the same parameters after training.
        flat = torch.cat([p.detach().flatten() for p in wrapped.parameters()])
        other = flat.clone()
        dist.broadcast(other, src=0)
        if not torch.equal(flat, other):
            raise AssertionError(f"rank {rank}: parameters differ from rank 0's")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_ddp_gradients_equal_the_plain_ddp_model():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_worker, args=(2, _free_port()), nprocs=2, join=True)
