"""Carry out a schedule in real training: offloading, recomputation, or both.

:class:`ScheduleRun` is the executor of one plan: an :class:`~chainoffload_torch._instrument.Instrument`
listener that turns boundary events into the schedule's actions. :class:`OffloadActivations` is
the same as a context manager around a forward pass over a list of stages (like torchtune's
``OffloadActivations``); :class:`chainoffload_torch.Offloader` uses it on a whole model.

How a schedule becomes actions (see docs/model.md, "The schedule"):

* ``saved_tensors_hooks`` route every tensor saved while block i runs into unit i
  (:class:`~chainoffload_torch._stages.UnitLedger` decides ownership, the same code as the
  profiler's). Tensors of kept units are returned to autograd untouched; tensors of offloaded
  units are replaced by a small handle, so the unit's storage lives only in the executor.
* The instrument's boundary events (NOTE [ boundary events ]) fire, in order, every schedule
  event up to them: transfers triggered there are queued on their channel; before op k
  starts, the compute stream waits for transfers with ``before=k``, and B_j waits for the
  prefetches of units j and j-1.
* A transfer that moves a_i alone (``moves="act"``) takes only the storage of block i's output
  tensor (the entry :class:`~chainoffload_torch._stages.UnitLedger` records at the end of F_i);
  the unit's other storages stay on the device, untouched, until B_i, as in docs/model.md.
* The GPU copy of an offloaded unit is released at the first event at which the simulated
  timeline has both ended O_i and F_{i+1} (see NOTE [ release point ]); the compute stream
  waits on the copy's event first. A prefetched copy is dropped with the unit at the end of
  B_i (autograd frees it as soon as the last node that saved it has run).
* A rematerializing schedule (``Fck``, ``Fn``, a repeated ``F``): the model's forward runs each
  stage's first forward op; a block run as ``Fck`` / ``Fn`` saves empty slots, and a later
  forward op calls the block again at its start event, under the original call's RNG, autocast,
  grad mode and module state, filling the slots the original graph's backward reads
  (NOTE [ recomputation ] in _recompute.py).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import chainoffload as co

from ._copy import Copier
from ._discovery import Blocks
from ._instrument import Instrument, recomputing
from ._pool import HostPool
from ._recompute import (
    FORWARD_KINDS,
    Act,
    CallRecord,
    PrefixRecord,
    RecomputationEnd,
    RematPlan,
    Slot,
    argument_state,
    prefix_state,
    rebuild_act,
    recomputes_without_grad,
    stateful_argument,
)
from ._saved import Kept, Packed, check_version, rebuild, root_of, version_probe
from ._stages import Entry, EntryState, UnitLedger, canonical_device, resident_storages
from ._tree import first_tensor, tensors_in

__all__ = ["OffloadActivations", "ScheduleRun", "StepStats"]

S = EntryState


@dataclasses.dataclass
class StepStats:
    """What one training step (forward + backward) moved and used.

    Attributes
    ----------
    offloaded_bytes, prefetched_bytes
        Bytes really copied device to host and host to device, counted at each copy.
    unit_offloaded, unit_prefetched
        The same per unit (stage, 1-based).
    recopied_bytes
        Part of ``offloaded_bytes`` copied a second time because the storage was modified in
        place after its offload was queued and saved again (NOTE [ version discipline ]).
    released_bytes
        Bytes of offloaded GPU copies the executor let go of at their release point.
    restored_reads
        Saved tensors autograd read back from a copy that came from the host.
    measured_peak
        On CUDA: the allocator's peak during the step above what was allocated when it began,
        plus the input a_0 when it was allocated before (the simulator's peak counts a_0);
        ``None`` on CPU.
    predicted_peak
        The simulator's peak of the schedule plus the bytes resident outside the chain
        (``None`` without a platform).
    wall_time
        Host seconds from the start of the forward to the end of the backward.
    recomputed_ops
        Forward ops of a rematerializing schedule run again in the backward (a block called
        again: ``Fck``, ``Fn`` or ``F`` after the forward).
    """

    offloaded_bytes: int = 0
    prefetched_bytes: int = 0
    unit_offloaded: dict[int, int] = dataclasses.field(default_factory=dict)
    unit_prefetched: dict[int, int] = dataclasses.field(default_factory=dict)
    recopied_bytes: int = 0
    released_bytes: int = 0
    restored_reads: int = 0
    measured_peak: int | None = None
    predicted_peak: int | None = None
    wall_time: float = 0.0
    recomputed_ops: int = 0


class _Step:
    """State of one step in flight."""

    def __init__(self, ledger: UnitLedger) -> None:
        self.ledger = ledger
        self.cursor = 0  # next schedule event to fire
        self.current: int | None = 0  # the unit new storages go to (0: the prefix)
        self.versions: dict[int, int | None] = {}
        self.offload_issued: set[int] = set()
        self.stats = StepStats()
        self.done = False
        self.forward_done = False
        self.t0 = time.perf_counter()
        self.mem_base = 0
        self.a0_before = 0  # bytes of a_0 allocated before the step (a model input)
        #: Nothing moves in this step: no saved-tensor hooks, no ledger (NOTE [ passive steps ]).
        self.passive = False
        # Rematerialization (NOTE [ recomputation ] in _recompute.py).
        self.dropping: int | None = None  # the block running without saving (its original Fck / Fn)
        self.slots: dict[int, list[Slot]] = {}  # per stage, what its original call would have saved
        self.records: dict[int, CallRecord] = {}  # per recomputed stage, its original call
        self.acts: dict[int, tuple[int, Act]] = {}  # a_i instances held for a recomputation: (maker op, act)
        self.inst: dict[int, str] = {}  # per unit, its instance on the device: "a" (lone a_i) or "whole"
        self.outputs: dict[int, tuple[int, int]] = {}  # a recomputed block's output: (address, version)
        self.call: tuple[tuple, dict] = ((), {})  # the model's arguments (a recomputed prefix's inputs)
        # Stages whose block this step did not call (NOTE [ skipped stages ]).
        self.skipped: set[int] = set()
        #: Per skipped stage, the unit its carried a_j came from (it goes back at the end of B_i).
        self.carried: dict[int, int] = {}
        #: The stage whose output is the hidden state now (what a skipped stage hands on).
        self.last_out = 0
        #: Entries saved between blocks into a unit whose offload was queued: sent at the next
        #: block's start, or, when the forward skipped its last blocks, left to the last unit.
        self.between: list[Entry] = []
        self.ended = 0  # the last stage whose end the forward reported
        #: The step called no block, and the code before the blocks (stage 1, run without
        #: saving) was the whole forward: rerun whole at its end (NOTE [ a step that calls no block ]).
        self.whole_prefix = False


class ScheduleRun:
    """Execute one schedule, step after step, as an instrument's listener.

    Parameters
    ----------
    chain
        The chain the schedule was made for; its length is the number of blocks.
    schedule
        A fixed-order schedule (F_1..F_L, B_L..B_1), or a rematerializing one (``Fck``, ``Fn``,
        a repeated ``F``) that begins with one forward op per stage, in order (the model's own
        forward; NOTE [ recomputation ] in _recompute.py).
    platform
        The platform the schedule was made for. With it the executor releases offloaded GPU
        copies where the simulated timeline does and reports the predicted peak; without it a
        copy is released as soon as both its offload was queued and F_{i+1} ended.
    device
        The model's device; by default that of the first parameter of ``roots``.
    roots
        Modules whose parameters, buffers and tensor attributes are never offloaded (the
        whole model).
    copier, pool
        Shared with other plans of the same model (made here when not given).
    names
        One name per stage of the chain (``Blocks.stage_names``: the blocks' own, ``"transformer.h.0"``,
        and the prefix's and tails' where they are stages), for messages.
    strict
        A schedule given by hand (``True``) is refused when the step shows that a unit it
        offloads cannot move (held by a later block, or sharing storage with its neighbour); a
        plan made by :func:`~chainoffload_torch.offload` from a profile that did not see it (a
        hook added afterwards) warns once and goes on: the numbers stay exact, only the memory
        freed is less than planned (NOTE [ version discipline ] keeps the copies right).
    pinned
        Per unit, the storages its profile found held beyond its backward
        (:attr:`chainoffload_torch.Sizes.pinned`): left resident, the rest of the unit moves.
    resident_bytes
        Bytes resident for the whole step outside the chain
        (:attr:`chainoffload_torch.Sizes.resident_bytes`), added to the predicted peak.
    blocks
        The chain's stages in the model; needed by a rematerializing schedule (the blocks it
        recomputes are called again).
    model
        The model whose forward is the step; needed by a rematerializing schedule that
        recomputes the code before the first block when it is stage 1 (NOTE [ recomputing the
        code before the first block ] in _recompute.py).

    Raises
    ------
    ValueError
        The schedule does not fit the chain, offloads an instance before the op that makes it
        ends, or recomputes what cannot be called again (the code before the first block
        without ``model``, a block whose output is not the next block's hidden input, the last
        block) or has no ``blocks``.
    """

    def __init__(
        self,
        chain: co.Chain,
        schedule: co.Schedule,
        *,
        platform: co.Platform | None = None,
        device: torch.device | str | None = None,
        roots: Iterable[nn.Module] = (),
        copier: Copier | None = None,
        pool: HostPool | None = None,
        names: Iterable[str] | None = None,
        pinned: dict[int, tuple[int, ...]] | None = None,
        resident_bytes: int = 0,
        strict: bool = True,
        blocks: Blocks | None = None,
        model: nn.Module | None = None,
    ) -> None:
        if not isinstance(chain, co.Chain):
            raise TypeError(f"chain: expected a chainoffload.Chain, got {type(chain).__name__}")
        if not isinstance(schedule, co.Schedule):
            raise TypeError(f"schedule: expected a chainoffload.Schedule, got {type(schedule).__name__}")
        if platform is not None and not isinstance(platform, co.Platform):
            raise TypeError(f"platform: expected a chainoffload.Platform, got {type(platform).__name__}")
        schedule.validate(chain)
        self.remat = RematPlan.of(schedule, chain.length) if schedule.has_remat else None
        #: The ops after the forward whose recomputation may stop once it filled its last slot:
        #: an F whose a_i no later recomputation reads and no transfer of its unit moves
        #: (NOTE [ a recomputation stops at its last saved tensor ] in _recompute.py).
        self._stops = frozenset(
            k for k, (kind, i) in enumerate(schedule.compute)
            if self.remat is not None and kind == "F" and k > self.remat.orig[i - 1] and k not in self.remat.last_read
            and not any(t.unit == i and t.op >= k for t in schedule.transfers)
        )
        self.blocks = blocks
        self.model = model
        if self.remat is not None:
            self._check_recomputable(blocks, chain.length)
        self.chain = chain
        self.schedule = schedule
        self.platform = platform
        self.timeline = co.simulate(chain, platform, schedule) if platform is not None else None
        self.offloaded = frozenset(schedule.offloaded_units)
        #: Units of which only a_i moves (the rest stays on the device).
        self.act_alone = frozenset(t.unit for t in schedule.transfers if t.kind == "offload" and t.moves == "act")
        self.roots = tuple(roots)
        if device is None:
            param = next((p for r in self.roots for p in r.parameters()), None)
            device = param.device if param is not None else None
        self.device = canonical_device(device)
        self.copier = copier
        self.pool = pool
        self.names = tuple(names) if names is not None else None
        self.strict = strict
        self._warned_unmoved: set[tuple[int, str]] = set()
        self.pinned = dict(pinned or {})
        self.resident_bytes = int(resident_bytes)
        #: ids of buffers seen to change in a recomputed block's forward; None until a step ended
        #: (NOTE [ state changes happen once ] in _recompute.py).
        self._mutable: set[int] = set()
        self._prefix_state: list[nn.Module] | None = None  # the modules outside the blocks
        #: Stages whose original call a completed step recorded (a block a step skipped was not
        #: seen: NOTE [ skipped stages ]).
        self._learned_at: set[int] = set()
        #: Per stage (index i - 1), the op the model's own forward runs: its first forward op.
        self._orig = self.remat.orig if self.remat is not None else tuple(range(chain.length))
        self._build_events()
        self._step: _Step | None = None
        self._warned_held: set[int] = set()
        self._warned_recopy = False
        self.last_step: StepStats | None = None
        self.steps = 0

    # -- the schedule as event tables ---------------------------------------------------------

    def _build_events(self) -> None:
        sched, length = self.schedule, self.chain.length
        n_events = 2 * len(sched.compute)
        self._n_events = n_events
        self._triggers: list[list[co.Transfer]] = [[] for _ in range(n_events)]
        self._waits: list[list[co.Transfer]] = [[] for _ in range(len(sched.compute))]
        self._release_at: list[list[int]] = [[] for _ in range(n_events)]
        self._offload_of: dict[int, co.Transfer] = {}
        self._b_start = {stage: 2 * k for k, (kind, stage) in enumerate(sched.compute) if kind == "B"}
        for idx, t in enumerate(sched.transfers):
            self._triggers[t.event if t.kind == "offload" else self._issue_event(idx, t)].append(t)
            if t.before is not None:
                self._waits[t.before].append(t)
            if t.kind == "offload":
                self._offload_of[t.unit] = t
                maker = self._maker(t.unit, t.event)
                if t.event < 2 * maker + 1:
                    raise ValueError(
                        f"schedule.transfers[{idx}]: the offload of unit {t.unit} is triggered at "
                        f"{t.at} of {sched.op_name(t.op)}, before {sched.op_name(maker)} has made it"
                    )
        for unit, t in self._offload_of.items():
            self._release_at[self._release_event(unit, t, length)].append(unit)
        # Rematerialization: which a_i instance the executor drops after which op.
        self._act_drop_at: dict[int, list[tuple[int, int]]] = {}
        if self.remat is not None:
            for m, k in self.remat.last_read.items():
                stage = 0 if m < 0 else sched.compute[m][1]
                self._act_drop_at.setdefault(k, []).append((stage, m))

    def _maker(self, unit: int, event: int) -> int:
        """The op that makes the instance of ``unit`` a transfer triggered at ``event`` moves:
        the last forward op of stage ``unit`` that starts at or before it (docs/model.md), or
        the first one."""
        comp = self.schedule.compute
        ops = [k for k, (kind, s) in enumerate(comp) if s == unit and kind in FORWARD_KINDS]
        before = [k for k in ops if 2 * k <= event]
        return before[-1] if before else ops[0]

    def _check_recomputable(self, blocks: Blocks | None, length: int) -> None:
        remat = self.remat
        need = set(remat.recomputed) | {i for i, k in enumerate(remat.first, start=1) if k != "F"}
        if not need:
            return
        if blocks is None:
            raise ValueError("blocks: a rematerializing schedule needs the chain's blocks, to call them again")
        if blocks.stages != length:
            raise ValueError(f"blocks: {blocks.stages} stages, but the chain has {length}")
        for i in sorted(need):
            b = blocks.block_at(i)
            if b is None:
                # NOTE [ the code after a block as a stage ] in _instrument.py.
                raise ValueError(
                    f"schedule: recomputes stage {i}, the code after a block before the next one, which is no module "
                    "call the executor can run again"
                )
            if b < 1:
                if self.model is not None:
                    continue  # NOTE [ recomputing the code before the first block ] in _recompute.py
                raise ValueError(
                    f"schedule: recomputes stage {i}, the code before the first block ({blocks.names[0]}), which is no "
                    "module call the executor can run again without the model (model=)"
                )
            if not blocks.is_linked(b) and b not in blocks.tails:
                raise ValueError(
                    f"schedule: recomputes stage {i} ({blocks.names[b - 1]}), whose a_{i} is made by the code after the "
                    "block (not the block's own output), which the executor cannot run again"
                )

    # NOTE [ release point ]
    # docs/model.md frees the GPU copy of an offloaded unit i at max(end of O_i, end of F_{i+1}),
    # without compute waiting. The host only sees op boundaries, so the executor releases it at
    # the first boundary event whose simulated time is at or after that instant (and not before
    # the end of F_{i+1}, which still reads a_i): there, in the simulated timeline, the copy has
    # ended and the compute stream's wait on its event costs nothing. Releasing it exactly at
    # the end of F_{i+1} instead would make compute wait whenever O_i is longer than F_{i+1},
    # a stall the schedule did not ask for; releasing later than the boundary would hold memory
    # the simulator frees. Without a platform the end of F_{i+1} is used.

    # NOTE [ prefetch issue point ]
    # docs/model.md allocates a prefetch's destination when the prefetch *starts*, and a channel
    # serves its queue one transfer at a time, so a prefetch triggered early may start much
    # later, behind others. The caching allocator counts memory in the order the host allocates,
    # so allocating every queued destination at its trigger holds them all at once: on an H200
    # the gpt-like chain of benchmarks/gpu_check.py measured 10.6 % above its predicted peak so,
    # and 9 % below it once prefetches were issued as below. The executor
    # therefore issues a prefetch -- allocates its destination and queues its copy -- at the
    # first boundary event at or after its simulated start (not before its trigger). The channel
    # is FIFO, so issue points keep the trigger order, and the copy starts at most one compute op
    # later than simulated; the memory the allocator sees is never ahead of the simulator's.

    def _issue_event(self, idx: int, prefetch: co.Transfer) -> int:
        tl = self.timeline
        if tl is None:
            return prefetch.event
        return self._first_event_at(prefetch.event, float(tl.transfer_start[idx]))

    def _first_event_at(self, earliest: int, when: float) -> int:
        """The first boundary event from ``earliest`` on whose simulated time is at or after ``when``."""
        tl = self.timeline
        for e in range(earliest, self._n_events):
            k, end = divmod(e, 2)
            at = float(tl.op_end[k] if end else tl.op_start[k])
            if at >= when - 1e-12 * max(1.0, abs(when)):
                return e
        return self._n_events - 1

    def _release_event(self, unit: int, offload: co.Transfer, length: int) -> int:
        if self.remat is not None:
            return self._release_event_remat(unit, offload)
        sched = self.schedule
        earliest = offload.event
        if unit < length:
            earliest = max(earliest, 2 * sched.index("F", unit + 1) + 1)
        tl = self.timeline
        if tl is None:
            return earliest
        t_idx = sched.transfers.index(offload)
        free_time = float(tl.transfer_end[t_idx])
        if unit < length:
            free_time = max(free_time, float(tl.op_end[sched.index("F", unit + 1)]))
        return self._first_event_at(earliest, free_time)

    def _release_event_remat(self, unit: int, offload: co.Transfer) -> int:
        """docs/model.md's release point of an offloaded instance: the latest of the end of its
        offload and the end of every forward op that reads the original (those of stage
        ``unit + 1`` before the first backward op at or after the trigger, that do not free it)."""
        sched, tl = self.schedule, self.timeline
        maker = self._maker(unit, offload.event)
        earliest = offload.event
        free_time = float(tl.transfer_end[sched.transfers.index(offload)]) if tl is not None else 0.0
        for k in range(maker + 1, len(sched.compute)):
            kind, s = sched.compute[k]
            if kind == "B" and 2 * k >= offload.event:
                break
            if s == unit and kind in FORWARD_KINDS:
                break  # a new instance: the offloaded one has no reader left
            if s == unit + 1 and kind in ("F", "Fck"):
                earliest = max(earliest, 2 * k + 1)
                if tl is not None:
                    free_time = max(free_time, float(tl.op_end[k]))
        if tl is None:
            return earliest
        return self._first_event_at(earliest, free_time)

    # -- listener: the forward -------------------------------------------------------------

    def wants(self) -> bool:
        """Offload only when autograd records (not under ``no_grad`` / ``inference_mode``)."""
        return torch.is_grad_enabled()

    def forward_start(self, args: tuple, kwargs: dict) -> _Step:
        """A step begins: drop what an unfinished previous step holds, open a ledger."""
        if self._step is not None and not self._step.done:
            # The previous step never reached the end of its backward (an exception in it, or
            # no backward at all): drop whatever it still holds before starting anew.
            self._abort(self._step)
        device = self.device
        if device is None:
            device = next((t.device for t in tensors_in((args, kwargs))), None)
            if device is None:
                raise RuntimeError("chainoffload_torch: no device known (no parameters, no tensor input); pass device=")
            self.device = device
        if self.copier is None:
            self.copier = Copier(device, duplex=self.platform.duplex if self.platform is not None else True)
        if self.pool is None:
            self.pool = HostPool(pin=device.type == "cuda")
        passive = not self.offloaded and self.remat is None
        # NOTE [ passive steps ]: a schedule that moves nothing needs no map of the storages;
        # nor, off CUDA, one that only recomputes (NOTE [ a plan that moves nothing owns nothing ]).
        walk = not passive and (bool(self.offloaded) or device.type == "cuda")
        ledger = UnitLedger(device, resident_storages(self.roots) if walk else set(), hold=self.offloaded, pinned=self.pinned)
        ledger.add_resident((args, kwargs))
        step = _Step(ledger)
        step.passive = passive
        step.call = (args, kwargs)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            step.mem_base = torch.cuda.memory_allocated(device)
        if self.timeline is not None:
            step.stats.predicted_peak = self.timeline.peak_memory + self.resident_bytes
        self._step = step
        return step

    # NOTE [ passive steps ]
    # A plan that offloads nothing (the budget holds the keep-all peak) runs its steps without
    # saved-tensor hooks and without the ledger: autograd keeps its saved tensors as in plain
    # PyTorch (its own in-place check included, which the hooks would take over), and the step
    # costs the boundary hooks alone. Measured on a tiny GPT-2 on CPU: 31 ms a step with the hooks
    # against 20 ms plain; an H200 showed 32 against 17 ms for a small conv chain.
    # The step's figures (wall time, the CUDA peak) are still recorded.

    # NOTE [ skipped stages ]
    # A training step may call a subset of the blocks: LayerDrop (HF Wav2Vec2 and HuBERT train
    # with layerdrop=0.1 by default, BART and Whisper expose it) skips a drawn few, an early exit
    # the last ones. The instrument learns it when a later block starts (or the forward returns)
    # and tells the executor, before any event of the skipped stage's ops fires. Decision: the
    # stage *collapses*. Its a_i is the a_j of the last stage that ran (the hidden state the
    # model hands on unchanged); its ops are no-ops whose events still fire at their place in the
    # sequence (transfers triggered there are queued as planned); a recomputation of it calls
    # nothing and makes that same a_j its a_i instance; its unit saves nothing. The carried a_j
    # (the output entry of unit j, when unit j is offloaded) is moved, for the step, into the
    # skipped unit i: it is offloaded, released, prefetched and awaited with unit i's transfers
    # (B_{i+1} reads it, as it would read a_i), and at the end of B_i it goes back to unit j,
    # whose backward may read it too. A carried a_j of a kept unit stays resident (unit j holds
    # it in the plan anyway).
    # Why the plan's bound still holds: at every event of the step the executor holds a subset
    # of what the plan holds, with the carried a_j in the place of unit i or of its a_i instance.
    # From F_j to F_i both hold a_j in unit j; from F_i's start to unit i's release the plan also
    # holds unit i (saved[i] >= act[i] bytes) and the step a_j alone; after it, a_j is where unit
    # i's copy is (host, or back from P_i's start to the end of B_i); from P_j's start (before
    # B_i) unit j is back in the plan too. The gradient B_{i+1} makes is g_j (act[j] bytes) where
    # the plan's B_{i+1} makes g_i (act[i]) and B_i adds g_{i-1}. Every substitution needs
    # act[j] <= act[i]: true of LayerDrop's layers, which keep the hidden size (the next block
    # takes a_j where it took a_i); a step that skips a block whose profiled input is larger than
    # its output is refused, naming it. tests/test_torch_layerdrop.py checks the bytes alive at
    # every op of skipping steps (the first block, the last, runs of them; pure offloading,
    # rotor and joint) against the plan's simulated memory. Bytes moved: unit i's own bytes
    # never exist, a_j moves at most once, so a step moves at most the plan's bytes.
    # The tail: a forward that skips its last blocks runs the head right after block j, so what
    # the head saves first lands in unit j. The code between two blocks saves into the unit
    # before; such entries (made after block j's end) are sent at the next block's start when
    # unit j's offload is already queued, and when the forward returns without that block they
    # go to unit L, the head's, which is never moved. An early exit is the same.
    # The profile: its forwards must run every block. A profiling forward that skips blocks
    # between others calls them itself (the instrument, for a listener with runs_skipped), each
    # on the hidden state the one before returned and on the next block's other arguments, and
    # hands the next block the result: a forward of the whole chain, measured, its numbers thrown
    # away with the rest of the pass. One that skips the last blocks is run again under other
    # seeds (SKIP_TRIES, generators put back after), and so is one whose made-up call cannot
    # run (a block with an extra input of its own); where no draw can be profiled, the call's
    # own draws are replayed with those blocks collapsed (NOTE [ blocks a profile cannot run ]
    # in _recorder.py). In such a pass the code after a skipped
    # block's place runs on the carried state before the instrument runs the block: a write
    # through .data found on the carried a_j (NOTE [ writes no version counter sees ] in
    # _recorder.py) marks the skipped blocks' units too, since a step that runs them writes their
    # outputs; a write only some steps make stays unseen, as for any loop (the fuzz draws no
    # .data writes with skipped blocks). Discovery retraces a forward that skipped most of a
    # list (NOTE [ blocks a forward skipped ] in _discovery.py). A rematerializing plan that
    # would recompute a block from a carried a_j that the code after a skipped block changed
    # raises (the check of NOTE [ recomputation ] in _recompute.py), never trains on.

    # NOTE [ a skipped first block ]
    # a_0, the chain's input (the prefix's output), is unit 0's: resident outside the chain in
    # the plan, never moved. The ledger notes it at stage_start(1); a step that skips the first
    # block never calls that, so the first block that ran saved a_0 as a storage no unit owned
    # yet, made it its own unit's, and moved it with that unit: act[0] bytes more than the
    # plan's (benchmarks/training_loops.py's LayerDrop row showed 10.27 MiB moved against a
    # 10.02 MiB plan, its unit 1 kept and unit 2 offloaded). Decision: while no block has run, a
    # skipped stage notes the hidden state it hands on as unit 0's, as stage_start(1) would (and
    # the bytes of a model input a_0, for the CUDA peak). Checked by
    # tests/test_torch_layerdrop.py (bytes moved per unit against the plan's, and exactly the
    # plan's less the skipped units' when only the first blocks are skipped).

    def stage_start(self, step: _Step, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None:
        """F_idx starts."""
        if step is not self._step:
            return
        ledger = step.ledger
        if idx == 1 and isinstance(hidden, torch.Tensor) and not ledger.owns(hidden):
            step.a0_before = hidden.numel() * hidden.element_size()
        if step.passive:
            return
        self._send_between(step)
        step.versions[idx] = ledger.stage_start(idx, hidden, (args, kwargs))
        self._refuse(ledger.held, "is held beyond its backward by a later block (a skip connection)")
        step.current = idx
        if self.remat is not None:
            self._record_call(step, idx, hidden, args, kwargs)
        self._advance(step, 2 * self._orig[idx - 1])

    def _record_call(self, step: _Step, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None:
        """The original call of stage ``idx`` begins: record what its recomputations need, and
        run it without saving if the schedule says Fck / Fn (NOTE [ recomputation ])."""
        remat = self.remat
        if idx == 1 and -1 in remat.last_read and isinstance(hidden, torch.Tensor):
            step.acts[0] = (-1, Act(hidden, None, original=True))
        prev = step.outputs.pop(idx - 1, None)
        # Only a block recomputed from a_{idx-1} must take it as it was made; one the schedule
        # never recomputes may get it changed (a pre-hook of its own that makes a new input). A
        # skipped stage before it carried the entry on (NOTE [ skipped stages ]), whether or not
        # this block is recomputed.
        if prev is not None and idx in remat.recomputed and (
            not isinstance(hidden, torch.Tensor)
            or hidden.untyped_storage().data_ptr() != prev[0]
            or hidden._version != prev[1]
        ):
            # A recomputed a_{idx-1} is the block's own output; this block read something else.
            raise RuntimeError(
                f"chainoffload_torch: block {idx} does not take block {idx - 1}'s output as it returned it (the code "
                f"between them changed it, in place or not), so a recomputed a_{idx - 1} would not be its input; the "
                "schedule recomputes from it. Train with method='best' (no recomputation), or let offload() plan"
            )
        if idx == 1 and idx in remat.recomputed and self.blocks.prefix:
            step.records[1] = self._record_prefix(step)
        elif idx in remat.recomputed:
            if not isinstance(hidden, torch.Tensor):
                raise RuntimeError(f"chainoffload_torch: block {idx} got no tensor as its hidden state; it cannot be recomputed")
            held = step.acts.get(idx - 1)
            if held is not None and held[1].original and held[1].tensor is not None and not _same_view(held[1].tensor, hidden):
                # The a_{idx-1} the executor holds for this block's recomputation is not what the
                # block took (the code between the blocks made a new hidden state): a
                # recomputation would start from the wrong tensor.
                raise RuntimeError(
                    f"chainoffload_torch: block {idx} does not take block {idx - 1}'s output as it returned it (the code "
                    "between them made a new hidden state), so a recomputation from it would start from another tensor; "
                    "the schedule recomputes it. Train with method='best' (no recomputation), or let offload() plan"
                )
            if held is not None and held[1].original and held[1].entry is not None and step.skipped:
                self._recopy_written_input(step, held[1].entry, hidden)
            b = self.blocks.block_at(idx)
            module = self.blocks.modules[b - 1]
            others = [h for h in module._forward_pre_hooks.values() if not _is_instrument_hook(h)]
            if others or nn.modules.module._global_forward_pre_hooks:
                raise RuntimeError(
                    f"chainoffload_torch: block {idx} ({self.blocks.names[b - 1]}) has forward pre-hooks of its own; a "
                    "recomputation would run them a second time on the arguments they already changed. Remove them, or "
                    "train with method='best' (no recomputation)"
                )
            # NOTE [ arguments a recomputation would change again ] in _recompute.py.
            objects, why = argument_state(module, args, kwargs, self.blocks.hidden_in[b - 1])
            if why is not None:
                raise RuntimeError(
                    f"chainoffload_torch: the schedule recomputes block {idx} ({self.blocks.names[b - 1]}), which {why}. "
                    "Train with method='best' (no recomputation), or let offload() plan (it never recomputes such a block)"
                )
            step.records[idx] = CallRecord(
                module, idx, args, kwargs, self.blocks.hidden_in[b - 1], hidden, self.device,
                self._mutable if idx in self._learned_at else None, objects=objects,
            )
        if remat.first[idx - 1] != "F":
            step.dropping = idx
            step.slots[idx] = []

    # NOTE [ a carried input written after its offload was queued ]
    # A plan recomputes block i from an offloaded copy of a_{i-1} only where no profile saw the
    # code before block i write a_{i-1} after the block before returned it (NOTE [ an input
    # written after its block returned ] in plans.py). A step that skips the blocks between j and
    # i hands block i the carried a_j (NOTE [ skipped stages ]), and the code after block j may
    # write that one (h += 1 after block j) after the offload of unit j was queued at F_j's end:
    # the copy would lack the write, and the recomputation could not start from it (the fuzz's
    # model 5485, seed 43, raised at the read). Decision: at block i's start, when this step
    # skipped blocks and the a_{i-1} held for its recomputation is an offloaded entry whose copy
    # was queued at another version than the input block i takes, the entry is copied to the
    # host again while its device copy is still there (the same rule as a storage saved again
    # after its offload: recopied_bytes, one warning), so the recomputation starts from the bytes
    # block i read. Not done: an entry whose device copy was already released at block i's start
    # (no plan releases a unit's copy before F_{i+1} ends, and a carried a_j goes with the
    # skipped unit's transfers, so the fuzz met none); the read still refuses it, loudly. A step
    # that skips nothing pays nothing for this check (a test of step.skipped per recomputed block).

    def _recopy_written_input(self, step: _Step, e: Entry, hidden: torch.Tensor) -> None:
        """Copy ``e`` (the a_{i-1} block i's recomputation starts from) to the host again when
        the code before block i wrote it after its offload was queued (NOTE [ a carried input
        written after its offload was queued ])."""
        if e.state is not S.OFFLOADING:
            return
        k = _known(e, hidden)
        if k is not None and k[2] is not None and k[2] != hidden._version:
            self._offload_entry(step, e)

    def _record_prefix(self, step: _Step) -> PrefixRecord:
        """The record of the code before the first block, stage 1, which the schedule recomputes
        (NOTE [ recomputing the code before the first block ] in _recompute.py)."""
        model, first = self.model, self.blocks.modules[0]
        mine = [h for h in model._forward_pre_hooks.values() if not _is_instrument_hook(h)]
        mine += [h for h in first._forward_pre_hooks.values() if not _is_instrument_hook(h)]
        if mine or nn.modules.module._global_forward_pre_hooks:
            raise RuntimeError(
                "chainoffload_torch: the schedule recomputes the code before the first block, and the model or its "
                f"first block ({self.blocks.names[0]}) has forward pre-hooks of its own; a recomputation would not "
                "run that code as it ran. Remove them, or train with method='best' (no recomputation)"
            )
        args, kwargs = step.call
        why = stateful_argument(model, args, kwargs, None)
        if why is not None:
            raise RuntimeError(
                f"chainoffload_torch: the schedule recomputes the code before the first block, and the model {why}. "
                "Train with method='best' (no recomputation), or let offload() plan (it never recomputes it then)"
            )
        if self._prefix_state is None:
            self._prefix_state = prefix_state(model, self.blocks.modules)
        return PrefixRecord(
            model, first, self.blocks.hidden_of, args, kwargs, self.device,
            self._mutable if 1 in self._learned_at else None, self._prefix_state,
            blocks=self.blocks.modules, skipped=step.skipped,
        )

    def stage_end(self, step: _Step, idx: int, hidden_in: Any, hidden_out: Any) -> None:
        """F_idx ends (for the last block, F_L goes on until the model's forward returns)."""
        if step is not self._step or step.passive:
            return
        ledger = step.ledger
        ledger.stage_end(idx, hidden_in, step.versions.pop(idx, None), hidden_out)
        step.ended = step.last_out = idx
        self._refuse(ledger.aliased, "returns its input or a view of it, so units share storage")
        out = ledger.output.get(idx)
        if out is not None and idx in self.offloaded:
            _counter(out, hidden_out)
        if self.remat is not None:
            self._end_call(step, idx, hidden_in, hidden_out)
        if idx < self.chain.length:
            self._advance(step, 2 * self._orig[idx - 1] + 1)

    def stage_skipped(self, step: _Step, idx: int, hidden: Any) -> None:
        """Stage ``idx``'s block was not called in this step (LayerDrop, an early exit): the stage
        collapses, its a_i is the a_j the last block that ran made (NOTE [ skipped stages ]).

        Called before the next block's start (``hidden``: its hidden input) or at the end of
        the forward (``None``), before any event of the stage's ops fires.
        """
        if step is not self._step:
            return
        step.skipped.add(idx)
        ledger = step.ledger
        j = step.last_out
        if not j and isinstance(hidden, torch.Tensor):
            # No block ran yet: ``hidden`` is a_0 (or what the code before the first block that
            # runs made of it), the chain's input, as stage_start(1) would have noted it
            # (NOTE [ a skipped first block ]).
            if idx == 1 and not ledger.owns(hidden):
                step.a0_before = hidden.numel() * hidden.element_size()
            if not step.passive and ledger.owns(hidden) and ledger.owner(hidden) is None:
                ledger.lookup(hidden, 0)
        if step.passive:
            return
        if j and self.chain.act[j] > self.chain.act[idx]:
            raise RuntimeError(
                f"chainoffload_torch: this step skipped block {self._name(idx)}, whose input (a_{j}, {self.chain.act[j]} "
                f"bytes in the profile) is larger than its output ({self.chain.act[idx]} bytes): a plan made with the "
                "block run does not bound a step without it. Skip only blocks whose output is the size of their input "
                "(LayerDrop's layers are), or turn the skipping off while offloading"
            )
        # The storage of the hidden state handed on (a_j, or a view of a storage a unit owns).
        x = ledger.owner(hidden) if isinstance(hidden, torch.Tensor) else (ledger.output.get(j) if j else None)
        u = x.unit if x is not None else 0
        if x is not None and u >= 1 and x.src is not None and x in ledger.units.get(u, ()):
            # The carried a_j takes the skipped unit's place: it moves with unit idx's transfers
            # and is freed as unit idx would be (kept if unit idx is); it goes back to unit u at
            # the end of B_idx.
            if ledger.output.get(u) is x:
                ledger.output.pop(u)
            ledger.move(x, idx)
            ledger.output[idx] = x
            step.carried[idx] = u
            step.last_out = idx
        if self.remat is not None:
            if idx == 1 and -1 in self.remat.last_read and isinstance(hidden, torch.Tensor):
                step.acts[0] = (-1, Act(hidden, None, original=True))  # as the first block's call would
            if j in step.outputs:
                step.outputs[idx] = step.outputs.pop(j)
            maker = self._orig[idx - 1]
            held = step.acts.get(j) if j else step.acts.get(0)
            if maker in self.remat.last_read and isinstance(hidden, torch.Tensor):
                step.acts[idx] = (maker, Act(hidden, ledger.output.get(idx), original=True))
            elif maker in self.remat.last_read and held is not None:
                step.acts[idx] = (maker, held[1])

    def _name(self, idx: int) -> str:
        name = self.names[idx - 1] if self.names is not None and idx <= len(self.names) else None
        return f"{idx} ({name})" if name else str(idx)

    def _send_between(self, step: _Step) -> None:
        """Send what was saved between two blocks into a unit whose offload was queued."""
        for e in step.between:
            if e.state is S.DEVICE and e.unit in step.offload_issued and self._moves(step, e):
                self._offload_entry(step, e)
        step.between.clear()

    def _end_call(self, step: _Step, idx: int, hidden_in: Any, hidden_out: Any) -> None:
        """The original call of stage ``idx`` ended (rematerializing schedules)."""
        if step.dropping == idx:
            step.dropping = None
        rec = step.records.get(idx)
        if rec is not None:
            if isinstance(hidden_in, torch.Tensor) and hidden_in._version != rec.hidden_version:
                raise RuntimeError(
                    f"chainoffload_torch: block {idx} modifies its hidden input in place, so the input a recomputation "
                    "would start from is gone; the schedule recomputes it. Train with method='best' (no recomputation), "
                    "or make the block leave its input alone"
                )
            self._mutable.update(id(b) for b in rec.changed_buffers())
            rec.ended()
        step.inst[idx] = "whole" if self.remat.first[idx - 1] == "F" else "a"
        if idx in self.remat.recomputed and idx + 1 in self.remat.recomputed and isinstance(hidden_out, torch.Tensor):
            step.outputs[idx] = (hidden_out.untyped_storage().data_ptr(), hidden_out._version)
        maker = self._orig[idx - 1]
        if maker in self.remat.last_read and isinstance(hidden_out, torch.Tensor):
            step.acts[idx] = (maker, Act(hidden_out, step.ledger.output.get(idx), original=True))

    def _refuse(self, units: set[int], why: str) -> None:
        bad = sorted(units & self.offloaded)
        if not bad:
            return
        if self.strict:
            raise RuntimeError(
                f"chainoffload_torch: unit(s) {bad}: a block {why}; the schedule offloads them: keep them "
                f"resident (offload(..., keep={bad}))"
            )
        new = [u for u in bad if (u, why) not in self._warned_unmoved]
        if new:
            self._warned_unmoved.update((u, why) for u in new)
            warnings.warn(
                f"chainoffload_torch: unit(s) {new}: a block {why}, which the profile did not see (a hook or a code "
                "path added after offload()?); the plan offloads them, so this step frees less memory than planned. "
                "The gradients stay exact. Profile again (handle.remove(), then offload()) to plan with it",
                RuntimeWarning,
                stacklevel=3,
            )

    def forward_end(self, step: _Step, outputs: Any) -> None:
        """F_L ends: the model's forward returned."""
        if step is not self._step:
            return
        if step.passive:
            step.forward_done = True
            step.current = None
            return
        ledger = step.ledger
        length = self.chain.length
        if (
            self.remat is not None and step.dropping == 1 and step.ended == 0 and isinstance(step.records.get(1), PrefixRecord)
            and all(k in step.skipped for k in range(2, length + 1))
        ):
            self._fill_whole_prefix(step)
        if length in step.skipped and step.between:
            # The code after the last block that ran was the head's (stage L): what it saved
            # belongs to unit L, which never moves (NOTE [ skipped stages ]).
            for e in step.between:
                if e.unit != length and e in ledger.units.get(e.unit, ()):
                    ledger.move(e, length)
            step.between.clear()
        self._send_between(step)
        ledger.forward_end(outputs, length)
        held = sorted((ledger.held & self.offloaded) - self._warned_held)
        if held:
            self._warned_held.update(held)
            warnings.warn(
                f"chainoffload_torch: the model's output holds storages of offloaded unit(s) {held} (e.g. "
                "output_hidden_states=True or a key/value cache): offloading them frees no memory",
                RuntimeWarning,
                stacklevel=2,
            )
        self._advance(step, 2 * self._orig[-1] + 1)
        step.forward_done = True
        step.current = None
        ledger.by_key.clear()  # no pack of the forward's after it: the address map is done

    # NOTE [ a step that calls no block ]
    # With LayerDrop a step may skip every block of the chain (the fuzz: 5 blocks at
    # layerdrop=0.5, one step in 32; discovery may take only the last few of a list as the
    # chain, the rest running in the code before it). When the code before the first block is
    # stage 1 and the schedule runs it without saving (Fck_1 / Fn_1, to recompute it later), that
    # stage never ends: no block call stops it, so it is the whole forward, the head's saves in
    # its slots too; no tensor hook marks a backward start, and autograd read the empty slots
    # before any recomputation ran ("the backward of block 1 needs what its recomputation saves":
    # 3 of the 11 one-sided raises of the two 5000-model fuzz runs). Decision: at the forward's
    # end, such a step runs the model's forward again at once, under the states the step started
    # with (PrefixRecord.call with whole=True: the same draws skip every block again, or it raises),
    # and what it saves fills the slots in order, kept on the device; the schedule's later
    # recomputations of stage 1 do nothing in that step (stages 2..L are skipped: they call
    # nothing either). The step then holds what plain PyTorch holds for the same step (every
    # block skipped, so no unit of a block holds anything); the plan's bound, proven for steps
    # that end stage 1, is not checked for it.

    def _fill_whole_prefix(self, step: _Step) -> None:
        """Fill stage 1's slots by running the whole forward again (NOTE [ a step that calls no block ])."""
        rec = step.records[1]
        rec.ended()
        step.dropping = None
        records: list[Kept] = []

        def keep(t: torch.Tensor) -> None:
            records.append(Kept(t.detach(), 1))  # not the rerun's graph, which is dropped

        hooks = torch.autograd.graph.saved_tensors_hooks(keep, _unpack_nothing)
        try:
            with recomputing():
                rec.call(None, hooks, whole=True)
        except Exception as exc:
            if str(exc).startswith("chainoffload_torch:"):
                raise
            raise RuntimeError(
                f"chainoffload_torch: this step called no block, and running the model's forward again to recompute "
                f"it failed: {type(exc).__name__}: {exc}. Train with method='best' (no recomputation)"
            ) from exc
        slots = step.slots.pop(1, [])
        if len(slots) != len(records):
            raise RuntimeError(
                f"chainoffload_torch: this step called no block, and the model's forward run again saved {len(records)} "
                f"tensors where the step saved {len(slots)}; train this model with method='best' (no recomputation)"
            )
        for slot, r in zip(slots, records, strict=True):
            slot.record = r
        step.whole_prefix = True
        step.stats.recomputed_ops += 1

    def forward_failed(self, step: _Step) -> None:
        """The forward raised: drop the step."""
        if step is self._step:
            self._abort(step)

    # -- listener: the backward ------------------------------------------------------------

    def backward_mark(self, step: _Step, idx: int) -> None:
        """B_idx starts (g_idx is complete; for idx = L, the backward began)."""
        if step is not self._step or step.done:
            return
        self._advance(step, self._b_start[idx])

    def backward_end(self, step: _Step) -> None:
        """B_1 ended: fire what is left, give every buffer back, record the step's figures."""
        if step.done or step is not self._step:
            return
        self._advance(step, self._n_events - 1)
        for unit in list(step.ledger.units):
            self._drop_unit(step, unit)
        self._learned_at.update(step.records)
        self._clear_remat(step)
        stats = step.stats
        stats.wall_time = time.perf_counter() - step.t0
        if self.device is not None and self.device.type == "cuda":
            stats.measured_peak = torch.cuda.max_memory_allocated(self.device) - step.mem_base + step.a0_before
        step.done = True
        self._step = None
        self.last_step = stats
        self.steps += 1
        self.pool.trim()

    # -- listener: saved tensors -------------------------------------------------------------

    def pack(self, step: _Step, t: torch.Tensor) -> Any:
        """A record of ``t`` for autograd: the tensor and its version, or, if its unit is
        offloaded, a handle on its storage (NOTE [ version discipline ]); inside a block the
        schedule runs without saving, an empty slot its recomputation fills (NOTE [ recomputation ])."""
        if step is not self._step or step.forward_done:
            return Kept(t, None)
        if step.dropping is not None:
            # NOTE [ pins in a stage run without saving ] in _stages.py
            if self.offloaded:  # NOTE [ a plan that moves nothing owns nothing ]
                step.ledger.count(t, step.current)
            slots = step.slots[step.dropping]
            slot = Slot(step.dropping, len(slots), t)
            slots.append(slot)
            return slot
        return self._record(step, t, step.current)

    def _record(self, step: _Step, t: torch.Tensor, stage: int | None) -> Any:
        if not self.offloaded:
            return Kept(t, stage)  # NOTE [ a plan that moves nothing owns nothing ]
        between = not step.forward_done and stage is not None and stage == step.ended
        known = len(step.ledger.units.get(stage, ())) if between else 0
        entry = step.ledger.pack(t, stage)
        if between and entry is not None and entry.unit == stage and len(step.ledger.units.get(stage, ())) > known:
            # Made by the code after block `stage` ended: the next block's start sends it if its
            # unit's offload was queued; a forward that skips its last blocks gives it to the head
            # (stage L), whose code it was (NOTE [ skipped stages ]).
            step.between.append(entry)
        if entry is None or entry.unit not in self.offloaded:
            return Kept(t, stage)
        if entry.unit in step.offload_issued and self._moves(step, entry):
            if entry in step.between:
                pass  # sent at the next block's start (_send_between)
            elif entry.state is S.DEVICE:
                # Saved after its unit's offload was queued (code between two blocks): send it too.
                self._offload_entry(step, entry)
            elif entry.state is S.OFFLOADING:
                self._recopy_if_stale(step, entry, t)
        elif entry.state is S.OFFLOADING:
            # NOTE [ a carried entry saved after its copy was queued ]
            self._recopy_if_stale(step, entry, t)
        probe = _counter(entry, t)[1]
        return Packed(entry, t, probe, stage)

    # NOTE [ a plan that moves nothing owns nothing ]
    # A rematerializing plan that offloads no unit (checkpointing's schedule, Fck 1..L-1, F L)
    # still runs the saved-tensor hooks: a no-save stage's tensors become slots, and every record
    # carries the version autograd would check. What the ledger learns from a saved tensor (which
    # unit owns its storage, the ordinals the profile's pins are known by, the units a later
    # block holds, what was saved between blocks) decides what moves, and what the executor
    # refuses or warns of for an offloaded unit (held, aliased: always `& self.offloaded`); with
    # no unit offloaded nothing reads it but the reports unit_states() and live_entries(). So
    # such a plan's pack makes its record and nothing else: no ledger pack or count per saved
    # tensor (317 a step, about 10 us each on CPU, in benchmarks/checkpointing.py's Llama at
    # checkpointing's memory). The ledger still sees the stages' inputs and outputs (stage_start,
    # stage_end: aliasing, the outputs a recomputation reads) and the forward's end. The records
    # are the same Kept records, so the in-place checks are as before. Nor does such a step walk
    # the model for its resident storages at its start (about 1 ms a step in that Llama): they
    # only keep a unit from owning what it cannot free, and no unit moves. On CUDA it still
    # does: the step's measured peak counts a model input a_0 (step.a0_before) by whether the
    # ledger owns it, which reads them.

    # NOTE [ a carried entry saved after its copy was queued ]
    # A step that skips block k carries a_{k-1} on, and its entry goes to the skipped unit k
    # (NOTE [ skipped stages ]). When unit k-1's offload was queued at F_{k-1}'s end, the entry's
    # copy is queued with it (state OFFLOADING), and the code after block k-1 may write a_{k-1}
    # after that (h.mul_(0.9) after the block). A block after the skipped place saves the written
    # a_{k-1}: its entry is now unit k's, whose own offload is not issued yet, so the rule of a
    # storage saved after its unit's offload (recopy if stale) did not apply; the saved record
    # read the unwritten host copy in the backward and the block's weight gradient was off,
    # silently (the recomputing fuzz of seed 43, model 5669: a joint plan that offloads every
    # unit, LayerDrop 0.5). Decision: a storage whose copy was queued is copied again when it is
    # saved at another version than the copy's, whichever unit owns it now (the same rule,
    # recopied_bytes and one warning); unit k's offload then finds it queued and sends nothing
    # more.

    def _recopy_if_stale(self, step: _Step, e: Entry, t: torch.Tensor) -> None:
        """Copy ``e`` to the host again if its storage may have changed since its copy was queued.

        ``t`` is being saved now, so autograd will read the storage as it is now. The copy holds
        it as it was at the copy's trigger: the same if no version counter of the storage moved
        since. A tensor whose counter the entry has not seen may have been changed unseen, so
        its storage is copied again too (once: its counter is known after that).
        """
        known = _known(e, t)
        moved = known is None or any(k[1]._version != k[2] for k in e.counters.values())
        if moved:
            _counter(e, t)
            self._offload_entry(step, e)

    def _where(self, record: Kept | Packed) -> str:
        stage = record.stage
        if stage is None:
            return "outside an offloaded step"
        if stage == 0:
            block = "before the first block"
        else:
            name = self.names[stage - 1] if self.names is not None and stage <= len(self.names) else str(stage)
            block = f"in the forward of block {stage} ({name})" + (", or after it" if stage == self.chain.length else "")
        unit = f"unit {record.entry.unit}, offloaded" if isinstance(record, Packed) else "kept on the device"
        return f"{block}; {unit}"

    def unpack(self, packed: Any) -> torch.Tensor:
        """The tensor behind ``packed``: the original, or its copy back from the host, after
        autograd's version check (NOTE [ version discipline ]); for a slot, what the
        recomputation saved in its place."""
        if isinstance(packed, Slot):
            if packed.probe._version != packed.version:  # the message is built only to raise
                name = self.names[packed.stage - 1] if self.names is not None and packed.stage <= len(self.names) else packed.stage
                check_version(packed, packed.probe._version, f"in the forward of block {packed.stage} ({name}), run without saving")
            if packed.record is None:
                raise RuntimeError(
                    f"chainoffload_torch: the backward of block {packed.stage} needs what its recomputation saves, and "
                    "the recomputation has not run (a backward that reaches this block before the schedule's point: a "
                    "second backward through the step, or a gradient that does not pass through the block's output, as "
                    "when the output is a view that later code modifies in place). Train with method='best' (no "
                    "recomputation), or let offload() plan (it never recomputes a block whose output view is modified)"
                )
            r = packed.record
            if type(r) is Kept and r.tensor._version == r.version:
                return r.tensor  # what the Kept branch below returns, one call less
            return self.unpack(r)
        if isinstance(packed, Kept):
            if packed.tensor._version != packed.version:  # the message is built only to raise
                check_version(packed, packed.tensor._version, self._where(packed))
            return packed.tensor
        if not isinstance(packed, Packed):
            return packed
        if packed.probe._version != packed.version:
            check_version(packed, packed.probe._version, self._where(packed))
        e = packed.entry
        if e.state in (S.DEVICE, S.OFFLOADING):
            buf = e.src
        else:
            if e.state is S.HOST:
                # No prefetch was triggered before this read (a schedule the simulator calls a
                # read violation): fetch it now rather than fail.
                step = self._step
                if step is None:
                    raise RuntimeError(f"chainoffload_torch: unit {e.unit} is read after its step ended")
                self._prefetch_entry(step, e)
            if e.state is S.PREFETCHING:
                self.copier.await_prefetch(e.h2d_event, e.dev)
                e.state = S.RESTORED
            if e.state is not S.RESTORED:
                raise RuntimeError(
                    f"chainoffload_torch: a saved tensor of unit {e.unit} was dropped (its step was abandoned: a "
                    "second forward ran before this backward, or the step was reset)"
                )
            buf = e.dev
            if self._step is not None:
                self._step.stats.restored_reads += 1
        return rebuild(packed, buf)

    # -- steps -------------------------------------------------------------------------------

    def _abort(self, step: _Step) -> None:
        """Drop everything a step holds: copies in flight are waited for, buffers go back."""
        if self.copier is not None:
            self.copier.synchronize()
        for entries in step.ledger.units.values():
            for e in entries:
                if e.host is not None:
                    self.pool.give(e.host)
                e.host = e.src = e.dev = None
                e.state = S.DROPPED
        step.ledger.units.clear()
        step.ledger.by_key.clear()
        self._clear_remat(step)
        step.done = True
        if self._step is step:
            self._step = None

    def reset(self) -> None:
        """Abandon the step in flight, if any (after an exception in its backward, say)."""
        if self._step is not None:
            self._abort(self._step)

    def _advance(self, step: _Step, upto: int) -> None:
        while step.cursor <= upto and step.cursor < self._n_events:
            self._fire(step, step.cursor)
            step.cursor += 1

    def _fire(self, step: _Step, event: int) -> None:
        k, end = divmod(event, 2)
        kind, stage = self.schedule.compute[k]
        # Frees before allocations at one instant (docs/model.md); transfers queued at the start
        # of op k before op k waits, so a transfer it must wait for is already in flight.
        for unit in self._release_at[event]:
            self._release(step, unit)
        for t in self._triggers[event]:
            if t.kind == "offload":
                self._offload(step, t.unit)
            else:
                self._prefetch(step, t.unit)
        if not end:
            for t in self._waits[k]:
                self._wait_transfer(step, t)
            if kind == "B":
                for unit in (stage, stage - 1):
                    if unit in self.offloaded:
                        self._await_prefetch(step, unit)
            elif self.remat is not None and k in self.remat.maker_of_read:
                self._recompute(step, k)
        if end and kind == "B":
            j = step.carried.pop(stage, None)
            if j is not None:
                self._give_back(step, stage, j)
            self._drop_unit(step, stage)
            if self.remat is not None:
                step.inst.pop(stage, None)
                # NOTE [ a record ends with its stage's backward ]
                if stage in step.records:
                    self._learned_at.add(stage)
                    del step.records[stage]
                if step.inst.get(stage - 1) == "a":
                    # B_i frees a lone a_{i-1}: it has no reader once stage i is done.
                    self._drop_unit(step, stage - 1)
                    step.inst.pop(stage - 1, None)
        if end and self.remat is not None:
            if kind == "Fn" and stage > 1:
                self._drop_unit(step, stage - 1)  # Fn_i frees its input a_{i-1}
                step.inst.pop(stage - 1, None)
            for unit, maker in self._act_drop_at.get(k, ()):
                held = step.acts.get(unit)
                if held is not None and held[0] == maker:
                    del step.acts[unit]

    # -- recomputation (NOTE [ recomputation ] in _recompute.py) ------------------------------

    def _recompute(self, step: _Step, k: int) -> None:
        """Run forward op ``k`` (after the forward) again: call its block on the a_{i-1}
        instance the schedule names, under the original call's states."""
        kind, i = self.schedule.compute[k]
        if i == 1 and step.whole_prefix:
            return  # filled at the forward's end (NOTE [ a step that calls no block ])
        if i in step.skipped:
            # A skipped block is never called: the a_i this op makes is the a_{i-1} it reads
            # (NOTE [ skipped stages ]).
            held = step.acts.get(i - 1)
            if k in self.remat.last_read and held is not None and held[0] == self.remat.maker_of_read[k]:
                step.acts[i] = (k, held[1])
            return
        rec = step.records.get(i)
        if rec is None:
            raise RuntimeError(f"chainoffload_torch: {kind}_{i} recomputes block {i}, whose call was not recorded in this step")
        what = f"block {i}"
        if isinstance(rec, PrefixRecord):
            what = "the code before the first block"
            x = None  # its inputs are the model's arguments, in the record
        else:
            maker = self.remat.maker_of_read[k]
            held = step.acts.get(i - 1)
            if held is None or held[0] != maker:
                raise RuntimeError(
                    f"chainoffload_torch: {kind}_{i} (op {k}) reads the a_{i - 1} that op {maker} made, which the "
                    "executor does not hold"
                )
            x = self._read_act(step, held[1], rec)
            x = x.detach()
            if rec.hidden_requires_grad:
                x.requires_grad_(True)
        ledger = step.ledger
        if i in ledger.units or i in ledger.output:
            self._drop_unit(step, i)  # F over a lone a_i replaces it
        ledger.restart(i)  # the same storages in the same order: pins apply as in the forward
        step.offload_issued.discard(i)  # an offload moves the instance its maker made, not this one
        for t in list(tensors_in((rec.args, rec.kwargs))) + ([x] if x is not None else []):
            if t.device == self.device and t.layout == torch.strided:
                ledger._borrow(t)  # the caller's, or unit i-1's: never unit i's
        step.inst[i] = "whole" if kind == "F" else "a"
        records: list[Any] = []
        if kind == "F":
            # NOTE [ a recomputation stops at its last saved tensor ] in _recompute.py
            stop = len(step.slots.get(i) or ()) if (
                k in self._stops and type(rec) is CallRecord and rec.objects is None
            ) else 0
            hooks = torch.autograd.graph.saved_tensors_hooks(
                lambda t: self._pack_recomputed(step, i, records, t, stop), _unpack_nothing
            )
        else:
            hooks = torch.autograd.graph.saved_tensors_hooks(_pack_nothing, _unpack_nothing)
        current, step.current = step.current, i
        stopped = False
        try:
            with recomputing():
                # Fck / Fn keep nothing: on CPU without autograd (NOTE [ what an Fck or Fn costs ]).
                out = rec.call(x, hooks, grad=kind == "F" or not recomputes_without_grad(self.device))
        except RecomputationEnd:
            out, stopped = None, True
        except Exception as exc:
            if str(exc).startswith("chainoffload_torch:"):
                raise
            # Never train on: say which block failed and what to do (NOTE [ arguments a
            # recomputation would change again ] in _recompute.py names the usual cause).
            raise RuntimeError(
                f"chainoffload_torch: recomputing {what} ({kind}_{i}, op {k}) failed: "
                f"{type(exc).__name__}: {exc}. A block that is recomputed must compute the same thing when called "
                "again on the same arguments; one that changes state it is given that cannot be put back as it was, or "
                "keeps state of its own, cannot. Train with method='best' (no recomputation)"
            ) from exc
        finally:
            step.current = current
        a = first_tensor(out)
        if not stopped and not isinstance(a, torch.Tensor):
            raise RuntimeError(f"chainoffload_torch: {what} returned no tensor when recomputed")
        if kind == "F":
            slots = step.slots.pop(i, None)
            if slots is None or len(slots) != len(records):
                raise RuntimeError(
                    f"chainoffload_torch: {what} saved {len(records)} tensors when recomputed but "
                    f"{'none' if slots is None else len(slots)} in its forward; a block that is recomputed must run "
                    "the same operations each time (no data-dependent control flow over what it saves, no state it "
                    "updates: a key/value cache, for which call the model with use_cache=False). Train with "
                    "method='best' (no recomputation)"
                )
            for slot, r in zip(slots, records, strict=True):
                slot.record = r
        twins, rec.twins = rec.twins, []
        if twins:  # NOTE [ state a recomputation puts back ] in _recompute.py
            _save_originals(twins, records, what)
        if stopped:  # no a_i made, and none read (NOTE [ a recomputation stops at its last saved tensor ])
            step.stats.recomputed_ops += 1
            return
        ledger.stage_end(i, x, None, a)
        if k in self.remat.last_read:
            step.acts[i] = (k, Act(a, ledger.output.get(i), original=False))
        step.stats.recomputed_ops += 1
        del out, a, x

    def _pack_recomputed(self, step: _Step, stage: int, records: list, t: torch.Tensor, stop: int = 0) -> None:
        """Pack hook of a recomputed F: the record goes to the original call's slot, nothing to
        the recomputation's own graph (which is never run backward). ``stop``: raise
        RecomputationEnd once that many records are made (0: never; NOTE [ a recomputation
        stops at its last saved tensor ] in _recompute.py)."""
        record = self._record(step, t, stage)
        if isinstance(record, Kept):
            record.tensor = t.detach()  # not the recomputation's graph, which is dropped
        records.append(record)
        if len(records) == stop:
            raise RecomputationEnd

    def _read_act(self, step: _Step, act: Act, rec: CallRecord) -> torch.Tensor:
        """The a_{i-1} a recomputation starts from: on the device, or its prefetched copy."""
        if act.tensor is not None:
            if act.original and act.probe._version != rec.hidden_version:
                raise RuntimeError(
                    f"chainoffload_torch: the hidden input of block {rec.stage} was modified in place after the block "
                    "read it (by the code after it), so the block cannot be recomputed from it; train with "
                    "method='best' (no recomputation)"
                )
            return act.tensor
        e = act.entry
        if e is None:
            raise RuntimeError(f"chainoffload_torch: the a_{rec.stage - 1} block {rec.stage} starts from is gone")
        if e.state is S.HOST:
            self._prefetch_entry(step, e)  # no prefetch triggered before (a read violation): fetch it now
        if e.state is S.PREFETCHING:
            self.copier.await_prefetch(e.h2d_event, e.dev)
            e.state = S.RESTORED
        if e.state is not S.RESTORED:
            raise RuntimeError(f"chainoffload_torch: the a_{rec.stage - 1} block {rec.stage} starts from was dropped")
        if act.original:
            copied = [c[2] for c in e.counters.values() if c[2] is not None]
            if any(v != rec.hidden_version for v in copied):
                raise RuntimeError(
                    f"chainoffload_torch: the hidden input of block {rec.stage} was modified in place after its offload "
                    "was queued, so the block cannot be recomputed from the copy; train with method='best'"
                )
        return rebuild_act(act, e.dev)

    # NOTE [ a record ends with its stage's backward ]
    # A block's call record holds its arguments, a skip an up block takes among them, for its
    # recomputations; no forward op of stage i runs after B_i, so the record is let go of there,
    # not at the step's end: an argument it held (an earlier unit's storage) lives no longer than
    # the chain counts it (NOTE [ the gradient a held storage waits for ] in _recorder.py).

    def _clear_remat(self, step: _Step) -> None:
        step.acts.clear()
        step.records.clear()
        step.slots.clear()
        step.inst.clear()
        step.outputs.clear()
        step.dropping = None

    # -- actions -----------------------------------------------------------------------------

    def _offload_entry(self, step: _Step, e: Entry) -> None:
        if e.host is None:
            host, guard = self.pool.take(e.nbytes)
        else:
            # Copied again (NOTE [ version discipline ]): the same buffer, on the same stream,
            # after the first copy, so the later bytes win.
            host, guard = e.host, None
            step.stats.recopied_bytes += e.nbytes
            if not self._warned_recopy:
                self._warned_recopy = True
                warnings.warn(
                    f"chainoffload_torch: a storage of offloaded unit {e.unit} was modified in place after its offload "
                    "was queued (code between blocks, or a pre-hook changing the hidden state?) and saved again: such "
                    "storages are copied to the host again, so the gradients stay exact; the step's "
                    "recopied_bytes (handle.last_step) says how many bytes that costs",
                    RuntimeWarning,
                    stacklevel=2,
                )
        e.d2h_event = self.copier.offload(e.src, host, guard)
        e.host = host
        e.state = S.OFFLOADING
        for k in e.counters.values():
            k[2] = k[1]._version
        stats = step.stats
        stats.offloaded_bytes += e.nbytes
        stats.unit_offloaded[e.unit] = stats.unit_offloaded.get(e.unit, 0) + e.nbytes

    def _moves(self, step: _Step, e: Entry) -> bool:
        """Whether the transfers of ``e``'s unit move ``e`` (all of the unit, or a_i alone: a
        transfer that says so, or a lone a_i that Fck_i / Fn_i made)."""
        alone = e.unit in self.act_alone or (self.remat is not None and step.inst.get(e.unit) == "a")
        return not alone or step.ledger.output.get(e.unit) is e

    def _moving(self, step: _Step, unit: int) -> list[Entry]:
        """The entries the transfers of ``unit`` move."""
        return [e for e in step.ledger.units.get(unit, ()) if self._moves(step, e)]

    def _offload(self, step: _Step, unit: int) -> None:
        step.offload_issued.add(unit)
        step.stats.unit_offloaded.setdefault(unit, 0)
        for e in self._moving(step, unit):
            if e.state is S.DEVICE:
                self._offload_entry(step, e)

    def _release_entry(self, step: _Step, e: Entry) -> None:
        self.copier.release(e.src, e.d2h_event)
        e.src = None
        for _, act in step.acts.values():
            if act.entry is e:
                act.tensor = None  # read from the prefetched copy from now on
        e.state = S.HOST
        step.ledger.forget(e)
        step.stats.released_bytes += e.nbytes

    def _release(self, step: _Step, unit: int) -> None:
        for e in self._moving(step, unit):
            if e.state is S.OFFLOADING:
                self._release_entry(step, e)

    def _prefetch_entry(self, step: _Step, e: Entry) -> None:
        if e.state is S.OFFLOADING:
            self._release_entry(step, e)
        if e.state is not S.HOST:
            return
        e.dev, e.h2d_event = self.copier.prefetch(e.host, e.d2h_event)
        self.pool.give(e.host, e.h2d_event)
        e.host = None
        e.state = S.PREFETCHING
        stats = step.stats
        stats.prefetched_bytes += e.nbytes
        stats.unit_prefetched[e.unit] = stats.unit_prefetched.get(e.unit, 0) + e.nbytes

    def _prefetch(self, step: _Step, unit: int) -> None:
        for e in self._moving(step, unit):
            self._prefetch_entry(step, e)

    def _await_prefetch(self, step: _Step, unit: int) -> None:
        for e in self._moving(step, unit):
            if e.state is S.PREFETCHING:
                self.copier.await_prefetch(e.h2d_event, e.dev)
                e.state = S.RESTORED

    def _wait_transfer(self, step: _Step, t: co.Transfer) -> None:
        for e in self._moving(step, t.unit):
            if t.kind == "offload" and e.d2h_event is not None:
                self.copier.wait(e.d2h_event)
            elif t.kind == "prefetch" and e.state is S.PREFETCHING:
                self.copier.await_prefetch(e.h2d_event, e.dev)
                e.state = S.RESTORED

    def _give_back(self, step: _Step, stage: int, j: int) -> None:
        """End of B_stage for a skipped stage: the a_j it carried goes back to unit j, whose own
        backward may still read it (NOTE [ skipped stages ])."""
        ledger = step.ledger
        x = ledger.output.pop(stage, None)
        if x is None:
            return
        ledger.move(x, j)  # x.unit is stage: stage_skipped made it so
        ledger.output[j] = x

    def _drop_unit(self, step: _Step, unit: int) -> None:
        """End of B_unit: the executor lets go of the unit (autograd may still hold handles).

        Every reference the executor keeps goes, the output's entry too: autograd's records
        alone then decide when a prefetched copy is freed, as they decide for an original.
        (Kept in ``ledger.output`` until the step ended, each prefetched a_i stayed on the
        device through the rest of the backward: measured on an H200, GPT-2's backward ran one
        a_i per offloaded block above the simulated memory, benchmarks/results/gpu_peak_trace.md.)
        """
        step.ledger.output.pop(unit, None)
        for e in step.ledger.units.pop(unit, ()):
            step.ledger.forget(e)  # a later pack of its storage (a recomputation in the forward) is no longer its
            if e.state is S.PREFETCHING:
                # Its destination must not be reused by compute before the copy into it ends.
                self.copier.await_prefetch(e.h2d_event, e.dev)
                e.state = S.RESTORED
            if e.host is not None:  # offloaded but never prefetched: nothing will read it
                self.copier.wait(e.d2h_event)
                self.pool.give(e.host)
                e.host = None
                e.state = S.DROPPED
            e.src = None

    # -- reports -----------------------------------------------------------------------------

    def unit_states(self) -> dict[int, list[EntryState]]:
        """The state of each entry of each unit of the step in flight (empty between steps)."""
        step = self._step
        if step is None:
            return {}
        return {u: [e.state for e in entries] for u, entries in sorted(step.ledger.units.items())}

    def live_entries(self) -> int:
        """Entries the step in flight holds (0 between steps)."""
        step = self._step
        return 0 if step is None else sum(len(v) for v in step.ledger.units.values())


def _save_originals(twins: list[tuple[torch.Tensor, torch.Tensor, int]], records: list, what: str) -> None:
    """Check that the tensors a recomputation put into its state objects (a key/value cache) hold
    the bytes of the originals at their places, and hand autograd views of the originals in place
    of those it saved (NOTE [ state a recomputation puts back ] in _recompute.py): the twins then
    die with the recomputation. ``twins``: (made, original, the original's version after its call)."""
    by_storage: dict[int, tuple[torch.Tensor, int]] = {}
    for made, orig, version in twins:
        st = made.untyped_storage()
        if not st.nbytes() or made.layout != torch.strided:
            continue
        # A version moved since the call is autograd's in-place error, which the slot's check
        # raises at unpack if the backward reads the tensor; the bytes are then not compared.
        if orig._version == version and not torch.equal(_storage_bytes(made), _storage_bytes(orig)):
            raise RuntimeError(
                f"chainoffload_torch: recomputing {what} put other values than its forward did into the state object "
                "it is given (a key/value cache), so the recomputation did not compute what the forward did; train "
                "this model with method='best' (no recomputation)"
            )
        by_storage.setdefault(st.data_ptr(), (orig, version))
    for r in records:
        if not isinstance(r, Kept) or r.tensor.layout != torch.strided:
            continue
        found = by_storage.get(r.tensor.untyped_storage().data_ptr()) if r.tensor.untyped_storage().nbytes() else None
        if found is None or found[0].dtype != r.tensor.dtype:
            continue
        orig, version = found
        # A view of the original's storage with the saved tensor's geometry that shares the
        # original's version counter (as _saved.version_probe does: set_ bumps the shared counter,
        # which is set back at once), holding the version the original had after its call: a
        # change of the cache's tensor in place before the backward reads it fails the unpack's
        # check, as autograd's own check fails without offloading.
        t = r.tensor
        now = orig._version
        view = orig.detach()
        view.set_(orig.untyped_storage(), t.storage_offset(), t.size(), t.stride())
        torch._C._autograd._unsafe_set_version_counter((view,), (now,))
        if t.is_neg():
            view = torch._neg_view(view)
        if t.is_conj():
            view = view.conj()
        r.tensor = view
        r.version = version


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (st.nbytes(),), (1,))


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` view the same bytes the same way (one may be a detached alias)."""
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _pack_nothing(t: torch.Tensor) -> None:
    """Pack hook of a recomputed Fck / Fn: it keeps nothing."""


def _unpack_nothing(_: Any) -> torch.Tensor:
    raise RuntimeError("chainoffload_torch: a recomputation's own graph is never run backward")


def _is_instrument_hook(h: Any) -> bool:
    from ._instrument import _Hook

    return isinstance(h, _Hook)


def _known(e: Entry, t: torch.Tensor) -> list | None:
    """``e``'s record of the version counter of ``t`` (its root's), if it has one."""
    r = root_of(t)
    k = e.counters.get(id(r))
    return k if k is not None and k[0]() is r else None


def _counter(e: Entry, t: torch.Tensor) -> list:
    """``e``'s record of ``t``'s version counter, made if new: [weakref to the root, version
    probe, version when the last copy was queued (``None``: not copied since it was seen)]."""
    k = _known(e, t)
    if k is None:
        r = root_of(t)
        k = [weakref.ref(r), version_probe(r), None]
        e.counters[id(r)] = k
    return k


class OffloadActivations:
    """Execute a fixed-order offloading schedule on a list of stages, as a context manager.

    The forward pass runs inside the ``with`` block; the backward then carries out the rest
    of the schedule by itself::

        ctx = OffloadActivations(stages, chain, schedule, platform=platform)
        with ctx:
            loss = loss_fn(model(x), y)   # the forward calls the stages, in order
        loss.backward()

    :func:`chainoffload_torch.offload` does this on a whole model, without a ``with`` block.

    Parameters
    ----------
    stages
        The chain's stages: an ``nn.Sequential`` or a list of modules, called in order inside
        the ``with`` block, each taking the previous one's output as its first argument.
    chain, schedule, platform, device
        As for :class:`ScheduleRun`.

    Raises
    ------
    ValueError
        The schedule has rematerialization ops, does not fit the chain, offloads a unit before
        its forward ends, or the number of stages differs from the chain's length.
    """

    def __init__(
        self,
        stages: Any,
        chain: co.Chain,
        schedule: co.Schedule,
        *,
        platform: co.Platform | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        blocks = Blocks.of(stages)
        if isinstance(chain, co.Chain) and chain.length != len(blocks):
            raise ValueError(f"chain: has {chain.length} stages but the model has {len(blocks)}")
        self.stages = list(blocks.modules)
        self.run = ScheduleRun(chain, schedule, platform=platform, device=device, roots=blocks.modules, blocks=blocks)
        self.instrument = Instrument(None, blocks, self.run)

    def __enter__(self) -> OffloadActivations:
        self.instrument.begin()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.instrument.end(failed=exc_type is not None)

    @property
    def last_step(self) -> StepStats | None:
        """Figures of the last completed step."""
        return self.run.last_step

    @property
    def pool(self) -> HostPool | None:
        """The host buffers (made at the first step)."""
        return self.run.pool

    @property
    def hooks_installed(self) -> int:
        """Module hooks and saved-tensor hooks currently installed."""
        return self.instrument.hooks_installed

    def unit_states(self) -> dict[int, list[EntryState]]:
        """See :meth:`ScheduleRun.unit_states`."""
        return self.run.unit_states()

    def live_entries(self) -> int:
        """See :meth:`ScheduleRun.live_entries`."""
        return self.run.live_entries()

    def reset(self) -> None:
        """Abandon the step in flight (see :meth:`ScheduleRun.reset`)."""
        if self.instrument._ctx is not None:
            raise RuntimeError("OffloadActivations.reset: called inside the with block")
        self.run.reset()
