"""The executor's cheaper per-tensor paths (issue 31) keep every number and every check.

* A rematerializing plan that offloads nothing makes its records without the ledger (NOTE [ a
  plan that moves nothing owns nothing ] in executor.py): the gradients stay plain PyTorch's
  bit for bit, and a saved tensor modified in place still raises as plain PyTorch does.
* A version probe of a plain tensor is made through ``.data`` (NOTE [ a probe through .data ] in
  _saved.py): it shares the counter, bumps nothing and holds no storage.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload_torch import _stages, executor  # noqa: E402
from chainoffload_torch._recompute import Slot  # noqa: E402
from chainoffload_torch._saved import version_probe  # noqa: E402
from recompute_blocks import ScalesInput, TanhOut  # noqa: E402

L = 8
INPLACE_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"


class Blk(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.l1 = nn.Linear(d, 2 * d)
        self.dp = nn.Dropout(0.3)
        self.l2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.l2(self.dp(torch.tanh(self.l1(x))))


def checkpointing_schedule(length: int) -> co.Schedule:
    """Hugging Face's gradient checkpointing on ``length`` stages: Fck 1..L-1, F L, then each
    stage recomputed (F i) just before its backward."""
    return remat_schedule(length, set(range(1, length)))


def hand_chain(length: int) -> co.Chain:
    return co.Chain(fwd=[1.0] * length, bwd=[1.0] * length, act=[128] * (length + 1), saved=[256] * length, name="hand")


def count_ledger_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("pack", "count"):
        real = getattr(_stages.UnitLedger, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(_stages.UnitLedger, name, spy)
    return calls


def test_a_recomputing_plan_that_offloads_nothing_trains_bitwise_equal_without_the_ledger(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(*[Blk(16) for _ in range(L)])
    ref = copy.deepcopy(model)
    x = torch.randn(32, 16)
    calls = count_ledger_calls(monkeypatch)
    walks: list[int] = []
    real_walk = executor.resident_storages
    monkeypatch.setattr(executor, "resident_storages", lambda roots: walks.append(1) or real_walk(roots))
    handle = ct.Offloader(model, hand_chain(L), checkpointing_schedule(L))
    oa = torch.optim.SGD(model.parameters(), lr=0.1)
    ob = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        for m, opt in ((model, oa), (ref, ob)):
            opt.zero_grad()
            torch.manual_seed(step)
            m(x).square().mean().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert handle.last_step.recomputed_ops == L - 1
        oa.step()
        ob.step()
    # No saved tensor of these steps went through the ledger (no unit moves: nothing to own),
    # and no step walked the model for its resident storages.
    assert calls == []
    assert walks == []
    assert handle.live_entries() == 0
    handle.remove()


def test_a_plan_that_offloads_still_packs_through_the_ledger(monkeypatch):
    """The spies above see the ledger's calls and the walk when a unit moves (so their silence
    means something)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[Blk(16) for _ in range(L)])
    x = torch.randn(32, 16)
    handle = ct.offload(model, x, memory=0.5)
    assert handle.schedule.offloaded_units
    calls = count_ledger_calls(monkeypatch)
    walks: list[int] = []
    real_walk = executor.resident_storages
    monkeypatch.setattr(executor, "resident_storages", lambda roots: walks.append(1) or real_walk(roots))
    model(x).square().mean().backward()
    assert "pack" in calls and walks == [1]
    handle.remove()


def remat_schedule(length: int, recomputed: set[int]) -> co.Schedule:
    """Stages in ``recomputed`` run as Fck in the forward and again (F) before their backward."""
    comp = [("Fck" if i in recomputed else "F", i) for i in range(1, length + 1)]
    for i in range(length, 0, -1):
        comp += ([("F", i)] if i in recomputed else []) + [("B", i)]
    return co.Schedule(tuple(comp))


@pytest.mark.parametrize("where", ["kept", "slot"])
def test_a_saved_tensor_modified_in_place_raises_as_plain_under_a_plan_that_offloads_nothing(where):
    """Block 5 scales block 4's saved tanh output in place; block 4 runs with saving ("kept":
    a record holds the tensor) or without, recomputed later ("slot": a probe of the original).
    Plain PyTorch raises; so does the executor, with autograd's message and the block."""
    torch.manual_seed(0)
    model = nn.Sequential(*[TanhOut(8) if i != 4 else ScalesInput(8) for i in range(L)])
    x = torch.randn(4, 8)
    ref = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match=INPLACE_ERROR) as plain:
        ref(x).square().mean().backward()
    recomputed = {1, 2, 3, 6, 7} | ({4} if where == "slot" else set())
    schedule = remat_schedule(L, recomputed)
    assert not schedule.offloaded_units
    handle = ct.Offloader(model, hand_chain(L), schedule)
    with pytest.raises(RuntimeError, match=INPLACE_ERROR) as ours:
        model(x).square().mean().backward()
    assert str(plain.value).split(" is at version")[0] in str(ours.value)
    assert "chainoffload_torch: saved in the forward of block 4" in str(ours.value)
    handle.remove()


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64),
    lambda: torch.randn(8, 8)[2:, ::2],  # a view: its counter is its base's
    lambda: torch.randn(8, 8, requires_grad=True) * 2,  # made by autograd
    lambda: torch.randn(8, dtype=torch.bfloat16),
    lambda: nn.Parameter(torch.randn(8)),  # not a plain tensor: the set_ path
])
def test_a_version_probe_shares_the_counter_bumps_nothing_and_frees_the_storage(make):
    t = make()
    root = t if t._base is None else t._base
    with torch.no_grad():
        root.add_(1)  # a version other than 0
    version = t._version
    probe = version_probe(t)
    assert probe._version == t._version == version
    assert probe.untyped_storage().nbytes() == 0 and probe.dtype == t.dtype and probe.device == t.device
    with torch.no_grad():
        t.mul_(2)
    assert probe._version == version + 1
    ref = StorageWeakRef(t.untyped_storage())
    del t, root
    assert ref.expired()  # the probe holds none of the storage
    assert probe._version == version + 1


def test_a_slot_names_the_tensor_as_autograds_message_does():
    for t in (torch.zeros(3, 4), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.int64)):
        assert Slot(1, 0, t).type_name == t.type()
