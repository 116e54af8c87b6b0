"""The public profile API: a model into a :class:`chainoffload.Chain`, its link into a Platform.

:func:`profile`, :func:`profile_full` and :func:`measure_sizes` find the blocks, install an
instrument and run the recorder's steps (``_recorder.py``), then measure the link
(``_link.py``). The chain's stages are the model's blocks (:func:`~chainoffload_torch.find_blocks`);
everything is measured in whole training steps of the real model, through the same hooks the
executor uses (see NOTE [ what the profiler measures ]):

* ``act[i]``: bytes of block i's hidden output a_i (numel x element size). ``act[0]``: the
  hidden input of block 1 alone. What the code before it (embeddings, a stem) saves besides it,
  and the storages of units held beyond their backward (by the model's output, later blocks,
  or the forward's own code: NOTE [ units held elsewhere ]) stay resident outside the chain
  (``Sizes.resident_bytes``, NOTE [ resident outside the chain ] in plans.py); a large stem is
  a stage of its own instead (NOTE [ prefix and suffix ]).
* ``saved[i]``: bytes of the storages unit i owns after one forward under
  ``saved_tensors_hooks`` (:class:`~chainoffload_torch._stages.UnitLedger`: what is saved from
  the start of block i to the start of block i+1 that is not an earlier unit's, a parameter,
  a buffer or an input, plus its output; for the last block, also what the head and the loss
  save), each storage counted once, whole. The executor moves exactly these storages.
* ``fwd[i]``, ``bwd[i]``, ``fwd_nosave[i]``: the time between boundary events of whole steps
  (forward and backward of the model), the median of ``repeats`` steps after ``warmup``, or
  with both ``None`` of as few steps as agree (one when it agrees with the forward before it;
  NOTE [ how many profiling steps ]); CUDA events on a GPU, ``perf_counter`` on CPU. The code before block 1 is timed into stage 1 and
  the code after block L into stage L, so the chain's compute time is the step's.
* ``fwd_tmp[i]``, ``bwd_tmp[i]``: on CUDA, the allocator's peak during F_i above what is
  allocated at its end, and during B_i above what is allocated at its start plus g_{i-1}.
  On CPU there is no allocator peak to read: both are 0.
* The link (:func:`measure_link`, in ``_link.py``): on CUDA, pinned-host copies on a side
  stream, each direction alone at two sizes (latency + bytes / bandwidth fitted through them),
  then both at once on two streams (``duplex`` when together they take clearly less than one
  after the other). On CPU, the "link" is a host memcpy measured the same way, and ``duplex``
  is true (no copy engines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import chainoffload as co

from ._coverage import Coverage, coverage
from ._discovery import Blocks, find_blocks, find_blocks_warm
from ._instrument import Instrument
from ._link import link_of, measure_link
from ._recorder import Sizes, _measure, _Recorder, measure_chain, prefix_pays, profiling_steps
from ._stages import canonical_device
from ._tree import tensors_in

__all__ = ["Sizes", "measure_sizes", "measure_link", "link_of", "profile", "profile_full", "Profile", "as_call", "prefix_pays"]


@dataclasses.dataclass(frozen=True)
class Profile:
    """Everything :func:`profile_full` measured."""

    chain: co.Chain
    platform: co.Platform
    sizes: Sizes
    device: torch.device
    blocks: Blocks

    @property
    def coverage(self) -> Coverage:
        """What share of the keep-all peak the chain can move, and what it leaves out
        (:class:`chainoffload_torch.plans.Coverage`; ``.describe()`` says it in one line)."""
        return coverage(self.chain, self.sizes, self.blocks)


def as_call(sample: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of a sample: a tensor, a tuple of positional arguments, or a mapping
    of keyword arguments (the Hugging Face way)."""
    if isinstance(sample, tuple):
        return sample, {}
    if isinstance(sample, Mapping):
        return (), dict(sample)
    return (sample,), {}


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to_device(v, device) for v in obj)
    if isinstance(obj, list):
        return [_to_device(v, device) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _root_and_blocks(
    model: Any, args: tuple, kwargs: dict, blocks: Any, device: torch.device | None = None
) -> tuple[nn.Module, Blocks, float | None]:
    """The module whose forward is a step, its blocks, and with ``device`` the seconds of the
    discovery's forward, run with autograd as the profile's warm-up (NOTE [ discovery as the
    warm-up ]; else ``None``); a list of stages becomes a Sequential."""
    if isinstance(model, nn.Module):
        root = model
    elif isinstance(model, (list, tuple)):
        root = nn.Sequential(*model)
        blocks = list(root) if blocks is None else blocks
    else:
        raise TypeError(f"model: expected an nn.Module or a list of modules, got {type(model).__name__}")
    if device is None:
        return root, find_blocks(root, args, kwargs, blocks), None
    return root, *find_blocks_warm(root, args, kwargs, blocks, device)


def _device_of(model: nn.Module, args: tuple, kwargs: dict, device: Any) -> torch.device:
    if device is not None:
        return canonical_device(device)
    param = next(model.parameters(), None)
    if param is not None:
        return param.device
    return next((t.device for t in tensors_in((args, kwargs))), torch.device("cpu"))


def measure_sizes(model: Any, sample: Any, *, blocks: Any = None) -> Sizes:
    """The sizes (act, saved) of ``model``'s chain for input ``sample``, without timing.

    Runs one forward with autograd under ``saved_tensors_hooks``; the model's buffers, grads
    and the RNG state are restored afterwards.

    Parameters
    ----------
    model
        An ``nn.Module`` (its blocks are found, or given by ``blocks``), an
        ``nn.Sequential`` or a list of modules (the stages).
    sample
        What the model is called with: a tensor, a tuple of positional arguments or a dict of
        keyword arguments, on the model's device.
    blocks
        As for :func:`chainoffload_torch.offload`.

    Returns
    -------
    Sizes
    """
    args, kwargs = as_call(_check_sample(sample))
    root, blks, _ = _root_and_blocks(model, args, kwargs, blocks)
    device = _device_of(root, args, kwargs, None)
    wrong = [t.device for t in tensors_in((args, kwargs)) if t.device != device]
    if wrong:
        raise ValueError(f"sample: is on {wrong[0]} but the model is on {device}")
    instrument = Instrument(root, blks, _Recorder(blks.stages, device, (root,)))
    instrument.install()
    try:
        sizes, _ = _measure(instrument, root, args, kwargs, device, 1, 0, timed=False, split_prefix=True)
    finally:
        instrument.remove()
    return sizes


def _check_sample(sample: Any) -> Any:
    if not any(True for _ in tensors_in(as_call(sample))):
        raise TypeError(
            f"sample: expected a tensor, a tuple of arguments or a dict of keyword arguments holding tensors, got {type(sample).__name__}"
        )
    return sample


def profile_full(
    model: Any,
    sample_input: Any,
    *,
    blocks: Any = None,
    device: torch.device | str | None = None,
    repeats: int | None = 5,
    warmup: int | None = 1,
    memory: int | None = None,
    name: str | None = None,
    measure_platform: bool = True,
    link_bytes: int | None = None,
    nosave: bool = True,
) -> Profile:
    """:func:`profile`, also returning the :class:`Sizes` (with the units that must stay
    resident), the device and the blocks.

    ``repeats=None, warmup=None`` takes as many steps as the timings need (NOTE [ how many
    profiling steps ]); ``nosave=False`` skips the forward without autograd that measures
    ``fwd_nosave`` (the chain then has none: only rematerializing methods read it).
    """
    repeats, warmup = profiling_steps(repeats, warmup, 5)
    args, kwargs = as_call(_check_sample(sample_input))
    probe = model if isinstance(model, nn.Module) else nn.Sequential(*model) if isinstance(model, (list, tuple)) else model
    dev = torch.device("cpu")
    if isinstance(probe, nn.Module):
        dev = _device_of(probe, args, kwargs, device)
        args, kwargs = _to_device(args, dev), _to_device(kwargs, dev)
    root, blks, reference = _root_and_blocks(model, args, kwargs, blocks, dev)
    dev = _device_of(root, args, kwargs, device)
    instrument = Instrument(root, blks, _Recorder(blks.stages, dev, (root,)))
    instrument.install()
    try:
        label = name or (type(model).__name__ if isinstance(model, nn.Module) else "chain")
        chain, sizes = measure_chain(
            instrument, root, args, kwargs, dev, repeats=repeats, warmup=warmup, name=label, nosave=nosave,
            split_prefix=True, reference=reference,
        )
        blks = instrument.blocks  # the stem may have become stage 1 (NOTE [ the prefix as a stage ])
    finally:
        instrument.remove()
    if measure_platform:
        link = link_of(dev, nbytes=link_bytes, repeats=max(3, repeats or 3))
    else:
        link = {"bandwidth_d2h": float("inf"), "bandwidth_h2d": float("inf"), "latency": 0.0, "duplex": True}
    mem = co.keep_all_peak(chain) if memory is None else int(memory)
    return Profile(chain, co.Platform(memory=mem, **link), sizes, dev, blks)


def profile(
    model: Any,
    sample_input: Any,
    *,
    blocks: Any = None,
    device: torch.device | str | None = None,
    repeats: int | None = 5,
    warmup: int | None = 1,
    memory: int | None = None,
    name: str | None = None,
) -> tuple[co.Chain, co.Platform]:
    """Profile ``model`` on ``sample_input`` into a chain and the platform it runs on.

    Parameters
    ----------
    model
        Any ``nn.Module`` whose blocks are found (or given by ``blocks``), or a list of
        modules (the stages, called one after the other); on its device.
    sample_input
        What the model is called with: a tensor, a tuple of positional arguments, or a dict
        of keyword arguments (``{"input_ids": ids, "labels": ids}``); moved to ``device`` if
        elsewhere.
    blocks
        The chain's stages, as for :func:`chainoffload_torch.offload`: ``None`` finds them.
    device
        Where to profile; default the model's (first parameter's) device.
    repeats, warmup
        Timed steps (the median is kept) and untimed steps before them, each followed by a
        forward without autograd (``fwd_nosave``). Both ``None``: as many steps as the timings
        need, one when the first agrees with block discovery's forward, at most 4 (what
        :func:`chainoffload_torch.offload` does: NOTE [ how many profiling steps ]).
    memory
        The platform's memory; default the keep-all peak of the profiled chain (so every
        schedule that offloads nothing fits, and a smaller value asks for offloading).
    name
        The chain's name; default the model's class name.

    Returns
    -------
    (Chain, Platform)
        Both save as docs/model.md's JSON with ``.save(path)``. See the module docstring for what
        each field measures on CUDA and on CPU.

    Raises
    ------
    ValueError
        No blocks found (the message says which module lists were seen and how to pass
        ``blocks=``), or bad ``repeats`` / ``warmup``.

    Notes
    -----
    Cost: a forward with autograd and no backward (block discovery, NOTE [ discovery as the
    warm-up ]), the probe's forward alone on each layout the profile tries (NOTE [ storages the
    forward keeps ]; two when the stem becomes a stage), then ``warmup + repeats`` steps, each
    followed by a forward without autograd, and the link (host copies, once per process).
    """
    prof = profile_full(
        model, sample_input, blocks=blocks, device=device, repeats=repeats, warmup=warmup, memory=memory, name=name
    )
    return prof.chain, prof.platform
