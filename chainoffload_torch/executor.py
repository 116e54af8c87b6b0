"""Carry out a pure-offloading schedule in real training.

:class:`OffloadActivations` is the mechanism, usable as a context manager around a forward pass
(like torchtune's ``OffloadActivations``); :class:`Offloader` wraps a chain module with it;
:func:`offload` profiles, solves and wraps in one line.

How a schedule becomes actions (see docs/model.md, "The schedule"):

* ``saved_tensors_hooks`` route every tensor that stage i saves for its backward into unit i
  (:class:`~chainoffload_torch._stages.UnitLedger` decides ownership, the same code as the
  profiler's). Tensors of kept units are returned to autograd untouched; tensors of offloaded
  units are replaced by a small handle, so the unit's storage lives only in the executor.
* Forward pre- and post-hooks on the stages mark the start and end of F_i; a tensor hook on
  each stage output a_i marks the end of B_{i+1} and the start of B_i (autograd calls it once
  g_i is complete), and a callback queued on the autograd engine marks the end of B_1. Each
  mark fires, in order, every schedule event up to it: transfers triggered there are queued on
  their channel; before op k starts, the compute stream waits for transfers with ``before=k``
  and B_j waits for the prefetches of units j and j-1.
* The GPU copy of an offloaded unit is released at the first event at which the simulated
  timeline has both ended O_i and F_{i+1} (see NOTE [ release point ]); the compute stream
  waits on the copy's event first. A prefetched copy is dropped with the unit at the end of
  B_i (autograd frees it as soon as the last node that saved it has run).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn

import chainoffload as co
from chainoffload.planner import plan_transfers
from chainoffload.units import format_bytes, parse_bytes

from ._copy import Copier, HostPool
from ._stages import Entry, UnitLedger, as_stages, resident_storages

__all__ = ["OffloadActivations", "Offloader", "StepStats", "offload"]


@dataclasses.dataclass
class StepStats:
    """What one training step (forward + backward) moved and used.

    Attributes
    ----------
    offloaded_bytes, prefetched_bytes
        Bytes really copied device to host and host to device, counted at each copy.
    unit_offloaded, unit_prefetched
        The same per unit (stage, 1-based).
    released_bytes
        Bytes of offloaded GPU copies the executor let go of at their release point.
    restored_reads
        Saved tensors autograd read back from a copy that came from the host.
    measured_peak
        On CUDA: the allocator's peak during the step above what was allocated when it began,
        plus the input a_0 (the simulator's peak counts a_0); ``None`` on CPU.
    predicted_peak
        The simulator's peak of the schedule (``None`` without a platform).
    wall_time
        Host seconds from the start of the forward to the end of the backward.
    """

    offloaded_bytes: int = 0
    prefetched_bytes: int = 0
    unit_offloaded: dict[int, int] = dataclasses.field(default_factory=dict)
    unit_prefetched: dict[int, int] = dataclasses.field(default_factory=dict)
    released_bytes: int = 0
    restored_reads: int = 0
    measured_peak: int | None = None
    predicted_peak: int | None = None
    wall_time: float = 0.0


class _Packed:
    """What autograd keeps for a tensor of an offloaded unit: its entry and how to view it."""

    __slots__ = ("entry", "dtype", "size", "stride", "offset")

    def __init__(self, entry: Entry, t: torch.Tensor) -> None:
        self.entry = entry
        self.dtype = t.dtype
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class _Step:
    """State of one step in flight."""

    def __init__(self, ledger: UnitLedger) -> None:
        self.ledger = ledger
        self.cursor = 0  # next schedule event to fire
        self.expect = 1  # next stage whose forward should start
        self.current: int | None = None  # stage whose forward is running
        self.inputs: dict[int, tuple[Any, int | None]] = {}
        self.stats = StepStats()
        self.done = False
        self.forward_done = False
        self.callback_queued = False
        self.t0 = time.perf_counter()
        self.mem_base = 0


class OffloadActivations:
    """Execute a fixed-order offloading schedule on a chain of modules.

    Use it as a context manager around the forward pass; the backward then carries out the
    rest of the schedule by itself::

        ctx = OffloadActivations(model, chain, schedule, platform=platform)
        with ctx:
            loss = loss_fn(model(x), y)
        loss.backward()

    Parameters
    ----------
    stages
        The chain's stages: an ``nn.Sequential`` or a list of modules, called in order, one
        tensor in and one tensor out each, during the ``with`` block.
    chain
        The chain the schedule was made for (:func:`chainoffload_torch.profile`); its length
        must be the number of stages.
    schedule
        A fixed-order schedule (F_1..F_L, B_L..B_1). Rematerialization ops are rejected.
    platform
        The platform the schedule was made for. With it the executor releases offloaded GPU
        copies where the simulated timeline does and reports the predicted peak; without it a
        copy is released as soon as both its offload was queued and F_{i+1} ended.
    device
        The chain's device; by default that of the first parameter (else the first input).

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
        self.stages = as_stages(stages)
        if not isinstance(chain, co.Chain):
            raise TypeError(f"chain: expected a chainoffload.Chain, got {type(chain).__name__}")
        if not isinstance(schedule, co.Schedule):
            raise TypeError(f"schedule: expected a chainoffload.Schedule, got {type(schedule).__name__}")
        if platform is not None and not isinstance(platform, co.Platform):
            raise TypeError(f"platform: expected a chainoffload.Platform, got {type(platform).__name__}")
        if chain.length != len(self.stages):
            raise ValueError(f"chain: has {chain.length} stages but the model has {len(self.stages)}")
        if schedule.has_remat:
            kinds = sorted({k for k, _ in schedule.compute if k in ("Fck", "Fn")})
            raise ValueError(
                "schedule: has rematerialization ops "
                f"({', '.join(kinds) or 'a repeated forward'}); only fixed-order (pure offloading) schedules can be executed"
            )
        schedule.validate(chain)
        self.chain = chain
        self.schedule = schedule
        self.platform = platform
        self.timeline = co.simulate(chain, platform, schedule) if platform is not None else None
        self.offloaded = frozenset(schedule.offloaded_units)
        if device is None:
            param = next((p for s in self.stages for p in s.parameters()), None)
            device = param.device if param is not None else None
        self.device = torch.device(device) if device is not None else None
        self._copier: Copier | None = None
        self.pool: HostPool | None = None
        if self.device is not None:
            self._make_copier(self.device)
        self._build_events()
        self._step: _Step | None = None
        self._handles: list[Any] = []
        self._saved_hooks: Any = None
        self._active = False
        self._passthrough = False
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
            self._triggers[t.event].append(t)
            if t.before is not None:
                self._waits[t.before].append(t)
            if t.kind == "offload":
                self._offload_of[t.unit] = t
                end_f = 2 * sched.index("F", t.unit) + 1
                if t.event < end_f:
                    raise ValueError(
                        f"schedule.transfers[{idx}]: the offload of unit {t.unit} is triggered at "
                        f"{t.at} of {sched.op_name(t.op)}, before F_{t.unit} has made it"
                    )
        for unit, t in self._offload_of.items():
            self._release_at[self._release_event(unit, t, length)].append(unit)

    # NOTE [ release point ]
    # docs/model.md frees the GPU copy of an offloaded unit i at max(end of O_i, end of F_{i+1}),
    # without compute waiting. The host only sees op boundaries, so the executor releases it at
    # the first boundary event whose simulated time is at or after that instant (and not before
    # the end of F_{i+1}, which still reads a_i): there, in the simulated timeline, the copy has
    # ended and the compute stream's wait on its event costs nothing. Releasing it exactly at
    # the end of F_{i+1} instead would make compute wait whenever O_i is longer than F_{i+1},
    # a stall the schedule did not ask for; releasing later than the boundary would hold memory
    # the simulator frees. Without a platform the end of F_{i+1} is used.

    def _release_event(self, unit: int, offload: co.Transfer, length: int) -> int:
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
        for e in range(earliest, self._n_events):
            k, end = divmod(e, 2)
            at = float(tl.op_end[k] if end else tl.op_start[k])
            if at >= free_time - 1e-12 * max(1.0, abs(free_time)):
                return e
        return self._n_events - 1

    # -- context manager -------------------------------------------------------------------

    def __enter__(self) -> "OffloadActivations":
        if self._active:
            raise RuntimeError("OffloadActivations: already entered (nested forward passes are not supported)")
        self._active = True
        self._passthrough = not torch.is_grad_enabled()
        if self._passthrough:
            # Inference: nothing is saved, nothing to do; a step in flight (its backward still
            # to come) is left as it is.
            return self
        if self._step is not None and not self._step.done:
            # The previous step never reached the end of its backward (an exception in it, or
            # no backward at all): drop whatever it still holds before starting anew.
            self._abort(self._step)
        try:
            self._start_step()
            for idx, stage in enumerate(self.stages, start=1):
                self._handles.append(stage.register_forward_pre_hook(functools.partial(self._pre_hook, idx)))
                self._handles.append(stage.register_forward_hook(functools.partial(self._post_hook, idx)))
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()
        except BaseException:
            self._teardown(abort=True)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._passthrough:
            self._active = False
            return
        step = self._step
        failed = exc_type is not None
        if not failed and step is not None and not step.forward_done:
            self._teardown(abort=True)
            raise RuntimeError(
                f"OffloadActivations: the forward ran stages 1..{step.expect - 1} of {len(self.stages)}; "
                "every stage must run once, in order, inside the with block"
            )
        self._teardown(abort=failed)

    def _teardown(self, abort: bool) -> None:
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._active = False
        if abort and self._step is not None:
            self._abort(self._step)

    # -- steps -------------------------------------------------------------------------------

    def _start_step(self) -> None:
        device = self.device
        if device is None:
            raise RuntimeError("OffloadActivations: no device known (the stages have no parameters); pass device=")
        if self._copier is None:
            self._make_copier(device)
        ledger = UnitLedger(device, resident_storages(self.stages), hold=self.offloaded)
        step = _Step(ledger)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            step.mem_base = torch.cuda.memory_allocated(device)
        if self.timeline is not None:
            step.stats.predicted_peak = self.timeline.peak_memory
        self._step = step

    def _make_copier(self, device: torch.device) -> None:
        self._copier = Copier(device, duplex=self.platform.duplex if self.platform is not None else True)
        self.pool = HostPool(pin=device.type == "cuda")

    def _finish(self, step: _Step) -> None:
        if step.done or step is not self._step:
            return
        self._advance(step, self._n_events - 1)
        for unit in list(step.ledger.units):
            self._drop_unit(step, unit)
        stats = step.stats
        stats.wall_time = time.perf_counter() - step.t0
        if self.device is not None and self.device.type == "cuda":
            stats.measured_peak = torch.cuda.max_memory_allocated(self.device) - step.mem_base + int(self.chain.act[0])
        step.done = True
        self._step = None
        self.last_step = stats
        self.steps += 1

    def _abort(self, step: _Step) -> None:
        """Drop everything a step holds: copies in flight are waited for, buffers go back."""
        if self._copier is not None:
            self._copier.synchronize()
        for entries in step.ledger.units.values():
            for e in entries:
                if e.host is not None:
                    self.pool.give(e.host)
                e.host = e.src = e.dev = None
                e.state = "dropped"
        step.ledger.units.clear()
        step.ledger.by_key.clear()
        step.done = True
        if self._step is step:
            self._step = None

    def reset(self) -> None:
        """Abandon the step in flight, if any (after an exception in its backward, say)."""
        if self._active:
            raise RuntimeError("OffloadActivations.reset: called inside the with block")
        if self._step is not None:
            self._abort(self._step)

    def _advance(self, step: _Step, upto: int) -> None:
        while step.cursor <= upto and step.cursor < self._n_events:
            self._fire(step, step.cursor)
            step.cursor += 1

    def _fire(self, step: _Step, event: int) -> None:
        k, end = divmod(event, 2)
        kind, stage = self.schedule.compute[k]
        # Frees before allocations at one instant (docs/model.md).
        for unit in self._release_at[event]:
            self._release(step, unit)
        if not end:
            for t in self._waits[k]:
                self._wait_transfer(step, t)
            if kind == "B":
                for unit in (stage, stage - 1):
                    if unit in self.offloaded:
                        self._await_prefetch(step, unit)
        for t in self._triggers[event]:
            if t.kind == "offload":
                self._offload(step, t.unit)
            else:
                self._prefetch(step, t.unit)
        if end and kind == "B":
            self._drop_unit(step, stage)

    # -- actions -----------------------------------------------------------------------------

    def _offload(self, step: _Step, unit: int) -> None:
        nbytes = 0
        for e in step.ledger.units.get(unit, ()):
            if e.state != "device":
                continue
            host, guard = self.pool.take(e.nbytes)
            e.d2h_event = self._copier.offload(e.src, host, guard)
            e.host = host
            e.state = "offloading"
            nbytes += e.nbytes
        stats = step.stats
        stats.offloaded_bytes += nbytes
        stats.unit_offloaded[unit] = stats.unit_offloaded.get(unit, 0) + nbytes

    def _release_entry(self, step: _Step, e: Entry) -> None:
        self._copier.wait(e.d2h_event)
        e.src = None
        e.state = "host"
        step.ledger.forget(e)
        step.stats.released_bytes += e.nbytes

    def _release(self, step: _Step, unit: int) -> None:
        for e in step.ledger.units.get(unit, ()):
            if e.state == "offloading":
                self._release_entry(step, e)

    def _prefetch_entry(self, step: _Step, e: Entry) -> None:
        if e.state == "offloading":
            self._release_entry(step, e)
        if e.state != "host":
            return
        e.dev, e.h2d_event = self._copier.prefetch(e.host, e.d2h_event)
        self.pool.give(e.host, e.h2d_event)
        e.host = None
        e.state = "prefetching"
        stats = step.stats
        stats.prefetched_bytes += e.nbytes
        stats.unit_prefetched[e.unit] = stats.unit_prefetched.get(e.unit, 0) + e.nbytes

    def _prefetch(self, step: _Step, unit: int) -> None:
        for e in step.ledger.units.get(unit, ()):
            self._prefetch_entry(step, e)

    def _await_prefetch(self, step: _Step, unit: int) -> None:
        for e in step.ledger.units.get(unit, ()):
            if e.state == "prefetching":
                self._copier.wait(e.h2d_event)
                e.state = "restored"

    def _wait_transfer(self, step: _Step, t: co.Transfer) -> None:
        for e in step.ledger.units.get(t.unit, ()):
            if t.kind == "offload" and e.d2h_event is not None:
                self._copier.wait(e.d2h_event)
            elif t.kind == "prefetch" and e.state == "prefetching":
                self._copier.wait(e.h2d_event)
                e.state = "restored"

    def _drop_unit(self, step: _Step, unit: int) -> None:
        """End of B_unit: the executor lets go of the unit (autograd may still hold handles)."""
        for e in step.ledger.units.pop(unit, ()):
            if e.state == "prefetching":
                # Its destination must not be reused by compute before the copy into it ends.
                self._copier.wait(e.h2d_event)
                e.state = "restored"
            if e.host is not None:  # offloaded but never prefetched: nothing will read it
                self._copier.wait(e.d2h_event)
                self.pool.give(e.host)
                e.host = None
                e.state = "dropped"
            e.src = None

    # -- hooks -------------------------------------------------------------------------------

    def _pre_hook(self, idx: int, module: nn.Module, args: tuple) -> None:
        step = self._step
        if step is None:
            return None
        if idx != step.expect or step.current is not None:
            raise RuntimeError(
                f"OffloadActivations: stage {idx} started while stage {step.current or step.expect} was expected; "
                "stages must run once each, in order"
            )
        inp = args[0] if args else None
        step.inputs[idx] = (inp, step.ledger.stage_start(idx, inp))
        step.current = idx
        self._advance(step, 2 * (idx - 1))
        return None

    def _post_hook(self, idx: int, module: nn.Module, args: tuple, out: Any) -> None:
        step = self._step
        if step is None:
            return None
        inp, version = step.inputs.pop(idx)
        ledger = step.ledger
        ledger.stage_end(idx, inp, version, out)
        bad = sorted(ledger.aliased & self.offloaded)
        if bad:
            raise RuntimeError(
                f"OffloadActivations: stage {idx} modifies its input in place or returns a view of it, so units "
                f"{bad} share storage; the schedule offloads unit(s) {bad}: keep them resident (offload(..., keep={bad}))"
            )
        step.current = None
        step.expect = idx + 1
        if out.requires_grad:
            out.register_hook(functools.partial(self._grad_hook, step, idx))
        self._advance(step, 2 * (idx - 1) + 1)
        if idx == len(self.stages):
            step.forward_done = True
            ledger.by_key.clear()  # no pack after the forward: the address map is done
        return None

    def _grad_hook(self, step: _Step, idx: int, grad: torch.Tensor) -> None:
        if step.done or step is not self._step:
            return None
        if not step.callback_queued:
            step.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(functools.partial(self._finish, step))
        # g_idx is complete: B_{idx+1} has ended and B_idx starts.
        self._advance(step, self._b_start[idx])
        return None

    def _pack(self, t: torch.Tensor) -> Any:
        step = self._step
        if step is None:
            return t
        entry = step.ledger.pack(t, step.current)
        if entry is None or entry.unit not in self.offloaded:
            return t
        return _Packed(entry, t)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        e = packed.entry
        if e.state in ("device", "offloading"):
            buf = e.src
        else:
            if e.state == "host":
                # No prefetch was triggered before this read (a schedule the simulator calls a
                # read violation): fetch it now rather than fail.
                step = self._step
                if step is None:
                    raise RuntimeError(f"OffloadActivations: unit {e.unit} is read after its step ended")
                self._prefetch_entry(step, e)
            if e.state == "prefetching":
                self._copier.wait(e.h2d_event)
                e.state = "restored"
            if e.state != "restored":
                raise RuntimeError(
                    f"OffloadActivations: a saved tensor of unit {e.unit} was dropped (its step was aborted or reset)"
                )
            buf = e.dev
            if self._step is not None:
                self._step.stats.restored_reads += 1
        return torch.empty(0, dtype=packed.dtype, device=buf.device).set_(
            buf.untyped_storage(), packed.offset, packed.size, packed.stride
        )

    # -- reports -----------------------------------------------------------------------------

    def unit_states(self) -> dict[int, list[str]]:
        """The state of each entry of each unit of the step in flight (empty between steps)."""
        step = self._step
        if step is None:
            return {}
        return {u: [e.state for e in entries] for u, entries in sorted(step.ledger.units.items())}

    def live_entries(self) -> int:
        """Entries the step in flight holds (0 between steps)."""
        step = self._step
        return 0 if step is None else sum(len(v) for v in step.ledger.units.values())

    @property
    def hooks_installed(self) -> int:
        """Module hooks and saved-tensor hooks currently installed by this executor."""
        return len(self._handles) + (self._saved_hooks is not None)


class Offloader(nn.Module):
    """A chain module that trains with a given offloading schedule.

    Parameters
    ----------
    model
        An ``nn.Sequential`` or a list of modules (the chain's stages); kept as ``.module``,
        so its parameters and state dict are this module's (under the ``module.`` prefix).
    chain, schedule, platform
        As for :class:`OffloadActivations`.
    result
        The solver's :class:`chainoffload.Result`, if any (shown by :meth:`table`).
    keep
        Units the user asked to keep resident (shown by :meth:`table`).
    aliased
        Units that must stay resident because stages share storage (shown by :meth:`table`).

    Notes
    -----
    ``forward`` runs the stages in order inside :class:`OffloadActivations`; the backward of
    its output carries out the rest of the schedule. Under ``torch.no_grad`` it is the plain
    model. After each step, :attr:`last_step` holds the :class:`StepStats`. One forward per
    backward: a second forward before the backward of the first abandons the first (its
    backward then fails with a clear error). On CUDA each step resets the allocator's peak
    statistics, to measure its own peak.
    """

    def __init__(
        self,
        model: Any,
        chain: co.Chain,
        schedule: co.Schedule,
        *,
        platform: co.Platform | None = None,
        result: co.Result | None = None,
        keep: Iterable[int] = (),
        aliased: Iterable[int] = (),
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        stages = as_stages(model)
        self.module = model if isinstance(model, nn.Module) else nn.ModuleList(stages)
        self.activations = OffloadActivations(stages, chain, schedule, platform=platform, device=device)
        self.result = result
        self.keep = frozenset(int(u) for u in keep)
        self.aliased = frozenset(int(u) for u in aliased)
        clash = sorted((self.keep | self.aliased) & self.activations.offloaded)
        if clash:
            raise ValueError(f"schedule: offloads unit(s) {clash}, which keep/aliased say must stay resident")

    def forward(self, x: Any) -> Any:
        """Run the chain; with autograd on, under the schedule."""
        with self.activations:
            for stage in self.activations.stages:
                x = stage(x)
        return x

    @property
    def chain(self) -> co.Chain:
        """The chain the schedule was made for."""
        return self.activations.chain

    @property
    def schedule(self) -> co.Schedule:
        """The schedule carried out."""
        return self.activations.schedule

    @property
    def last_step(self) -> StepStats | None:
        """Figures of the last completed step."""
        return self.activations.last_step

    @property
    def offloaded_bytes(self) -> int:
        """Bytes really copied to the host in the last completed step (0 before any)."""
        s = self.activations.last_step
        return 0 if s is None else s.offloaded_bytes

    @property
    def predicted_peak(self) -> int | None:
        """The simulator's peak memory of the schedule (needs a platform)."""
        tl = self.activations.timeline
        return None if tl is None else tl.peak_memory

    @property
    def measured_peak(self) -> int | None:
        """The allocator's peak in the last step (CUDA only; see :class:`StepStats`)."""
        s = self.activations.last_step
        return None if s is None else s.measured_peak

    def reset(self) -> None:
        """Abandon the step in flight (see :meth:`OffloadActivations.reset`)."""
        self.activations.reset()

    def decisions(self) -> list[dict[str, Any]]:
        """One row per stage: sizes, the decision, its triggers and the bytes last moved."""
        act = self.activations
        sched, chain = act.schedule, act.chain
        by_unit: dict[int, dict[str, co.Transfer]] = {}
        for t in sched.transfers:
            by_unit.setdefault(t.unit, {})[t.kind] = t
        last = act.last_step
        rows = []
        for i, stage in enumerate(act.stages, start=1):
            trs = by_unit.get(i, {})
            if i in act.offloaded:
                decision = "offload"
            elif i in self.aliased:
                decision = "keep (aliased)"
            elif i in self.keep:
                decision = "keep (user)"
            else:
                decision = "keep"

            def trig(t: co.Transfer | None) -> str:
                return "" if t is None else f"{t.at} of {sched.op_name(t.op)}"

            rows.append(
                {
                    "stage": i,
                    "module": type(stage).__name__,
                    "act": int(chain.act[i]),
                    "saved": int(chain.saved[i - 1]),
                    "fwd": float(chain.fwd[i - 1]),
                    "bwd": float(chain.bwd[i - 1]),
                    "decision": decision,
                    "offload_at": trig(trs.get("offload")),
                    "prefetch_at": trig(trs.get("prefetch")),
                    "moved": None if last is None else last.unit_offloaded.get(i, 0),
                }
            )
        return rows

    def table(self) -> str:
        """:meth:`decisions` as a Markdown table, with the totals and peaks below it."""
        head = "| stage | module | act | saved | decision | offload at | prefetch at | moved last step |"
        lines = [head, "|---:|---|---:|---:|---|---|---|---:|"]
        for r in self.decisions():
            moved = "" if r["moved"] is None else format_bytes(r["moved"])
            lines.append(
                f"| {r['stage']} | {r['module']} | {format_bytes(r['act'])} | {format_bytes(r['saved'])} | "
                f"{r['decision']} | {r['offload_at']} | {r['prefetch_at']} | {moved} |"
            )
        predicted = self.predicted_peak
        tl = self.activations.timeline
        tail = [f"offloaded per step: {format_bytes(self.schedule.offloaded_bytes(self.chain))} predicted"]
        if self.last_step is not None:
            tail[0] += f", {format_bytes(self.offloaded_bytes)} measured"
        if predicted is not None:
            peak = f"peak: {format_bytes(predicted)} predicted"
            if self.measured_peak is not None:
                peak += f", {format_bytes(self.measured_peak)} measured"
            tail.append(peak)
            tail.append(f"simulated makespan: {tl.makespan:.6g} s (compute alone {self.chain.compute_time:.6g} s)")
        return "\n".join(lines + [""] + tail)


def choose_schedule(
    chain: co.Chain,
    platform: co.Platform,
    method: str | None = None,
    keep: Iterable[int] = (),
    **options: Any,
) -> co.Result:
    """Solve with ``method`` (default: :func:`chainoffload.solve`'s) keeping ``keep`` resident.

    When the method's schedule offloads a unit in ``keep``, the largest-first rule is run over
    the other units instead (largest saved first, each set planned by the shared transfer
    planner and judged by the simulator), and the better feasible of the two is returned.

    Raises
    ------
    ValueError
        If no feasible schedule is found; the message gives the least memory known to work.
    """
    keep = frozenset(int(u) for u in keep)
    for u in keep:
        if not 1 <= u <= chain.length:
            raise ValueError(f"keep: {u} is not a stage in 1..{chain.length}")
    result = co.solve(chain, platform, method, **options)
    if result.feasible and not (set(result.schedule.offloaded_units) & keep):
        return result
    if keep:
        t0 = time.perf_counter()
        units = sorted((u for u in range(1, chain.length) if u not in keep), key=lambda u: (-int(chain.saved[u - 1]), u))
        for k in range(len(units) + 1):
            chosen = sorted(units[:k])
            schedule = plan_transfers(chain, platform, chosen) if chosen else co.Schedule.keep_all(chain.length)
            tl = co.simulate(chain, platform, schedule)
            if tl.feasible:
                return co.Result(
                    "largest-first (keep)",
                    co.Status.FEASIBLE,
                    schedule,
                    makespan=tl.makespan,
                    lower_bound=chain.compute_time,
                    peak_memory=tl.peak_memory,
                    offloaded_bytes=tl.offloaded_bytes,
                    runtime=time.perf_counter() - t0,
                    timeline=tl,
                    info={"units": chosen, "keep": sorted(keep)},
                )
    hint = f"; the least memory known to work is {format_bytes(result.min_memory)}" if result.min_memory else ""
    if keep:
        how = f"method {result.method}: {result.status}; largest-first over the units not kept: none fits"
        kept = f" with units {sorted(keep)} kept resident"
    else:
        how, kept = f"method {result.method}: {result.status}", ""
    raise ValueError(f"memory: no schedule fits in {format_bytes(platform.memory)}{kept} ({how}){hint}")


def offload(
    model: Any,
    sample: torch.Tensor,
    memory: int | str | None = None,
    *,
    method: str | None = None,
    keep: Sequence[int] = (),
    device: torch.device | str | None = None,
    platform: co.Platform | None = None,
    repeats: int = 3,
    **options: Any,
) -> Offloader:
    """Profile ``model``, solve for ``memory`` and return it wrapped to train under the schedule.

    Parameters
    ----------
    model
        An ``nn.Sequential`` or a list of modules (the chain's stages), on its device.
    sample
        A representative input batch (same shape and dtype as in training).
    memory
        GPU memory for activations: bytes or a string such as ``"6GiB"``. ``None``: the
        platform's memory if one is given, else the profiled keep-all peak (nothing offloaded).
    method
        A :func:`chainoffload.methods` name; default :data:`chainoffload.solvers.DEFAULT_METHOD`.
    keep
        Stages whose units stay resident whatever the solver would do.
    device
        Where to profile; default the model's device.
    platform
        Use this link instead of measuring one (its memory is replaced by ``memory`` if given).
    repeats
        Timing repeats per stage (median taken).
    **options
        Passed to the solver.

    Returns
    -------
    Offloader
        The wrapped model; ``.table()`` shows the decisions.

    Raises
    ------
    ValueError
        Bad ``memory`` or ``keep``, or no schedule fits.
    """
    from .profiler import profile_full

    stages = as_stages(model)
    prof = profile_full(stages, sample, device=device, repeats=repeats, measure_platform=platform is None)
    plat = platform if platform is not None else prof.platform
    if memory is not None:
        mem = parse_bytes(memory, field="memory") if isinstance(memory, str) else memory
        if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not math.isfinite(mem) or mem < 0:
            raise ValueError(f"memory: {memory!r} must be a number of bytes >= 0 or a size such as '6GiB'")
        plat = plat.with_memory(int(mem))
    aliased = sorted(prof.sizes.aliased)
    result = choose_schedule(prof.chain, plat, method, set(keep) | set(aliased), **options)
    return Offloader(
        model,
        prof.chain,
        result.schedule,
        platform=plat,
        result=result,
        keep=keep,
        aliased=aliased,
        device=prof.device,
    )
