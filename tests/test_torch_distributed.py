"""Offloading inside DistributedDataParallel and FSDP2: 2 CPU processes, gloo, gradients bitwise
equal to the same distributed run without offloading.

One spawn runs every check (starting processes that import torch is the slow part); each check
writes its outcome per rank, and one test per check reads it.
"""

import copy
import importlib.util
import socket
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402

_spec = importlib.util.spec_from_file_location("torch_models", Path(__file__).resolve().parents[1] / "benchmarks" / "torch_models.py")
torch_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_models)

STEPS = 3
WORLD = 2
# A fixed link: each rank profiles its own times, but the plan must not depend on a noisy link.
LINK = co.Platform(memory=1, bandwidth_d2h=1e9, bandwidth_h2d=1e9)


def _cnn():
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


def train_side_by_side(offloaded, plain, batches, handle, local) -> None:
    """SGD steps on both; losses and gradients (``local`` of each) torch.equal at every step,
    and the bytes moved the plan's."""
    opt_w = torch.optim.SGD(offloaded.parameters(), lr=0.1)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
    for step, (xs, ys) in enumerate(batches):
        opt_w.zero_grad()
        opt_p.zero_grad()
        lw = nn.functional.cross_entropy(offloaded(xs), ys)
        lw.backward()
        lp = nn.functional.cross_entropy(plain(xs), ys)
        lp.backward()
        assert torch.equal(lw, lp), f"step {step}: loss {lw.item()} != {lp.item()}"
        for (name, p), q in zip(offloaded.named_parameters(), plain.parameters(), strict=True):
            assert torch.equal(local(p.grad), local(q.grad)), f"step {step}: gradient of {name} differs"
        stats = handle.last_step
        assert stats.offloaded_bytes == handle.plan.offloaded_bytes == stats.prefetched_bytes > 0, (step, stats)
        opt_w.step()
        opt_p.step()


def _check_ddp(rank: int) -> None:
    base = _cnn()
    torch.manual_seed(100 + rank)  # each rank its own data
    x, target = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    # Over twice the batch: profiled (a nearer size would be solved on the first plan's times).
    bigger, bigger_target = torch.randn(9, 3, 8, 8), torch.randint(0, 10, (9,))
    model = copy.deepcopy(base)
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0, platform=LINK)
    assert handle.schedule.offloaded_units, "the test needs a plan that offloads something"
    wrapped = nn.parallel.DistributedDataParallel(model)
    plain = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
    # The last step has another batch size on both ranks: a plan is made inside DDP's forward.
    batches = [(x, target)] * (STEPS - 1) + [(bigger, bigger_target)]
    train_side_by_side(wrapped, plain, batches, handle, lambda g: g)
    assert handle.replans == 1 and len(handle.plans) == 2, (handle.replans, len(handle.plans))
    # The all-reduce really happened: both ranks hold the same parameters after training.
    flat = torch.cat([p.detach().flatten() for p in wrapped.parameters()])
    other = flat.clone()
    dist.broadcast(other, src=0)
    assert torch.equal(flat, other), "parameters differ from rank 0's"


def _shard(model: nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


def _check_fsdp(rank: int) -> None:
    base = torch_models.ResidualMLP()
    torch.manual_seed(200 + rank)
    x, y = torch.randn(24, 8), torch.randint(0, 3, (24,))
    x2, y2 = torch.randn(30, 8), torch.randint(0, 3, (30,))
    model, ref = copy.deepcopy(base), copy.deepcopy(base)
    # Plans are made before sharding: for the training shape, and for a second one.
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0, platform=LINK)
    second = handle.prepare(x2)
    assert handle.schedule.offloaded_units and second.schedule.offloaded_units
    _shard(model)
    _shard(ref)
    train_side_by_side(model, ref, [(x, y), (x, y), (x2, y2), (x, y)], handle, lambda g: g.to_local())
    assert handle.replans == 0 and len(handle.plans) == 2
    # A shape nobody planned for is refused before anything runs (no profiling inside FSDP).
    try:
        model(torch.randn(7, 8))
    except RuntimeError as exc:
        assert "prepare" in str(exc), exc
    else:
        raise AssertionError("a new shape under FSDP was not refused")


CHECKS = {"ddp": _check_ddp, "fsdp": _check_fsdp}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        for name, check in CHECKS.items():
            try:
                check(rank)
                outcome = "ok"
            except Exception:  # noqa: BLE001 - reported by the test of this check
                outcome = traceback.format_exc()
            Path(out, f"{name}-{rank}.txt").write_text(outcome)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("distributed")
    mp.spawn(_worker, args=(WORLD, _free_port(), str(out)), nprocs=WORLD, join=True)
    return {p.stem: p.read_text() for p in out.iterdir()}


@pytest.mark.timeout(300)
def test_ddp_gradients_equal_the_plain_ddp_model_also_after_a_new_batch_size(outcomes):
    for rank in range(WORLD):
        assert outcomes.get(f"ddp-{rank}") == "ok", outcomes.get(f"ddp-{rank}")


@pytest.mark.timeout(300)
def test_fsdp2_gradients_equal_the_plain_fsdp_run_with_plans_made_before_sharding(outcomes):
    pytest.importorskip("torch.distributed.fsdp", reason="FSDP2")
    for rank in range(WORLD):
        assert outcomes.get(f"fsdp-{rank}") == "ok", outcomes.get(f"fsdp-{rank}")
