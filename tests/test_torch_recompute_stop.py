"""A recomputation before its backward stops at its last saved tensor (NOTE [ a recomputation
stops at its last saved tensor ] in chainoffload_torch/_recompute.py): the code after it does not
run again, training stays bitwise plain PyTorch's, and a recomputation whose a_i a later one
reads, or a transfer moves, runs whole."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

L = 8

#: The blocks whose code after their last saved tensor ran, in order (a list outside the
#: modules: no state a recomputation puts back).
REACHED: list[int] = []


class SavesThenScales(nn.Module):
    """Saves in its linear layer, relu and dropout (the mask), then runs code that saves nothing
    (a scale by a number, the residual add) and logs that it got there."""

    def __init__(self, d: int, index: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.dp = nn.Dropout(0.2)
        self.index = index

    def forward(self, x):
        h = self.dp(torch.relu(self.lin(x)))
        REACHED.append(self.index)
        return x + h * 0.5


def model_and_input():
    torch.manual_seed(0)
    return nn.Sequential(*[SavesThenScales(16, i) for i in range(1, L + 1)]), torch.randn(32, 16)


def hand_chain() -> co.Chain:
    return co.Chain(fwd=[1.0] * L, bwd=[1.0] * L, act=[128] * (L + 1), saved=[256] * L, name="hand")


def forward_then(tail: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """Fck 1..L-1, F L, B L, then ``tail``."""
    return tuple([("Fck", i) for i in range(1, L)] + [("F", L), ("B", L)] + tail)


def train(model, ref, x, handle, steps=3) -> list[list[int]]:
    """Train both side by side (SGD), every gradient and parameter torch.equal; the blocks whose
    code after their last saved tensor ran, per step of ``model``."""
    oa = torch.optim.SGD(model.parameters(), lr=0.1)
    ob = torch.optim.SGD(ref.parameters(), lr=0.1)
    reached = []
    for step in range(steps):
        REACHED.clear()
        torch.manual_seed(step)
        model(x).square().mean().backward()
        reached.append(list(REACHED))
        torch.manual_seed(step)
        ref(x).square().mean().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert handle.last_step.recomputed_ops == L - 1
        for opt in (oa, ob):
            opt.step()
            opt.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    return reached


def test_checkpointing_s_recomputations_stop_at_their_last_saved_tensor():
    """Hugging Face's schedule: every recomputation is an F whose a_i nothing reads; none runs
    the code after its last saved tensor, as torch.utils.checkpoint's early stop does not."""
    model, x = model_and_input()
    ref = copy.deepcopy(model)
    tail = [op for i in range(L - 1, 0, -1) for op in (("F", i), ("B", i))]
    handle = ct.Offloader(model, hand_chain(), co.Schedule(forward_then(tail)))
    for reached in train(model, ref, x, handle):
        assert reached == list(range(1, L + 1))  # the forward's calls only
    handle.remove()


def test_a_recomputation_whose_output_a_later_one_reads_runs_whole():
    """F_{L-2} is recomputed before F_{L-1}, which starts from the a_{L-2} it makes: F_{L-2} runs
    to its end, F_{L-1} and the rest stop."""
    model, x = model_and_input()
    ref = copy.deepcopy(model)
    tail = [("F", L - 2), ("F", L - 1), ("B", L - 1), ("B", L - 2)]
    tail += [op for i in range(L - 3, 0, -1) for op in (("F", i), ("B", i))]
    handle = ct.Offloader(model, hand_chain(), co.Schedule(forward_then(tail)))
    for reached in train(model, ref, x, handle):
        assert reached == list(range(1, L + 1)) + [L - 2]
    handle.remove()


def test_a_recomputation_whose_unit_a_transfer_moves_runs_whole():
    """Unit 3 is offloaded at the end of its recomputation and prefetched for its backward: the
    recomputation makes the whole unit, a_3 with it, and runs to its end."""
    model, x = model_and_input()
    ref = copy.deepcopy(model)
    tail = [op for i in range(L - 1, 0, -1) for op in (("F", i), ("B", i))]
    compute = forward_then(tail)
    k = compute.index(("F", 3), L)
    transfers = (co.Transfer("offload", 3, k, "end"), co.Transfer("prefetch", 3, k, "end", before=k + 1))
    handle = ct.Offloader(model, hand_chain(), co.Schedule(compute, transfers))
    for reached in train(model, ref, x, handle):
        assert reached == list(range(1, L + 1)) + [3]
    handle.remove()
