"""Which storage belongs to which unit: the bookkeeping the profiler and the executor share.

The profiler (:func:`chainoffload_torch.profile`) and the executor decide which storage belongs
to which unit with the same code, :class:`UnitLedger`, so that the bytes the chain predicts for
a unit are the bytes the executor moves for it. An :class:`Entry` is one storage of a unit and
its :class:`EntryState` (on the device, being offloaded, on the host, being prefetched, back).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ._tree import held_tensors, tensors_in

__all__ = [
    "as_stages",
    "UnitLedger",
    "Entry",
    "EntryState",
    "storage_of",
    "model_state",
    "resident_storages",
    "is_parameter_like",
    "canonical_device",
    "unmovable_kind",
]


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


def canonical_device(device: Any) -> torch.device | None:
    """``device`` as tensors report theirs: ``"cuda"`` becomes ``cuda:<current>``, so that
    comparing it with a tensor's device says whether the tensor is there."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def storage_of(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of the storage under ``t``: what a unit really holds for it."""
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def resident_storages(modules: Iterable[nn.Module]) -> set[int]:
    """Data pointers of every parameter, buffer and plain tensor attribute of ``modules``
    (and of their submodules).

    These stay on the device whatever the schedule says: a copy of them would free nothing.
    """
    keys: set[int] = set()
    for root in modules:
        # Every module under root (modules(), walked without its recursive generators), its
        # parameters(recurse=False) and buffers(recurse=False) read from their dicts (None is no
        # tensor), and its tensor attributes: once per step of a plan that moves or recomputes
        # something, so the walk is kept cheap.
        stack, seen = [root], set()
        while stack:
            mod = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            d = vars(mod)
            stack.extend(m for m in d.get("_modules", {}).values() if m is not None)
            for group in (d.get("_parameters", {}).values(), d.get("_buffers", {}).values(), d.values()):
                for t in group:
                    if isinstance(t, torch.Tensor):
                        key = _storage_key(t)
                        if key is not None:
                            keys.add(key)
    return keys


def _storage_key(t: Any) -> int | None:
    """The data pointer of ``t``'s storage; for a wrapper subclass (an FSDP2 DTensor), of its
    local tensor; ``None`` when it has none."""
    if t is None:
        return None
    if type(t) not in (torch.Tensor, nn.Parameter):
        t = getattr(t, "_local_tensor", None)
        if not isinstance(t, torch.Tensor):
            return None
    if t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # a storage Python cannot see (a fake or meta wrapper)
        return None


def _is_parameter(t: torch.Tensor) -> bool:
    """``isinstance(t, nn.Parameter)``, without the Python ``__instancecheck__`` of Parameter's
    metaclass for the two types met at nearly every saved tensor: a plain tensor is one only
    with ``_is_param`` set (as the metaclass asks), a Parameter always."""
    tp = type(t)
    if tp is torch.Tensor:
        return bool(getattr(t, "_is_param", False))
    if tp is nn.Parameter:
        return True
    return isinstance(t, nn.Parameter)


def is_parameter_like(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter, wherever it is held: an ``nn.Parameter``, a view of one,
    or the cast of one that autocast keeps for the whole forward (see NOTE [ never a parameter ])."""
    base = t._base
    if _is_parameter(t) or (base is not None and _is_parameter(base)):
        return True
    if base is not None:
        # A view of autocast's cast of a weight (w.t() that a bf16 matmul saves): the cache
        # holds its storage until the autocast region exits, as it holds the cast's.
        return is_parameter_like(base)
    fn = t.grad_fn
    if fn is not None and fn.name() == "ToCopyBackward0":
        nxt = fn.next_functions
        src = getattr(nxt[0][0], "variable", None) if nxt else None
        return isinstance(src, nn.Parameter)
    return False


# NOTE [ never a parameter ]
# Moving a parameter to the host frees nothing (the module still holds it) and the next
# optimizer step would read the host copy's stale twin. A unit therefore never owns: any
# nn.Parameter, wherever it is held (a block's own, a parent's, a tied or shared weight, an
# FSDP2 unsharded parameter, which is an nn.Parameter over a fresh all-gather buffer); a view of
# one (w.t() saved by a matmul); the cast autocast makes of one (ToCopyBackward0 of a leaf
# parameter), which autocast's cache holds until the autocast region exits, and a view of that
# cast (w.t() of it, which a bf16 matmul saves); and any storage of a
# parameter, buffer or tensor attribute of the model (resident_storages), views included. Nor
# does it own a tensor passed to a block other than its hidden state (masks, position
# embeddings): the caller holds those for the whole forward.


class EntryState(enum.StrEnum):
    """Where the data of one storage of a unit is, in one step."""

    DEVICE = "device"  #: the original is held (or, for a unit kept resident, left alone)
    OFFLOADING = "offloading"  #: a D2H copy is queued; the original is still held
    HOST = "host"  #: only the host copy exists
    PREFETCHING = "prefetching"  #: an H2D copy into ``dev`` is queued
    RESTORED = "restored"  #: the compute stream has waited for the H2D copy
    DROPPED = "dropped"  #: the step was aborted, or the unit's backward is over

    def __str__(self) -> str:
        return self.value


class Entry:
    """One storage owned by a unit: the thing that is moved, once, however many tensors view it."""

    __slots__ = (
        "unit", "key", "nbytes", "ref", "src", "host", "host_guard", "dev", "state", "d2h_event", "h2d_event", "counters", "__weakref__"
    )

    def __init__(self, unit: int, key: int, nbytes: int, tensor: torch.Tensor, hold: bool) -> None:
        self.unit = unit
        self.key = key
        self.nbytes = nbytes
        # A weak reference to the storage itself (not to the Python tensor, which dies while
        # autograd still holds its storage) tells a live storage from a freed one whose address
        # came back (NOTE [ addresses come back ]).
        self.ref = StorageWeakRef(tensor.untyped_storage())
        # The byte view holds the storage alive (without the tensor's autograd graph) until the
        # offload has copied it and the release point is reached.
        self.src = _byte_view(tensor) if hold else None
        self.host = None
        self.host_guard = None
        self.dev = None
        self.state = EntryState.DEVICE
        self.d2h_event = None
        self.h2d_event = None
        #: The executor's records of the version counters of tensors over this storage
        #: (NOTE [ version discipline ] in _saved.py).
        self.counters: dict[int, list] = {}

    def alive(self) -> bool:
        """Whether the storage this entry was made for is still the one at its address."""
        return self.src is not None or not self.ref.expired()


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage of ``t`` (no autograd history)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class UnitLedger:
    """Which unit owns which storage, in one forward pass of the model.

    Rules (docs/model.md, the chain's "saved"): a storage belongs to the unit of the stage during whose forward
    it is first seen, by the pack hook of ``saved_tensors_hooks`` or as the stage's output.
    The caller says which stage is running: 0 before the first block (the prefix: embeddings;
    never offloaded, resident outside the chain, NOTE [ prefix and suffix ] in _recorder.py;
    when the prefix is a stage of its own, it is stage 1 and nothing runs in 0), i from the
    start of block i to the start of block i+1, and L after the last block (the suffix: head and
    loss, counted in unit L). A stage that
    saves its input a_{i-1} adds nothing to its own unit, since that storage is already unit
    i-1's. Never owned (NOTE [ never a parameter ]): parameters wherever they are held, the
    model's buffers and tensor attributes, the model's inputs and the extra inputs of a block.
    Tensors on another device, of another layout than strided, or of a tensor subclass are
    left alone.

    Parameters
    ----------
    device
        The model's device; only storages there are owned.
    resident
        Data pointers never owned (see :func:`resident_storages`); the ledger adds to it.
    hold
        Units whose entries must hold their storage (the ones to be offloaded).
    pinned
        Per unit, the ordinals (0-based, in the order the unit first sees its storages) of
        storages a profile found held beyond the unit's backward: they are never owned, so they
        stay resident and the rest of the unit can move (NOTE [ units held elsewhere ]).
    """

    def __init__(
        self, device: torch.device, resident: set[int], hold: Iterable[int] = (), pinned: Mapping[int, Iterable[int]] | None = None
    ) -> None:
        self.device = device
        self.resident = set(resident)
        #: Storages of a call's inputs and of blocks' extra inputs, never owned while they live:
        #: they may be freed within the forward and their address reused (NOTE [ addresses come back ]).
        self.borrowed: dict[int, StorageWeakRef] = {}
        self.hold = set(hold)
        self.pinned = {u: frozenset(v) for u, v in (pinned or {}).items()}
        self._seen: dict[int, int] = {}  # per stage, new storages seen so far (pinned ones too)
        #: Storages a stage run without saving saw and owns none of: data pointer -> (stage,
        #: ordinal, weak reference, bytes); NOTE [ pins in a stage run without saving ].
        self._counted: dict[int, tuple[int, int, StorageWeakRef, int]] = {}
        self.by_key: dict[int, Entry] = {}
        self.units: dict[int, list[Entry]] = {}
        #: Units that share storage across a stage boundary (NOTE [ aliasing stages ]).
        self.aliased: set[int] = set()
        #: Units a later block or the model's output still holds (NOTE [ units held elsewhere ]).
        self.held: set[int] = set()
        #: The entries so held, and by what: ``"output"`` or ``"block N"`` (the first later block
        #: that took it as an extra input).
        self.held_by: dict[Entry, str] = {}
        #: The entry of each stage's output a_i, where its unit owns it (what ``moves="act"`` moves).
        self.output: dict[int, Entry] = {}
        #: Per unit, saved tensors of a kind the executor cannot rebuild from a byte copy, and
        #: their bytes where known (NOTE [ tensors that cannot move ]).
        self.unmovable: dict[int, dict[str, int]] = {}
        #: Bytes of the storages the model's output holds that no unit owns (the logits of a
        #: language model's head): NOTE [ the output's own storages ] in _recorder.py.
        self.output_only = 0
        #: Those storages: data pointer -> bytes.
        self.output_storages: dict[int, int] = {}

    def add_resident(self, obj: Any) -> None:
        """Never own the storages of the tensors in ``obj`` (a call's inputs)."""
        for t in tensors_in(obj):
            if t.layout == torch.strided and t.device == self.device:
                self._borrow(t)

    def _borrow(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        self.borrowed[st.data_ptr()] = StorageWeakRef(st)

    def _resident(self, key: int) -> bool:
        if key in self.resident:
            return True
        ref = self.borrowed.get(key)
        return ref is not None and not ref.expired()

    def owns(self, t: Any) -> bool:
        """Whether ``t`` is a tensor a unit could own (not resident, right device and kind)."""
        if not isinstance(t, torch.Tensor) or unmovable_kind(t) is not None:
            return False
        if t.device != self.device or is_parameter_like(t):
            return False
        st = t.untyped_storage()
        return st.nbytes() > 0 and not self._resident(st.data_ptr())

    def owner(self, t: torch.Tensor) -> Entry | None:
        """The live entry of ``t``'s storage, if a unit owns it."""
        key, nbytes = storage_of(t)
        entry = self.by_key.get(key)
        if entry is not None and (not entry.alive() or entry.nbytes != nbytes):
            return None  # a freed storage whose address was reused
        return entry

    def lookup(self, t: torch.Tensor, stage: int) -> Entry | None:
        """The entry of ``t``'s storage, made for ``stage``'s unit if no live unit owns it yet;
        ``None`` for a storage the profile pinned (it is resident from now on)."""
        entry = self.owner(t)
        if entry is None:
            key, nbytes = storage_of(t)
            counted = self._counted.get(key)
            if counted is not None and counted[0] == stage and counted[3] == nbytes and not counted[2].expired():
                ordinal = counted[1]  # counted while the stage ran without saving: the same storage
                del self._counted[key]
            else:
                ordinal = self._seen.get(stage, 0)
                self._seen[stage] = ordinal + 1
            if ordinal in self.pinned.get(stage, ()):
                self._borrow(t)
                return None
            entry = Entry(stage, key, nbytes, t, hold=stage in self.hold)
            self.by_key[key] = entry
            self.units.setdefault(stage, []).append(entry)
        return entry

    def count(self, t: Any, stage: int | None) -> None:
        """Count ``t``, saved while ``stage`` runs without saving (an original Fck / Fn), among
        the new storages the stage sees, as :meth:`pack` would, owning nothing: the pins of the
        stage and of its output keep their ordinals (NOTE [ pins in a stage run without saving ])."""
        if not self.pinned.get(stage):
            return  # ordinals serve pins alone: NOTE [ pins in a stage run without saving ]
        if not isinstance(t, torch.Tensor) or unmovable_kind(t) is not None:
            return
        if t.device != self.device or is_parameter_like(t):
            return
        st = t.untyped_storage()
        key, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or self._resident(key) or self.owner(t) is not None:
            return
        counted = self._counted.get(key)
        if counted is not None and counted[3] == nbytes and not counted[2].expired():
            return  # saved again in the same run: seen once, as an entry would make it
        ordinal = self._seen.get(stage, 0)
        self._seen[stage] = ordinal + 1
        if ordinal in self.pinned.get(stage, ()):
            self._borrow(t)
            return
        self._counted[key] = (stage, ordinal, StorageWeakRef(st), nbytes)

    def restart(self, stage: int) -> None:
        """``stage`` runs again (a recomputation): it sees the same storages in the same order,
        so the pins apply as in the forward."""
        self._seen[stage] = 0
        if not self._counted:
            return
        for key in [k for k, c in self._counted.items() if c[0] == stage]:
            del self._counted[key]

    def move(self, entry: Entry, unit: int) -> None:
        """Make ``entry`` unit ``unit``'s (a skipped stage's carried a_j, and back at the end of
        its backward: NOTE [ skipped stages ] in executor.py)."""
        held = self.units.get(entry.unit)
        if held is not None and entry in held:
            held.remove(entry)
        entry.unit = unit
        self.units.setdefault(unit, []).append(entry)

    def forget(self, entry: Entry) -> None:
        """Drop ``entry`` from the address map (its storage is freed; the address may return)."""
        if self.by_key.get(entry.key) is entry:
            del self.by_key[entry.key]

    def stage_start(self, stage: int, inp: Any, extras: Any = ()) -> int | None:
        """Note the hidden input of ``stage`` (a_0 becomes unit 0) and its other inputs
        ``extras``; return the input's version for :meth:`stage_end`."""
        for t in tensors_in(extras):
            if t is inp or not isinstance(t, torch.Tensor) or t.device != self.device or t.layout != torch.strided:
                continue
            entry = self.owner(t)
            if entry is None and stage >= 2 and self.owns(t):
                # Made after the chain began (between blocks, as an encoder's output the decoder
                # blocks read): an activation of the unit running then, and held by this block.
                entry = self.lookup(t, stage - 1)
                if entry is None:
                    continue  # pinned by the profile: resident from now on
                self.held.add(entry.unit)
                self.held_by.setdefault(entry, f"block {stage}")
            elif entry is None:
                self._borrow(t)
            elif 1 <= entry.unit < stage - 1 or (1 <= entry.unit == stage - 1 and not _is_view_of(t, inp)):
                # An earlier unit's storage handed to a later block: it stays alive beyond the
                # unit's own backward use, so moving it would free nothing.
                self.held.add(entry.unit)
                self.held_by.setdefault(entry, f"block {stage}")
        if not isinstance(inp, torch.Tensor):
            return None
        if stage == 1 and self.owns(inp):
            self.lookup(inp, 0)
        return inp._version

    def pack(self, t: Any, stage: int | None) -> Entry | None:
        """The entry a tensor saved while ``stage`` runs belongs to, or ``None`` if no unit's."""
        if stage is None or not isinstance(t, torch.Tensor):
            return None
        # owns(t), each test made once (one call per saved tensor of every step).
        kind = unmovable_kind(t)
        if kind is not None:
            if stage >= 1 and not is_parameter_like(t) and _device_of(t) == self.device:
                kinds = self.unmovable.setdefault(stage, {})
                kinds[kind] = kinds.get(kind, 0) + _known_bytes(t)
            return None
        if t.device != self.device or is_parameter_like(t):
            return None
        st = t.untyped_storage()
        if st.nbytes() == 0 or self._resident(st.data_ptr()):
            return None
        entry = self.lookup(t, stage)
        if entry is not None and 1 <= entry.unit and stage >= entry.unit + 2:
            # Saved again by a later stage (the parent's code multiplies a skip it kept into a
            # later block's input): B_stage reads it, beyond its unit's backward, so moving it
            # would free nothing; held, as an extra input of a later block is (NOTE [ late release ]
            # in _recorder.py: only storages no later stage saves may move late).
            self.held.add(entry.unit)
            self.held_by.setdefault(entry, f"block {stage}")
        return entry

    def stage_end(self, stage: int, inp: Any, version_before: int | None, out: Any) -> torch.Tensor:
        """Register ``stage``'s output a_i in its unit and check aliasing; return the output."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"stage {stage} returned a {type(out).__name__} with no tensor in it; a block must return its hidden state"
            )
        self.check_stage(stage, inp, version_before, out)
        if self.owns(out):
            entry = self.lookup(out, stage)
            if entry is not None and entry.unit == stage:
                self.output[stage] = entry
        return out

    def forward_end(self, outputs: Any, last: int) -> None:
        """Mark units 1..last-1 whose storages the model's outputs still hold, and count the
        bytes of the output's storages that no unit owns (:attr:`output_only`)."""
        own: dict[int, int] = {}
        for t in held_tensors(outputs):
            if t.device == self.device and t.layout == torch.strided:
                entry = self.owner(t)
                if entry is not None and 1 <= entry.unit < last:
                    self.held.add(entry.unit)
                    self.held_by.setdefault(entry, "output")
                elif entry is None and self.owns(t):
                    key, nbytes = storage_of(t)
                    own[key] = nbytes
        self.output_only = sum(own.values())
        self.output_storages = own

    def unit_bytes(self, unit: int) -> int:
        """Bytes of all storages ``unit`` owns."""
        return sum(e.nbytes for e in self.units.get(unit, ()))

    def check_stage(self, stage: int, inp: Any, version_before: int | None, out: torch.Tensor) -> None:
        """Mark units that share storage across a stage boundary (see NOTE [ aliasing stages ]).

        ``version_before`` (the input's version at the stage's start) is not a reason: a stage
        that modifies its input in place but returns a storage of its own is handled by the
        executor's version discipline (NOTE [ version discipline ] in _saved.py).
        """
        if not isinstance(inp, torch.Tensor) or inp.device != out.device or inp.layout != torch.strided:
            return
        same = inp.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() and out.untyped_storage().nbytes() > 0
        if same:
            if stage > 1:
                self.aliased.add(stage - 1)
            self.aliased.add(stage)


def unmovable_kind(t: torch.Tensor) -> str | None:
    """Why a byte copy of ``t``'s storage could not give autograd ``t`` back, or ``None``.

    A saved tensor is moved as the bytes of its storage and rebuilt as a strided view of them
    with its dtype, size, stride, offset and conj/neg bits. That is not all of a tensor of a
    subclass (DTensor, FSDP2's, a quantization wrapper), of another layout (sparse, mkldnn), a
    quantized tensor (scale, zero point), a nested tensor (its offsets) or a named one.
    """
    if type(t) not in (torch.Tensor, nn.Parameter):
        return f"{type(t).__name__} (a tensor subclass)"
    if t.layout != torch.strided:
        return f"{str(t.layout).removeprefix('torch.')} tensor"
    if t.is_quantized:
        return "quantized tensor"
    if t.is_nested:
        return "nested tensor"
    names = getattr(t, "names", None)  # named tensors are gone from recent PyTorch
    if names is not None and any(n is not None for n in names):
        return "named tensor"
    return None


def _device_of(t: torch.Tensor) -> torch.device | None:
    try:
        return t.device
    except (RuntimeError, NotImplementedError):
        return None


def _known_bytes(t: torch.Tensor) -> int:
    """Bytes under ``t`` where PyTorch tells them (0 for a wrapper that hides its data)."""
    try:
        if t.layout == torch.sparse_coo:
            return _known_bytes(t._values()) + _known_bytes(t._indices())
        if t.layout != torch.strided:
            return t.values().nbytes  # compressed layouts: the values, the bulk of it
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


# NOTE [ tensors that cannot move ]
# A saved tensor that is not a plain strided tensor (see unmovable_kind) is returned to autograd
# as it is, on the device: the executor never rebuilds what a byte copy cannot carry. Its unit
# is kept resident -- the profile marks it "unmovable", offload() keeps it and handle.table()
# names the kind -- and the bytes PyTorch can tell are counted in the unit, so the plan's
# memory includes them.


def _is_view_of(t: torch.Tensor, inp: Any) -> bool:
    return isinstance(inp, torch.Tensor) and t.untyped_storage().data_ptr() == inp.untyped_storage().data_ptr()


# NOTE [ addresses come back ]
# A storage is known by its data pointer while a forward runs, and the allocator hands a freed
# address to the next allocation of a fitting size (on CPU, malloc decides, so whether it does
# varies from run to run). Every map keyed by address therefore checks that the storage it was
# made for is still alive, with a weak reference to the storage itself: an extra input freed
# after its block (a mask made per call) must not make a later activation at its address look
# resident, and a unit's storage whose Python tensor died while autograd holds it must not be
# counted again by the next unit that saves a view of it. Before this, one storage of BERT's
# suffix was seen or not from one profile to the next (256 B of unit L), and T5's 2 KiB.


# NOTE [ aliasing stages ]
# A stage that returns its input modified in place (nn.ReLU(inplace=True) as a stage of its
# own) or a view of it shares one storage between units i-1 and i. Unit i does not own that
# storage, so moving it would move fewer bytes than its saved[i] (which is at least act[i]), and
# freeing unit i-1's copy would free nothing while unit i lives. Both units are therefore marked
# "aliased": the profile reports them, offload() keeps them resident, and the executor refuses a
# schedule that offloads one. A stage that modifies its input in place and returns a storage of
# its own is not aliased: the version discipline copies the input again if it was saved after
# the change (NOTE [ version discipline ] in _saved.py).
#
# NOTE [ units held elsewhere ]
# Offloading frees a unit's GPU memory only if nothing else holds its storages. Two holders the
# ledger can see: a later block that takes an earlier unit's storage as an extra input (a skip
# connection across blocks, T5's position bias, an encoder's output read by every decoder
# block), and the model's output (Hugging Face's output_hidden_states=True returns every hidden
# state; use_cache=True returns every layer's keys and values in a cache object). The storages
# so held (held_by) stay resident; the rest of their unit can move:
# * A profile pins them: the next ledgers of the same call (the executor's) never own them,
#   recognised by their ordinal among the new storages their stage sees (the same code sees the
#   same storages in the same order for the same shapes). Their bytes are resident outside the
#   chain (NOTE [ resident outside the chain ] in plans.py: off the budget, added to the
#   predicted peak) from the start of the step to its end, a superset of their real lifetime
#   (made in F_i, alive until their last reader's backward, or until the output is dropped).
#   A third holder the ledger cannot see, the forward's own code, is found by the profile's
#   probe pass: what it still holds when the forward returns is treated the same way; what it
#   lets go of earlier (a list of skips) moves with its unit (NOTE [ storages the forward keeps ]
#   and NOTE [ late release ] in _recorder.py). A later stage that saves an earlier unit's storage
#   again (pack) holds it as an extra input would: B_j reads it after B_i.
# * A unit whose output a_i is held (output_hidden_states, the last encoder block's output read
#   by the decoder) is kept resident whole and marked "held": moving the rest of it would need
#   a_i apart from the unit, which the chain model has no room for. Not when the next stage is
#   its block's tail: no stage is recomputed from that a_i, and it is pinned alone (NOTE [ the
#   code after a block as a stage ] in _instrument.py).
# If a pinned storage is met out of order in a step (another path through the model), it is
# owned after all and the executor sees it held: it warns or refuses, it never trains wrong.

# NOTE [ pins in a stage run without saving ]
# The ordinals count the new storages a stage sees as it runs saving (the profile's passes).
# An original Fck_i / Fn_i runs block i without saving: its pack hook gives autograd slots and
# the ledger owns nothing, yet it counts what it saves (UnitLedger.count), as pack would, so
# that the stage's output, met last at its end, keeps its ordinal. Uncounted, BART's last
# encoder layer's pinned output (its 17th storage) came 1st in an Fck, was owned as the lone
# a_i, forgotten by the ledger at its offload's release while the decoder still held it,
# taken again by the next stage's unit at the first decoder block's start, and moved twice
# (16384 bytes a step beyond the plan's). A recomputation starts the count again (restart).
# The ordinals serve the pins alone (lookup's and count's only reader is the test against
# pinned[stage]), so a stage the profile pinned nothing of is not counted: an Fck's saved
# tensors then cost no ledger work (about 5 us each on CPU, 266 a step in
# benchmarks/checkpointing.py's Llama at checkpointing's memory), and its lookups later draw
# ordinals that no pin reads. A plan that offloads no unit counts nothing at all, pins or not
# (NOTE [ a plan that moves nothing owns nothing ] in executor.py).


@contextlib.contextmanager
def model_state(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Run profiling passes without leaving a trace: restore buffers, grads and the RNG after.

    Batch norm updates its running statistics in every training forward and profiling runs
    backwards that accumulate into ``.grad``; a profile must not change the model it measures
    (nor a gradient accumulation in progress, nor the dropout masks of the next step).
    """
    seen: set[int] = set()
    params, buffers = [], []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        for b in m.buffers():
            if id(b) not in seen:
                seen.add(id(b))
                buffers.append(b)
    saved_buffers = [b.detach().clone() for b in buffers]
    saved_grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, v in zip(buffers, saved_buffers, strict=True):
                    b.copy_(v)
                for p, g in zip(params, saved_grads, strict=True):
                    if g is None:
                        p.grad = None
                    elif p.grad is not None and p.grad.shape == g.shape:
                        p.grad.copy_(g)  # keep the user's grad tensor (an optimizer may hold it)
                    else:
                        p.grad = g
