"""Differential fuzzing of offloaded training against plain autograd: random block models.

The adapter's promise is *the same training, in less memory*: :func:`chainoffload_torch.offload`
may refuse a model, run it slower or keep memory resident, but it must never train on other
numbers than plain PyTorch would. This module draws small random models that stress that
promise and checks it, bitwise, against an untouched twin:

* :func:`random_models` — a Hypothesis strategy of :class:`ModelCase` (needs ``hypothesis``, in
  the ``dev`` extra): an ``nn.Module`` whose forward runs a prefix, an ``nn.ModuleList`` of 8 or
  more blocks and a suffix, with a batch and a loss. Blocks mix in-place ops (on fresh tensors
  and on tensors autograd saved), views and reshapes, conj / neg lazy views, float64, bfloat16
  and complex64 compute, int and bool tensors passed between blocks, shared weights, skips to
  later blocks, ``no_grad`` sections, ``detach``, dropout, batch norm; the parent's forward may modify the
  hidden state in place between blocks; hooks (some modifying the hidden state in place) are
  registered before and after :func:`~chainoffload_torch.offload`.
* :func:`draw_model` — the same description drawn from a seeded :class:`random.Random`, through
  the same generator code (no Hypothesis needed): what a long benchmark run uses.
* :func:`differential_check` — train a case plain and offloaded for a few SGD steps and say
  which :class:`Outcome` it had: ``equal``, ``both_raised`` and ``refused`` keep the promise;
  ``silent_difference``, ``offloaded_only_raise`` and ``plain_only_raise`` break it.

Example: check your own executor's settings on random models::

    from hypothesis import given, settings, strategies as st
    from chainoffload_torch.testing import random_models, differential_check

    @settings(max_examples=50, deadline=None)
    @given(random_models(max_blocks=10), st.floats(0.3, 1.0))
    def test_same_training(case, memory):
        result = differential_check(case, memory=memory, method="largest-first")
        assert result.ok, result

A case's ``repr`` is a :class:`ModelSpec` literal that rebuilds the same model, so a shrunk
failure pastes straight into a regression test.
"""

from __future__ import annotations

import dataclasses
import math
import random
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FEATURES",
    "MODEL_FEATURES",
    "LOOP_FEATURES",
    "DRAW_SOURCES",
    "OPTIMIZERS",
    "BLOCK_OPS",
    "BETWEEN_OPS",
    "HOOK_KINDS",
    "OUTCOMES",
    "FAILURES",
    "BlockSpec",
    "HookSpec",
    "ModelSpec",
    "ModelCase",
    "FuzzModel",
    "FuzzBlock",
    "Outcome",
    "random_models",
    "draw_model",
    "differential_check",
]

# -- the vocabulary ---------------------------------------------------------------------------

#: Ops a block may run on its working tensor ``x`` (shape ``(batch, width)``, the hidden dtype),
#: in the order drawn, and the feature each belongs to. Every op keeps the shape and dtype of
#: ``x``; the ones that compute in another dtype cast back at their end. ``linear`` is first:
#: Hypothesis shrinks an op towards it, the plainest one.
BLOCK_OPS: dict[str, str] = {
    "linear": "basic",  # x @ W.T with the block's (maybe shared) weight
    "tanh": "basic",  # saves its output
    "sigmoid": "basic",  # saves its output
    "gelu": "basic",  # saves its input
    "gain": "basic",  # x * g, a per-feature parameter (saves x and g)
    "residual": "basic",  # x + tanh(x @ W.T): the output is saved by nothing
    "relu_": "inplace",  # x.relu_() on whatever x is now (fresh, saved, a view, the block's input)
    "mul_": "inplace",  # x.mul_(0.5)
    "add_": "inplace",  # x.add_(1.0)
    "transpose": "views",  # a non-contiguous view of a view of x, saved by a mul
    "narrow": "views",  # two narrowed halves of x (one at an offset), multiplied: both saved
    "stride": "views",  # x[:, ::2] * x[:, 1::2]: strided views saved
    "expand": "views",  # x * mean(x).expand(...): a stride-0 view saved
    "conj": "conj",  # complex64: a * a.conj(), which saves the lazy conj view
    "neg_view": "neg_view",  # x * torch._neg_view(x), which saves the lazy neg view
    "complex": "complex",  # complex64 compute without a conj view (z * z)
    "float64": "float64",  # compute in float64 with a float64 parameter, cast back
    "bfloat16": "bfloat16",  # compute in bfloat16 with a bfloat16 parameter, cast back
    "no_grad": "no_grad",  # a scale computed under torch.no_grad(), then x / scale
    "detach": "detach",  # x + 0.5 * tanh(x.detach())
    "dropout": "dropout",  # F.dropout(x, 0.25) (the RNG is seeded before every forward)
    "index": "int_args",  # x.index_select(1, perm): an int64 tensor the parent passes
    "mask": "bool_args",  # x.masked_fill(mask, 0): a bool tensor the parent or a block passes
    "skip": "skip",  # x + 0.5 * x * skip: an earlier block's output, passed as an extra arg
    "batchnorm": "batchnorm",  # the block's BatchNorm1d: running statistics a recomputation must not move twice
}

#: Ops that save their *output*: an in-place op right after one of them modifies a tensor
#: autograd saved, which plain PyTorch refuses in backward ("modified by an inplace operation").
SAVES_OUTPUT = frozenset({"tanh", "sigmoid"})
#: Ops that modify ``x`` in place.
INPLACE_OPS = frozenset({"relu_", "mul_", "add_"})

#: What the parent's forward may do to the hidden state right after a block returns it.
BETWEEN_OPS: dict[str, str] = {
    "mul_": "between_inplace",  # h.mul_(0.9)
    "iadd": "between_inplace",  # h += 1
    "scale": "basic",  # h = h * 0.9 (a new tensor)
    "alias": "views",  # h = h.view(h.shape): a new tensor object over the same storage
}

#: Module hooks on a block, and the feature each belongs to.
HOOK_KINDS: dict[str, str] = {
    "pre_inplace": "pre_hook_inplace",  # forward pre-hook: args[0].mul_(0.9) in place
    "pre_new": "hooks",  # forward pre-hook: returns (args[0] * 0.9, *rest)
    "post_inplace": "hooks",  # forward hook: output.mul_(0.9) in place
    "post_new": "hooks",  # forward hook: returns output + 0.1
}

#: The model's features (``basic`` is always on).
MODEL_FEATURES: tuple[str, ...] = (
    "inplace",
    "inplace_saved",
    "between_inplace",
    "pre_hook_inplace",
    "views",
    "conj",
    "neg_view",
    "complex",
    "float64",
    "bfloat16",
    "mixed_hidden",
    "int_args",
    "bool_args",
    "shared",
    "skip",
    "no_grad",
    "detach",
    "hooks",
    "late_hooks",
    "dropout",
    "batchnorm",
)
#: The features above are the model's, drawn first; these are the training loop's (NOTE [ the
#: loops the fuzz draws ]), drawn after the model so that a seed draws the same model as before.
LOOP_FEATURES: tuple[str, ...] = (
    "python_random",
    "numpy_random",
    "counter",
    "data_write",
    "optimizer_in_hooks",
    "varying_shapes",
    "several_forwards",
    "skipped_blocks",
)
#: Every feature :func:`random_models` can switch on or off (``features=``). ``basic`` is always on.
FEATURES: tuple[str, ...] = MODEL_FEATURES + LOOP_FEATURES

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


# -- descriptions -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """One block: the ops it runs, in order, and what it shares with others.

    Attributes
    ----------
    ops
        Names from :data:`BLOCK_OPS`.
    share
        Index (0-based) of an earlier block whose weight this block uses as its own, or ``None``.
    skip_from
        Index of an earlier block (at least two back) whose output the parent passes to this
        block as ``skip=``; needed by the ``skip`` op.
    emits_mask
        The block returns ``(x, x.detach() > 0)``: a bool tensor the parent passes on as the
        next blocks' ``mask=``.
    """

    ops: tuple[str, ...] = ("linear",)
    share: int | None = None
    skip_from: int | None = None
    emits_mask: bool = False

    def __repr__(self) -> str:
        parts = [repr(self.ops)]
        if self.share is not None:
            parts.append(f"share={self.share}")
        if self.skip_from is not None:
            parts.append(f"skip_from={self.skip_from}")
        if self.emits_mask:
            parts.append("emits_mask=True")
        return f"BlockSpec({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """A module hook on block ``block``: one of :data:`HOOK_KINDS`, registered on the model
    ``"before"`` or ``"after"`` :func:`~chainoffload_torch.offload` instruments it."""

    block: int
    kind: str
    when: str = "before"

    def __repr__(self) -> str:
        return f"HookSpec({self.block}, {self.kind!r}, {self.when!r})"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The drawn description of a random block model: everything :meth:`ModelCase.build` needs.

    Its ``repr`` is a literal that rebuilds it (only fields off their defaults are shown).

    Attributes
    ----------
    blocks
        One :class:`BlockSpec` per block (the chain's stages, an ``nn.ModuleList``).
    seed
        Seeds the weights and the batch (a private generator: the global RNG is untouched).
    width, batch
        The hidden state is ``(batch, width)``; ``width`` is even (the views halve it).
    dtype
        The hidden state's dtype: ``"float32"`` or ``"float64"``.
    between
        ``(block index, op)`` pairs: the parent's forward runs the :data:`BETWEEN_OPS` op on
        the hidden state right after that block.
    hooks
        The module hooks.
    hidden_casts
        Indices of blocks after which the parent casts the hidden state to float64 and back
        (mixed dtypes between blocks).
    draws
        ``(block index, source)`` pairs: the parent scales the hidden state after that block by
        a factor drawn from ``"python"`` (``random.random()``, stochastic depth's way),
        ``"numpy"`` (``np.random.rand()``) or ``"counter"`` (the model's own call counter).
    data_writes
        Indices of blocks after which the parent writes the hidden state through ``.data``
        (``h.data.mul_(0.9)``: no version counter moves).
    optimizer
        ``"sgd"`` (stepped in the loop) or ``"adamw_in_hooks"`` (one AdamW per parameter,
        stepped from its post-accumulate-grad hook: torchtune's optimizer in backward).
    batches
        The batch size of each training step (shapes that change per step); empty: ``batch``.
    forwards
        Forwards per backward: the loss sums the model's outputs on ``forwards`` scaled copies
        of the batch, each run before the one backward (a Siamese or contrastive loss).
    layerdrop
        In training, each block is skipped with this chance, drawn with torch's generator
        (``torch.rand``, as Hugging Face's LayerDrop; seeded before every forward): the parent
        hands the hidden state on to the code after the block unchanged.
    """

    blocks: tuple[BlockSpec, ...]
    seed: int = 0
    width: int = 8
    batch: int = 2
    dtype: str = "float32"
    between: tuple[tuple[int, str], ...] = ()
    hooks: tuple[HookSpec, ...] = ()
    hidden_casts: tuple[int, ...] = ()
    draws: tuple[tuple[int, str], ...] = ()
    data_writes: tuple[int, ...] = ()
    optimizer: str = "sgd"
    batches: tuple[int, ...] = ()
    forwards: int = 1
    layerdrop: float = 0.0

    def __post_init__(self) -> None:
        if len(self.blocks) < 2:
            raise ValueError(f"blocks: a chain needs at least 2 blocks, got {len(self.blocks)}")
        if self.width < 2 or self.width % 2:
            raise ValueError(f"width: {self.width} must be even and >= 2 (the views halve it)")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(_DTYPES)}")
        for i, b in enumerate(self.blocks):
            for op in b.ops:
                if op not in BLOCK_OPS:
                    raise ValueError(f"blocks[{i}].ops: unknown op {op!r}")
            if b.share is not None and not 0 <= b.share < i:
                raise ValueError(f"blocks[{i}].share: {b.share} is not an earlier block")
            if b.skip_from is not None and not 0 <= b.skip_from < i - 1:
                raise ValueError(f"blocks[{i}].skip_from: {b.skip_from} is not a block at least two back")
            if "skip" in b.ops and b.skip_from is None:
                raise ValueError(f"blocks[{i}]: the skip op needs skip_from")
        for i, op in self.between:
            if op not in BETWEEN_OPS or not 0 <= i < len(self.blocks):
                raise ValueError(f"between: ({i}, {op!r}) is not a block index and one of {', '.join(BETWEEN_OPS)}")
        for h in self.hooks:
            if h.kind not in HOOK_KINDS or h.when not in ("before", "after") or not 0 <= h.block < len(self.blocks):
                raise ValueError(f"hooks: {h!r} is not a valid hook")
        for i, source in self.draws:
            if source not in DRAW_SOURCES or not 0 <= i < len(self.blocks):
                raise ValueError(f"draws: ({i}, {source!r}) is not a block index and one of {', '.join(DRAW_SOURCES)}")
        if any(not 0 <= i < len(self.blocks) for i in self.data_writes):
            raise ValueError(f"data_writes: {self.data_writes} holds an index that is not a block's")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches: {self.batches} must be batch sizes >= 1")
        if isinstance(self.forwards, bool) or not isinstance(self.forwards, int) or self.forwards < 1:
            raise ValueError(f"forwards: {self.forwards!r} must be an integer >= 1")
        if isinstance(self.layerdrop, bool) or not isinstance(self.layerdrop, (int, float)) or not 0 <= self.layerdrop < 1:
            raise ValueError(f"layerdrop: {self.layerdrop!r} must be a chance in [0, 1)")

    @property
    def features(self) -> frozenset[str]:
        """The features this description really uses (for per-feature counts)."""
        used = set()
        for b in self.blocks:
            prev = None
            for op in b.ops:
                used.add(BLOCK_OPS[op])
                if op in INPLACE_OPS and prev in SAVES_OUTPUT:
                    used.add("inplace_saved")
                prev = op
            if b.share is not None:
                used.add("shared")
            if b.emits_mask:
                used.add("bool_args")
        used.update(BETWEEN_OPS[op] for _, op in self.between)
        for h in self.hooks:
            used.add(HOOK_KINDS[h.kind])
            if h.when == "after":
                used.add("late_hooks")
        if self.hidden_casts:
            used.add("mixed_hidden")
        used.update({"python": "python_random", "numpy": "numpy_random", "counter": "counter"}[src] for _, src in self.draws)
        if self.data_writes:
            used.add("data_write")
        if self.optimizer == "adamw_in_hooks":
            used.add("optimizer_in_hooks")
        if len(set(self.batches)) > 1:
            used.add("varying_shapes")
        if self.forwards > 1:
            used.add("several_forwards")
        if self.layerdrop:
            used.add("skipped_blocks")
        used.discard("basic")
        return frozenset(used)

    def __repr__(self) -> str:
        lines = ["ModelSpec(", "    blocks=("]
        lines += [f"        {b!r}," for b in self.blocks]
        lines.append("    ),")
        for f in dataclasses.fields(self)[1:]:
            v = getattr(self, f.name)
            if v != f.default:
                lines.append(f"    {f.name}={v!r},")
        lines.append(")")
        return "\n".join(lines)


# -- the model --------------------------------------------------------------------------------


class FuzzBlock(nn.Module):
    """A block that runs the ops of its :class:`BlockSpec` on the hidden state.

    Every block has the same class (so :func:`~chainoffload_torch.offload` finds the list as
    repeated blocks) and the same parameters: ``weight`` (width x width), ``gain`` (width), and
    ``gain64`` / ``gain16`` for the float64 and bfloat16 ops.
    """

    def __init__(self, spec: BlockSpec, width: int, dtype: torch.dtype, gen: torch.Generator) -> None:
        super().__init__()
        self.ops = spec.ops
        self.emits_mask = spec.emits_mask
        scale = 1.0 / math.sqrt(width)
        self.weight = nn.Parameter(torch.randn(width, width, generator=gen, dtype=torch.float64).mul(scale).to(dtype))
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(width, generator=gen, dtype=torch.float64).to(dtype))
        self.gain64 = nn.Parameter(1.0 + 0.1 * torch.randn(width, generator=gen, dtype=torch.float64))
        self.gain16 = nn.Parameter((1.0 + 0.1 * torch.randn(width, generator=gen, dtype=torch.float64)).to(torch.bfloat16))
        if "batchnorm" in spec.ops:
            self.bn = nn.BatchNorm1d(width, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        skip: torch.Tensor | None = None,
        index: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> Any:
        dtype = x.dtype
        for op in self.ops:
            x = _run_op(self, op, x, dtype, skip, index, mask)
        if self.emits_mask:
            return x, x.detach() > 0
        return x


def _run_op(blk: FuzzBlock, op: str, x: torch.Tensor, dtype: torch.dtype, skip: Any, index: Any, mask: Any) -> torch.Tensor:
    b, w = x.shape
    half = w // 2
    if op == "linear":
        return F.linear(x, blk.weight)
    if op == "tanh":
        return torch.tanh(x)
    if op == "sigmoid":
        return torch.sigmoid(x)
    if op == "gelu":
        return F.gelu(x)
    if op == "gain":
        return x * blk.gain
    if op == "residual":
        return x + torch.tanh(F.linear(x, blk.weight))
    if op == "relu_":
        return x.relu_()
    if op == "mul_":
        return x.mul_(0.5)
    if op == "add_":
        return x.add_(1.0)
    if op == "transpose":
        t = x.view(b, 2, half).transpose(1, 2)  # (b, half, 2), non-contiguous: a view of a view
        y = t * blk.gain.view(half, 2)  # saves t
        return y.transpose(1, 2).reshape(b, w)
    if op == "narrow":
        lo, hi = x.narrow(1, 0, half), x.narrow(1, half, half)  # hi at a storage offset
        return torch.cat([lo * hi, hi], dim=1)
    if op == "stride":
        even, odd = x[:, ::2], x[:, 1::2]
        return torch.cat([even * odd, even + odd], dim=1)
    if op == "expand":
        return x * x.mean(dim=1, keepdim=True).expand(b, w)
    if op == "conj":
        a = torch.complex(x.float(), x.flip(1).float())
        return (a * a.conj()).real.to(dtype) * 0.5  # mul saves a.conj(), a lazy conj view of a
    if op == "neg_view":
        return torch.tanh(x * torch._neg_view(x))  # mul saves the lazy neg view
    if op == "complex":
        z = torch.complex(x.float(), x.flip(1).float())
        return torch.tanh((z * z).real).to(dtype)
    if op == "float64":
        return torch.tanh(x.double() * blk.gain64).to(dtype)
    if op == "bfloat16":
        return (x.bfloat16() * blk.gain16).to(dtype)
    if op == "no_grad":
        with torch.no_grad():
            s = x.abs().mean() + 1.0
        return x / s
    if op == "detach":
        return x + 0.5 * torch.tanh(x.detach())
    if op == "dropout":
        return F.dropout(x, p=0.25, training=blk.training)
    if op == "index":
        return x.index_select(1, index)
    if op == "mask":
        return x.masked_fill(mask, 0.0)
    if op == "skip":
        return x + 0.5 * (x * skip)
    if op == "batchnorm":
        return blk.bn(x)
    raise ValueError(f"unknown op {op!r}")  # pragma: no cover - ModelSpec checks ops


class _ScaleArgInPlace:
    """Forward pre-hook: scales the block's hidden input in place (returns nothing)."""

    def __call__(self, module: nn.Module, args: tuple) -> None:
        args[0].mul_(0.9)


class _ScaleArg:
    """Forward pre-hook: hands the block a scaled copy of its hidden input."""

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        return (args[0] * 0.9,) + tuple(args[1:])


class _ScaleOutInPlace:
    """Forward hook: scales the block's hidden output in place (returns nothing)."""

    def __call__(self, module: nn.Module, args: tuple, out: Any) -> None:
        (out[0] if isinstance(out, tuple) else out).mul_(0.9)


class _ShiftOut:
    """Forward hook: replaces the block's hidden output by ``output + 0.1``."""

    def __call__(self, module: nn.Module, args: tuple, out: Any) -> Any:
        if isinstance(out, tuple):
            return (out[0] + 0.1,) + out[1:]
        return out + 0.1


_HOOKS = {"pre_inplace": _ScaleArgInPlace, "pre_new": _ScaleArg, "post_inplace": _ScaleOutInPlace, "post_new": _ShiftOut}

#: Where the parent's scale factors come from (:attr:`ModelSpec.draws`), and the optimizers.
DRAW_SOURCES = ("python", "numpy", "counter")
OPTIMIZERS = ("sgd", "adamw_in_hooks")


class FuzzModel(nn.Module):
    """The model of a :class:`ModelSpec`: prefix, ``blocks`` (an ``nn.ModuleList``), suffix.

    ``forward(x, perm)`` returns the suffix's output ``(batch, 3)``; :meth:`ModelCase.loss`
    makes the loss of it.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        dtype = _DTYPES[spec.dtype]
        gen = torch.Generator().manual_seed(spec.seed)
        w = spec.width
        self.embed = nn.Parameter(torch.randn(w, w, generator=gen, dtype=torch.float64).mul(1.0 / math.sqrt(w)).to(dtype))
        self.blocks = nn.ModuleList(FuzzBlock(b, w, dtype, gen) for b in spec.blocks)
        self.head = nn.Parameter(torch.randn(3, w, generator=gen, dtype=torch.float64).mul(1.0 / math.sqrt(w)).to(dtype))
        for i, b in enumerate(spec.blocks):
            if b.share is not None:
                # One Parameter object in two blocks: both blocks' uses add into its grad.
                self.blocks[i].weight = self.blocks[b.share].weight
        self._between = dict(spec.between)
        self._draws = dict(spec.draws)
        self._data_writes = frozenset(spec.data_writes)
        self.calls = 0  # a plain attribute the forward advances (the "counter" draws)
        self._casts = frozenset(spec.hidden_casts)
        self._skips_needed = frozenset(b.skip_from for b in spec.blocks if b.skip_from is not None)

    def forward(self, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = F.linear(x, self.embed)
        mask = h.detach() < -0.5  # a bool tensor made in the prefix, passed to blocks
        outputs: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.blocks):
            spec = self.spec.blocks[i]
            extra: dict[str, Any] = {}
            if spec.skip_from is not None:
                extra["skip"] = outputs[spec.skip_from]
            if "index" in spec.ops:
                extra["index"] = perm
            if "mask" in spec.ops:
                extra["mask"] = mask
            if self.spec.layerdrop and self.training and torch.rand([]) < self.spec.layerdrop:
                out = h  # LayerDrop: the block is skipped this step
            else:
                out = block(h, **extra)
            if isinstance(out, tuple):
                h, mask = out
            else:
                h = out
            if i in self._skips_needed:
                outputs[i] = h
            op = self._between.get(i)
            if op == "mul_":
                h.mul_(0.9)
            elif op == "iadd":
                h += 1.0
            elif op == "scale":
                h = h * 0.9
            elif op == "alias":
                h = h.view(h.shape)
            if i in self._casts:
                h = h.double().tanh().to(x.dtype)
            source = self._draws.get(i)
            if source == "python":
                h = h * (0.5 + random.random())
            elif source == "numpy":
                h = h * float(0.5 + np.random.rand())
            elif source == "counter":
                # Never periodic: a pass that advanced the counter unseen shows whatever the
                # number of passes (a factor of calls % 3 missed three of them).
                h = h * (1.0 + 0.01 * self.calls)
            if i in self._data_writes:
                h.data.mul_(0.9)
        return F.linear(h, self.head)


def _optimizer_in_backward(model: nn.Module, lr: float = 1e-2) -> None:
    """One AdamW per parameter, stepped (and its grad cleared) from the parameter's
    post-accumulate-grad hook, as torchtune's optimizer in backward."""
    opts = {p: torch.optim.AdamW([p], lr=lr) for p in model.parameters()}

    def step(p: torch.Tensor) -> None:
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)


class _Globals:
    """One side's Python and NumPy global generators: each model of a differential check draws
    from its own, as if it trained alone in its own process."""

    def __init__(self, seed: int) -> None:
        state, np_state = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state, self.np_state = random.getstate(), np.random.get_state()
        random.setstate(state)
        np.random.set_state(np_state)
        self._outer: Any = None

    def __enter__(self) -> _Globals:
        self._outer = (random.getstate(), np.random.get_state())
        random.setstate(self.state)
        np.random.set_state(self.np_state)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.state, self.np_state = random.getstate(), np.random.get_state()
        random.setstate(self._outer[0])
        np.random.set_state(self._outer[1])


class ModelCase:
    """A drawn random model: builds it, its batch and its loss, deterministically.

    Parameters
    ----------
    spec
        The description; ``repr(case)`` is ``repr(spec)``.
    """

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def build(self, device: torch.device | str | None = None) -> FuzzModel:
        """A fresh model (on ``device``, default CPU), with the hooks registered ``"before"``
        offloading.

        Two calls give identical models (weights from the spec's seed, drawn on the CPU).
        """
        model = FuzzModel(self.spec)
        if device is not None:
            model.to(device)
        self._register(model, "before")
        if self.spec.optimizer == "adamw_in_hooks":
            _optimizer_in_backward(model)
        return model

    def register_late_hooks(self, model: FuzzModel) -> None:
        """Register the hooks meant for ``"after"`` offloading (on a plain model too, to compare)."""
        self._register(model, "after")

    def _register(self, model: FuzzModel, when: str) -> None:
        for h in self.spec.hooks:
            if h.when != when:
                continue
            fn = _HOOKS[h.kind]()
            block = model.blocks[h.block]
            if h.kind.startswith("pre"):
                block.register_forward_pre_hook(fn)
            else:
                block.register_forward_hook(fn)

    def batch(self, device: torch.device | str | None = None, step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, perm)`` on ``device``: the input ``(batch, width)`` and an int64 permutation of
        the features; ``step`` picks that step's batch size from ``batches`` (when drawn)."""
        gen = torch.Generator().manual_seed(self.spec.seed + 1)
        rows = self.spec.batch
        if step is not None and self.spec.batches:
            rows = self.spec.batches[step % len(self.spec.batches)]
        x = torch.randn(rows, self.spec.width, generator=gen, dtype=torch.float64).to(_DTYPES[self.spec.dtype])
        perm = torch.randperm(self.spec.width, generator=gen)
        if device is not None:
            x, perm = x.to(device), perm.to(device)
        return x, perm

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        """The training loss of ``model`` on ``batch`` (a scalar); with ``forwards`` > 1, of
        that many forwards (on scaled copies of ``x``) before the one backward."""
        x, perm = batch
        outs = [model(x * (1.0 + 0.25 * k), perm) for k in range(self.spec.forwards)]
        return sum(o.square().mean() for o in outs[1:]) + outs[0].square().mean() if len(outs) > 1 else outs[0].square().mean()

    @property
    def features(self) -> frozenset[str]:
        """See :attr:`ModelSpec.features`."""
        return self.spec.features

    def __repr__(self) -> str:
        return repr(self.spec)


# -- the description generator (shared by the strategy and seeded draws) ----------------------


class _RandomSource:
    """Choices from a :class:`random.Random` (:func:`draw_model`)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq: tuple) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class _HypothesisSource:
    """Choices from a Hypothesis ``draw``: each shrinks towards the low end / first element /
    ``False``, so a failure shrinks to few blocks, plain ops and features off."""

    def __init__(self, draw: Callable, st: Any) -> None:
        self.draw = draw
        self.st = st

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def choice(self, seq: tuple) -> Any:
        return self.draw(self.st.sampled_from(seq))

    def chance(self, p: float) -> bool:
        # An integer draw shrinks to 0, which is "no": features shrink away.
        return self.draw(self.st.integers(0, 999)) >= round(1000 * (1.0 - p))


def _check_features(features: Iterable[str] | None) -> frozenset[str]:
    if features is None:
        return frozenset(FEATURES)
    if isinstance(features, str):
        raise TypeError("features: pass an iterable of feature names, not one string")
    chosen = frozenset(features)
    unknown = sorted(chosen - set(FEATURES))
    if unknown:
        raise ValueError(f"features: unknown {unknown}; known: {', '.join(FEATURES)}")
    return chosen


def _check_bounds(min_blocks: Any, max_blocks: Any, max_ops: Any) -> None:
    for name, v, low in (("min_blocks", min_blocks, 2), ("max_blocks", max_blocks, 2), ("max_ops", max_ops, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {v!r}")
    if max_blocks < min_blocks:
        raise ValueError(f"max_blocks: {max_blocks} is below min_blocks={min_blocks}")


def _describe(src: Any, min_blocks: int, max_blocks: int, max_ops: int, features: frozenset[str]) -> ModelSpec:
    """Draw a :class:`ModelSpec` from ``src`` (either source): the one generator both
    :func:`random_models` and :func:`draw_model` use."""
    # Each model switches on a few of the allowed features (each with chance 1/3), so that a
    # failure points at few features, and plain PyTorch's own refusals (in-place on a saved
    # tensor) do not mask every other feature of every model.
    on = {"basic"} | {f for f in MODEL_FEATURES if f in features and src.chance(1 / 3)}
    n = src.integer(min_blocks, max_blocks)
    ops_allowed = tuple(op for op, feat in BLOCK_OPS.items() if feat in on and op not in ("skip",))
    blocks = []
    for i in range(n):
        ops = []
        for _ in range(src.integer(1, max_ops)):
            op = src.choice(ops_allowed)
            if op in INPLACE_OPS and ops and ops[-1] in SAVES_OUTPUT and "inplace_saved" not in on:
                ops.append("gain")  # a fresh tensor between: the in-place op no longer hits a saved one
            ops.append(op)
        skip_from = None
        if "skip" in on and i >= 2 and src.chance(0.15):
            skip_from = src.integer(0, i - 2)
            ops.insert(src.integer(0, len(ops)), "skip")
        share = src.integer(0, i - 1) if "shared" in on and i >= 1 and src.chance(0.15) else None
        emits = "bool_args" in on and src.chance(0.1)
        blocks.append(BlockSpec(tuple(ops), share=share, skip_from=skip_from, emits_mask=emits))
    between_ops = tuple(op for op, feat in BETWEEN_OPS.items() if feat in on)
    between = tuple((i, src.choice(between_ops)) for i in range(n) if between_ops and src.chance(0.1))
    hook_kinds = tuple(k for k, feat in HOOK_KINDS.items() if feat in on)
    hooks = []
    if hook_kinds:
        for _ in range(src.integer(0, 2)):
            when = "after" if "late_hooks" in on and src.chance(0.5) else "before"
            hooks.append(HookSpec(src.integer(0, n - 1), src.choice(hook_kinds), when))
    casts = tuple(i for i in range(n) if "mixed_hidden" in on and src.chance(0.05))
    spec = ModelSpec(
        blocks=tuple(blocks),
        seed=src.integer(0, 2**16),
        width=2 * src.integer(1, 6),
        batch=src.integer(1, 4),
        dtype=src.choice(("float32", "float64")),
        between=between,
        hooks=tuple(hooks),
        hidden_casts=casts,
    )
    # NOTE [ the loops the fuzz draws ]: after the model, so a seed draws the model it drew before.
    loop = {f for f in LOOP_FEATURES if f in features and f != "skipped_blocks" and src.chance(1 / 4)}
    side = random.Random(spec.seed * 1_000_003 + n)  # the model's own seed: src's draws stay
    layerdrop = side.choice((0.1, 0.3, 0.5)) if "skipped_blocks" in features and side.random() < 1 / 4 else 0.0
    spec = dataclasses.replace(spec, layerdrop=layerdrop)
    if not loop:
        return spec
    sources = tuple(s for s, f in (("python", "python_random"), ("numpy", "numpy_random"), ("counter", "counter")) if f in loop)
    draws = tuple((i, src.choice(sources)) for i in range(n) if sources and src.chance(0.2))
    writes = tuple(i for i in range(n - 1) if "data_write" in loop and src.chance(0.15))
    if layerdrop and writes:
        # A write through .data after a block a step skips lands on another block's output than
        # the profile saw (a write that only some steps make: docs/model.md says keep= them).
        writes = ()
    batches = tuple(src.integer(1, 5) for _ in range(4)) if "varying_shapes" in loop else ()
    return dataclasses.replace(
        spec,
        draws=draws,
        data_writes=writes,
        optimizer="adamw_in_hooks" if "optimizer_in_hooks" in loop else "sgd",
        batches=batches,
        forwards=src.integer(2, 3) if "several_forwards" in loop else 1,
    )


def draw_model(
    rng: random.Random | int,
    *,
    min_blocks: int = 8,
    max_blocks: int = 12,
    max_ops: int = 4,
    features: Iterable[str] | None = None,
) -> ModelCase:
    """One random model drawn from a seeded ``random.Random`` (no Hypothesis needed).

    The same generator as :func:`random_models`, fed by ``rng`` instead of Hypothesis: a long
    run (``benchmarks/torch_fuzz.py``) draws thousands reproducibly from one seed.

    Parameters
    ----------
    rng
        A ``random.Random``, or an int seed for a fresh one.
    min_blocks, max_blocks, max_ops, features
        As for :func:`random_models`.

    Returns
    -------
    ModelCase
    """
    _check_bounds(min_blocks, max_blocks, max_ops)
    feats = _check_features(features)
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    return ModelCase(_describe(_RandomSource(rng), min_blocks, max_blocks, max_ops, feats))


def random_models(
    *,
    min_blocks: int = 8,
    max_blocks: int = 12,
    max_ops: int = 4,
    features: Iterable[str] | None = None,
) -> Any:
    """A Hypothesis strategy of random block models (:class:`ModelCase`).

    Parameters
    ----------
    min_blocks, max_blocks
        Blocks in the model's ``nn.ModuleList`` (at least 2; the default draws 8 to 12).
    max_ops
        Most ops per block (at least 1).
    features
        The :data:`FEATURES` the models may use (default all); e.g.
        ``features=set(FEATURES) - {"inplace_saved"}`` draws only models plain PyTorch can train.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[ModelCase]

    Raises
    ------
    ImportError
        Hypothesis is not installed (it is in the ``dev`` extra).
    ValueError
        A bad bound or an unknown feature.
    """
    try:
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - hypothesis is in the dev extra
        raise ImportError(
            "chainoffload_torch.testing.random_models needs Hypothesis: pip install 'chainoffload[dev]' (or hypothesis)"
        ) from exc
    _check_bounds(min_blocks, max_blocks, max_ops)
    feats = _check_features(features)

    @st.composite
    def _models(draw: Callable) -> ModelCase:
        return ModelCase(_describe(_HypothesisSource(draw, st), min_blocks, max_blocks, max_ops, feats))

    return _models()


# NOTE [ the loops the fuzz draws ]
# Issue 32 found training loops, not models, that offload() changed silently: an optimizer
# stepped from gradient hooks, stochastic depth drawn with Python's random or NumPy, a forward
# driven by a call counter, writes through .data, shapes that change every step. A drawn case
# may use each (LOOP_FEATURES, drawn after the model so that a seed draws the same model as
# before they existed): the parent scales the hidden state by a factor from random.random(),
# np.random.rand() or the model's own counter, writes it through .data, the optimizer is one
# AdamW per parameter stepped from its post-accumulate-grad hook (registered before offload()),
# the batch size may change each step (replans, and plans reused across shapes: each batch of
# them is trained twice in a row, since a step of new shapes that a known plan may serve keeps
# what it saves and measures their sizes, and its twin runs the plan made from them: NOTE [ one
# plan for many shapes ] in api.py), and the loss may take two or three forwards before its one
# backward. Each side
# of the check has its own Python and NumPy generators, seeded alike once before offload() and
# never reseeded (_Globals): a profiling pass that drew from them would show in a later step.
# LayerDrop ("skipped_blocks"): each block skipped in training with chance 0.1, 0.3 or 0.5,
# drawn with torch's generator (seeded before every forward), so steps run a subset of the
# blocks and the profile's forwards skip some too (NOTE [ skipped stages ] in executor.py); the
# chance is drawn from the model's own seed, not from the description's stream, so that every
# other draw of a seed stays what it was. Not with writes through .data: after a skipped block
# the write lands on another block's output than the profile saw, a write only some steps make,
# which the profile cannot see (docs/model.md: keep= those blocks); the fuzz found it silent.


# -- the differential check -------------------------------------------------------------------

#: Every outcome :func:`differential_check` gives.
OUTCOMES = ("equal", "both_raised", "refused", "silent_difference", "offloaded_only_raise", "plain_only_raise")
#: The outcomes that break the promise.
FAILURES = frozenset({"silent_difference", "offloaded_only_raise", "plain_only_raise"})


@dataclasses.dataclass
class Outcome:
    """What :func:`differential_check` saw.

    Attributes
    ----------
    kind
        One of :data:`OUTCOMES`.
    detail
        One line: the refusal's reason, the two errors, or the first tensor that differed.
    step
        The training step (0-based) where it was decided; ``None`` for ``equal`` / ``refused``.
    offloaded_units
        The units the plan offloaded (empty when nothing was, or when refused).
    plain_error, offloaded_error
        ``"Type: message"`` of each side's exception, if any.
    same_error
        For ``both_raised``: whether both raised the same type with the same message.
    recomputations
        For ``equal``: forward ops the plan ran again per step (0: it recomputed nothing).
    moved_bytes
        For ``equal``: bytes the plan copied device to host in the last step (0: it moved nothing).
    steps
        For ``equal``: per offloaded step that completed a step of a plan, ``(forward ops run
        again, bytes copied device to host)`` (a step that runs no plan's step, say one whose
        blocks a LayerDrop skipped, is left out): whether a plan recomputed, or recomputed and
        moved, in some step, where the last step alone may not (another shape's plan, a skip).
    """

    kind: str
    detail: str = ""
    step: int | None = None
    offloaded_units: tuple[int, ...] = ()
    plain_error: str | None = None
    offloaded_error: str | None = None
    same_error: bool | None = None
    recomputations: int = 0
    moved_bytes: int = 0
    steps: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the promise held (``equal``, ``both_raised`` or ``refused``)."""
        return self.kind not in FAILURES


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bitwise the same tensor: ``torch.equal``, or, where both hold NaNs, the same bits.

    ``torch.equal`` says NaN != NaN; two runs of the same numbers that both overflowed are the
    same training, so NaNs compare by their bits. Never a tolerance.
    """
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
    return bool(a.isnan().any()) and torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"[:300]


def _first_difference(plain: nn.Module, off: nn.Module, what: str) -> str | None:
    """The name of the first parameter (``what``: its value or its grad) that differs."""
    for (name, p), (_, q) in zip(plain.named_parameters(), off.named_parameters(), strict=True):
        a, b = (p.grad, q.grad) if what == "grad" else (p.detach(), q.detach())
        if not _same(a, b):
            return f"{what} of {name}"
    return None


def differential_check(
    case: ModelCase,
    *,
    memory: float,
    steps: int = 3,
    method: str | None = None,
    lr: float = 0.05,
    device: torch.device | str | None = None,
    schedule: Callable[[Any], Any] | None = None,
    **offload_options: Any,
) -> Outcome:
    """Train ``case`` plain and offloaded, side by side, and compare every number bitwise.

    Two identical models are built; one is offloaded with
    ``chainoffload_torch.offload(model, batch, memory=memory, method=method)``. Each step seeds
    the RNG (``torch.manual_seed(seed + step)``) before each forward, runs loss and backward on
    both, compares the losses and every gradient, then takes an SGD step on both and compares
    every parameter. The global RNG state is restored after.

    Parameters
    ----------
    case
        A :class:`ModelCase` (from :func:`random_models` or :func:`draw_model`).
    memory
        A fraction in (0, 1] of the keep-all peak.
    steps
        Optimizer steps.
    method
        The solver (default: :func:`~chainoffload_torch.offload`'s).
    lr
        SGD's learning rate.
    device
        Where both models train (default CPU). On CUDA a few backward kernels (``index_select``'s)
        use atomics, so run-to-run differences there are not the adapter's.
    schedule
        Instead of :func:`~chainoffload_torch.offload`'s plan: a function of the profiled chain
        that returns a schedule for it (one the core's strategies draw, say:
        ``chainoffload.testing.strategies.well_formed_schedules``), carried out by
        :class:`~chainoffload_torch.Offloader` with the profile's blocks. A schedule that
        recomputes a block the profiling passes saw a recomputation would get wrong (its input
        modified in place, pre-hooks of its own: what ``offload()`` never recomputes), or that
        recomputes a block from an offloaded copy of an input written after the block before
        returned it, is refused as ``offload()`` would refuse it (``memory`` is then unused).
    **offload_options
        Passed to :func:`~chainoffload_torch.offload` (default ``repeats=1, warmup=0``).

    Returns
    -------
    Outcome
        ``equal``: losses, gradients and parameters ``torch.equal`` after every step.
        ``both_raised``: both sides raised (in the same step, or offload() itself raised on a
        model plain PyTorch cannot train). ``refused``: ``offload()`` raised a ``ValueError`` /
        ``RuntimeError`` before training a model plain PyTorch trains. Failures: ``silent_difference``
        (a number differs), ``offloaded_only_raise`` (including any other exception type from
        ``offload()``), ``plain_only_raise`` (the offloaded model trained what plain PyTorch
        refuses).
    """
    from . import offload

    if not isinstance(memory, (int, float)) or isinstance(memory, bool) or not 0 < memory <= 1:
        raise ValueError(f"memory: {memory!r} must be a fraction in (0, 1] of the keep-all peak")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: {steps!r} must be an integer >= 1")
    options = {"repeats": 1, "warmup": 0, **offload_options}
    seed = case.spec.seed
    dev = torch.device(device) if device is not None else None
    cuda = [dev.index or 0] if dev is not None and dev.type == "cuda" else []
    sides = (_Globals(seed), _Globals(seed))
    with torch.random.fork_rng(devices=cuda):
        plain, off = case.build(dev), case.build(dev)
        batch = case.batch(dev, 0)
        # What offload() draws from torch's generator (the discovery's forward, the profile's:
        # a LayerDrop model's skips) is the model's own, not whatever the process's random
        # initial seed or the models checked before it left: a check is repeatable alone.
        torch.manual_seed(seed)
        handle = None
        setup_error: BaseException | None = None
        try:
            with sides[1]:  # what offload() draws would show in the offloaded side's steps
                if schedule is None:
                    handle = offload(off, batch, memory=float(memory), method=method, **options)
                else:
                    handle = _hand_plan(off, batch, schedule, options)
        except Exception as exc:  # noqa: BLE001 - every exception is an outcome to classify
            setup_error = exc
        case.register_late_hooks(plain)
        case.register_late_hooks(off)
        units = tuple(handle.schedule.offloaded_units) if handle is not None else ()
        seen: list[Any] = []

        def on_step() -> None:
            last = handle.last_step
            if last is not None and not any(last is s for s in seen):
                seen.append(last)

        try:
            outcome = _train_both(case, plain, off, batch, seed, steps, lr, setup_error, units, sides, on_step)
            if outcome.kind == "equal" and handle.last_step is not None:
                last = handle.last_step
                outcome = dataclasses.replace(
                    outcome, recomputations=last.recomputed_ops, moved_bytes=last.offloaded_bytes,
                    steps=tuple((s.recomputed_ops, s.offloaded_bytes) for s in seen),
                )
            return outcome
        finally:
            if handle is not None:
                handle.remove()


def _hand_plan(model: nn.Module, batch: tuple, schedule: Callable[[Any], Any], options: dict[str, Any]) -> Any:
    """An :class:`~chainoffload_torch.Offloader` of ``schedule(chain)`` on ``model``'s profile."""
    import chainoffload as co

    from . import Offloader
    from ._instrument import Instrument
    from ._recorder import _Recorder, measure_chain
    from .plans import _Unsafe, _watch_blocks, not_recomputable, stale_inputs
    from .profiler import Profile, _device_of, _root_and_blocks, as_call

    # profile() without making the code before the first block a stage: no schedule may recompute
    # that stage, and the core's strategies draw schedules that start with Fck_1 as often as not.
    args, kwargs = as_call(batch)
    dev = _device_of(model, args, kwargs, None)
    root, blocks, reference = _root_and_blocks(model, args, kwargs, None, dev)
    instrument = Instrument(root, blocks, _Recorder(blocks.stages, dev, (root,)))
    instrument.install()
    try:
        with _watch_blocks(blocks) as unsafe:
            chain, sizes = measure_chain(
                instrument, root, args, kwargs, dev, repeats=options.get("repeats", 1), warmup=options.get("warmup", 0),
                name="fuzz", nosave=False, split_prefix=False, reference=reference,
            )
    finally:
        instrument.remove()
    prof = Profile(chain, co.Platform(memory=co.keep_all_peak(chain), bandwidth_d2h=1e12, bandwidth_h2d=1e12, latency=0.0, duplex=True), sizes, dev, blocks)
    sched = schedule(prof.chain)
    banned = not_recomputable(prof.chain, prof.sizes, _Unsafe(prof.blocks, unsafe))
    comp = sched.compute
    firsts: set[int] = set()
    for kind, i in comp:
        if kind == "B":
            continue
        redo = i in firsts
        firsts.add(i)
        if (kind != "F" or redo) and i in banned:
            raise ValueError(f"schedule: recomputes stage {i}, which offload() never recomputes: {banned[i]}")
    stale = stale_inputs(prof.chain, _Unsafe(prof.blocks, unsafe), sched)
    if stale:
        # NOTE [ an input written after its block returned ] in plans.py.
        i = min(stale)
        raise ValueError(f"schedule: recomputes stage {i} from an offloaded copy of its input, which offload() never does: {stale[i]}")
    bad = sorted(set(sched.offloaded_units) & set(prof.sizes.resident))
    if bad:
        raise ValueError(f"schedule: offloads unit(s) {bad}, which offload() keeps resident (aliased, held or unmovable)")
    platform = prof.platform.with_memory(co.keep_all_peak(prof.chain))
    return Offloader(model, prof.chain, sched, platform=platform, blocks=prof.blocks)


def _step(case: ModelCase, model: nn.Module, batch: tuple, seed: int) -> tuple[torch.Tensor | None, BaseException | None]:
    torch.manual_seed(seed)
    try:
        loss = case.loss(model, batch)
        loss.backward()
        return loss.detach(), None
    except Exception as exc:  # noqa: BLE001
        return None, exc


def _train_both(
    case: ModelCase,
    plain: nn.Module,
    off: nn.Module,
    batch: tuple,
    seed: int,
    steps: int,
    lr: float,
    setup_error: BaseException | None,
    units: tuple[int, ...],
    sides: tuple[_Globals, _Globals] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Outcome:
    if sides is None:
        sides = (_Globals(seed), _Globals(seed))
    # NOTE [ the loops the fuzz draws ]: an optimizer in hooks steps from the backward itself.
    in_loop = case.spec.optimizer == "sgd"
    opt_plain = torch.optim.SGD(plain.parameters(), lr=lr) if in_loop else None
    opt_off = torch.optim.SGD(off.parameters(), lr=lr) if setup_error is None and in_loop else None
    device = batch[0].device
    # NOTE [ the loops the fuzz draws ]: shapes that change, each batch twice in a row.
    order = [k for k in range(steps) for _ in range(2 if case.spec.batches else 1)]
    for step in order:
        if step and case.spec.batches:
            batch = case.batch(device, step)
        if opt_plain is not None:
            opt_plain.zero_grad()
        with sides[0]:
            loss_p, err_p = _step(case, plain, batch, seed + step)
        if setup_error is not None:
            if err_p is not None:
                return Outcome(
                    "both_raised",
                    f"offload() raised {_err(setup_error)}; plain raised {_err(err_p)} in step {step}",
                    step,
                    plain_error=_err(err_p),
                    offloaded_error=_err(setup_error),
                    same_error=_err(err_p) == _err(setup_error),
                )
            continue
        if opt_off is not None:
            opt_off.zero_grad()
        with sides[1]:
            loss_o, err_o = _step(case, off, batch, seed + step)
        if err_o is None and on_step is not None:
            on_step()
        if err_p is not None or err_o is not None:
            kind = "both_raised" if err_p is not None and err_o is not None else (
                "plain_only_raise" if err_p is not None else "offloaded_only_raise"
            )
            ep = None if err_p is None else _err(err_p)
            eo = None if err_o is None else _err(err_o)
            detail = f"plain: {ep or 'trained'}; offloaded: {eo or 'trained'}"
            if kind == "offloaded_only_raise":
                detail += " | " + "".join(traceback.format_exception(err_o)[-3:]).replace("\n", " ")[:400]
            return Outcome(kind, detail, step, units, ep, eo, None if kind != "both_raised" else ep == eo)
        if not _same(loss_p, loss_o):
            return Outcome("silent_difference", f"loss differs in step {step}: {loss_p.item()!r} vs {loss_o.item()!r}", step, units)
        where = _first_difference(plain, off, "grad")
        if where is not None:
            return Outcome("silent_difference", f"{where} differs in step {step}", step, units)
        if opt_plain is not None:
            opt_plain.step()
            opt_off.step()
        where = _first_difference(plain, off, "value")
        if where is not None:
            return Outcome("silent_difference", f"{where} differs after step {step}", step, units)
    if setup_error is not None:
        msg = _err(setup_error)
        if isinstance(setup_error, (ValueError, RuntimeError)):
            return Outcome("refused", msg)
        return Outcome("offloaded_only_raise", f"offload() crashed: {msg}", None, (), None, msg)
    return Outcome("equal", f"{len(order)} steps bitwise equal", None, units)
