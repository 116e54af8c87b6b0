"""The tensors inside a call's arguments or a module's outputs, and the key of a call's shapes.

Models are called with a tensor, a tuple of arguments or keyword arguments (the Hugging Face
way), and return tensors, tuples, dicts or ``ModelOutput`` objects (ordered dicts). These
helpers walk such structures without knowing their types.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["tensors_in", "first_tensor", "signature", "call_key", "describe_key", "held_tensors", "autocast_state"]

# Leaves of a call's key other than tensors: values that change what the forward computes.
_PLAIN = (bool, int, float, str, type(None))


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``: itself, or inside (nested) tuples, lists and mappings, in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from tensors_in(v)


def held_tensors(obj: Any, depth: int = 4) -> Iterator[torch.Tensor]:
    """:func:`tensors_in`, also looking ``depth`` levels into the attributes of other objects.

    A model's output may hold activations inside an object of its own (a Hugging Face
    ``DynamicCache`` keeps every layer's keys and values); modules are not looked into.
    """
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth <= 0 or isinstance(obj, (nn.Module, *_PLAIN)):
        return
    if isinstance(obj, Mapping):
        values = list(obj.values())
    elif isinstance(obj, (tuple, list)):
        values = list(obj)
    elif hasattr(obj, "__dict__"):
        values = list(vars(obj).values())
    else:
        return
    for v in values:
        yield from held_tensors(v, depth - 1)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The hidden state in a block's output: the output itself, or its first tensor."""
    return next(tensors_in(obj), None)


def signature(t: Any) -> tuple | None:
    """What identifies a tensor's data while it is alive: (device, storage address, offset,
    shape, stride, dtype); ``None`` for anything else. An alias a wrapper makes of a tensor (a
    new object over the same data, as FSDP's pre-forward hook hands a block) has the same."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return None
    return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _leaf_key(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype), str(obj.device), obj.requires_grad)
    if isinstance(obj, _PLAIN):
        return obj
    return type(obj).__name__


def _key(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return ("map", tuple((k, _key(v)) for k, v in obj.items()))
    if isinstance(obj, (tuple, list)):
        return ("seq", tuple(_key(v) for v in obj))
    return _leaf_key(obj)


def call_key(model: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """A hashable key of what a plan depends on in one call of ``model``.

    The shapes, dtypes and devices of every tensor argument, the values of plain arguments
    (flags such as ``use_cache``), the model's training mode and the autocast state: two calls
    with the same key save the same storages in the same blocks.
    """
    device = next((t.device.type for t in tensors_in((args, kwargs))), "cpu")
    return (model.training, autocast_state(device), _key(tuple(args)), _key(dict(sorted(kwargs.items()))))


def autocast_state(device_type: str) -> tuple[bool, str | None]:
    """(enabled, dtype) of autocast for ``device_type`` ("cpu", "cuda", ...)."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if enabled else None
    except TypeError:  # torch < 2.4: no device-type argument
        enabled = torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        dtype = (torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()) if enabled else None
    return enabled, None if dtype is None else str(dtype)


def describe_key(key: tuple | None) -> str:
    """The tensor shapes of a :func:`call_key`, for messages: ``input_ids=(8, 128) int64, ...``."""
    if key is None:
        return "any shapes"
    parts: list[str] = []

    def walk(k: Any, name: str) -> None:
        if isinstance(k, tuple) and k and k[0] == "tensor":
            shape = "(" + ", ".join(str(d) for d in k[1]) + ("," if len(k[1]) == 1 else "") + ")"
            parts.append(f"{name}={shape} {k[2].replace('torch.', '')}")
        elif isinstance(k, tuple) and k and k[0] == "map":
            for sub, v in k[1]:
                walk(v, f"{name}.{sub}" if name else str(sub))
        elif isinstance(k, tuple) and k and k[0] == "seq":
            for idx, v in enumerate(k[1]):
                walk(v, f"{name}[{idx}]" if name else f"arg{idx}")

    _, amp, args, kwargs = key
    walk(args, "")
    walk(kwargs, "")
    text = ", ".join(parts) or "no tensors"
    if amp[0]:
        text += f" (autocast {amp[1].replace('torch.', '')})"
    return text
