"""What autograd keeps for a saved tensor while the executor's hooks are in force.

PyTorch checks a saved tensor's version counter when the backward reads it, and raises if the
tensor was modified in place after it was saved. It does so only when no saved-tensor hooks are
installed (NOTE [ version discipline ]): under ``saved_tensors_hooks`` the check is the hooks'
job. So every tensor the executor's pack hook sees comes back as a record that carries what
autograd would have checked, kept or offloaded alike:

* :class:`Kept` holds the tensor itself (its unit stays on the device) and its version;
* :class:`Packed` holds the storage's :class:`~chainoffload_torch._stages.Entry`, how to view
  it (dtype, size, stride, offset, the lazy conj and neg bits) and a *version probe*: a tensor
  with no storage that shares the original's version counter, so that a modification after the
  storage went to the host is still seen.

:func:`check_version` raises the error autograd raises, with the block and unit added.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

__all__ = ["Kept", "Packed", "version_probe", "root_of", "check_version", "rebuild"]


def version_probe(t: torch.Tensor) -> torch.Tensor:
    """A tensor that shares ``t``'s version counter and holds none of its storage.

    ``detach()`` shares the version counter (and the storage); re-pointing it at an empty
    storage drops the storage but, being an in-place op, bumps the shared counter, which is
    set back at once. Nothing runs between the two, so no one sees the bumped value. A plain
    strided tensor takes a cheaper path that bumps nothing (NOTE [ a probe through .data ]).
    """
    version = t._version
    probe = t.detach()
    if type(t) is torch.Tensor and t.layout == torch.strided:
        # NOTE [ a probe through .data ]
        try:
            probe.data = _empty_tensor(t.dtype, t.device)
        except RuntimeError:
            pass
        else:
            if probe._version == version and probe.untyped_storage().nbytes() == 0:
                return probe
        probe = t.detach()
    probe.set_(_empty_storage(t.dtype, t.device), 0, (0,), (1,))
    torch._C._autograd._unsafe_set_version_counter((probe,), (version,))
    return probe


# NOTE [ a probe through .data ]
# Assigning ``probe.data`` swaps the probe's storage and metadata for an empty tensor's and keeps
# the probe's own version counter (TensorImpl::shallow_copy_from copies everything but it), without
# bumping it: half of a probe's cost on CPU (about 2 of 4.5 us; set_ bumps the shared counter, so
# it has to be set back, a third call). A plain strided tensor only; the probe's version and empty
# storage are checked after, and anything else takes the set_ path. The empty tensors are shared
# per dtype and device as the storages are (NOTE [ one empty storage for the probes ]).
@functools.lru_cache(maxsize=64)
def _empty_tensor(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=dtype, device=device)


# NOTE [ one empty storage for the probes ]
# A probe is pointed at a storage of 0 bytes that nothing ever writes or resizes (a probe is only
# read for its version counter), so all probes of a dtype and device share one, made once: a new
# empty storage at every saved tensor was half of a probe's cost (about 4 of 11 us on CPU, where a
# step of a rematerializing plan makes one probe per tensor its no-save blocks save).
@functools.lru_cache(maxsize=64)
def _empty_storage(dtype: torch.dtype, device: torch.device) -> torch.UntypedStorage:
    return torch.empty(0, dtype=dtype, device=device).untyped_storage()


def root_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose version counter ``t`` shares for certain: its base if it is a view."""
    base = t._base
    return t if base is None else base


_BACKWARD = re.compile(r"Backward\d*$")


def _describe(t: torch.Tensor) -> tuple[str, int | None]:
    """What autograd's message names: the node that made ``t`` (without "Backward0") and which
    of its outputs ``t`` is; ``("", None)`` for a leaf."""
    fn = t.grad_fn
    if fn is None:
        return "", None
    return _node_name(fn.name()), t.output_nr


@functools.lru_cache(maxsize=1024)
def _node_name(name: str) -> str:
    """A node's name without "Backward0" (a few names, met at every saved tensor of a step)."""
    return _BACKWARD.sub("", name)


class Kept:
    """A saved tensor autograd gets back as it is (its unit stays on the device)."""

    __slots__ = ("tensor", "version", "made_by", "output_nr", "stage")

    def __init__(self, t: torch.Tensor, stage: int | None) -> None:
        self.tensor = t
        self.version = t._version
        self.made_by, self.output_nr = _describe(t)
        self.stage = stage


class Packed:
    """A saved tensor of an offloaded unit: its storage's entry, how to view it, its version."""

    __slots__ = ("entry", "dtype", "size", "stride", "offset", "conj", "neg", "probe", "version", "made_by", "output_nr", "stage", "type_name")

    def __init__(self, entry: Any, t: torch.Tensor, probe: torch.Tensor, stage: int | None) -> None:
        self.entry = entry
        self.dtype = t.dtype
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()
        # Lazy conjugate and negative views keep their data un-negated in the storage; the bits
        # live on the tensor, not the storage, so they must be carried across the round trip.
        self.conj = t.is_conj()
        self.neg = t.is_neg()
        self.probe = probe
        self.version = t._version
        self.made_by, self.output_nr = _describe(t)
        self.stage = stage
        self.type_name = t.type()


def rebuild(p: Packed, storage_of: torch.Tensor) -> torch.Tensor:
    """The tensor ``p`` describes, over the storage of ``storage_of`` (a byte view)."""
    t = torch.empty(0, dtype=p.dtype, device=storage_of.device).set_(storage_of.untyped_storage(), p.offset, p.size, p.stride)
    if p.neg:
        t = torch._neg_view(t)
    if p.conj:
        t = t.conj()
    return t


# NOTE [ version discipline ]
# autograd's SavedVariable records a saved tensor's version and, at unpack, raises "one of the
# variables needed for gradient computation has been modified by an inplace operation" if the
# version moved -- but only when no saved-tensor hooks are installed. Under our hooks nothing
# checked it, so a model that plain PyTorch refuses trained on wrong values, even with nothing
# offloaded. The pack hook therefore records each tensor's version and the unpack hook compares,
# for kept tensors (the tensor itself is at hand) and offloaded ones (through a version probe,
# since the original storage is gone by then). The same records keep the host copy honest: an
# offload copies a storage at its trigger, and code may legally modify the storage after that
# (the parent's `h = block(h); h.mul_(0.9)`, or a pre-hook scaling args[0]) before a later op
# saves it. A pack that lands on a storage whose copy is already queued therefore asks whether
# the storage changed since the copy (see ScheduleRun._recopy_if_stale); if it may have, the
# copy is made again, so the host holds what autograd will read. Tensors saved before such a
# change fail the version check at unpack, exactly as without offloading.


def check_version(record: Kept | Packed, current: int, where: str) -> None:
    """Raise autograd's in-place error if the saved tensor's version moved since it was saved.

    Parameters
    ----------
    record
        The pack hook's record.
    current
        The version now (of the tensor, or of its probe).
    where
        The block and unit, appended to the message.
    """
    if current == record.version:
        return
    if isinstance(record, Kept):
        t = record.tensor
        what = f"[{t.type()} [{', '.join(map(str, t.shape))}]]"
    else:
        what = f"[{record.type_name} [{', '.join(map(str, record.size))}]]"
    made = f", which is output {record.output_nr} of {record.made_by}," if record.made_by else ""
    raise RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        f"{what}{made} is at version {current}; expected version {record.version} instead. Hint: enable anomaly "
        "detection to find the operation that failed to compute its gradient, with "
        f"torch.autograd.set_detect_anomaly(True, check_nan=False). (chainoffload_torch: saved {where})"
    )
