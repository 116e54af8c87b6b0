"""The recorder: profiling steps of a model, through its instrument, into a chain and its sizes.

:func:`measure_chain` runs whole training steps of the model through an installed
:class:`~chainoffload_torch._instrument.Instrument`, a recorder as its listener (NOTE [ what the
profiler measures ]): first the probe, a forward alone (NOTE [ storages the forward keeps ],
NOTE [ the probe's forward is not a step ]), then as many steps as the timings need (NOTE [ how
many profiling steps ]); per stage the boundary times and transients, per unit the storages it
owns (:class:`Sizes`); :func:`chain_of` makes the :class:`chainoffload.Chain` of them. The public profile API (``profiler.py``) and the plans
(``plans.py``) call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import statistics
import sys
import time
import weakref
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import chainoffload as co

from ._instrument import Instrument, SkippedBlocks
from ._pool import size_class
from ._recompute import _state_objects, state_structure
from ._saved import Kept, check_version, version_probe
from ._stages import UnitLedger, is_parameter_like, resident_storages
from ._state import training_state
from ._timer import Timer
from ._tree import tensors_in

__all__ = [
    "Sizes", "measure_chain", "chain_of", "measure_call_sizes", "profiling_steps", "prefix_pays", "WRITTEN",
    "AUTO_MAX_STEPS", "AUTO_TOLERANCE",
]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Sizes of a chain, in bytes.

    Attributes
    ----------
    act
        Output sizes a_0..a_L (length L + 1).
    saved
        Unit sizes, stages 1..L: ``max(owned[i], act[i])`` (the chain needs saved >= act).
    owned
        Bytes of the storages each unit really owns (what the executor moves for it).
    aliased
        Stages whose units share storage with a neighbour (a block that writes its input in
        place or returns a view of it): they must stay resident.
    held
        Stages whose output a_i a later block or the model's output still holds (a skip
        connection across blocks, ``output_hidden_states``, an encoder's output read by a
        decoder): they stay resident whole. Not a block's whose next stage is its tail: that
        a_i is pinned alone (NOTE [ the code after a block as a stage ] in _instrument.py).
    storages
        Per unit 1..L, the bytes of each storage it owns (what the host pool must hold for it).
    unmovable
        Stages that save a tensor a byte copy cannot rebuild (a tensor subclass, sparse,
        quantized, nested or named), and which kinds: they stay resident
        (NOTE [ tensors that cannot move ]).
    pinned
        Per unit, the ordinals of its storages held beyond its backward other than its output
        (a key/value cache in the model's output, a tensor later blocks read): they stay
        resident, counted in ``act[0]``, and the rest of the unit can move (NOTE [ units held
        elsewhere ]).
    held_bytes
        The bytes so pinned, by holder: ``"output"`` (the model's output), ``"blocks"`` (later
        blocks' extra inputs) and ``"forward"`` (a reference the forward's own code keeps, such
        as a list of skips: NOTE [ storages the forward keeps ]).
    prefix_unit
        Bytes of the storages the code before the first block keeps for the backward, its
        output a_0 included, when that code is not a stage of its own (0 when it is):
        NOTE [ prefix and suffix ].
    prefix_bytes
        Of these, the bytes beyond a_0's: resident outside the chain (:attr:`resident_bytes`).
    held_why
        Per unit kept resident whole because its output is held: by what (``"output"``,
        ``"block N"``, ``"forward"``).
    output_bytes
        Bytes of the storages the model's output holds that no unit owns (a language model's
        logits): counted in unit L and in every earlier backward (NOTE [ the output's own
        storages ]).
    late
        Per unit, the storages the forward's own code keeps alive after the next block and lets
        go of before it returns (a stage's input its frame holds, a skip the up path reads), as
        (ordinal, r): alive until the end of F_r whether or not the unit is offloaded. They
        move with their unit (NOTE [ late release ]).
    late_tmp
        Per stage 1..L, the bytes of those storages added to its ``fwd_tmp``: a storage of unit
        i released during F_r counts in every stage i+2..r.
    restore_tmp
        Per stage 1..L, for a stage whose call takes a state object (a key/value cache), the
        bytes of its unit's pinned storages, added to its ``fwd_tmp``: a recomputation makes
        them again while it runs (NOTE [ state a recomputation puts back ] in _recompute.py).
    collapsed
        Stages whose block the measured forward skipped and could not run in its place: measured
        as a step that skips them runs them (NOTE [ blocks a profile cannot run ]), so these
        sizes hold only for a call that skips them too.
    held_grad
        Per storage of a unit i that a later block's call takes as an argument (a skip):
        ``(i, j, bytes, output, whole)``, j the last stage whose call takes it, bytes the
        gradient storage(s) B_j hands it (measured in the profile's backward), ``output``
        whether it is a_i, ``whole`` whether unit i is held whole: that gradient waits from B_j
        until the sum at B_{i+1} (B_i for another storage of the unit), counted by
        :func:`held_grad_tmp` (NOTE [ the gradient a held storage waits for ]).
    unowned_tmp
        Per stage 1..L, the bytes of the storages alive at its start that the forward's code
        made and no unit owns (not saved by autograd, no stage's output, no state object's):
        added to its ``fwd_tmp`` (NOTE [ storages no unit owns ]).
    unowned_bytes
        Bytes resident outside the chain of storages no unit owns that live into the backward:
        those still alive when the forward returns that are not the output's, and the output's
        loss with the gradient autograd seeds its backward with (NOTE [ storages no unit owns ]).
    pinned_act
        Units whose output a_i is pinned alone (its next stage is its block's tail): an
        offload of a_i alone moves nothing (NOTE [ a pinned a_i never moves ] in plans.py).
    """

    act: tuple[int, ...]
    saved: tuple[int, ...]
    owned: tuple[int, ...]
    aliased: frozenset[int]
    held: frozenset[int] = frozenset()
    storages: tuple[tuple[int, ...], ...] = ()
    unmovable: Mapping[int, str] = dataclasses.field(default_factory=dict, hash=False)
    pinned: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict, hash=False)
    held_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)
    prefix_unit: int = 0
    prefix_bytes: int = 0
    held_why: Mapping[int, str] = dataclasses.field(default_factory=dict, hash=False)
    output_bytes: int = 0
    late: Mapping[int, tuple[tuple[int, int], ...]] = dataclasses.field(default_factory=dict, hash=False)
    late_tmp: tuple[int, ...] = ()
    restore_tmp: tuple[int, ...] = ()
    collapsed: frozenset[int] = frozenset()
    held_grad: tuple[tuple[int, int, int, bool, bool], ...] = ()
    unowned_tmp: tuple[int, ...] = ()
    unowned_bytes: int = 0
    pinned_act: frozenset[int] = frozenset()

    @property
    def resident(self) -> frozenset[int]:
        """Units that cannot be offloaded: aliased, held or unmovable."""
        return self.aliased | self.held | frozenset(self.unmovable)

    @property
    def resident_bytes(self) -> int:
        """Bytes resident for the whole step outside the chain: what the code before the first
        block saves besides a_0, and the storages pinned because something holds them beyond
        their unit's backward, and the storages no unit owns that live into the backward
        (``unowned_bytes``). The solver gets the budget less these (NOTE [ resident outside
        the chain ] in plans.py)."""
        return int(self.prefix_bytes) + sum(self.held_bytes.values()) + int(self.unowned_bytes)

    def host_bytes(self, units: Any) -> int:
        """Bytes of host buffers (in the pool's size classes) that offloading ``units`` takes."""
        return sum(size_class(n) for u in units for n in self.storages[u - 1])


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class _RecordedPass:
    """What the recorder collects of one profiled pass: the ledger of units, the boundary marks
    and the storages each unit saved."""

    def __init__(self, ledger: UnitLedger) -> None:
        self.ledger = ledger
        self.current: int | None = 0
        self.versions: dict[int, int | None] = {}
        self.marks: dict[Any, tuple[Any, int, int]] = {}
        self.act: dict[int, int] = {}
        self.a0_entry: Any = None  # the ledger's entry of a_0, when a unit owns it
        #: A probe pass: per entry the forward keeps alive after the next block, the last stage
        #: at whose start it was still alive (NOTE [ storages the forward keeps ]).
        self.alive_at: dict[Any, int] = {}
        #: A measured pass: (unit, ordinal) -> the stage r during whose forward the forward's own
        #: code lets go of that storage (NOTE [ late release ]).
        self.late: dict[tuple[int, int], int] = {}
        #: A probe pass: per entry, the aliases of what autograd saved from its storage that the
        #: pass gave autograd instead (NOTE [ storages the forward keeps ]).
        self.aliases: dict[Any, list[torch.Tensor]] = {}
        #: A probe pass: per stage, the seconds its checks took inside that stage's forward.
        self.checks: dict[int, float] = {}
        #: Seconds the forward spent in the recorder's bookkeeping (the ledger, per saved tensor
        #: and per boundary), which a reference forward does not run (NOTE [ how many
        #: profiling steps ]).
        self.bookkeeping = 0.0
        #: Entries of hidden states the forward held while the instrument ran the blocks it
        #: skipped in their place: not the forward's late release (NOTE [ skipped stages ] in
        #: executor.py).
        self.carried: set[Any] = set()
        #: Per stage whose call took a state object (a key/value cache), the tensors its call
        #: put into it, as (weak reference, data pointer, bytes) of each new storage; the objects
        #: and the storages they held at the call's start while it runs (NOTE [ what a state
        #: object holds ]).
        self.state_new: dict[int, list[tuple[Any, int, int]]] = {}
        self.state_open: dict[int, tuple[list, set[int]]] = {}
        #: Of those storages, the ones no unit owns, alive when the forward returned: ptr -> bytes.
        self.state_unowned: dict[int, int] = {}
        #: Stages collapsed as a skipping step runs them (NOTE [ blocks a profile cannot run ]).
        self.collapsed: set[int] = set()
        #: Per stage whose call takes an earlier unit's held storage, while it runs: the gradient
        #: edges of those storages -> their entries, and the nodes the graph walk stops at
        #: (NOTE [ the gradient a held storage waits for ]).
        self.hold_open: dict[int, tuple[dict[tuple[int, int], Any], set[int]]] = {}
        #: (entry, holder stage) -> {data pointer: bytes} of the gradients B_holder handed it.
        self.held_grads: dict[tuple[Any, int], dict[int, int]] = {}
        #: A probe pass, while its forward runs: the storages it makes on the device; per stage,
        #: the bytes of those alive at its start that no unit owns; the bytes of those alive when
        #: the forward returned (NOTE [ storages no unit owns ]).
        self.made: _Made | None = None
        self.outputs: list[StorageWeakRef] = []
        #: Casts of weights autocast makes and autograd saves (NOTE [ never a parameter ] in _stages.py).
        self.weights: list[StorageWeakRef] = []
        self.unowned: dict[int, int] = {}
        #: (the weak references keep each StorageImpl, and so its cdata, from being reused)
        self.unowned_seen: dict[int, dict[int, tuple[StorageWeakRef, int]]] = {}
        self.unowned_end = 0
        #: The bytes of the output's loss when no unit owns it (NOTE [ storages no unit owns ]).
        self.loss_bytes = 0


class _Made(TorchDispatchMode):
    """Every storage an op makes on ``device`` (an output over none of its inputs' storages)
    while the probe's forward runs, by weak reference, less what the recorder itself makes
    (``paused``): NOTE [ storages no unit owns ]."""

    def __init__(self, device: torch.device, p: _RecordedPass) -> None:
        super().__init__()
        self.device = device
        self.p = p
        #: StorageWeakRef.cdata -> (the weak reference, bytes, data pointer)
        self.made: dict[int, tuple[StorageWeakRef, int, int]] = {}
        self.paused = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        start = time.perf_counter()
        try:
            self._note(out, args, kwargs)
        finally:
            # Off the stage's time on CPU, as the probe's other checks (_forward_times).
            # (The code before the first block is timed in stage 1: NOTE [ what the profiler measures ].)
            p = self.p
            if p.current is not None:
                k = max(1, p.current)
                p.checks[k] = p.checks.get(k, 0.0) + time.perf_counter() - start
        return out

    def _note(self, out: Any, args: tuple, kwargs: dict | None) -> None:
        inputs = None
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or type(t) is not torch.Tensor or t.device != self.device:
                continue
            st = t.untyped_storage()
            if not st.nbytes():
                continue
            ref = StorageWeakRef(st)
            if ref.cdata in self.made:
                continue
            if inputs is None:
                inputs = {
                    a.untyped_storage().data_ptr() for a in pytree.tree_leaves((args, kwargs))
                    if isinstance(a, torch.Tensor) and a.layout == torch.strided
                }
            if st.data_ptr() not in inputs:
                self.made[ref.cdata] = (ref, st.nbytes(), st.data_ptr())


@contextlib.contextmanager
def _unseen(p: _RecordedPass | None) -> Any:
    """The recorder's own work: what it makes is none of the forward's (NOTE [ storages no
    unit owns ])."""
    made = p.made if p is not None else None
    if made is None:
        yield
        return
    made.paused += 1
    try:
        yield
    finally:
        made.paused -= 1


class _Recorder:
    """An instrument listener that measures: marks at every boundary, sizes through the ledger."""

    def __init__(self, n: int, device: torch.device, roots: tuple[nn.Module, ...]) -> None:
        self.n = n
        self.device = device
        self.roots = roots
        self.timer = Timer(device)
        self.current: _RecordedPass | None = None
        #: The next pass is a probe (NOTE [ storages the forward keeps ]).
        self.probe = False
        #: Fingerprint what the passes save, and compare at unpack, until one backward has run
        #: (NOTE [ writes no version counter sees ]).
        self.check_writes = True
        #: Fingerprint what is saved, for the backward to compare (False in a pass that runs no
        #: backward: only the checks between blocks can see a write there).
        self.check_saved = True
        self._prints: dict[int, tuple[int, torch.Tensor]] = {}
        self._compares: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        #: Per entry of an output a_i: (i, fingerprint of its storage at the end of F_i, a
        #: version probe of a_i, its version then).
        self._at_end: dict[int, tuple[int, torch.Tensor, torch.Tensor, int]] = {}
        #: Units a tensor of which the backward read with other bytes than were saved.
        self.written: set[int] = set()
        #: Per unit whose output a profiling pass handed on past skipped blocks, the stages of
        #: those blocks: a write found on it may be the code after any of them (NOTE [ skipped
        #: stages ] in executor.py).
        self._also: dict[int, set[int]] = {}
        #: Per stage, the seconds the backward spent on those checks (off B_i's time on CPU).
        self.bwd_checks: dict[int, float] = {}

    #: Blocks a profiling forward skipped are called anyway (NOTE [ skipped stages ] in executor.py).
    runs_skipped = True
    #: Blocks (the instrument's numbers) a pass takes as skipped instead, when it replays the
    #: call's own draws; ``None``: draw again instead (NOTE [ blocks a profile cannot run ]).
    collapse: frozenset[int] | None = None

    def wants(self) -> bool:
        return True

    def forward_start(self, args: tuple, kwargs: dict) -> _RecordedPass:
        ledger = UnitLedger(self.device, resident_storages(self.roots))
        ledger.add_resident((args, kwargs))
        p = self.current = _RecordedPass(ledger)
        if self.probe and torch.is_grad_enabled():
            # NOTE [ storages no unit owns ]: left in forward_end or forward_failed.
            p.made = _Made(self.device, p)
            p.made.__enter__()
        p.marks["start"] = self.timer.mark()
        return p

    def stage_start(self, p: _RecordedPass, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None:
        with _unseen(p):
            self._stage_start(p, idx, hidden, args, kwargs)

    def _stage_start(self, p: _RecordedPass, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None:
        if self.check_writes and isinstance(hidden, torch.Tensor):
            start = time.perf_counter()
            self._check_between(p, hidden)
            p.checks[idx] = p.checks.get(idx, 0.0) + time.perf_counter() - start
        start = time.perf_counter()
        p.versions[idx] = p.ledger.stage_start(idx, hidden, (args, kwargs))
        _note_holds(p, idx, hidden, (args, kwargs))
        roots: list = []
        _state_objects((args, kwargs), roots)
        if roots:
            p.state_open[idx] = (roots, {t.untyped_storage().data_ptr() for t in state_structure(roots)[1]})
        p.bookkeeping += time.perf_counter() - start
        if self.probe:
            start = time.perf_counter()
            self._still_alive(p, idx - 2, idx)
            if p.made is not None:
                p.unowned_seen[idx] = _unowned(p, hidden)
            p.checks[idx] = time.perf_counter() - start
        if idx == 1:
            p.act[0] = _nbytes(hidden)
            p.a0_entry = p.ledger.owner(hidden) if isinstance(hidden, torch.Tensor) else None
        p.current = idx

    def stage_end(self, p: _RecordedPass, idx: int, hidden_in: Any, hidden_out: Any) -> None:
        with _unseen(p):
            self._stage_end(p, idx, hidden_in, hidden_out)

    def _stage_end(self, p: _RecordedPass, idx: int, hidden_in: Any, hidden_out: Any) -> None:
        start = time.perf_counter()
        if p.made is not None and isinstance(hidden_out, torch.Tensor):
            p.outputs.append(StorageWeakRef(hidden_out.untyped_storage()))
        if idx in p.state_open:
            roots, before = p.state_open.pop(idx)
            new: dict[int, tuple[Any, int, int]] = {}
            for t in state_structure(roots)[1]:
                st = t.untyped_storage()
                if st.data_ptr() not in before and st.nbytes() and t.device == self.device:
                    new.setdefault(st.data_ptr(), (weakref.ref(t), st.data_ptr(), st.nbytes()))
            p.state_new[idx] = list(new.values())
        p.ledger.stage_end(idx, hidden_in, p.versions.pop(idx, None), hidden_out)
        if idx in p.hold_open:
            _hook_holds(p, idx, hidden_out)
        p.bookkeeping += time.perf_counter() - start
        start = time.perf_counter()
        if self.check_writes and idx < self.n and isinstance(hidden_out, torch.Tensor):
            entry = p.ledger.owner(hidden_out)
            fp = _fingerprint(_storage_bytes(hidden_out)) if entry is not None and entry.unit == idx else None
            if fp is not None:
                # The earliest an offload may copy a_i: what the backward reads must be these
                # bytes, or a write its version counter saw (NOTE [ writes no version counter sees ]).
                self._at_end[id(entry)] = (idx, fp, version_probe(hidden_out), hidden_out._version)
            p.checks[idx] = p.checks.get(idx, 0.0) + time.perf_counter() - start
        p.act[idx] = _nbytes(hidden_out)
        if idx < self.n:
            p.marks[("f", idx)] = self.timer.mark()

    def _check_between(self, p: _RecordedPass, hidden: torch.Tensor) -> None:
        """Compare the storage of a block's output, as the next block reads it, with its
        fingerprint at the end of its own block, when no version counter moved in between: the
        code between the two blocks wrote it through .data (NOTE [ writes no version counter sees ])."""
        entry = p.ledger.owner(hidden)
        end = self._at_end.get(id(entry)) if entry is not None else None
        if end is not None and end[2]._version == end[3]:
            self._compares.append((end[0], end[1], _fingerprint(_storage_bytes(hidden))))

    def forward_end(self, p: _RecordedPass, outputs: Any) -> None:
        made, p.made = p.made, None
        if made is not None:
            made.__exit__(None, None, None)
        p.marks[("f", self.n)] = self.timer.mark()
        p.ledger.forward_end(outputs, self.n)
        for new in p.state_new.values():
            for ref, ptr, nbytes in new:
                t = ref()
                if t is not None and p.ledger.owner(t) is None:
                    p.state_unowned[ptr] = nbytes
        if self.probe:
            self._still_alive(p, self.n - 1, None)
        if made is not None:
            p.made = made
            p.unowned_end, p.loss_bytes = _unowned_at_end(p, outputs)
            p.made = None
        p.current = None

    def _still_alive(self, p: _RecordedPass, upto: int, stage: int | None) -> None:
        """Note the storages of units 1..``upto`` that are still alive at the start of ``stage``
        (``None``: when the forward returns, where they are held by the forward beyond it):
        NOTE [ storages the forward keeps ]."""
        ledger = p.ledger
        for u in range(1, upto + 1):
            for e in ledger.units.get(u, ()):
                if e in ledger.held_by or e in p.carried or not _held_beyond_probe(p, e):
                    continue
                if stage is None:
                    ledger.held_by[e] = "forward"
                else:
                    p.alive_at[e] = stage

    def carrying(self, p: _RecordedPass, hidden: Any, stages: tuple[int, ...]) -> None:
        """The forward holds ``hidden`` while the instrument runs the blocks of ``stages`` that
        it skipped, in their place (NOTE [ skipped stages ] in executor.py): its storage's
        holding is none of the forward's own, and the code the forward ran after those blocks'
        places ran on it: a write found on it marks their units too (a training step that runs
        them writes their outputs)."""
        entry = p.ledger.owner(hidden) if isinstance(hidden, torch.Tensor) else None
        if entry is not None:
            p.carried.add(entry)
            if entry.unit >= 1:
                self._also.setdefault(entry.unit, set()).update(stages)

    def stage_skipped(self, p: _RecordedPass, idx: int, hidden: Any) -> None:
        """Stage ``idx`` collapses, as in a training step that skips its block (NOTE [ blocks a
        profile cannot run ]): its a_i is the hidden state handed on (``None`` after the last
        block: the last a_j), its unit saves nothing."""
        p.collapsed.add(idx)
        if idx >= 2 and ("f", idx - 1) not in p.marks:
            # The code before the blocks (stage 1) never ended: this draw calls no block, so that
            # code ran the whole forward (NOTE [ a step that calls no block ] in executor.py).
            p.marks[("f", idx - 1)] = self.timer.mark()
            p.act.setdefault(idx - 1, 0)
        p.act[idx] = _nbytes(hidden) if hidden is not None else p.act.get(idx - 1, 0)
        if idx < self.n:
            p.marks[("f", idx)] = self.timer.mark()

    def forward_failed(self, p: _RecordedPass) -> None:
        made, p.made = p.made, None
        if made is not None:
            made.__exit__(None, None, None)
        p.current = None
        # No backward reads what this pass saved, and the ids of its records may come back in
        # the next pass (one run again after it skipped its last blocks: NOTE [ skipped stages ]
        # in executor.py).
        self._prints.clear()
        self._at_end.clear()

    def backward_mark(self, p: _RecordedPass, idx: int) -> None:
        if idx < self.n:
            p.marks.setdefault(("g", idx), self.timer.mark())

    def backward_end(self, p: _RecordedPass) -> None:
        return None

    def pack(self, p: _RecordedPass, t: torch.Tensor) -> Any:
        if p.made is None:
            return self._pack(p, t)
        with _unseen(p):
            return self._pack(p, t)

    def _pack(self, p: _RecordedPass, t: torch.Tensor) -> Any:
        start = time.perf_counter()
        entry = p.ledger.pack(t, p.current)
        if p.made is not None and entry is None and is_parameter_like(t):
            # A weight's autocast cast: outside the chain as the weights are (NOTE [ storages no
            # unit owns ]).
            p.weights.append(StorageWeakRef(t.untyped_storage()))
        kept = Kept(t, p.current)
        # A print under this id is a Kept freed without a backward reading it (a saved tensor the
        # forward made and dropped): its address came back, and a later unpack of this one would
        # compare another tensor with it and see a write.
        self._prints.pop(id(kept), None)
        checked = 0.0
        if self.check_writes and self.check_saved and entry is not None and 1 <= entry.unit <= self.n:
            fp_start = time.perf_counter()
            fp = _fingerprint(t)
            if fp is not None:
                self._prints[id(kept)] = (entry.unit, fp, id(entry))
            checked = time.perf_counter() - fp_start
            if p.current is not None:  # not the stage's own work: off its time on CPU
                p.checks[p.current] = p.checks.get(p.current, 0.0) + checked
        if self.probe and entry is not None:
            # NOTE [ storages the forward keeps ]: autograd gets an alias, a tensor object of the
            # probe's own over the same storage, so any other reference is the forward's.
            kept.tensor = t.detach()
            p.aliases.setdefault(entry, []).append(kept.tensor)
        p.bookkeeping += time.perf_counter() - start - checked
        return kept

    def unpack(self, k: Any) -> Any:
        # The check autograd skips under saved-tensor hooks (NOTE [ version discipline ]): a
        # model that modifies a saved tensor in place is refused while profiling, as plain
        # PyTorch would refuse its first backward.
        if isinstance(k, Kept):
            check_version(k, k.tensor._version, "while profiling (chainoffload_torch.profile)")
            seen = self._prints.pop(id(k), None)
            if seen is not None:
                start = time.perf_counter()
                self._compares.append((seen[0], seen[1], _fingerprint(k.tensor)))
                end = self._at_end.pop(seen[2], None)
                if end is not None and end[2]._version == end[3]:
                    # No version counter of a_i moved since F_i ended: its bytes must not have.
                    self._compares.append((end[0], end[1], _fingerprint(_storage_bytes(k.tensor))))
                if k.stage is not None:
                    self.bwd_checks[k.stage] = self.bwd_checks.get(k.stage, 0.0) + time.perf_counter() - start
            return k.tensor
        return k

    def found_writes(self) -> set[int]:
        """The units found written so far: those noted, and those the checks pending show read
        back with other bytes (NOTE [ writes no version counter sees ])."""
        found = set(self.written)
        for unit, then, now in self._compares:
            if not torch.equal(then, now):
                found.add(unit)
                found |= self._also.get(unit, set())
        return found

    def checked_writes(self) -> None:
        """After a backward: note the units read back with other bytes than saved, and stop
        checking (NOTE [ writes no version counter sees ])."""
        self.written = self.found_writes()
        self._compares.clear()
        self._prints.clear()
        self._at_end.clear()
        self.check_writes = False


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage of ``t``."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _fingerprint(t: torch.Tensor) -> torch.Tensor | None:
    """Two integer sums over the bit patterns of ``t`` (all of them, and by rows of 64 weighted
    by position), on its device: what a write of its bytes changes but for a vanishing chance.
    ``None`` for a tensor whose bytes cannot be read so (not strided, an odd element size)."""
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    try:
        # The stored bytes as they are: a plain tensor over them (no lazy conj / neg bit).
        x = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
        if x.is_complex():
            x = torch.view_as_real(x)
        dt = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        try:
            v = x.view(dt)
        except RuntimeError:
            v = x.contiguous().view(dt)
        v = v.reshape(-1)
    except (RuntimeError, KeyError):
        return None
    rows = v.numel() // 64
    whole = v.sum(dtype=torch.int64)
    if not rows:
        return whole.reshape(1)
    weights = torch.arange(1, rows + 1, device=v.device, dtype=torch.int64)
    by_row = (v[: rows * 64].view(rows, 64).sum(1, dtype=torch.int64) * weights).sum()
    return torch.stack([whole, by_row])


def _backward_roots(out: Any) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """What a profiling step backpropagates: the output's ``loss`` if it has one, else every
    output tensor that requires grad (with a gradient of ones; the values do not change the work)."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return [loss], [None if loss.numel() == 1 else torch.ones_like(loss)]
    roots = [t for t in tensors_in(out) if t.requires_grad]
    if not roots:
        raise ValueError("sample: the model's output has no tensor that requires grad, so a training step has no backward")
    return roots, [torch.ones_like(t) for t in roots]


def _times(timer: Timer, marks: dict, n: int) -> tuple[list[float], list[float]]:
    """Per-stage forward and backward seconds of one pass (NOTE [ what the profiler measures ])."""
    ends = [marks["start"]] + [marks[("f", i)] for i in range(1, n + 1)]
    fwd = [timer.seconds(ends[i - 1][0], ends[i][0]) for i in range(1, n + 1)]
    if "bwd_start" not in marks:
        return fwd, []
    end = marks["bwd_end"]
    # b[i]: when g_i is complete (B_i starts); b[n] the backward's start, b[0] its end. No mark
    # for g_i (a_i needs no gradient): B_1..B_i have nothing to do, their time is 0.
    b = [end] + [marks.get(("g", i), end) for i in range(1, n)] + [marks["bwd_start"]]
    bwd = [timer.seconds(b[i][0], b[i - 1][0]) for i in range(1, n + 1)]
    return fwd, bwd


def _tmp(marks: dict, n: int, act: list[int]) -> tuple[list[int], list[int]]:
    """CUDA: transient bytes of each F_i and B_i from the allocator marks."""
    f_marks = [marks["start"]] + [marks[("f", i)] for i in range(1, n + 1)]
    fwd_tmp = [max(0, f_marks[i][2] - f_marks[i][1]) for i in range(1, n + 1)]
    end = marks["bwd_end"]
    b = [end] + [marks.get(("g", i), end) for i in range(1, n)] + [marks["bwd_start"]]
    bwd_tmp = [max(0, b[i - 1][2] - b[i][1] - act[i - 1]) for i in range(1, n + 1)]
    return fwd_tmp, bwd_tmp


def _holder(by: str) -> str:
    """The ``held_bytes`` key of a ledger's ``held_by`` value."""
    return by if by in ("output", "forward") else "blocks"


def _sizes(p: _RecordedPass, n: int, tails: Collection[int] = ()) -> Sizes:
    """The sizes of pass ``p`` of an ``n``-stage chain; ``tails``: the stages that are code after
    a block (NOTE [ the code after a block as a stage ] in _instrument.py)."""
    ledger = p.ledger
    held, pinned, held_bytes, held_why = set(), {}, {"output": 0, "blocks": 0, "forward": 0}, {}
    pinned_act = set()
    for i in range(1, n):
        entries = ledger.units.get(i, [])
        mine = [e for e in entries if e in ledger.held_by]
        if not mine:
            continue
        out = ledger.output.get(i)
        if out in ledger.held_by and i + 1 not in tails:
            # NOTE [ units held elsewhere ] in _stages.py. A block's a_i that its tail takes is
            # pinned as any held storage: no stage is recomputed from it (NOTE [ the code after a
            # block as a stage ] in _instrument.py).
            held.add(i)
            held_why[i] = ledger.held_by[out]
            continue
        pinned[i] = tuple(k for k, e in enumerate(entries) if e in ledger.held_by)
        if out in ledger.held_by:
            pinned_act.add(i)
        for e in mine:
            held_bytes[_holder(ledger.held_by[e])] += e.nbytes
    # a_0 is the hidden input of the first stage alone: its size is also g_0's, which B_1 makes
    # (docs/model.md). What the code before it saves besides it (a stem's activations) is
    # resident outside the chain, never in act[0], where it would be counted again as g_0.
    prefix_unit = ledger.unit_bytes(0)
    a0 = p.a0_entry
    prefix_bytes = prefix_unit - (a0.nbytes if a0 is not None and a0.unit == 0 else 0)
    act = [p.act.get(0, 0)] + [p.act.get(i, 0) for i in range(1, n + 1)]
    unmovable = {i: ", ".join(sorted(kinds)) for i, kinds in ledger.unmovable.items() if 1 <= i <= n}

    def kept(i: int) -> list:
        return [e for k, e in enumerate(ledger.units.get(i, ())) if k not in pinned.get(i, ())]

    # What cannot move still takes memory in its unit (counted where PyTorch tells its bytes).
    owned = tuple(sum(e.nbytes for e in kept(i)) + sum(ledger.unmovable.get(i, {}).values()) for i in range(1, n + 1))
    aliased = set(ledger.aliased)
    saved = []
    for i, own in enumerate(owned, start=1):
        if own < act[i]:
            aliased.add(i)  # its output is not a storage it owns: moving it would not move act[i]
        saved.append(max(own, act[i]))
    storages = tuple(tuple(e.nbytes for e in kept(i)) for i in range(1, n + 1))
    late, late_tmp = _late(p, n, held | aliased | set(unmovable))
    # NOTE [ what a state object holds ]: a recomputation of a stage given a cache makes what its
    # call put into the cache again; what no unit owns of it is resident from that call on.
    restore_tmp = tuple(sum(nbytes for _, _, nbytes in p.state_new.get(i, ())) for i in range(1, n + 1))
    unowned = sum(p.state_unowned.values())
    in_output = sum(nbytes for ptr, nbytes in p.state_unowned.items() if ptr in ledger.output_storages)
    if unowned:
        held_bytes["output"] += unowned
    return Sizes(
        tuple(act),
        tuple(saved),
        owned,
        frozenset(aliased),
        frozenset(held),
        storages,
        unmovable,
        pinned,
        {k: v for k, v in held_bytes.items() if v},
        prefix_unit,
        prefix_bytes,
        held_why,
        ledger.output_only - in_output,
        late,
        late_tmp,
        restore_tmp if any(restore_tmp) else (),
        frozenset(p.collapsed),
        pinned_act=frozenset(pinned_act),
    )


# NOTE [ what a state object holds ]
# A block given a state object (a key/value cache) puts tensors into it: a decoder layer's keys
# and values. The recorder looks at the objects' graph (NOTE [ state a recomputation puts back ]
# in _recompute.py) at the start and at the end of every such call, and takes the storages that
# were not there before as what the call put in. Two figures come of them:
# * Those no unit owns (autograd does not save them: Llama's keys, which repeat_kv copies before
#   the product; GPT-2's keys, which matmul copies as it transposes them) are alive from that call
#   to the end of the step when the output or the forward holds them: resident outside the chain
#   (held_bytes["output"]), from the step's start, instead of in unit L from F_L as the output's
#   own storages are (NOTE [ the output's own storages ]), which left them out of the forward.
#   Those a unit owns are pinned already (NOTE [ units held elsewhere ] in _stages.py).
# * All of them are what a recomputation of the stage makes again while it runs (twins of the
#   originals, which the executor drops at its end): restore_tmp, added to the stage's fwd_tmp.


def _late(p: _RecordedPass, n: int, resident: set[int]) -> tuple[dict[int, tuple[tuple[int, int], ...]], tuple[int, ...]]:
    """The storages released late by the forward's own code, per unit, and the bytes each
    stage's ``fwd_tmp`` gets for them (NOTE [ late release ])."""
    ledger = p.ledger
    late: dict[int, list[tuple[int, int]]] = {}
    tmp = [0] * n
    for (u, k), r in sorted(p.late.items()):
        entries = ledger.units.get(u, ())
        # A unit that stays resident whole counts the storage in saved[u] until B_u already; one
        # pinned or held by a later block or the output is resident outside the chain.
        if not 1 <= u < n or k >= len(entries) or u in resident or entries[k] in ledger.held_by:
            continue
        r = min(r, n)
        if r < u + 2:
            continue
        late.setdefault(u, []).append((k, r))
        for j in range(u + 2, r + 1):
            tmp[j - 1] += entries[k].nbytes
    return {u: tuple(v) for u, v in late.items()}, tuple(tmp)


def _known(p: _RecordedPass) -> set[int]:
    """The storages the chain counts elsewhere, alive: every unit's (the prefix's included),
    every stage's output a_i, and the casts of weights autograd saves, outside the chain as the
    weights are (NOTE [ storages no unit owns ])."""
    known = {e.ref.cdata for es in p.ledger.units.values() for e in es if not e.ref.expired()}
    known.update(r.cdata for r in p.outputs if not r.expired())
    known.update(r.cdata for r in p.weights if not r.expired())
    return known


def _unowned(p: _RecordedPass, hidden: Any) -> dict[int, tuple[StorageWeakRef, int]]:
    """The storages the probe's forward made that are alive now, at a stage's start, and that
    the chain counts nowhere else: no unit's, no stage's output, not the stage's hidden input, no
    state object's (NOTE [ storages no unit owns ]); cdata -> (weak reference, bytes)."""
    made = p.made.made if p.made is not None else {}
    known = _known(p)
    if isinstance(hidden, torch.Tensor):
        known.add(StorageWeakRef(hidden.untyped_storage()).cdata)
    state = {ptr for new in p.state_new.values() for _, ptr, _ in new}
    out = {}
    for c, (ref, nbytes, ptr) in list(made.items()):
        if ref.expired():
            del made[c]
        elif c not in known and ptr not in state:
            out[c] = (ref, nbytes)
    return out


def _unowned_at_end(p: _RecordedPass, outputs: Any) -> tuple[int, int]:
    """When the probe's forward returns: the bytes of the storages it made that are still
    alive and that the chain counts nowhere else (no unit's, not the output's own, no state
    object's), resident outside the chain, and the bytes of the output's loss when no unit owns
    it (NOTE [ storages no unit owns ]). Sets ``p.unowned``, per stage, from the storages seen
    at its start less these, which resident_bytes counts already."""
    ledger = p.ledger
    made = p.made.made if p.made is not None else {}
    known = _known(p)
    skip = set(ledger.output_storages) | set(p.state_unowned) | {ptr for new in p.state_new.values() for _, ptr, _ in new}
    alive = {c: n for c, (ref, n, ptr) in made.items() if not ref.expired() and c not in known and ptr not in skip}
    end = sum(alive.values())
    p.unowned = {j: sum(n for c, (_, n) in seen.items() if c not in alive) for j, seen in p.unowned_seen.items()}
    p.unowned_seen.clear()
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    loss_bytes = 0
    if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.layout == torch.strided:
        st = loss.untyped_storage()
        if st.data_ptr() in ledger.output_storages:
            loss_bytes = st.nbytes()
    return end, loss_bytes


def _with_unowned(sizes: Sizes, p: _RecordedPass, n: int) -> Sizes:
    """``sizes`` with the storages no unit owns that pass ``p`` (or its probe) found
    (NOTE [ storages no unit owns ]): per stage in ``unowned_tmp``, and resident outside the
    chain those that live into the backward; the output's loss moves there from the output's
    own storages, with its seed gradient."""
    tmp = tuple(int(p.unowned.get(i, 0)) for i in range(1, n + 1))
    loss = min(int(p.loss_bytes), int(sizes.output_bytes))
    return dataclasses.replace(
        sizes,
        unowned_tmp=tmp if any(tmp) else (),
        unowned_bytes=int(p.unowned_end) + 2 * loss,
        output_bytes=int(sizes.output_bytes) - loss,
    )


def _measure(
    instrument: Instrument,
    root: nn.Module,
    args: tuple,
    kwargs: dict,
    device: torch.device,
    repeats: int | None,
    warmup: int | None,
    timed: bool = True,
    *,
    nosave: bool = True,
    split_prefix: bool = False,
    reference: float | None = None,
    redraw: bool = True,
) -> tuple[Sizes, dict[str, list]]:
    """Run profiling steps through ``instrument`` (its listener swapped for a recorder).

    ``repeats=None``: as many steps as the timings need (NOTE [ how many profiling steps ]),
    ``reference`` the seconds of a forward with autograd just before (the discovery's, NOTE
    [ discovery as the warm-up ]; ``None``: the probe's forward is one and takes no backward);
    ``nosave``: also time a forward without autograd after each step (``fwd_nosave``);
    ``split_prefix``: make the code before the first block a stage when it pays, decided
    from the probe (NOTE [ the prefix as a stage ]; ``instrument.blocks`` is replaced), and
    leave in its block's stage a tail that would pin an earlier unit (NOTE [ the code after a
    block as a stage ] in _instrument.py): the first plan chooses the layout, later shapes keep it;
    ``redraw=False``: a pass whose skipped blocks cannot be run replays the call's own draws at
    once, without drawing others first (NOTE [ blocks a profile cannot run ]).
    """
    before = instrument.listener
    runs: dict[str, list] = {"fwd": [], "bwd": [], "nosave": [], "fwd_tmp": [], "bwd_tmp": []}
    sizes, rec, kept, written = None, None, [], set()
    try:
        with training_state([root]), torch.enable_grad():
            n = instrument.blocks.stages
            rec = instrument.listener = _Recorder(n, device, (root,))
            rec.check_saved = timed  # no backward reads a fingerprint of what is saved
            probed = None  # what the probe found on this layout, once it ran
            steps: list[dict[str, list]] = []
            limit = (warmup + repeats) if repeats is not None else AUTO_MAX_STEPS
            replay = _Replay(device)
            while True:
                rec.probe = probed is None  # the first pass on a layout is the probe
                out = _forward_every_block(root, args, kwargs, rec, replay, redraw=redraw)
                p = rec.current
                rec.current = None
                if rec.probe:
                    probed = _probed(p)
                    blks = instrument.blocks
                    tail_stages = tail_stages_of(blks)
                    if split_prefix and not blks.prefix and prefix_pays(_sizes(p, n, tail_stages), tail_stages):
                        # NOTE [ the prefix as a stage ]: the probe's sizes decide, before its
                        # backward; the next pass probes the new layout (what the forward keeps
                        # is found per unit).
                        del out, p
                        instrument.blocks = dataclasses.replace(instrument.blocks, prefix=True)
                        n = instrument.blocks.stages
                        carried = _writes_between(rec, blks, instrument.blocks)
                        rec = instrument.listener = _Recorder(n, device, (root,))
                        rec.written |= carried
                        rec.check_saved = timed
                        probed = None
                        continue
                    pinning = _pinning_tails(p, instrument.blocks) if split_prefix else set()
                    if pinning:
                        # NOTE [ the code after a block as a stage ] in _instrument.py: a tail that
                        # saves the output of the stage before its block would pin it resident.
                        del out, p
                        blks = instrument.blocks
                        instrument.blocks = dataclasses.replace(blks, tails=tuple(b for b in blks.tails if b not in pinning))
                        n = instrument.blocks.stages
                        carried = _writes_between(rec, blks, instrument.blocks)
                        rec = instrument.listener = _Recorder(n, device, (root,))
                        rec.written |= carried
                        rec.check_saved = timed
                        probed = None
                        continue
                    if timed:
                        # NOTE [ the probe's forward is not a step ]: its times are its dispatch
                        # mode's as much as the model's; no backward follows it.
                        if reference is None and repeats is None:
                            # Nothing warmed up this forward: it is the reference.
                            rec.timer.sync()
                            reference = sum(_forward_times(rec.timer, p, n)) - p.bookkeeping
                        del out, p
                        rec._prints.clear()  # no backward reads them (their ids may come back)
                        rec._at_end.clear()
                        continue
                else:
                    _apply_probe(p, probed)
                # The last step's: a first call may make what the model then caches (and so holds).
                sizes = _with_unowned(_sizes(p, n, tail_stages_of(instrument.blocks)), p, n)
                if not timed:
                    break
                roots, grads = _backward_roots(out)
                p.marks["bwd_start"] = rec.timer.mark()
                try:
                    torch.autograd.backward(roots, grads)
                except Exception:
                    if isinstance(replay.collapse, _Every):
                        raise  # the call's own draws, as its step runs them: plain PyTorch raises too
                    # NOTE [ a profiling backward that raises ]: replay the call's own draws with
                    # every block they skip collapsed, on a fresh recorder.
                    del out, p, roots, grads
                    replay.collapse = _Every()
                    carried = _writes_between(rec, instrument.blocks, instrument.blocks)
                    rec = instrument.listener = _Recorder(n, device, (root,))
                    rec.written |= carried
                    rec.check_saved = timed
                    probed, steps = None, []
                    continue
                p.marks["bwd_end"] = rec.timer.mark()
                sizes = _with_held_grads(sizes, p)
                for k in sorted(p.collapsed):
                    # A collapsed a_k is the a_j before it: its gradient is complete when g_j is.
                    if k < n and ("g", k) not in p.marks:
                        p.marks[("g", k)] = p.marks.get(("g", k - 1), p.marks["bwd_end"])
                rec.timer.sync()
                if rec.check_writes:
                    rec.checked_writes()
                    written = rec.written
                del out, roots, grads
                fwd, bwd = _forward_times(rec.timer, p, n), _times(rec.timer, p.marks, n)[1]
                if rec.bwd_checks and not rec.timer.cuda:
                    bwd = [max(0.0, b - rec.bwd_checks.get(i, 0.0)) for i, b in enumerate(bwd, start=1)]
                rec.bwd_checks.clear()
                step = {"fwd": fwd, "bwd": bwd, "bookkeeping": p.bookkeeping}
                if rec.timer.cuda:
                    step["fwd_tmp"], step["bwd_tmp"] = _tmp(p.marks, n, list(sizes.act))
                if nosave:
                    with torch.no_grad():
                        _forward_every_block(root, args, kwargs, rec, replay, redraw=redraw)
                    rec.timer.sync()
                    step["nosave"] = _times(rec.timer, rec.current.marks, n)[0]
                    rec.current = None
                steps.append(step)
                del p  # before the next forward (NOTE [ how many profiling steps ])
                kept = _kept_steps(steps, reference, warmup, repeats)
                if kept is not None or len(steps) == limit:
                    break
            if not timed and rec.check_writes:
                # A pass with no backward (a new shape's sizes): the checks between blocks need
                # none (NOTE [ writes no version counter sees ]).
                rec.checked_writes()
                written = rec.written
            if timed:
                for step in steps:  # transients: the most any step saw, warm-up included
                    for field in ("fwd_tmp", "bwd_tmp"):
                        if field in step:
                            runs[field].append(step[field])
                for step in kept:
                    for field in ("fwd", "bwd", "nosave"):
                        if field in step:
                            runs[field].append(step[field])
    finally:
        instrument.listener = before
        if rec is not None:
            rec.current = None
    if sizes is not None:
        sizes = _with_written(sizes, written)
    return sizes, runs


def _writes_between(rec: _Recorder, old: Any, new: Any) -> set[int]:
    """The units a pass on the ``old`` layout found written between blocks (its checks at each
    block's start: no backward needed), as stages of the ``new`` layout, for the recorder that
    replaces ``rec`` when the probe changes the layout (NOTE [ a layout's change keeps the
    writes found ])."""
    carried: set[int] = set()
    for u in rec.found_writes():
        b = old.block_at(u)
        if b is not None:
            carried.add(new.stage_of(b))
            continue
        # a tail of the old layout: its own stage in the new one, or its block's when it merged
        owner = next((k for k in old.tails if old.stage_of(k) + 1 == u), None)
        if owner is not None:
            carried.add(new.stage_of(owner) + (1 if owner in new.tails else 0))
    return {u for u in carried if 1 <= u <= new.stages}


# NOTE [ a layout's change keeps the writes found ]
# The probe (the first pass on a layout) may change the layout: the code before the first block
# becomes a stage (NOTE [ the prefix as a stage ]), or a tail that would pin an earlier unit goes
# back into its block. The pass on the new layout starts a new recorder, and its checks between
# blocks see only its own draws: a .data write whose bytes that pass leaves as they were (an
# all-zero output scaled after dropout zeroed its input) would go unseen though the probe saw it
# (the recomputing fuzz's model 3717: an offloaded unit's host copy held the unwritten bytes,
# gradients off, silently). So what the probe's checks found moves to the new recorder, renumbered
# by block.


def _with_written(sizes: Sizes, written: set[int]) -> Sizes:
    """``sizes`` with the units found written where no version counter sees unmovable
    (NOTE [ writes no version counter sees ]: those units stay resident)."""
    if not written:
        return sizes
    unmovable = dict(sizes.unmovable)
    for u in sorted(written):
        unmovable[u] = ", ".join(x for x in (unmovable.get(u), WRITTEN) if x)
    return dataclasses.replace(sizes, unmovable=unmovable)


def measuring_recorder(n: int, device: torch.device, root: nn.Module) -> _Recorder:
    """The recorder of a training step that measures its own shapes' sizes (NOTE [ one plan
    for many shapes ] in api.py): the pass :func:`measure_call_sizes` runs (a probe, the checks
    between blocks, no fingerprints of what is saved: no backward of its own compares them)."""
    rec = _Recorder(n, device, (root,))
    rec.check_saved = False
    rec.probe = True
    return rec


def sizes_of_pass(rec: _Recorder, p: _RecordedPass, n: int, tails: Collection[int] = ()) -> Sizes:
    """The sizes a measuring pass found, after its forward returned: what
    :func:`measure_call_sizes` computes from the same pass (the probe's findings, the units
    written between blocks); ``tails`` as :func:`_sizes` takes them."""
    _probed(p)
    sizes = _with_unowned(_sizes(p, n, tails), p, n)
    rec.checked_writes()
    return _with_written(sizes, rec.written)


#: What Sizes.unmovable says of a unit the backward read back with other bytes than it saved.
WRITTEN = "tensor written after it was saved, where no version counter sees it (through .data)"


# NOTE [ writes no version counter sees ]
# PyTorch checks at unpack that a saved tensor was not modified in place since it was saved (its
# version counter), and the executor does the same for what it moves (NOTE [ version discipline ]
# in _saved.py). A write through .data (h = block(h); h.data.mul_(0.9) in the parent's forward)
# or through a tensor made with set_() or from a storage goes around that counter: plain PyTorch
# trains on the written bytes, deterministically, while an offloaded unit's host copy may have
# been taken before the write, and the backward would read the stale bytes (gradients off by up
# to 1.9e-3 at memory 0.6, silently). The profile finds such writes: until one of its steps has
# run a backward, the recorder takes a fingerprint of every tensor a unit owns when it is saved
# (two integer sums of its bit patterns, on its device, no copy) and again when the backward
# reads it; the two are compared after the backward (one sync). A unit read back with other
# bytes is kept resident (Sizes.unmovable, shown in the table), where the backward reads what
# plain training reads, and is never recomputed (plans.not_recomputable). The saved tensors
# alone miss a written a_i that nothing saves (the next block saves tanh(a_i), not a_i): a
# recomputation of F_i and then F_{i+1} from the recomputed a_i reads the unwritten bytes (the
# fuzz's rotor plans: gradients off, silently). So a_i's storage is also fingerprinted at the
# end of F_i and again when F_{i+1} starts with it as its hidden input; bytes that changed with
# no version counter moving mark unit i written. That check needs no backward, so it runs in the
# forward that measures a new shape's sizes too (measure_call_sizes: a shape whose plan is
# borrowed from a larger one's, whose profile may have seen the write change no byte, as an
# all-zero output scaled), and a borrowed schedule that moves or recomputes a unit found written
# at the new shape is not used (_Planner.reuse). What it cannot see: a write that happens only
# in some steps (drawn at random, or after the profiled ones), or that leaves the checked bytes
# as they were; a model that writes through .data in its forward only now and then must keep
# those blocks resident with keep=. The fingerprints cost one read of what the step saves,
# twice, and two of each a_i, in one profiling step (and one forward per new shape).


#: Profiling forwards tried, under other random draws, when one skips its last blocks.
SKIP_TRIES = 32


# NOTE [ blocks a profile cannot run ]
# A profiling forward must measure every block (NOTE [ skipped stages ] in executor.py), so it
# runs the blocks LayerDrop skipped in their place, or draws again. At a new shape both can fail
# where plain training does not: a batch of one, on which batch norm in training raises
# ("Expected more than 1 value per channel"), or a block with an extra input of its own (a mask)
# that the next block's arguments lack. The made-up call raises, every other draw either runs
# the block itself (and raises) or skips one that cannot run, and the step raised where plain
# PyTorch, skipping the block, trains (5 of the 11 one-sided raises of the two 5000-model fuzz
# runs). Decision: a draw other than the call's own that raises is one that cannot be profiled
# (the call does not make it); when none can be (SKIP_TRIES), the pass replays the call's own
# draws (_Replay: torch's, Python's and NumPy's generators as the call found them) and each block
# that cannot run in its place collapses as the training step collapses it: its a_i the carried
# a_j, its unit saving nothing (the instrument tells the recorder stage_skipped). A block found
# so makes the replay run again with it collapsed; the passes after the first replay alike, so
# every pass of the profile measures the same draw. The sizes then hold only for a call that
# skips those blocks (Sizes.collapsed), which a plan cannot know before the call runs: the handle
# measures every later call of that shape under the call's own draws (redraw=False: at once, no
# other draws) and takes the plan whose sizes are the same (collapsed stages included), else makes
# one (Offloader._for_draws). A call that runs such a block at that shape raises in that measuring
# forward what plain PyTorch raises in its forward, before anything of the step ran. The cost: a
# measuring forward per call of such a shape (about 1.5 forwards), paid only where a block could
# not be profiled. The collapsed stage's B_i is timed as nothing (its gradient mark is g_j's).
# A replayed draw may call no block of the chain at all; the code before the blocks, when it is
# stage 1, then ran the whole forward, and ends where the first collapsed stage is told (a_1 of
# 0 bytes), as the executor takes such a step (NOTE [ a step that calls no block ] in executor.py).


class _Replay:
    """The random draws a call's own forward makes (its first profiling pass), to replay when
    no other draw can be profiled, and the blocks such replays collapse (NOTE [ blocks a
    profile cannot run ])."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.torch = torch.get_rng_state()
        self.torch_cuda = torch.cuda.get_rng_state(device) if self.cuda else None
        self.device = device
        self.py = random.getstate()
        np_random = sys.modules.get("numpy.random")
        self.np = np_random.get_state() if np_random is not None else None
        #: Once a pass fell back to replaying: the blocks every later pass collapses.
        self.collapse: frozenset[int] | None = None

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state(self.torch_cuda, self.device)
        random.setstate(self.py)
        if self.np is not None:
            sys.modules["numpy.random"].set_state(self.np)


def _forward_every_block(
    root: nn.Module, args: tuple, kwargs: dict, rec: _Recorder | None = None, replay: _Replay | None = None, *, redraw: bool = True
) -> Any:
    """A profiling forward of ``root`` that runs every block: the instrument calls the blocks
    it skips between others; one that skips the last ones is run again under other random draws
    (torch, Python and NumPy generators seeded afresh; ``training_state`` puts them back after
    the passes), at most :data:`SKIP_TRIES` times (NOTE [ skipped stages ] in executor.py).
    With ``rec`` and ``replay``, when no draw can be profiled (or at once, with ``redraw=False``),
    the call's own draws are replayed with the blocks that cannot run collapsed (NOTE [ blocks a
    profile cannot run ])."""
    if replay is not None and replay.collapse is not None:
        return _replayed(root, args, kwargs, rec, replay)
    tries = SKIP_TRIES if redraw or replay is None else 1
    for attempt in range(tries):
        try:
            return root(*args, **kwargs)
        except SkippedBlocks as exc:
            if attempt == tries - 1:
                if replay is not None and rec is not None:
                    return _replayed(root, args, kwargs, rec, replay)
                raise RuntimeError(
                    f"{exc} in each of {SKIP_TRIES} tries under other random draws, so the profile cannot measure "
                    "them; profile with the skipping turned off (Hugging Face: config.layerdrop = 0), or give blocks= "
                    "without the blocks the forward leaves out"
                ) from None
        except Exception:
            if attempt == 0 or replay is None:
                raise  # the call's own draws: a training step under them raises the same
            # Draws the call did not make: a block they run cannot run at these shapes (batch
            # norm in training on a batch of one), where the call skips it.
            if attempt == tries - 1:
                return _replayed(root, args, kwargs, rec, replay)
        seed = 0x5EED + attempt
        torch.manual_seed(seed)
        random.seed(seed)
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            np_random.seed(seed)
    raise AssertionError("unreachable")


def _replayed(root: nn.Module, args: tuple, kwargs: dict, rec: _Recorder, replay: _Replay) -> Any:
    """A pass under the call's own draws, with each skipped block that cannot run in its place
    collapsed (NOTE [ blocks a profile cannot run ]); a block found so makes the pass run again."""
    every = isinstance(replay.collapse, _Every)
    collapse: Any = replay.collapse if every else set(replay.collapse or ())
    try:
        while True:
            replay.restore()
            rec.collapse = collapse if every else frozenset(collapse)
            try:
                out = root(*args, **kwargs)
            except SkippedBlocks as exc:
                if exc.block is None or exc.block in collapse:
                    raise RuntimeError(
                        f"{exc}, so the profile cannot measure it; profile with the skipping turned off (Hugging Face: "
                        "config.layerdrop = 0), or give blocks= without the blocks the forward leaves out"
                    ) from None
                collapse.add(exc.block)
                continue
            replay.collapse = collapse if every else frozenset(collapse)
            return out
    finally:
        rec.collapse = None


class _Every:
    """Every block: the collapse of a replay whose every skipped block collapses (NOTE [ a
    profiling backward that raises ])."""

    def __contains__(self, block: object) -> bool:
        return True

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "every skipped block"


# NOTE [ a profiling backward that raises ]
# A profiling pass runs the blocks a LayerDrop forward skipped in their place (NOTE [ skipped
# stages ] in executor.py), so its backward goes through blocks next to each other that no step
# of the call's draws puts together. Where one block writes in place what the block before it
# saved (relu_ saves its result, and the next block's mul_ writes it), that backward raises
# autograd's "modified by an inplace operation", though plain PyTorch, which skipped one of the
# two, trains. The fuzz's model 4999 (recompute-all, seed 43: relu_ then mul_ as blocks 3 and
# 4, LayerDrop 0.5) raised so in the profile a step of a draw that no plan of its shape served
# made (NOTE [ one measure per new draw ] in api.py). The forward's failures were handled (NOTE
# [ blocks a profile cannot run ]); the backward's were not. Decision: a profiling backward that
# raises, in a pass that was not yet a replay of the call's own draws with every skipped block
# collapsed, makes the profile start again on a fresh recorder (as a probe that changes the
# layout does) replaying the call's own draws with every block they skip collapsed (_Every): a
# pass that runs what the call's step runs, whose backward raises only where the call's own
# training step does (and then the profile raises it). The sizes then hold only for calls that
# skip those blocks (Sizes.collapsed), as for any replay, and later calls of the shape are
# measured under their own draws first. Its cost: the passes before, in profiles that met it.


def _forward_times(timer: Timer, p: _RecordedPass, n: int) -> list[float]:
    """Per-stage forward seconds of a pass, less a probe's own checks where the clock is the
    host's (on a GPU the device's clock runs on while the host checks)."""
    fwd = _times(timer, p.marks, n)[0]
    if timer.cuda or not p.checks:
        return fwd
    return [max(0.0, f - p.checks.get(i, 0.0)) for i, f in enumerate(fwd, start=1)]


#: The adaptive profile (``repeats=None``): the most steps it takes, and how close two
#: forwards (and backwards) must be for the timings to count as settled
#: (NOTE [ how many profiling steps ]).
AUTO_MAX_STEPS = 4
AUTO_TOLERANCE = 0.25


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= AUTO_TOLERANCE * max(a, b)


def _kept_steps(steps: list[dict[str, list]], reference: float | None, warmup: int | None, repeats: int | None) -> list | None:
    """The steps whose timings count, once enough are taken; ``None`` while more are needed."""
    k = len(steps)
    if repeats is not None:
        return steps[warmup:] if k == warmup + repeats else None
    fwd, bwd = sum(steps[-1]["fwd"]), sum(steps[-1]["bwd"])
    own = fwd - steps[-1].get("bookkeeping", 0.0)  # the model's forward, as the reference's
    # One-sided: the reference forward runs the same ops and more (discovery's hooks, the
    # probe's checks), so a step faster than it says nothing against the step; only a slower
    # one looks cold. A later step as fast counts alone too, unless its backward is slower
    # than the one before.
    warm = reference is not None and own <= (1 + AUTO_TOLERANCE) * reference
    if warm and (k == 1 or bwd <= (1 + AUTO_TOLERANCE) * sum(steps[-2]["bwd"])):
        return steps[-1:]
    if k == 1:
        return None
    if _close(fwd, sum(steps[-2]["fwd"])) and _close(bwd, sum(steps[-2]["bwd"])):
        return steps[-2:]
    return steps[1:] if k == AUTO_MAX_STEPS else None


# NOTE [ how many profiling steps ]
# offload() should cost about two training steps of the model it profiles (issue 22 measured
# about six: a warm-up step and three timed ones, each followed by a forward without autograd,
# and the whole again when the stem became a stage). What a plan needs from the steps:
# * Sizes: one forward with autograd; they do not vary from step to step (the last step's are
#   kept, as a first call may make what the model then caches).
# * Times: per stage, to a precision that matters to the solver (when a transfer hides behind
#   compute), and not inflated by one-time costs (lazy initialisation, the first call of a
#   kernel, the allocator growing its pools).
# * fwd_nosave: only a rematerializing method reads it, and the executor's Fck / Fn in the
#   forward run with autograd, at fwd (NOTE [ what an Fck or Fn costs ] in _recompute.py):
#   offload() and budget_curve() skip that forward (nosave=False); profile() keeps it.
# A reference forward before the first step warms up the forward: block discovery's, run with
# autograd as a step's forward runs (NOTE [ discovery as the warm-up ]), and timed. So with
# repeats=None the first step's timings count at once when its forward took at most
# AUTO_TOLERANCE (25 %) longer than the reference (which runs the same ops and discovery's hooks
# besides, so a faster step is no warning): then the process is warm, and one step is the
# profile. Otherwise steps are taken until one is that close to the reference with a backward
# no slower than the step before's (it counts alone), or two in a row agree, forward and
# backward, within that tolerance (those two count), or AUTO_MAX_STEPS are taken (all but the
# first count, as warmup=1 would). The reference first because two cold steps can agree with
# each other: a CPU process whose heap reaches a new peak pays page faults for a step or two
# (a 21 M GPT-2 of width 256: its last stages' forwards 4x slower), and keeping both would
# inflate the profile. The reference forward holds what autograd saves, so it peaks where a
# step's forward does and pays those faults itself (0.8 of a step for that GPT-2 instead of
# 0.45); the reference is then lenient by as much on CPU, the price of a first step that needs
# no second. A profile with no forward just before it (a new shape's plan) takes the probe's
# forward as its reference.
# The probe (NOTE [ storages the forward keeps ]) is a forward of its own, with no backward,
# before the steps, and its times are no step's (NOTE [ the probe's forward is not a step ]).
# A step is compared with the
# reference less the seconds its forward spent in the recorder's bookkeeping (the ledger, per
# saved tensor), which the reference does not run: 24-33 % of the forward of the tiny models of
# benchmarks/offload_time.py on CPU (forwards of 5-25 ms), which made each first step look cold
# and take a second; under 2 % for the 6.9 M GPT-2 there.
# Each step's pass (its ledger) is let go of before the next step's forward: kept through it,
# the 21 M GPT-2's second step peaked 650 MB above a plain step, with 180,000 page faults and
# its forward 2.5 s instead of 1.1 s. The ledger holds no storage alive then (every weak
# reference in it has expired), so the heap's layout, not live data, is the likely cause.
# The cost: a model already warm (offload() after a few plain steps, or a forward-heavy first
# call that settles at once) pays discovery's forward, the probe's forward and one step; a cold
# or noisy one pays up to four steps, as before. What it gives up: the backward of a one-step
# profile is a single sample, unchecked (no earlier backward to compare it with); a backward with a
# one-time cost
# that the forward did not have shows up in bwd[i] of the stages it hit. Pass repeats= (and
# warmup=) for the median of a fixed number of steps.
#
# The prefix's layout is decided from the probe's sizes (the same ledger on the same forward,
# NOTE [ the prefix as a stage ]) after its forward, so a model whose stem pays is measured
# once, with one more forward (the probe's on the first layout), instead of twice.
# tests/test_torch_profile_cost.py holds both the count of model calls and the sizes against
# the layout decided after a full step.
#
# NOTE [ the probe's forward is not a step ]
# The probe's forward runs every op through a Python dispatch mode (_Made: NOTE [ storages no
# unit owns ]), aliases every saved tensor and fingerprints it; the checks' seconds are taken
# off the stages' times, the mode's mere presence (Python's dispatch of every op) cannot be.
# The probe was the first profiling step, and with repeats=None its step alone was the profile
# whenever its forward looked warm, which it did (the reference runs hooks too): on CPU the
# forwards of benchmarks/profile_accuracy.py's Llama, BERT and T5 (width 256) profiled 1.08-1.16,
# 1.18-1.33 and 1.13-1.39 times the plain forward's (three runs, the median of 5 profiles each),
# so a recomputation was priced up to 39 % above its cost, and a step 4-20 % above. Decision:
# the probe is a forward alone, its sizes kept and its times dropped, and the steps that count
# come after it, with explicit repeats too (warmup counts steps after the probe). The forward
# then profiles 1.04-1.15 times the plain one (three runs; the rest is mostly the recorder's
# ledger, which the executor runs too where a plan moves bytes) and a step 1.02-1.07 times
# (benchmarks/results/profile_accuracy.md). The cost: one forward more per profile (the probe's
# backward is gone, one step's backward comes instead); a later shape's profile already ran the
# probe's forward alone, as its reference.
#
# NOTE [ discovery as the warm-up ]
# find_blocks traces one forward to find the blocks; offload() and profile() run it with
# autograd, as a training step's forward runs, and time it, so it is also the warm-up and the
# reference above. Without autograd it cost 0.43 of a step of the 21 M GPT-2, and the separate
# probe forward after it another 0.78 (the faults of a heap growing to a step's peak); now the
# discovery pays the faults. The probe was then made the first step, which saved its forward,
# until its dispatch mode was found to inflate that step's times (NOTE [ the probe's forward is
# not a step ]): it is a forward of its own again, after discovery's. Discovery's model call is the
# same but for autograd: its trace sees the same calls (the model's code rarely branches on
# torch.is_grad_enabled(), and where it does the
# training step takes the branch this forward takes). The public find_blocks keeps its forward
# without autograd.


def _held_beyond_probe(p: _RecordedPass, e: Any) -> bool:
    """Whether something other than the probe's own aliases (and autograd's records of them)
    holds ``e``'s storage."""
    aliases = p.aliases.get(e)
    if not aliases:
        return not e.ref.expired()
    st = aliases[0].untyped_storage()
    # One reference per tensor over the storage, and one for ``st`` itself.
    return torch._C._storage_Use_Count(st._cdata) > len(aliases) + 1


def _probed(p: _RecordedPass) -> tuple[set[tuple[int, int]], dict[tuple[int, int], int], tuple[dict[int, int], int, int]]:
    """What a probe pass found the forward keeps alive by itself (NOTE [ storages the forward
    keeps ]), by (unit, ordinal): those it still holds when it returns, and those it lets go of
    earlier, each with the stage r during whose forward it does (NOTE [ late release ]); set as
    the pass's own late releases. The pass's aliases are let go of: autograd's records hold
    them, and the backward frees each as a plain one would. Third: the bytes of storages no unit
    owns, per stage, when the forward returned, and the loss's (NOTE [ storages no unit owns ])."""
    held, late = set(), {}
    for u, entries in p.ledger.units.items():
        for k, e in enumerate(entries):
            if p.ledger.held_by.get(e) == "forward":
                held.add((u, k))
            elif e in p.alive_at and e not in p.ledger.held_by:
                late[(u, k)] = p.alive_at[e]
    p.late = dict(late)
    p.aliases.clear()
    return held, late, (dict(p.unowned), p.unowned_end, p.loss_bytes)


def _apply_probe(p: _RecordedPass, probed: tuple[set[tuple[int, int]], dict[tuple[int, int], int], tuple[dict[int, int], int, int]]) -> None:
    """Mark in a measured pass's ledger what the probe found, by (unit, ordinal), and what it
    found no unit owns."""
    held, late, (unowned, p.unowned_end, p.loss_bytes) = probed
    p.unowned = dict(unowned)
    for u, k in held:
        entries = p.ledger.units.get(u, ())
        if k < len(entries):
            p.ledger.held_by.setdefault(entries[k], "forward")
    p.late = dict(late)


# NOTE [ storages the forward keeps ]
# Offloading unit i frees its storages once autograd's references are the executor's handles,
# at the end of F_{i+1} or later (docs/model.md's release point). A reference the forward's own
# code keeps defers that: a U-Net's down blocks append their outputs to a Python list in the
# parent's forward and its up path reads them later, a CNN stage's forward(input) holds its input
# until its last block returns, a custom autograd Function keeps a tensor as a ctx attribute.
# The ledger sees only what autograd saves and what blocks receive, so the first pass on a
# layout is a probe: its pack hook gives autograd an alias of each saved tensor (a detached
# tensor object of its own over the same storage) and keeps a list of them, and at the start of
# every stage from i+2 on and when the forward returns it looks which storages of unit i have
# references beyond those aliases: held by something other than autograd and the executor.
# Autograd holds the aliases as it would the saved tensors, so the probe peaks where a step does
# and is a step itself: its list is dropped when the forward returns and its backward frees
# each alias as a plain one would. (An earlier probe gave autograd nothing to hold and let the
# storages die as it went: on CPU glibc handed that memory back to the system and the first step
# after it paid it again in page faults, a 21 M GPT-2 of width 256: 110,000-130,000 faults,
# its forward 1.4-1.9 s against 1.0 s, a second profiling step.)
# A unit's own output is alive at the start of the next stage (its hidden input), which is why
# the check waits one stage. Two cases, by (unit, ordinal), as the pinned storages of
# NOTE [ units held elsewhere ]:
# * Alive when the forward returns (a module attribute, a cache, the output): held by "forward"
#   beyond the forward. A unit whose output is so held stays resident whole; the others' storages
#   stay resident outside the chain and the rest moves; offload() names the blocks.
# * Let go of before that, during F_r (the last stage at whose start it was alive): it moves
#   with its unit, and the chain counts it where the executor cannot free it (NOTE [ late release ]).
#
# NOTE [ late release ]
# A storage s of unit i that the forward's own code holds until F_r (r >= i+2) and no later
# stage saves (one that is saved again, B_j reads beyond B_i: held, UnitLedger.pack) is offloaded
# with its unit like any other: the executor copies it, drops its own reference at its release
# point, and the forward's reference frees it during F_r; the prefetch brings it back before
# B_{i+1}, as for the rest of the unit. docs/model.md frees the original at max(end of O_i, end
# of F_{i+1}); s lives on until the end of F_r. The chain says so without a new rule: s's bytes
# are added to fwd_tmp[j] for every stage j in i+2..r (Sizes.late_tmp), which F_j allocates at
# its start and frees at its end. That is exact when unit i is offloaded and its original is
# released by the end of F_{i+1}; when O_i ends later (s counted twice until then), or unit i
# stays resident (s in saved[i] as well), it is above the truth by s, never below. j = i+1 needs
# nothing: unit i is resident in the chain until F_{i+1} ends whatever the schedule. Before this
# rule such a unit stayed resident whole (its output held) or s was pinned resident for the
# whole step: HF ResNet's stem and stage inputs kept its least memory at 75 % of the keep-all
# peak, a U-Net's skips at 97 %. An in-place change of s after its offload was queued and before
# its release, followed by a save, is copied again (NOTE [ version discipline ] in _saved.py);
# a change after its release with no later save is never read back by autograd (a saved s would
# fail autograd's own version check, as without offloading).
#
# NOTE [ storages no unit owns ]
# The ledger sees what autograd saves and what blocks receive; a storage the forward's code
# makes and holds that autograd never saves is no unit's: BART's encoder holds its
# inputs_embeds and position embeddings until it returns (16 KiB at the tests' size), its
# decoder_input_ids are made before the first block and only the decoder's embedding saves them,
# its decoder holds its own embeddings until it returns. The strict check (every storage alive at
# every op's start within the simulated memory plus R) was up to 4104 B over for it. So the
# probe's forward runs under a dispatch mode (_Made) that keeps a weak reference to every
# storage an op makes on the device (an output over none of its inputs' storages; the
# recorder's own work, fingerprints and aliases, paused), and at the start of every stage j
# (after _still_alive) adds up those alive that the chain counts elsewhere in no way (_unowned):
# not a unit's entry (the prefix's included), not a stage's output a_i (act[i]), not stage j's
# hidden input, not a state object's (NOTE [ what a state object holds ]), not a weight's cast
# that autocast keeps and autograd saves (outside the chain as weights are, NOTE [ never a
# parameter ] in _stages.py; bf16 autocast made none of a small MLP's units move at 60 % when
# they were counted). Those bytes go to
# fwd_tmp[j] (Sizes.unowned_tmp, added by chain_of; scaled_chain takes the reference's out
# before scaling, as for late_tmp): F_j allocates fwd_tmp at its start, so the simulated memory
# at every op start of the forward holds them; a recomputation of F_j in the backward counts
# them again, above the truth. Those still alive when the forward returns and not the output's
# own (counted in unit L: NOTE [ the output's own storages ]) are resident outside the chain
# (Sizes.unowned_bytes, in resident_bytes), as is the output's loss when no unit owns it, twice
# (the loop holds it through its backward, autograd holds the gradient of ones it seeds it with),
# leaving output_bytes: the output's own storages are counted in B_i's bwd_tmp, not in a
# recomputation between two B's, where those 8 bytes were over. The keep-all peak keeps
# unowned_tmp (plain training holds those storages too, unlike late_tmp's second count). The
# mode runs in the probe only (one pass per layout; its own bookkeeping is off the stage times on
# CPU, as the probe's other checks); the measured steps after it take the probe's figures
# (_apply_probe). Its cost is Python's dispatch of every op: offload() of the tests' tiny BART
# on CPU took 1.05-1.64 s against 0.60-0.78 s without the mode (4 runs each, load average 10);
# almost all of it the mode's mere presence, not its bookkeeping.
# The backward's own storages, such as the gradient of a storage pinned because later blocks
# read it (BART's encoder output), which every reader's backward adds to, are held_grad's
# (NOTE [ the gradient a held storage waits for ]), not this mode's.

def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _median_rows(values: list[list[float]], n: int) -> list[float]:
    return [_median([v[i] for v in values]) for i in range(n)]


def _max(values: list[list[int]], n: int) -> list[int]:
    return [int(max(v[i] for v in values)) if values else 0 for i in range(n)]


def _check_counts(repeats: Any, warmup: Any) -> None:
    for fname, v, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            raise ValueError(f"{fname}: {v!r} must be None or an integer >= {least}")


def profiling_steps(repeats: int | None, warmup: int | None, default_repeats: int) -> tuple[int | None, int | None]:
    """``(repeats, warmup)`` as :func:`_measure` takes them: both ``None`` is the adaptive
    profile (NOTE [ how many profiling steps ]); one given, the other takes its fixed default
    (``default_repeats`` timed steps, 1 warm-up step), as before the adaptive profile."""
    _check_counts(repeats, warmup)
    if repeats is None and warmup is None:
        return None, None
    return (default_repeats if repeats is None else repeats), (1 if warmup is None else warmup)


def tail_stages_of(blocks: Any) -> frozenset[int]:
    """The stages of ``blocks`` that are code after a block (NOTE [ the code after a block as a
    stage ] in _instrument.py)."""
    return frozenset(blocks.stage_of(b) + 1 for b in getattr(blocks, "tails", ()))


def _pinning_tails(p: _RecordedPass, blocks: Any) -> set[int]:
    """The blocks whose tail would make a unit resident that the layout without it moves
    (NOTE [ the code after a block as a stage ] in _instrument.py): a tail that saves a storage
    of the stage before the block (read two stages after that unit: held, where run in the
    block's stage it is read by the next stage's backward only). A block whose own output
    something later holds (BART's last encoder layer, whose output every decoder layer reads)
    keeps its tail: that storage is pinned, as in the block's stage (:func:`_sizes`)."""
    out = set()
    ledger = p.ledger
    for b in getattr(blocks, "tails", ()):
        tail = blocks.stage_of(b) + 1
        if any(by == f"block {tail}" and e.unit == tail - 2 for e, by in ledger.held_by.items()):
            out.add(b)
    return out


def prefix_pays(sizes: Sizes, tails: Any = ()) -> bool:
    """Whether the code before the first block should be a stage of its own
    (NOTE [ the prefix as a stage ]): it keeps at least as much as the smallest block the
    solver may move. ``tails``: the stages of code after a block (NOTE [ the code after a block
    as a stage ] in _instrument.py), which are no blocks: the decision stays the one the layout
    without them makes."""
    if not sizes.prefix_unit:
        return False
    tails = set(tails)
    movable = [s for i, s in enumerate(sizes.saved[:-1], start=1) if i not in sizes.resident and i not in tails]
    return bool(movable) and sizes.prefix_unit >= min(movable)


def measure_chain(
    instrument: Instrument,
    root: nn.Module,
    args: tuple,
    kwargs: dict,
    device: torch.device,
    *,
    repeats: int | None,
    warmup: int | None,
    name: str,
    nosave: bool = True,
    split_prefix: bool = False,
    reference: float | None = None,
) -> tuple[co.Chain, Sizes]:
    """The chain and sizes of one call, measured through an installed ``instrument``.

    ``repeats``, ``warmup``: a fixed number of steps, or both ``None`` for as many as the
    timings need (NOTE [ how many profiling steps ]). ``nosave``: measure ``fwd_nosave`` (one
    forward without autograd per step; else the chain has none, which means ``fwd``).
    ``split_prefix``: the code before the first block may become stage 1
    (NOTE [ the prefix as a stage ]), in which case ``instrument.blocks`` is replaced.
    ``reference``: the seconds of a forward with autograd run just before, the block
    discovery's (NOTE [ discovery as the warm-up ]), if there was one.
    """
    sizes, runs = _measure(
        instrument, root, args, kwargs, device, repeats, warmup, nosave=nosave, split_prefix=split_prefix,
        reference=reference,
    )
    n = instrument.blocks.stages
    chain = chain_of(
        sizes, _median_rows(runs["fwd"], n), _median_rows(runs["bwd"], n), _max(runs["fwd_tmp"], n), _max(runs["bwd_tmp"], n),
        _median_rows(runs["nosave"], n) if nosave else None, name,
    )
    return chain, sizes


def _note_holds(p: _RecordedPass, idx: int, hidden: Any, extras: Any) -> None:
    """Note the held storages of earlier units that the call of stage ``idx`` takes as
    arguments, by their gradient edge (NOTE [ the gradient a held storage waits for ])."""
    if not torch.is_grad_enabled():
        return
    ledger = p.ledger
    targets: dict[tuple[int, int], Any] = {}
    stops: set[int] = set()
    for t in tensors_in(extras):
        if not isinstance(t, torch.Tensor) or not t.requires_grad:
            continue
        if t.grad_fn is not None:
            stops.add(id(t.grad_fn))  # an input: the block's graph ends there
        if t is hidden:
            continue
        e = ledger.owner(t)
        if e is None or e not in ledger.held_by or not 1 <= e.unit < idx:
            continue
        edge = torch.autograd.graph.get_gradient_edge(t)
        node, nr = edge.node, edge.output_nr
        targets[(id(node), nr)] = (e, node)
        stops.add(id(node))
    if isinstance(hidden, torch.Tensor) and hidden.grad_fn is not None:
        stops.add(id(hidden.grad_fn))
    if targets:
        p.hold_open[idx] = (targets, stops)


#: Nodes of one block's graph walked at most, looking for the edges of its held arguments.
_WALK = 100_000


def _hook_holds(p: _RecordedPass, idx: int, out: Any) -> None:
    """Hook the nodes of stage ``idx``'s graph that hand a gradient to a held argument, to
    measure the storage of that gradient in the backward."""
    targets, stops = p.hold_open.pop(idx)
    store = p.held_grads
    todo = [t.grad_fn for t in tensors_in(out) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while todo and len(seen) < _WALK:
        node = todo.pop()
        if id(node) in seen or id(node) in stops:
            continue
        seen.add(id(node))
        for k, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            hit = targets.get((id(nxt), nr))
            if hit is not None:
                node.register_hook(_grad_meter(store, (hit[0], idx), k))
            elif id(nxt) not in seen:
                todo.append(nxt)


def _grad_meter(store: dict, key: tuple[Any, int], k: int) -> Any:
    def meter(grad_inputs: tuple, grad_outputs: tuple) -> None:
        g = grad_inputs[k] if k < len(grad_inputs) else None
        if isinstance(g, torch.Tensor) and g.layout == torch.strided:
            st = g.untyped_storage()
            store.setdefault(key, {})[st.data_ptr()] = st.nbytes()

    return meter


def _with_held_grads(sizes: Sizes, p: _RecordedPass) -> Sizes:
    """``sizes`` with the gradients the backward of a pass handed held storages (``held_grad``)."""
    per: dict[int, tuple[int, int, int, bool]] = {}
    for (e, j), ptrs in p.held_grads.items():
        g = sum(ptrs.values())
        i = e.unit
        old = per.get(id(e))
        if old is not None:
            j, g = max(j, old[1]), max(g, old[2])
        per[id(e)] = (i, j, g, p.ledger.output.get(i) is e)
    p.held_grads.clear()
    held = tuple(sorted((i, j, g, out, i in sizes.held) for i, j, g, out in per.values() if g and 1 <= i < j))
    return dataclasses.replace(sizes, held_grad=held) if held else sizes


def held_grad_tmp(sizes: Sizes | None, n: int) -> tuple[list[int], list[int]]:
    """Per stage 1..n, the bytes of held storages' gradients added to ``fwd_tmp`` and to
    ``bwd_tmp`` (NOTE [ the gradient a held storage waits for ])."""
    fwd, bwd = [0] * n, [0] * n
    for i, j, g, output, whole in (getattr(sizes, "held_grad", ()) or ()):
        for k in range(i + 1 if output else i, min(j, n + 1)):
            bwd[k - 1] += g
        for k in range(i + 1 if whole else 1, min(j, n + 1)):
            fwd[k - 1] += g
    return fwd, bwd


# NOTE [ the gradient a held storage waits for ]
# A storage s of unit i that a later block j takes as an argument (a U-Net's skip, an encoder's
# output every decoder layer reads) gets a gradient from B_j, long before the gradient of the
# rest of the chain reaches it: autograd keeps that gradient until the other contributions are
# summed into it, at B_{i+1} for a_i (as g_i), within B_i for another storage of the unit. The
# chain has g_k alone there, so it is counted where it lives: its bytes (the storage of the
# gradient B_j hands s, measured by a hook on the node of block j's graph that hands it, in the
# profile's backward: a skip concatenated in the block gets a view of the whole concatenation's
# gradient) go to bwd_tmp[k] for every k from i + 1 (i for another storage) to j - 1, the
# backward ops whose start sees it, and to fwd_tmp[k] of every forward op a recomputation may
# run then: k in i+1..j-1 when unit i is held whole (never recomputed: NOTE [ one call
# chooses ] in plans.py, so no recomputation crosses stage i before B_i), 1..j-1 otherwise.
# The first forward counts them too, above the truth: the keep-all peak leaves them out
# (keep_all_chain), as it does the late releases. With j the last stage whose call takes s (its
# gradient is summed in place as the next ones arrive), and the largest one B_j hands it.
# A storage taken by a later call that needs no gradient has none to wait for.


def chain_of(
    sizes: Sizes, fwd: list[float], bwd: list[float], fwd_tmp: list[int], bwd_tmp: list[int], nosave: list[float] | None, name: str
) -> co.Chain:
    """The chain of measured ``sizes`` and per-stage times and transients (as the allocator saw
    them), with what the adapter adds: the output's own storages and the late releases."""
    n = len(sizes.saved)
    # NOTE [ the output's own storages ]
    saved = list(sizes.saved)
    saved[-1] += sizes.output_bytes
    bwd_tmp = [b + sizes.output_bytes if i < n else b for i, b in enumerate(bwd_tmp, start=1)]
    # NOTE [ late release ], NOTE [ state a recomputation puts back ] in _recompute.py,
    # NOTE [ storages no unit owns ]
    fwd_tmp = [
        f + (sizes.late_tmp[i] if sizes.late_tmp else 0) + (sizes.restore_tmp[i] if sizes.restore_tmp else 0)
        + (sizes.unowned_tmp[i] if sizes.unowned_tmp else 0)
        for i, f in enumerate(fwd_tmp)
    ]
    # NOTE [ the gradient a held storage waits for ]
    held_fwd, held_bwd = held_grad_tmp(sizes, n)
    fwd_tmp = [f + h for f, h in zip(fwd_tmp, held_fwd, strict=True)]
    bwd_tmp = [b + h for b, h in zip(bwd_tmp, held_bwd, strict=True)]
    return co.Chain(fwd, bwd, list(sizes.act), saved, fwd_tmp, bwd_tmp, nosave, name=name)


def measure_call_sizes(
    instrument: Instrument, root: nn.Module, args: tuple, kwargs: dict, device: torch.device, *, redraw: bool = True
) -> Sizes:
    """The sizes of one call, from one forward with autograd and no backward through an
    installed ``instrument`` (the model's state restored after): what a plan reused for another
    shape is checked with (NOTE [ one plan for many shapes ] in api.py). ``redraw``: as
    :func:`_measure`'s."""
    sizes, _ = _measure(instrument, root, args, kwargs, device, 1, 0, timed=False, redraw=redraw)
    return sizes


# NOTE [ the output's own storages ]
# What the model returns is held by the caller from the end of the forward, and a training loop
# that keeps it (``out = model(x); loss_fn(out, y).backward()``, or ``out.loss.backward()``)
# holds it through the whole backward. The storages of the output that some unit owns are that
# unit's (held: NOTE [ units held elsewhere ]); the others, such as a language model's logits
# (the head's result, which the loss reads but autograd does not save), are no unit's, and an
# H200 showed GPT-2 small's step 1.56 GiB (its logits) above the simulation from F_L to the
# backward's start. They are counted where they live: in unit L (from the end of F_L, kept
# resident, to the end of B_L) and in the transient of every B_i before it. A loop that drops
# the output before its backward (``model(**batch).loss.backward()``) peaks below the
# prediction in the backward by their size: the safe side.


# NOTE [ what the profiler measures ]
# Everything comes from whole steps of the real model, through the instrument the executor
# uses, so a stage's boundaries in the profile are the ones the executor fires at. Sizes come
# from one forward (who owns a storage depends on its neighbours: stage i saving its input
# a_{i-1} adds nothing to unit i). Times come from the same steps: F_i runs from the end of
# F_{i-1} (the start of the forward for i = 1) to the end of block i (the end of the model's
# forward for i = L); B_L from the start of the backward to the moment g_{L-1} is complete,
# B_i from g_i to g_{i-1}, B_1 to the end of the backward. A profiling step backpropagates the
# output's loss when it has one, else every output that requires grad with a gradient of ones.
# One step without autograd per repeat gives fwd_nosave (when asked: NOTE [ how many profiling
# steps ]). The model's buffers, gradients and
# RNG are restored after, with everything else a pass can change (training_state: NOTE
# [ profiling leaves no trace ] in _state.py), so profiling leaves no trace in training.
#
# NOTE [ prefix and suffix ]
# The chain is the blocks; a model has code before the first block (embeddings, a ResNet's
# stem) and after the last (final norm, head, loss). The suffix's time is counted in stage L and
# the storages it saves in unit L, which the adapter keeps resident. The prefix is one of two
# things:
# * Not a stage (the default): its time is counted in stage 1, a_0 is the first block's hidden
#   input alone (act[0], which is also g_0's size), and the other storages the prefix saves
#   (Sizes.prefix_bytes) stay resident for the whole step outside the chain (NOTE [ resident
#   outside the chain ] in plans.py): counted once, never as g_0 again.
# * Stage 1 of its own, when what it keeps (its unit: those storages and its output, when it
#   owns it) is at least the smallest unit the solver may move (prefix_pays): a ResNet's stem.
#   It then moves like any unit, a_0 is the forward's hidden input (none: 0 bytes, the model's
#   arguments being the caller's, as they are for every chain of the adapter) and g_0 nothing.
#   Whether it pays is read from the probe's sizes after its forward, before its backward; the
#   next pass probes the new layout and the steps are measured once (NOTE [ how many profiling
#   steps ], NOTE [ the prefix as a stage ] in _instrument.py).
# Below that size a stage would only renumber the units (keep= and the tables count blocks from
# 1) to move a few KiB of embeddings.
