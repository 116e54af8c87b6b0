"""Stages of a chain and the storage bookkeeping that the profiler and the executor share.

The profiler (:func:`chainoffload_torch.measure_sizes`) and the executor
(:class:`chainoffload_torch.OffloadActivations`) decide which storage belongs to which unit with
the same code, :class:`UnitLedger`, so that the bytes the chain predicts for a unit are the bytes
the executor moves for it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

__all__ = ["as_stages", "UnitLedger", "Entry", "storage_of", "model_state"]


def as_stages(model: Any) -> list[nn.Module]:
    """The stages of ``model``: the children of an ``nn.Sequential``, or a list of blocks.

    Parameters
    ----------
    model
        An ``nn.Sequential``, an ``nn.ModuleList`` or a list/tuple of modules; stage i is its
        i-th element (1-based in the chain).

    Raises
    ------
    TypeError
        If ``model`` is none of these, or an element is not an ``nn.Module``.
    ValueError
        If it has no stage, or the same module object appears twice (its hooks would fire
        for two stages at once).
    """
    if isinstance(model, (nn.Sequential, nn.ModuleList)):
        stages = list(model)
    elif isinstance(model, (list, tuple)):
        stages = list(model)
    else:
        raise TypeError(
            f"model: expected an nn.Sequential or a list of modules (the chain's stages), got {type(model).__name__}"
        )
    if not stages:
        raise ValueError("model: the chain needs at least one stage, got 0")
    seen: dict[int, int] = {}
    for idx, stage in enumerate(stages, start=1):
        if not isinstance(stage, nn.Module):
            raise TypeError(f"model: stage {idx} is a {type(stage).__name__}, not an nn.Module")
        if id(stage) in seen:
            raise ValueError(f"model: stage {idx} is the same module object as stage {seen[id(stage)]}; stages must be distinct")
        seen[id(stage)] = idx
    return stages


def storage_of(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of the storage under ``t``: what a unit really holds for it."""
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def resident_storages(stages: Sequence[nn.Module]) -> set[int]:
    """Data pointers of every parameter, buffer and plain tensor attribute of ``stages``.

    These stay on the device whatever the schedule says: a copy of them would free nothing.
    """
    keys: set[int] = set()
    for stage in stages:
        for mod in stage.modules():
            for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
                if t is not None and t.layout == torch.strided:
                    keys.add(t.untyped_storage().data_ptr())
            for value in vars(mod).values():
                if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                    keys.add(value.untyped_storage().data_ptr())
    return keys


class Entry:
    """One storage owned by a unit: the thing that is moved, once, however many tensors view it.

    ``state`` is one of ``"device"`` (the original is held), ``"offloading"`` (a D2H copy is
    queued, the original still held), ``"host"`` (only the host copy exists), ``"prefetching"``
    (an H2D copy into ``dev`` is queued), ``"restored"`` (the compute stream has waited for it)
    and ``"dropped"`` (the step was aborted).
    """

    __slots__ = ("unit", "key", "nbytes", "ref", "src", "host", "host_guard", "dev", "state", "d2h_event", "h2d_event", "__weakref__")

    def __init__(self, unit: int, key: int, nbytes: int, tensor: torch.Tensor, hold: bool) -> None:
        self.unit = unit
        self.key = key
        self.nbytes = nbytes
        # A weak reference tells a live storage from a freed one whose address came back.
        self.ref = weakref.ref(tensor)
        # The byte view holds the storage alive (without the tensor's autograd graph) until the
        # offload has copied it and the release point is reached.
        self.src = _byte_view(tensor) if hold else None
        self.host = None
        self.host_guard = None
        self.dev = None
        self.state = "device"
        self.d2h_event = None
        self.h2d_event = None

    def alive(self) -> bool:
        """Whether the storage this entry was made for is still the one at its address."""
        return self.src is not None or self.ref() is not None


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage of ``t`` (no autograd history)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class UnitLedger:
    """Which unit owns which storage, in one forward pass of the chain.

    Rules (docs/model.md, the chain's "saved"): a storage belongs to the unit of the stage during whose forward
    it is first seen, by the pack hook of ``saved_tensors_hooks`` or as the stage's output;
    the chain's input a_0 is unit 0 (never offloaded); a stage that saves its input a_{i-1}
    adds nothing to its own unit, since that storage is already unit i-1's. Parameters,
    buffers and tensor attributes of the stages are never owned. Tensors on another device,
    of another layout than strided, or of a tensor subclass are left alone.

    Parameters
    ----------
    device
        The chain's device; only storages there are owned.
    resident
        Data pointers never owned (see :func:`resident_storages`).
    hold
        Units whose entries must hold their storage (the ones to be offloaded).
    """

    def __init__(self, device: torch.device, resident: set[int], hold: Iterable[int] = ()) -> None:
        self.device = device
        self.resident = resident
        self.hold = set(hold)
        self.by_key: dict[int, Entry] = {}
        self.units: dict[int, list[Entry]] = {}
        self.aliased: set[int] = set()

    def owns(self, t: Any) -> bool:
        """Whether ``t`` is a tensor a unit could own (not resident, right device and kind)."""
        if not isinstance(t, torch.Tensor) or type(t) not in (torch.Tensor, nn.Parameter):
            return False
        if isinstance(t, nn.Parameter) or t.layout != torch.strided or t.device != self.device:
            return False
        st = t.untyped_storage()
        return st.nbytes() > 0 and st.data_ptr() not in self.resident

    def lookup(self, t: torch.Tensor, stage: int) -> Entry:
        """The entry of ``t``'s storage, made for ``stage``'s unit if no live unit owns it yet."""
        key, nbytes = storage_of(t)
        entry = self.by_key.get(key)
        if entry is not None and (not entry.alive() or entry.nbytes != nbytes):
            entry = None  # a freed storage whose address was reused
        if entry is None:
            entry = Entry(stage, key, nbytes, t, hold=stage in self.hold)
            self.by_key[key] = entry
            self.units.setdefault(stage, []).append(entry)
        return entry

    def forget(self, entry: Entry) -> None:
        """Drop ``entry`` from the address map (its storage is freed; the address may return)."""
        if self.by_key.get(entry.key) is entry:
            del self.by_key[entry.key]

    def stage_start(self, stage: int, inp: Any) -> int | None:
        """Note the input of ``stage`` (a_0 becomes unit 0); return its version for :meth:`stage_end`."""
        if not isinstance(inp, torch.Tensor):
            return None
        if stage == 1 and self.owns(inp):
            self.lookup(inp, 0)
        return inp._version

    def pack(self, t: Any, stage: int | None) -> Entry | None:
        """The entry a tensor saved during ``stage``'s forward belongs to, or ``None`` if no unit's."""
        if stage is None or not self.owns(t):
            return None
        return self.lookup(t, stage)

    def stage_end(self, stage: int, inp: Any, version_before: int | None, out: Any) -> torch.Tensor:
        """Register ``stage``'s output a_i in its unit and check aliasing; return the output."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"stage {stage} returned a {type(out).__name__}; a chain's stages must each return one tensor"
            )
        self.check_stage(stage, inp, version_before, out)
        if self.owns(out):
            self.lookup(out, stage)
        return out

    def unit_bytes(self, unit: int) -> int:
        """Bytes of all storages ``unit`` owns."""
        return sum(e.nbytes for e in self.units.get(unit, ()))

    def check_stage(self, stage: int, inp: Any, version_before: int | None, out: torch.Tensor) -> None:
        """Mark units that share storage across a stage boundary (see NOTE [ aliasing stages ])."""
        if not isinstance(inp, torch.Tensor) or inp.device != out.device or inp.layout != torch.strided:
            return
        same = inp.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() and out.untyped_storage().nbytes() > 0
        if same or (version_before is not None and inp._version != version_before):
            if stage > 1:
                self.aliased.add(stage - 1)
            self.aliased.add(stage)


# NOTE [ aliasing stages ]
# A stage that modifies its input in place (nn.ReLU(inplace=True) as a stage of its own) or
# returns a view of it shares one storage between units i-1 and i. Offloading unit i-1 would
# copy that storage at its trigger, before stage i writes it, and bring back stale data; unit i
# does not own the storage, so moving it would move fewer bytes than its saved[i] (which is at
# least act[i]). Both units are therefore marked "aliased": measure_sizes reports them, offload()
# keeps them resident, and the executor refuses a schedule that offloads one.


@contextlib.contextmanager
def model_state(stages: Sequence[nn.Module]) -> Iterator[None]:
    """Run profiling passes without leaving a trace: restore buffers, grads and the RNG after.

    Batch norm updates its running statistics in every training forward and profiling runs
    backwards that accumulate into ``.grad``; a profile must not change the model it measures.
    """
    params = [p for s in stages for p in s.parameters()]
    buffers = [b for s in stages for b in s.buffers()]
    saved_buffers = [b.detach().clone() for b in buffers]
    saved_grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    devices = sorted({str(p.device) for p in params if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, v in zip(buffers, saved_buffers):
                    b.copy_(v)
                for p, g in zip(params, saved_grads):
                    if g is None:
                        p.grad = None
                    elif p.grad is not None and p.grad.shape == g.shape:
                        p.grad.copy_(g)  # keep the user's grad tensor (an optimizer may hold it)
                    else:
                        p.grad = g
