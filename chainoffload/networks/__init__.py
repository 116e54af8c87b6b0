"""Chains of real networks, shipped as package data (``chainoffload/networks/<name>.json``).

ResNet-18/50/101/152, VGG-16/19, DenseNet-121, Inception-v3 and two GPT-2-like transformer
stacks, each cut into block-level stages, at realistic batch and input sizes. Sizes (``act``,
``saved``, ``fwd_tmp``, ``bwd_tmp``) are exact for PyTorch's autograd: they were traced from one
training iteration on PyTorch's meta device. Times are a documented roofline of one NVIDIA
A100-SXM4-40GB unless the catalog says they were measured; each network also ships a V100-era
twin (``gpu="V100"``: the same sizes, times from a roofline of one Tesla V100, float32 without
TF32, the platform of the NeurIPS 2021 rematerialization + offloading paper). ``README.md`` in
this directory says where every number comes from; ``benchmarks/networks/build.py``
regenerates the files.

>>> from chainoffload.networks import network, network_names
>>> chain = network("resnet50")
>>> chain.length
18
>>> network("resnet50", gpu="V100").name
'resnet50-v100'
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ..chain import Chain

__all__ = ["network", "network_names", "network_info", "load_network", "GPUS"]

#: The compute-time models every network ships with: file suffix per GPU name.
GPUS = {"A100": "", "V100": "-v100"}


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict[str, Any]]:
    text = resources.files(__name__).joinpath("catalog.json").read_text(encoding="utf-8")
    return json.loads(text)


def network_names() -> dict[str, str]:
    """Names of the shipped networks, smallest family member first, with one-line descriptions.

    Returns
    -------
    dict
        ``{name: description}`` in catalog order; ``list(network_names())`` gives the names.
    """
    return {name: entry["description"] for name, entry in _catalog().items()}


def network_info(name: str) -> dict[str, Any]:
    """The catalog entry of network ``name``: description, input shape and dtype, parameter
    count, where its times come from (``times``; ``times_v100`` for the V100 twin), the label
    of each stage, and per-stage forward and backward FLOPs.

    Raises
    ------
    ValueError
        If ``name`` is not a shipped network; the message lists the known ones.
    """
    catalog = _catalog()
    if name not in catalog:
        raise ValueError(f"network: unknown network {name!r}; known: {', '.join(catalog)}")
    return json.loads(json.dumps(catalog[name]))  # a copy: callers may not edit the cache


def network(name: str, gpu: str = "A100") -> Chain:
    """The shipped chain of network ``name`` (see :func:`network_names`).

    Parameters
    ----------
    name
        e.g. ``"resnet50"``, ``"gpt2_12"``.
    gpu
        Whose compute times: ``"A100"`` (the catalog's ``times``: an A100 roofline, or
        measured) or ``"V100"`` (a Tesla V100 roofline, float32 without TF32; the catalog's
        ``times_v100``). Sizes are the same.

    Returns
    -------
    Chain
        Validated on load; its ``name`` is ``name`` (A100) or ``name + "-v100"``.

    Raises
    ------
    ValueError
        If ``name`` is not a shipped network or ``gpu`` not one of :data:`GPUS`; the message
        lists the known ones.
    """
    network_info(name)  # the error for unknown names
    if gpu not in GPUS:
        raise ValueError(f"network: gpu {gpu!r} is not one of {', '.join(GPUS)}")
    text = resources.files(__name__).joinpath(f"{name}{GPUS[gpu]}.json").read_text(encoding="utf-8")
    return Chain.from_json(text)


#: Alias of :func:`network` (the name ``benchmarks/compare.py`` imports).
load_network = network
