"""Blocks shared by the tests of recomputation in the adapter (test_torch_recompute.py,
test_torch_bare_records.py): a block whose saved tensor is its output, and one that writes its
input in place, so that a block run without saving before it leaves autograd's in-place check
to the executor."""

from __future__ import annotations

import torch
from torch import nn


class TanhOut(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x))  # tanh saves its output


class ScalesInput(nn.Module):
    """Scales its input in place: the tanh output the block before saved (when that block is a
    TanhOut, saved by a stage the schedule runs with saving)."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        x.mul_(0.5)
        return self.lin(x)
