"""Exact sizes and roofline times of a staged network, traced on PyTorch's meta device.

One training iteration F_1..F_L, B_L..B_1 runs on ``device="meta"``: every tensor has its real
shape, dtype and storage but no data, so ResNet-152 at batch 64 costs a few seconds of CPU and no
memory. Three instruments watch it:

* a ``saved_tensors_hooks`` pack hook records the storages autograd saves during F_i;
* a ``TorchDispatchMode`` sees every aten op: it records each new output storage (allocation)
  and, through a ``weakref.finalize`` on the storage, when it dies (free), giving the exact
  activation-memory curve of the iteration; and it adds each op's FLOPs (PyTorch's own
  formulas, ``torch.utils.flop_counter.flop_registry``) and bytes read and written to the
  stage running it, for the roofline;
* parameters, buffers and parameter gradients are kept out of every figure (docs/model.md: weights
  and optimizer state are outside the activation budget).

NOTE [ meta device checks ]: (1) the pack hook fires on meta and storages have their real
``nbytes``; (2) a storage's Python object is preserved while the storage lives, so ``id()`` of
``untyped_storage()`` is a stable identity and a finalizer on it fires exactly when the storage
is freed. ``tests/test_networks.py`` checks both on a small case against hand-counted bytes, and
that ``saved`` equals what the allocation log says F_i left alive.

How each chain field is derived (docs/model.md's model):

* ``act[i]``: bytes of the storage of stage i's output (``act[0]``: the input; ``act[L]``: the
  scalar loss).
* ``saved[i]``: distinct storages the pack hook sees during F_i, deduplicated by storage, plus
  the output's, minus parameters, buffers and the stage's input (which is unit i-1's).
* ``fwd_tmp[i]``: the model charges ``saved[i] + fwd_tmp[i]`` from the start of F_i; the trace
  gives the real peak P of memory allocated during F_i above what was live at its start, so
  ``fwd_tmp[i] = P - saved[i]`` (tensors made and freed inside the stage, e.g. a batch norm output
  before an out-of-place op, a concatenation's inputs).
* ``bwd_tmp[i]``: the model charges ``act[i-1] + bwd_tmp[i]`` (g_{i-1} and scratch) from the start of
  B_i and frees at its end; the trace gives the real peak Q of B_i above its start, counting
  the frees of saved tensors as they happen, so ``bwd_tmp[i] = max(0, Q - act[i-1])``.
* ``fwd[i]``, ``bwd[i]``: the sum over the aten ops of F_i / B_i of a roofline (see
  :class:`Roofline`). B_i's ops are the real backward ops of the stage, so bwd is not a fixed
  multiple of fwd (stage 1 computes no input gradient, an in-place ReLU's backward is one pass).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from network_models import Staged

__all__ = ["Roofline", "A100_SXM4_40GB", "V100_SXM2_16GB", "StageFigures", "measure"]

_aten = torch.ops.aten
_CONV_OPS = {_aten.convolution, _aten._convolution, _aten.convolution_backward}
_NO_TRAFFIC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh"}


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Time of one aten op: ``max(flops / (peak * compute_efficiency), bytes / (bandwidth * memory_efficiency))``.

    Attributes
    ----------
    name
        The GPU, as NVIDIA names it.
    peak_bf16, peak_tf32, peak_fp32
        Dense tensor-core / CUDA-core peaks in FLOP/s. Which one applies: bfloat16 ops use
        ``peak_bf16``; float32 convolutions ``peak_tf32`` (cuDNN's default,
        ``torch.backends.cudnn.allow_tf32 = True``); float32 matmuls ``peak_fp32`` (PyTorch's
        default, ``torch.backends.cuda.matmul.allow_tf32 = False``).
    bandwidth
        HBM bandwidth in bytes/s.
    compute_efficiency, memory_efficiency
        Fractions of peak that kernels reach, one number each for the whole network.
    """

    name: str
    peak_bf16: float
    peak_tf32: float
    peak_fp32: float
    bandwidth: float
    compute_efficiency: float
    memory_efficiency: float

    def op_time(self, func: Any, dtype: torch.dtype, flops: float, nbytes: float) -> float:
        """Seconds for one op doing ``flops`` FLOPs and moving ``nbytes`` bytes in ``dtype``."""
        if dtype in (torch.bfloat16, torch.float16):
            peak = self.peak_bf16
        elif func._overloadpacket in _CONV_OPS:
            peak = self.peak_tf32
        else:
            peak = self.peak_fp32
        return max(flops / (peak * self.compute_efficiency), nbytes / (self.bandwidth * self.memory_efficiency))

    def describe(self) -> str:
        """One line for the catalog and the README."""
        head = (
            f"roofline of one {self.name}: per aten op max(FLOPs / (peak x {self.compute_efficiency}), "
            f"bytes / ({self.bandwidth / 1e12:g} TB/s x {self.memory_efficiency})), peak "
        )
        if self.peak_tf32 == self.peak_fp32:
            # No TF32 on this GPU: float32 convolutions run on the CUDA cores like matmuls.
            return head + (
                f"{self.peak_fp32 / 1e12:g} TFLOP/s fp32 (convolutions and matmuls, no TF32), "
                f"{self.peak_bf16 / 1e12:g} fp16 tensor cores (for the bf16 chains, as fp16: no bf16 on this GPU)"
            )
        return head + (
            f"{self.peak_bf16 / 1e12:g} TFLOP/s bf16, {self.peak_tf32 / 1e12:g} TF32 (fp32 convolutions), "
            f"{self.peak_fp32 / 1e12:g} fp32 (fp32 matmuls)"
        )


#: NVIDIA A100-SXM4-40GB datasheet figures (dense, no sparsity); efficiencies are our choice.
A100_SXM4_40GB = Roofline(
    name="NVIDIA A100-SXM4-40GB",
    peak_bf16=312e12,
    peak_tf32=156e12,
    peak_fp32=19.5e12,
    bandwidth=1.555e12,
    compute_efficiency=0.6,
    memory_efficiency=0.8,
)

#: NVIDIA Tesla V100-SXM2-16GB datasheet figures, the GPU of the NeurIPS 2021 paper's experiments:
#: no TF32 (Volta), so float32 convolutions run at the 15.7 TFLOP/s fp32 peak; half precision
#: on tensor cores (fp16: Volta has no bf16, so a bf16 chain stands for its fp16 twin, same
#: sizes). Efficiencies as for the A100.
V100_SXM2_16GB = Roofline(
    name="NVIDIA Tesla V100-SXM2-16GB",
    peak_bf16=125e12,
    peak_tf32=15.7e12,
    peak_fp32=15.7e12,
    bandwidth=0.9e12,
    compute_efficiency=0.6,
    memory_efficiency=0.8,
)


@dataclasses.dataclass
class StageFigures:
    """What the trace measured for one stage (sizes in bytes, times in seconds, FLOPs)."""

    label: str
    act: int
    saved: int
    fwd_tmp: int
    bwd_tmp: int
    fwd: float
    bwd: float
    fwd_flops: float
    bwd_flops: float
    retained: int  # bytes F_i allocated that were still live at its end (must equal saved)
    # (fwd, bwd) of the stage under each extra roofline given to measure(), in that order
    also: list[tuple[float, float]] = dataclasses.field(default_factory=list)


class _Window:
    """Per-stage accumulator of op costs."""

    def __init__(self, extra: int) -> None:
        self.time = 0.0
        self.flops = 0.0
        self.also = [0.0] * extra


class _Tracker(TorchDispatchMode):
    """Allocation log and op costs of everything dispatched while active (see module doc)."""

    def __init__(self, roofline: Roofline, preexisting: set[int], also: tuple[Roofline, ...] = ()) -> None:
        super().__init__()
        self.roofline = roofline
        self.also = also
        # id() of storages made before the trace (parameters, buffers, a_0): alive throughout,
        # so their ids are never reused; an op whose output aliases one of them allocates nothing
        self.preexisting = preexisting
        self.live: dict[int, tuple[int, int]] = {}  # id(storage) -> (token, nbytes)
        self.events: list[tuple[int, int]] = []  # (token, +nbytes | -nbytes) in time order
        self.window: _Window | None = None
        self._tokens = itertools.count()

    def _free(self, key: int, token: int) -> None:
        entry = self.live.get(key)
        if entry is not None and entry[0] == token:
            del self.live[key]
            self.events.append((token, -entry[1]))

    def track(self, t: torch.Tensor) -> None:
        """Log ``t``'s storage as allocated now if it is new."""
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.live or key in self.preexisting:
            return
        token = next(self._tokens)
        nbytes = storage.nbytes()
        self.live[key] = (token, nbytes)
        self.events.append((token, nbytes))
        weakref.finalize(storage, self._free, key, token)

    def token_of(self, t: torch.Tensor) -> int | None:
        entry = self.live.get(id(t.untyped_storage()))
        return None if entry is None else entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in outs:
            self.track(t)
        if self.window is not None and not func.is_view and func._overloadpacket.__name__ not in _NO_TRAFFIC:
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(t.numel() * t.element_size() for t in itertools.chain(ins, outs))
            formula = flop_registry.get(func._overloadpacket)
            flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
            dtype = (ins or outs)[0].dtype if (ins or outs) else torch.float32
            self.window.time += self.roofline.op_time(func, dtype, flops, nbytes)
            for k, other in enumerate(self.also):
                self.window.also[k] += other.op_time(func, dtype, flops, nbytes)
            self.window.flops += flops
        return out


def _peak(events: list[tuple[int, int]], exclude: set[int]) -> int:
    """Highest running sum of the events (starting from 0), ignoring tokens in ``exclude``."""
    level = peak = 0
    for token, delta in events:
        if token in exclude:
            continue
        level += delta
        peak = max(peak, level)
    return peak


def _saved_recorder(seen: dict[int, int], own: set[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A pack hook that records in ``seen`` the bytes of every storage autograd saves, except the
    storages in ``own`` (parameters, buffers, the stage's input)."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if id(s) not in own:
            seen[id(s)] = s.nbytes()
        # a detached alias: returning t itself would make an output saved by its own grad_fn a
        # reference cycle, and its storage would never be freed
        return t.detach()

    return pack


def measure(
    staged: Staged, roofline: Roofline = A100_SXM4_40GB, also: tuple[Roofline, ...] = ()
) -> tuple[int, list[StageFigures]]:
    """Trace one training iteration of ``staged`` (built on the meta device) stage by stage.

    Parameters
    ----------
    staged
        The network; its modules must live on the meta device (build it under
        ``with torch.device("meta")``) in training mode. All on ``cpu`` also works, with real
        data: the tests compare the two on small cases.
    roofline
        The GPU model for the times.
    also
        Further GPU models: each stage's times under them land in ``StageFigures.also``
        (the same ops, FLOPs and bytes, priced by another roofline).

    Returns
    -------
    act0, stages
        Bytes of the input a_0, and one :class:`StageFigures` per stage.
    """
    modules = [m for _, m in staged.stages]
    excluded: set[int] = set()  # id() of parameter and buffer storages
    devices = set()
    for m in modules:
        for t in itertools.chain(m.parameters(), m.buffers()):
            devices.add(t.device.type)
            excluded.add(id(t.untyped_storage()))
    if not devices <= {"meta"} and devices != {"cpu"}:
        raise ValueError(
            f"measure: stage tensors must all be on the meta device (or all on cpu, for checks), found {sorted(devices)}"
        )
    device = devices.pop() if devices else "meta"
    figures: list[StageFigures] = []
    x0 = torch.zeros(staged.input_shape, dtype=staged.input_dtype, device=device)
    act0 = x0.untyped_storage().nbytes()
    tracker = _Tracker(roofline, excluded | {id(x0.untyped_storage())}, tuple(also))
    inputs: list[torch.Tensor | None] = []
    outputs: list[torch.Tensor | None] = []

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a window would free earlier garbage at a random point
    try:
        with tracker:
            for i, (label, module) in enumerate(staged.stages):
                if i == 0:
                    x = x0
                else:
                    prev = outputs[-1]
                    assert prev is not None
                    x = prev.detach().requires_grad_(prev.is_floating_point())
                seen: dict[int, int] = {}
                pack = _saved_recorder(seen, excluded | {id(x.untyped_storage())})
                start = len(tracker.events)
                tracker.window = window = _Window(len(also))
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    y = module(x)
                tracker.window = None
                out_storage = y.untyped_storage()
                seen[id(out_storage)] = out_storage.nbytes()
                saved = sum(seen.values())
                f_events = tracker.events[start:]
                freed = {tok for tok, d in f_events if d < 0}
                retained = sum(d for tok, d in f_events if d > 0 and tok not in freed)
                peak = _peak(f_events, set())
                figures.append(
                    StageFigures(
                        label=label,
                        act=out_storage.nbytes(),
                        saved=saved,
                        fwd_tmp=max(0, peak - saved),
                        bwd_tmp=0,
                        fwd=window.time,
                        bwd=0.0,
                        fwd_flops=window.flops,
                        bwd_flops=0.0,
                        retained=retained,
                        also=[(t, 0.0) for t in window.also],
                    )
                )
                inputs.append(x)
                outputs.append(y)
                del x, y, seen, pack

            act_in = [act0] + [f.act for f in figures[:-1]]
            grad: torch.Tensor | None = None
            for i in reversed(range(len(modules))):
                y = outputs[i]
                assert y is not None
                if grad is None:
                    grad = torch.ones_like(y)  # g_L, the loss gradient (allocated before B_L)
                gc.collect()
                start = len(tracker.events)
                tracker.window = window = _Window(len(also))
                torch.autograd.backward(y, grad)
                tracker.window = None
                param_grads = set()
                for p in modules[i].parameters():
                    if p.grad is not None:
                        tok = tracker.token_of(p.grad)
                        if tok is not None:
                            param_grads.add(tok)
                peak = _peak(tracker.events[start:], param_grads)
                fig = figures[i]
                fig.bwd_tmp = max(0, peak - act_in[i])
                fig.bwd = window.time
                fig.also = [(f, b) for (f, _), b in zip(fig.also, window.also, strict=True)]
                fig.bwd_flops = window.flops
                x = inputs[i]
                assert x is not None
                grad = x.grad if i > 0 else None
                outputs[i] = inputs[i] = None
                del x, y
    finally:
        tracker.window = None
        if was_enabled:
            gc.enable()
    return act0, figures
