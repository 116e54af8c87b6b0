"""The user API: :func:`offload` instruments a model in place and returns an :class:`Offloader`.

One call::

    handle = ct.offload(model, batch, memory="6GiB")     # or memory=0.5 of the keep-all peak
    loss = model(**batch).loss; loss.backward()           # the training loop is unchanged

finds the model's blocks, profiles a step into a :class:`chainoffload.Chain`, solves with
:func:`chainoffload.solve` (keeping resident the units that cannot move) and hooks the model so
that every training step carries the schedule out. A call with other input shapes gets its own
plan (NOTE [ plans per shape ]); ``handle.remove()`` leaves the model exactly as it was.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import chainoffload as co
from chainoffload.bounds import offload_memory_floor
from chainoffload.solvers import spec
from chainoffload.units import format_bytes, parse_bytes

from ._copy import Copier
from ._discovery import Blocks, find_blocks_warm, resolve_blocks
from ._instrument import COMPILE_REFUSAL, CONCURRENT_REFUSAL, Instrument, check_not_instrumented
from ._link import copies_overlap, link_of
from ._pool import HostPool
from ._recompute import RematPlan
from ._recorder import measuring_recorder, profiling_steps, sizes_of_pass, tail_stages_of
from ._shapes import dominates, numbers_apart, same_layout, strip_numbers, volume
from ._stages import EntryState, canonical_device
from ._tree import call_key, describe_key, held_tensors
from .executor import ScheduleRun, StepStats
from .plans import (
    Budget,
    Plan,
    _Planner,
    _takes,
    charge_recomputation,
    coverage,
    exact_bytes,
    recompute_chain,
    resident_units,
    stage_floor,
    step_peak,
)
from .profiler import _device_of, _to_device, as_call

__all__ = ["Offloader", "offload", "budget_curve"]

#: What :func:`budget_curve` sweeps when no method is named: the policies users know and the
#: default search (all pure offloading: the executor does not recompute).
BUDGET_METHODS = ("offload-all", "first-k", "largest-first", "best")

#: What a call with new input shapes does: plan for them, warn and keep the plan, or refuse.
ON_NEW_SHAPE = ("replan", "warn", "error")


class Offloader:
    """A model trained under an offloading schedule, instrumented in place.

    Made by :func:`offload` (profile, solve, one plan per input shape), or by hand from a
    chain and schedule of your own (one plan for every call). The model keeps its class, its
    ``forward``, its submodules and its ``state_dict`` keys; only hooks are added, and
    :meth:`remove` takes them away. Train as usual; under ``no_grad`` / ``inference_mode``
    nothing is offloaded.

    Parameters
    ----------
    model
        The model (an ``nn.Module`` whose forward runs the blocks in order).
    chain, schedule
        The chain of the blocks and a fixed-order schedule for it.
    platform
        The platform the schedule was made for (release points and the predicted peak).
    blocks
        The chain's stages: ``None`` for the children of an ``nn.Sequential`` model, a module
        path, a list of modules, or :attr:`chainoffload_torch.Profile.blocks`.
    device
        The model's device; by default that of its first parameter.
    keep
        Units the schedule must not offload (checked, and shown by :meth:`table`).

    Notes
    -----
    One forward per backward: a second forward before the backward of the first abandons the
    first (its backward then fails with a clear error). Gradient accumulation (several
    forward/backward pairs before the optimizer step) is that, in order. On CUDA each step
    resets the allocator's peak statistics, to measure its own peak.
    """

    def __init__(
        self,
        model: nn.Module,
        chain: co.Chain,
        schedule: co.Schedule,
        *,
        platform: co.Platform | None = None,
        blocks: Any = None,
        device: torch.device | str | None = None,
        keep: Iterable[int] = (),
    ) -> None:
        _check_model(model)
        if not isinstance(chain, co.Chain):
            raise TypeError(f"chain: expected a chainoffload.Chain, got {type(chain).__name__}")
        if not isinstance(schedule, co.Schedule):
            raise TypeError(f"schedule: expected a chainoffload.Schedule, got {type(schedule).__name__}")
        if isinstance(blocks, Blocks):
            blks = blocks
        elif blocks is None and isinstance(model, nn.Sequential):
            blks = Blocks.of(model, [str(i) for i in range(len(model))])
        elif blocks is None:
            raise ValueError("blocks: pass the chain's stages (a module path or a list of modules) for a model that is not an nn.Sequential")
        else:
            mods = resolve_blocks(model, blocks)
            names = {id(m): n for n, m in model.named_modules()}
            blks = Blocks.of(mods, [names.get(id(m), str(k)) for k, m in enumerate(mods)])
        if chain.length != blks.stages:
            raise ValueError(f"chain: has {chain.length} stages but the model has {blks.stages}")
        kept = frozenset(co.solvers.check_keep(chain, keep))
        clash = sorted(kept & set(schedule.offloaded_units))
        if clash:
            raise ValueError(f"schedule: offloads unit(s) {clash}, which keep says must stay resident")
        param = next(model.parameters(), None)
        where = device if device is not None else (param.device if param is not None else None)
        # Copies overlap compute or not by the device's copy engine, whatever link the platform
        # states (NOTE [ copies on CPU ] in _link.py).
        plan = Plan(None, chain, platform, schedule, keep=kept, overlap=where is None or copies_overlap(where))
        self._setup(model, blks, device, None, "error", 1, None)
        try:
            self._use(plan)
        except BaseException:
            self.remove()
            raise
        self._instrument.install()

    # -- construction ----------------------------------------------------------------------

    def _setup(
        self,
        model: nn.Module,
        blocks: Blocks,
        device: Any,
        planner: _Planner | None,
        on_new_shape: str,
        cache_size: int,
        host_memory: int | None,
    ) -> None:
        check_not_instrumented(model)
        self.model = model
        self.blocks = blocks
        if device is None:
            param = next(model.parameters(), None)
            device = param.device if param is not None else None
        self.device = canonical_device(device)
        self._planner = planner
        self.on_new_shape = on_new_shape
        self.cache_size = cache_size
        self._plans: collections.OrderedDict[Any, tuple[Plan, ScheduleRun]] = collections.OrderedDict()
        self._plan: Plan | None = None
        self._run: ScheduleRun | None = None
        self._copier: Copier | None = None
        self.pool = HostPool(pin=self.device is not None and self.device.type == "cuda", limit=host_memory)
        self._warned: set[Any] = set()
        self.replans = 0  #: plans profiled and solved after the first (new shapes)
        self.reuses = 0  #: plans that run a larger shape's schedule (NOTE [ one plan for many shapes ])
        #: Plans solved for a new shape's measured sizes on a close shape's profiled times, scaled
        #: (NOTE [ one plan for many shapes ]).
        self.rescaled = 0
        #: Every plan made, by key (less the numbers known not to change sizes), oldest first.
        self._known: dict[Any, Plan] = {}
        #: Paths of number arguments found not to change what a step saves.
        self._neutral: set[tuple] = set()
        #: The training step in flight that measures its own new shapes (NOTE [ one plan for
        #: many shapes ]), and the keys whose step did not measure them (it skipped blocks).
        self._measuring: _Measuring | None = None
        self._not_measured: set[Any] = set()
        #: Sizes a training step measured for a key no plan could be made from without a
        #: profile: the next call of that key profiles without measuring them again.
        self._measured: dict[Any, Any] = {}
        #: Training steps of new shapes that measured their own sizes, every tensor they saved
        #: kept on the device (NOTE [ one plan for many shapes ]).
        self.measured = 0
        #: Per key, plans that hold only for calls that skip certain blocks (NOTE [ blocks a
        #: profile cannot run ] in _recorder.py), the most recent DRAW_PLANS.
        self._draw_plans: dict[Any, list[Plan]] = {}
        self._removed = False
        #: The step between its forward's start and its backward's end (NOTE [ one step at a
        #: time ]), the thread that started it, and whether its backward has begun.
        self._in_flight: Any = None
        self._flight_thread: int | None = None
        self._in_backward = False
        #: remove() was called while a step was in flight: done at that step's end.
        self._remove_pending = False
        #: The step in flight's forward returned, and weak references to the tensors it returned
        #: (NOTE [ several forwards per backward ]).
        self._forward_done = False
        self._outputs: list[weakref.ref] = []
        self._warned_extra = False
        self._instrument = Instrument(model, blocks, self)

    def _key(self, key: Any) -> Any:
        """``key`` less the numbers known not to change sizes (NOTE [ one plan for many shapes ])."""
        return strip_numbers(key, self._neutral) if key is not None else None

    def _remember(self, plan: Plan) -> None:
        self._known[self._key(plan.key)] = plan
        while len(self._known) > KNOWN_PLANS:
            del self._known[next(iter(self._known))]

    def _rekey(self) -> None:
        """After a number argument was found not to change sizes: key the plans without it."""
        self._plans = collections.OrderedDict((self._key(p.key), (p, r)) for p, r in self._plans.values())
        self._known = {self._key(p.key): p for p in self._known.values()}
        # Keyed with the numbers in: such a shape is measured again when it comes back.
        self._measured.clear()
        self._not_measured.clear()

    def _cache(self, plan: Plan) -> ScheduleRun:
        """``plan``'s executor, made and cached (most recently used) if new."""
        pkey = self._key(plan.key)
        hit = self._plans.get(pkey)
        if hit is not None and hit[0] is plan:
            self._plans.move_to_end(pkey)
            return hit[1]
        if self._copier is None and self.device is not None:
            self._copier = Copier(self.device, duplex=plan.platform.duplex if plan.platform is not None else True)
        run = ScheduleRun(
            plan.chain,
            plan.schedule,
            platform=plan.platform,
            device=self.device,
            roots=(self.model,),
            copier=self._copier,
            pool=self.pool,
            pinned=plan.sizes.pinned if plan.sizes is not None else None,
            resident_bytes=plan.resident_bytes,
            names=self.blocks.stage_names,
            blocks=self.blocks,
            model=self.model,
            # A plan of offload()'s own came from a profile: what it did not see is warned of,
            # not refused mid-training; a schedule given by hand is the user's word, refused.
            strict=self._planner is None,
        )
        self._plans[pkey] = (plan, run)
        while len(self._plans) > self.cache_size:
            # Least recently used first; neither the plan in force nor the new one.
            victim = next((k for k, (p, _) in self._plans.items() if p is not self._plan and k != pkey), None)
            if victim is None:
                break
            del self._plans[victim]
        return run

    def _use(self, plan: Plan) -> ScheduleRun:
        """Put ``plan`` in force (cached, with its executor)."""
        run = self._cache(plan)
        self._remember(plan)
        if self._run is not None and self._run is not run:
            self._run.reset()  # a step of the previous plan still in flight is abandoned
        self._plan, self._run = plan, run
        self.pool.retain = plan.host_bytes
        self.pool.trim()
        return run

    # -- listener --------------------------------------------------------------------------

    def wants(self) -> bool:
        """Offload only when autograd records (not under ``no_grad`` / ``inference_mode``)."""
        return not self._removed and torch.is_grad_enabled()

    def forward_start(self, args: tuple, kwargs: dict) -> Any:
        """Choose the plan for this call's shapes (NOTE [ plans per shape ]) and start its step."""
        if self._in_backward and self._flight_thread != threading.get_ident():
            raise RuntimeError(CONCURRENT_REFUSAL)
        if self._extra_forward():
            return _ExtraForward()
        self._measuring = None
        run = self._select(args, kwargs)
        if isinstance(run, _Measuring):
            self._measuring = run  # NOTE [ one plan for many shapes ]: its events go to its recorder
        step = run.forward_start(args, kwargs)
        self._in_flight, self._flight_thread, self._in_backward = step, threading.get_ident(), False
        self._forward_done, self._outputs = False, []
        return step

    def _extra_forward(self) -> bool:
        """Whether this forward is one more before the backward of the step in flight, whose
        outputs the caller still holds (NOTE [ several forwards per backward ])."""
        if self._in_flight is None or not self._forward_done or self._in_backward:
            return False
        if self._flight_thread != threading.get_ident() or not any(r() is not None for r in self._outputs):
            return False
        if not self._warned_extra:
            self._warned_extra = True
            warnings.warn(
                "chainoffload_torch: the model ran another forward before the backward of the one before (a Siamese "
                "or contrastive loss, several forwards per backward): the first forward runs under the plan and what "
                "the others save stays resident, beyond the plan's memory bound; the gradients are exact",
                RuntimeWarning,
                stacklevel=5,
            )
        return True

    def _select(self, args: tuple, kwargs: dict) -> ScheduleRun | _Measuring:
        if self._planner is None:
            return self._run
        raw = call_key(self.model, args, kwargs)
        key = self._key(raw)
        if key == self._key(self._plan.key) and not _draw_only(self._plan):
            return self._run
        hit = self._plans.get(key)
        known = hit[0] if hit is not None else self._known.get(key)
        if known is not None:
            if _draw_only(known):
                return self._use(self._for_draws(args, kwargs, raw, known))
            return self._use(known)
        if self.on_new_shape == "error":
            raise ValueError(
                f"on_new_shape: the plan was made for {describe_key(self._plan.key)}, this call has "
                f"{describe_key(key)} (on_new_shape='error'; 'replan' makes a plan for it)"
            )
        if self.on_new_shape == "warn":
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(
                    f"chainoffload_torch: the plan was made for {describe_key(self._plan.key)}; this call has "
                    f"{describe_key(key)}: running the plan as it is (other bytes moved, other peak)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return self._run
        if _sharded(self.model):
            raise RuntimeError(
                f"on_new_shape: the model is sharded by FSDP, where no plan can be made inside a step; this call has "
                f"{describe_key(key)}: plan for it before fully_shard with handle.prepare(sample)"
            )
        if self._run is not None:
            self._run.reset()
        measured = self._measured.pop(key, None)
        if key in self._not_measured:
            self._not_measured.discard(key)  # measured apart now, as before this rule
        elif measured is None:
            found = self._candidates(key)
            if any(found[:2]) or found[2] is not None:
                # NOTE [ one plan for many shapes ]: this step measures its own sizes, kept
                # resident whole; its plan is made when its forward returns.
                self.measured += 1
                return _Measuring(self, raw, found)
        return self._use(self._plan_for(args, kwargs, raw, sizes=measured))

    def _for_draws(self, args: tuple, kwargs: dict, raw: Any, plan: Plan) -> Plan:
        """A plan for this call when its shapes' plan holds only for calls that skip the blocks
        its profile could not run (NOTE [ blocks a profile cannot run ] in _recorder.py): this
        call's sizes are measured under its own draws (a block it runs that cannot run at these
        shapes raises here, as it does in plain PyTorch); a plan of these shapes made for the
        same sizes is taken, else one is made from the sizes that measure found (NOTE [ one
        measure per new draw ])."""
        key = self._key(raw)
        sizes = self._planner.measure(self._instrument, args, kwargs, like=plan, redraw=False)
        variants = self._draw_plans.setdefault(key, [])
        for p in [plan, *variants]:
            if _same_sizes(p.sizes, sizes):
                return p
        if self._run is not None:
            self._run.reset()
        found = self._plan_for(args, kwargs, raw, sizes=sizes)
        if _draw_only(found):
            # ``plan`` stops being the key's plan: kept among the variants, a call of its draws
            # finds it again instead of planning anew.
            for p in (plan, found):
                if not any(p is v for v in variants):
                    variants.append(p)
            del variants[:-DRAW_PLANS]
        return found

    def _candidates(self, key: Any) -> tuple[list, list, Plan | None]:
        """The known plans a call of ``key`` may be served from once its sizes are known: those
        it differs from in numbers alone (with the paths), the larger shapes' (smallest first),
        and the profiled shape whose times it may be solved on (NOTE [ one plan for many shapes ])."""
        plans = list(self._known.values())
        same = [(p, apart) for p in plans if (apart := numbers_apart(self._key(p.key), key))]
        larger = sorted(
            (p for p in plans if p.reused_from is None and dominates(self._key(p.key), key)), key=lambda p: volume(p.key)
        )
        return same, larger, _times_source(plans, key, self._key)

    def _from_sizes(self, raw: Any, sizes: Any, found: tuple[list, list, Plan | None]) -> Plan | None:
        """A plan for a call of ``raw`` from its measured ``sizes`` without a profile (a known
        plan, a larger shape's schedule, a solve on a close shape's times), or ``None``."""
        same, larger, timed = found
        for p, apart in same:
            if _same_sizes(p.sizes, sizes):
                self._neutral |= apart
                self._rekey()
                return p
        for p in larger:
            plan = self._planner.reuse(p, sizes, raw)
            if plan is not None:
                self.reuses += 1
                return plan
        if timed is not None:
            plan = self._planner.rescale(self._instrument, timed, sizes, raw)
            if plan is not None:
                self.rescaled += 1
                return plan
        return None

    def _plan_for(self, args: tuple, kwargs: dict, raw: Any, count: bool = True, sizes: Any = None) -> Plan:
        """A plan for a call of new shapes: a known plan when only numbers that change no size
        differ, a larger shape's schedule when it fits these shapes' budget, a solve on these
        shapes' measured sizes and a close shape's profiled times, else a new profile and
        solve (NOTE [ one plan for many shapes ]). ``sizes``: measured already, by a training
        step of these shapes or by a measuring forward under the call's own draws (NOTE [ one
        measure per new draw ])."""
        found = self._candidates(self._key(raw))
        same, larger, timed = found
        if same or larger or timed is not None:
            like = same[0][0] if same else larger[0] if larger else timed
            if sizes is None:
                sizes = self._planner.measure(self._instrument, args, kwargs, like=like)
            else:
                sizes = self._planner.with_written(sizes, like)  # what its profile found written, as measure adds
            plan = self._from_sizes(raw, sizes, found)
            if plan is not None:
                return plan
        plan = self._planner.plan(self._instrument, args, kwargs, raw)
        self.replans += int(count)  # prepare()'s plans are not replans inside training
        return plan

    def _measured_step(self, m: _Measuring, sizes: Any) -> None:
        """The forward of a step that measured its new shapes returned (NOTE [ one plan for
        many shapes ]): their plan, made now from the sizes it found, is the plan in force;
        without one (a profile is needed), the next call of these shapes profiles."""
        key = self._key(m.raw)
        if sizes is None:
            self._not_measured.add(key)  # it skipped blocks: the next call measures apart
            return
        same, larger, timed = m.found
        like = same[0][0] if same else larger[0] if larger else timed
        sizes = self._planner.with_written(sizes, like)
        plan = self._from_sizes(m.raw, sizes, m.found)
        if plan is None:
            self._measured[key] = sizes
            while len(self._measured) > KNOWN_PLANS:
                del self._measured[next(iter(self._measured))]
            return
        self._use(plan)

    def prepare(self, sample: Any) -> Plan:
        """Make (or find) the plan for ``sample``'s shapes now, outside a training step.

        Under FSDP, plans must be made before ``fully_shard`` (a profiling step of a sharded
        model would leave FSDP's deferred gradient reduction behind); under DDP it saves the
        first step of each shape the profiling time. The plan in force does not change.

        Parameters
        ----------
        sample
            As for :func:`offload`.

        Returns
        -------
        Plan
        """
        if self._planner is None:
            raise RuntimeError("prepare: this handle has a plan given by hand; it applies to every call")
        if self._removed:
            raise RuntimeError("prepare: the handle was removed")
        args, kwargs = as_call(sample)
        args, kwargs = _to_device(args, self.device), _to_device(kwargs, self.device)
        raw = call_key(self.model, args, kwargs)
        key = self._key(raw)
        hit = self._plans.get(key)
        if hit is not None:
            return hit[0]
        if key in self._known:
            return self._known[key]
        if _sharded(self.model):
            raise RuntimeError("prepare: the model is already sharded by FSDP; prepare plans before fully_shard")
        plan = self._plan_for(args, kwargs, raw, count=False)
        self._cache(plan)
        self._remember(plan)
        return plan

    def _measures(self, step: Any) -> _Measuring | None:
        m = self._measuring
        return m if m is not None and step is m.step else None

    def stage_start(self, step: Any, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None:
        m = self._measures(step)
        if m is not None:
            m.rec.stage_start(step, idx, hidden, args, kwargs)
            return
        self._run.stage_start(step, idx, hidden, args, kwargs)

    def stage_end(self, step: Any, idx: int, hidden_in: Any, hidden_out: Any) -> None:
        m = self._measures(step)
        if m is not None:
            m.rec.stage_end(step, idx, hidden_in, hidden_out)
            return
        self._run.stage_end(step, idx, hidden_in, hidden_out)

    def stage_skipped(self, step: Any, idx: int, hidden: Any) -> None:
        m = self._measures(step)
        if m is not None:
            m.skipped = True  # its sizes are not the shapes' (a block was not called)
            return
        self._run.stage_skipped(step, idx, hidden)

    def forward_end(self, step: Any, outputs: Any) -> None:
        m = self._measures(step)
        if m is not None:
            m.rec.forward_end(step, outputs)
            self._measured_step(m, None if m.skipped else sizes_of_pass(m.rec, step, m.n, tail_stages_of(self._instrument.blocks)))
        else:
            self._run.forward_end(step, outputs)
        if step is self._in_flight:
            self._forward_done = True
            self._outputs = [weakref.ref(t) for t in held_tensors(outputs) if t.requires_grad]

    def forward_failed(self, step: Any) -> None:
        m = self._measures(step)
        if m is not None:
            m.rec.forward_failed(step)
            self._measuring = None
        else:
            self._run.forward_failed(step)
        self._step_over(step)

    def backward_mark(self, step: Any, idx: int) -> None:
        if step is self._in_flight:
            self._in_backward = True
        if self._measures(step) is None:
            self._run.backward_mark(step, idx)

    def backward_end(self, step: Any) -> None:
        if self._measures(step) is not None:
            self._measuring = None
        else:
            self._run.backward_end(step)
        self._step_over(step)

    def _step_over(self, step: Any) -> None:
        if step is None or step is not self._in_flight:
            return
        self._in_flight, self._flight_thread, self._in_backward = None, None, False
        self._forward_done, self._outputs = False, []
        if self._remove_pending:
            self._remove_pending = False
            self._release()

    def pack(self, step: Any, t: torch.Tensor) -> Any:
        m = self._measures(step)
        if m is not None:
            return m.rec.pack(step, t)
        return self._run.pack(step, t)

    def unpack(self, packed: Any) -> torch.Tensor:
        return self._run.unpack(packed)

    # -- what the user reads -----------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The plan in force (that of the last call's shapes)."""
        return self._plan

    @property
    def plans(self) -> tuple[Plan, ...]:
        """The cached plans, least recently used first."""
        return tuple(p for p, _ in self._plans.values())

    @property
    def chain(self) -> co.Chain:
        """The chain of the plan in force."""
        return self._plan.chain

    @property
    def schedule(self) -> co.Schedule:
        """The schedule in force."""
        return self._plan.schedule

    @property
    def platform(self) -> co.Platform | None:
        """The platform of the plan in force (its memory is the limit solved for)."""
        return self._plan.platform

    @property
    def result(self) -> co.Result | None:
        """The solver's result for the plan in force."""
        return self._plan.result

    @property
    def last_step(self) -> StepStats | None:
        """Figures of the last completed step of the plan in force."""
        return self._run.last_step

    @property
    def offloaded_bytes(self) -> int:
        """Bytes really copied to the host in the last completed step (0 before any)."""
        s = self._run.last_step
        return 0 if s is None else s.offloaded_bytes

    @property
    def predicted_peak(self) -> int | None:
        """The simulator's peak memory of the plan in force, plus the bytes resident outside
        the chain (needs a platform; NOTE [ resident outside the chain ])."""
        tl = self._run.timeline
        return None if tl is None else tl.peak_memory + self._plan.resident_bytes

    @property
    def measured_peak(self) -> int | None:
        """The allocator's peak in the last step (CUDA only; see :class:`StepStats`)."""
        s = self._run.last_step
        return None if s is None else s.measured_peak

    @property
    def hooks_installed(self) -> int:
        """Module hooks and saved-tensor hooks this handle has installed now."""
        return self._instrument.hooks_installed

    def unit_states(self) -> dict[int, list[EntryState]]:
        """The state of each storage of each unit in the step in flight (empty between steps)."""
        return self._run.unit_states()

    def live_entries(self) -> int:
        """Storages the step in flight holds (0 between steps)."""
        return self._run.live_entries()

    def reset(self) -> None:
        """Abandon the step in flight, if any (after an exception in its backward, say)."""
        self._measuring = None
        self._run.reset()
        self._step_over(self._in_flight)

    def remove(self) -> None:
        """Take every hook away and free the host buffers.

        The model is then exactly as it was before :func:`offload`: its next forward is plain.
        Called between a step's forward and the end of its backward (``out = model(x);
        handle.remove(); out.sum().backward()``), that backward still runs under the plan, and
        the host buffers are freed at its end (or when the handle is let go of, if it never runs).
        """
        if self._removed:
            return
        self._instrument.remove()
        self._removed = True
        if self._in_flight is not None:
            self._remove_pending = True  # NOTE [ one step at a time ]
            return
        self._release()

    def _release(self) -> None:
        for _, run in self._plans.values():
            run.reset()
        self.pool.clear()

    def decisions(self) -> list[dict[str, Any]]:
        """One row per block of the plan in force: sizes, the decision, its triggers, the bytes last moved."""
        plan, run = self._plan, self._run
        sched, chain = plan.schedule, plan.chain
        sizes = plan.sizes
        by_unit: dict[int, dict[str, co.Transfer]] = {}
        for t in sched.transfers:
            by_unit.setdefault(t.unit, {})[t.kind] = t
        last = run.last_step
        rows = []
        recomputes, checkpoints, lone = _remat_decisions(sched, chain.length)
        for i, name in enumerate(self.blocks.stage_names, start=1):
            trs = by_unit.get(i, {})
            if i in run.offloaded:
                alone = i in run.act_alone or (i in lone and "offload" in trs and run._maker(i, trs["offload"].event) in lone[i])
                decision = "offload a_i alone" if alone else "offload"
                if sizes is not None and sizes.pinned.get(i):
                    decision += ", held storages stay"
            elif i in plan.keep:
                decision = "keep (user)"
            elif sizes is not None and i in sizes.aliased:
                decision = "keep (aliased)"
            elif sizes is not None and i in sizes.held:
                decision = "keep (held)"
            elif sizes is not None and i in sizes.unmovable:
                decision = f"keep (saves a {sizes.unmovable[i]})"
            else:
                decision = "keep"
            if recomputes.get(i):
                n = recomputes[i]
                decision = f"recompute ({n} time{'s' if n > 1 else ''})" + ("" if decision == "keep" else f"; {decision}")
            if i in checkpoints:
                decision += "; a_i kept as a checkpoint (recomputations start from it)"
            if i in plan.not_recomputable and i < chain.length:
                decision += f" (never recomputed: {plan.not_recomputable[i]})"

            def trig(t: co.Transfer | None) -> str:
                return "" if t is None else f"{t.at} of {sched.op_name(t.op)}"

            rows.append(
                {
                    "stage": i,
                    "module": name,
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
        """:meth:`decisions` as a Markdown table, with the plan's figures below it."""
        head = "| stage | block | act | saved | decision | offload at | prefetch at | moved last step |"
        lines = [head, "|---:|---|---:|---:|---|---|---|---:|"]
        for r in self.decisions():
            moved = "" if r["moved"] is None else format_bytes(r["moved"])
            lines.append(
                f"| {r['stage']} | {r['module']} | {format_bytes(r['act'])} | {format_bytes(r['saved'])} | "
                f"{r['decision']} | {r['offload_at']} | {r['prefetch_at']} | {moved} |"
            )
        plan, chain = self._plan, self._plan.chain
        how = ""
        if plan.reused_from:
            how = f" (runs the schedule solved for {describe_key(plan.reused_from)})"
        elif plan.times_from:
            how = f" (solved on its measured sizes and the times profiled at {describe_key(plan.times_from)}, scaled)"
        tail = [f"plan for: {plan.shapes}{how}"]
        if len(self._known) > 1 or self._neutral:
            tail.append(self._shapes_line())
        if plan.platform is not None:
            r = plan.resident_bytes
            outside = f", {exact_bytes(r)} of it resident outside the chain" if r else ""
            tail.append(
                f"memory: {exact_bytes(plan.memory)} given{outside}; keep-all peak {exact_bytes(plan.keep_all_peak)}; "
                f"proven floors {exact_bytes(offload_memory_floor(chain) + r)} (pure offloading), "
                f"{exact_bytes(stage_floor(chain, plan.sizes) + r)} (any schedule)"
            )
        if plan.fallback:
            tail.append(f"fallback: {plan.fallback}")
        if _draw_only(plan):
            stages = ", ".join(str(i) for i in sorted(plan.sizes.collapsed))
            tail.append(
                f"measured with stage(s) {stages} skipped, as the call's LayerDrop skipped them (a skipped block "
                "that cannot run at these shapes, or the last ones): the plan holds for calls that skip them too, "
                "so each call of these shapes is measured first"
            )
        if plan.sizes is not None:
            tail.append(coverage(chain, plan.sizes, self.blocks).describe())
        moved = f"offloaded per step: {format_bytes(plan.offloaded_bytes)} predicted"
        if self.last_step is not None:
            moved += f", {format_bytes(self.offloaded_bytes)} measured"
        tail.append(moved)
        predicted = self.predicted_peak
        if predicted is not None:
            peak = f"peak: {format_bytes(predicted)} predicted"
            if self.measured_peak is not None:
                peak += f", {format_bytes(self.measured_peak)} measured"
            tail.append(peak)
            tl = self._run.timeline
            if plan.overlap:
                tail.append(f"simulated makespan: {tl.makespan:.6g} s (compute alone {chain.compute_time:.6g} s)")
            else:
                tail.append(
                    f"simulated step: {tl.serial_makespan:.6g} s with every copy inline (on this device a copy does not "
                    f"overlap compute: it runs on the compute thread); compute alone {chain.compute_time:.6g} s, "
                    f"{tl.makespan:.6g} s if copies overlapped"
                )
        if plan.host_bytes is not None:
            tail.append(f"host buffers: {format_bytes(plan.host_bytes)} for this plan, {format_bytes(self.pool.total_bytes)} held")
        return "\n".join(lines + [""] + tail)

    def _shapes_line(self) -> str:
        """Which plan each shape seen uses (NOTE [ one plan for many shapes ])."""
        known = list(self._known.values())
        own = sum(1 for p in known if p.reused_from is None)
        scaled = sum(1 for p in known if p.times_from is not None)
        parts = []
        for p in known[-SHAPES_SHOWN:]:
            if p.reused_from is not None:
                how = f"schedule of {describe_key(p.reused_from)}"
            elif p.times_from is not None:
                how = f"its own, on times of {describe_key(p.times_from)}"
            else:
                how = "its own"
            parts.append(f"{p.shapes} -> {how}")
        more = f" (the last {SHAPES_SHOWN})" if len(known) > SHAPES_SHOWN else ""
        neutral = ""
        if self._neutral:
            names = sorted(".".join(str(x) for x in path[1:]) or str(path) for path in self._neutral)
            neutral = f"; arguments that change no size (one plan for all their values): {', '.join(names)}"
        return (
            f"plans: {len(known)} shape(s), {own - scaled} profiled and solved, {scaled} solved on a close shape's "
            f"times scaled, {len(known) - own} running a larger shape's schedule{neutral}; shapes{more}: " + "; ".join(parts)
        )

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"{len(self.blocks)} blocks, {len(self._plans)} plan(s)"
        return f"Offloader({type(self.model).__name__}, {state})"


#: Plans remembered (beyond the cache of executors), and shapes the table lists.
KNOWN_PLANS = 256
SHAPES_SHOWN = 12


#: How far (a ratio of the calls' tensor volumes, either way) a profile's times are scaled to
#: another shape's plan before a new profile anchors them (NOTE [ one plan for many shapes ]).
TIMES_SCALE = 2.0


def _times_source(plans: list[Plan], key: Any, strip: Any) -> Plan | None:
    """The plan whose profiled times a call of ``key`` is solved on: one profiled at its own
    shapes, of the same layout (only tensor dimensions differ), its volume within
    :data:`TIMES_SCALE` of the call's, the closest; ``None`` if none."""
    v = volume(key)
    best, gap = None, math.inf
    for p in plans:
        if p.reused_from is not None or p.times_from is not None or p.sizes is None or not same_layout(strip(p.key), key):
            continue
        w = volume(p.key)
        if not v or not w or max(v / w, w / v) > TIMES_SCALE:
            continue
        d = abs(math.log(v / w))
        if d < gap:
            best, gap = p, d
    return best


#: Plans kept per shape that hold only for calls skipping certain blocks.
DRAW_PLANS = 8


def _draw_only(plan: Plan) -> bool:
    """Whether ``plan`` holds only for calls that skip the blocks its profile could not run
    (NOTE [ blocks a profile cannot run ] in _recorder.py)."""
    return plan.sizes is not None and bool(plan.sizes.collapsed)


def _same_sizes(a: Any, b: Any) -> bool:
    """Whether two profiles' sizes are those of the same storages (what a plan depends on)."""
    if a is None or b is None:
        return False
    return (
        a.act == b.act and a.saved == b.saved and a.storages == b.storages and dict(a.pinned) == dict(b.pinned)
        and a.resident == b.resident and a.output_bytes == b.output_bytes and a.prefix_bytes == b.prefix_bytes
        and dict(a.late) == dict(b.late) and a.collapsed == b.collapsed
        and a.unowned_tmp == b.unowned_tmp and a.unowned_bytes == b.unowned_bytes
    )


# NOTE [ one plan for many shapes ]
# Dynamic padding gives every batch its own sequence length: a plan per shape costs a profile
# (5-7 steps) and a solve per length, and the cache of executors thrashed (24 replans in 25
# steps, 5.5-6.8x plain time). A call of new shapes is now planned, in order:
# * Numbers that change no size: a call whose key differs from a known plan's only in number
#   arguments (HF Trainer's num_items_in_batch as an int, a step counter) has its sizes measured
#   once (below); if every storage is the size
#   the known plan's profile found, those arguments are left out of every key from then on, and
#   their values share one plan. A number that changes sizes keeps splitting plans.
# * A larger shape's schedule: a known plan whose shapes dominate the call's (the same
#   arguments, every tensor dimension at least as large) lends its schedule when it fits this
#   call's budget: the call's sizes measured (exact), its times are the larger
#   plan's scaled by each stage's output size, and the simulator must find the schedule feasible
#   under this call's memory (a fraction is of this call's keep-all peak), with no unit it moves
#   resident at these shapes. The plan is the call's own (its chain, its sizes, its pinned
#   storages for the executor) with the borrowed schedule, Plan.reused_from saying whose; the
#   smallest dominating plan is tried first. It costs a simulation instead of a profile and a
#   solve (the sizes: below). What it gives up: the schedule is the larger shape's best, not this
#   one's (it may offload more than this shape needs), and its times are estimates.
# * A solve on the call's own sizes and a close shape's times: when no schedule can be borrowed
#   (a new longest length), a plan profiled at its own shapes of the same layout (only tensor
#   dimensions differ) whose tensor volume is within TIMES_SCALE (2x) of the call's lends its
#   times: the call's chain has the sizes just measured (exact) and that profile's times and
#   transients scaled by each stage's output size (as a borrowed schedule's are), and is solved
#   for this call's budget (handle.rescaled, Plan.times_from). The memory the plan is checked
#   against is the measured one; only the times, which decide how well transfers hide behind
#   compute and never what the step holds, are estimates. It costs a
#   solve instead of a profile (two to four steps of the model plus that solve). The nearest
#   profiled shape is the source, never a plan that was itself solved on scaled times, so the
#   estimates do not drift from a measurement by more than TIMES_SCALE.
# * Else a profile and a solve, as before (handle.replans counts them, handle.reuses the
#   borrowed ones). A run over random lengths profiles only when a new longest length is over
#   twice the volume of every profiled one: a few times over hundreds of steps (the Trainer-like
#   run of benchmarks/training_loops.py counts them).
# The sizes the first three need are measured, never guessed (a prediction from the sizes of
# other shapes, affine in the sequence length, would be checked only by the step that runs under
# it, after its memory was spent). They used to cost a measuring forward of their own before the
# step (about 1.5x a plain forward on a CPU: the probe's ledger and the state it restores); in
# the Trainer-like run of benchmarks/training_loops.py, where 76 of 200 steps bring a new
# length, it was the largest share of what offloading added (steps of a new length 2.07x
# plain). That forward held every tensor it saved to its end: the keep-all peak of the forward.
# So the training step of those shapes is now the measuring pass itself (_Measuring): its
# forward runs under the recorder the measuring forward ran (measuring_recorder: the probe, the
# checks between blocks that find writes no version counter sees; sizes_of_pass computes what
# measure_call_sizes does from it), autograd keeps what it saves on the device (Kept records,
# version-checked at unpack as plain PyTorch checks), and when the forward returns the plan is
# made from those sizes (_measured_step) and put in force; the backward reads what a plain one
# reads, so the numbers are plain PyTorch's. That step moves nothing and peaks where plain
# PyTorch does for its shapes: above the forward that it replaces by the backward's transients,
# for one step per new shape (handle.measured counts them). What else differs: a step whose
# forward skips blocks (LayerDrop) measured nothing of the skipped stages, so its shapes go
# to the measuring forward at their next call (it draws again until every block runs); shapes
# whose sizes no known plan serves (a number that does change sizes, a borrowed schedule that
# does not fit and no profiled times close enough) are profiled at their next call, not in the
# step that found it out (a profile runs whole steps of the model, which cannot run between a
# forward and its backward); handle.prepare still measures with a forward of its own.
# A shape whose profile could not run a block a LayerDrop step skipped has a plan for calls that
# skip it only, and every call of it is measured first, by a forward of its own (NOTE [ blocks a
# profile cannot run ] in _recorder.py; NOTE [ one measure per new draw ]).
# Plans made are remembered by key (KNOWN_PLANS); the executors of the most recent cache_size are
# kept, and one evicted is rebuilt from its plan without a profile. handle.table() lists which
# plan each shape seen uses.


# NOTE [ one measure per new draw ]
# At a shape whose plans hold only for calls that skip certain blocks (NOTE [ blocks a profile
# cannot run ] in _recorder.py), every call is measured under its own draws (redraw=False) before
# its step. A call whose sizes no kept plan of the shape has (it skips other blocks, say the last
# too) used to be handed to _plan_for without them, which measured again under redraws: the
# call's own draw, then up to SKIP_TRIES others, each run until the block that cannot run raised,
# then the replay (34 calls of a block that always runs, against 3 for the first measure, in
# tests/test_torch_layerdrop.py's batch-norm model). The draws it tried are the ones the shape's
# profile tried (the same seeds, the same shapes), which is why that profile replayed, so they
# found nothing but the replay of the call's own draws: the sizes measured first. They are now
# handed on, with the units the candidate plan's profile found written (what measure adds;
# with_written only adds, so the write checks of both measures hold), and are this call's own,
# which a redraw that happened to run could only have replaced with another draw's. The plan
# that was the shape's stays among its variants (DRAW_PLANS) when a new one takes its place in
# force: a later call of its draws took it from there, not from a new plan (before, it fell out,
# and the next call of the first pattern was planned again: a profile, when the new plan's
# times were scaled from it). What it does not change: the version checks and the checks
# between blocks run in that one measure as before, and a call that runs a block that cannot
# run raises there, before its step.


def _untrainable(skip: str) -> ValueError:
    """offload()'s refusal of a model whose profile drew a skip no offloaded step can carry out
    (NOTE [ a skip no step can carry out ] in _instrument.py)."""
    return ValueError(
        "offload: a random draw of the profile skipped blocks that no offloaded step can skip ("
        + skip.removeprefix("chainoffload_torch: ")
        + "): a training step that draws it would be refused mid-training, where plain PyTorch trains"
    )


class _Measuring:
    """A training step of new shapes that measures their sizes with its own forward, every
    tensor it saves kept on the device (NOTE [ one plan for many shapes ]): the recorder of the
    measuring forward is its listener."""

    def __init__(self, owner: Offloader, raw: Any, found: tuple) -> None:
        self.raw = raw
        self.found = found
        self.n = owner._instrument.blocks.stages
        self.rec = measuring_recorder(self.n, owner._planner.device, owner.model)
        self.step: Any = None
        self.skipped = False

    def forward_start(self, args: tuple, kwargs: dict) -> Any:
        self.step = self.rec.forward_start(args, kwargs)
        return self.step


class _ExtraForward:
    """The step of a forward run before the backward of the step in flight: passive (no
    saved-tensor hooks: autograd keeps what it saves), and no executor's step, so every event of
    it is ignored (NOTE [ several forwards per backward ])."""

    passive = True
    done = False


# NOTE [ several forwards per backward ]
# Siamese and contrastive losses (SimCLR) run the model two or more times before one backward:
# a = model(x1); b = model(x2); loss(a, b).backward(). The executor carries out one step at a
# time, and a second forward used to abandon the first (its backward then raised "a saved tensor
# of unit 5 was dropped"). Now a forward that starts while the step in flight has finished its
# forward, not begun its backward, on the same thread, with a tensor it returned still alive
# (the caller holds it for the loss), runs as an extra forward: passive (no saved-tensor hooks,
# what it saves stays resident as in plain PyTorch) and outside the executor (its events reach
# the handle with a step no executor knows, and are ignored), while the first step keeps its
# plan and its backward moves what it planned. The numbers are plain autograd's; the memory
# bound holds for the first forward only, and a warning says so once. A forward after a step
# whose outputs were all dropped without a backward (an evaluation under grad mode) still
# abandons it, as before; a loop that keeps such outputs alive and trains on gets its later
# forwards run resident until a backward ends the step in flight, with that warning.


# NOTE [ one step at a time ]
# A handle carries out one step at a time: the executor's state (which storages are on the host,
# which copies are queued) is that of the step in flight, from its forward's start to its
# backward's end. Two threads calling one offloaded model at once would interleave two steps in
# that state (the "dictionary changed size during iteration"); the instrument refuses a
# forward from a second thread while another thread's forward runs, and the handle one while
# another thread's step is in its backward, both with CONCURRENT_REFUSAL and before anything
# moves. Steps from different threads one after the other are fine (a pool of worker threads).
# A forward after another's forward and before its backward, on one thread, is a second forward
# per backward (the executor's rule, not a concurrency error).
# remove() in the middle of a step takes the module hooks away at once (the next forward is
# plain) and leaves the step in flight to its plan: its backward's tensor hooks and saved-tensor
# records still reach the handle, which frees the host buffers when that backward ends. Dropping
# the step there (as remove() did) made its backward fail with "unit 3 was dropped".


def _remat_decisions(sched: co.Schedule, length: int) -> tuple[dict[int, int], set[int], dict[int, set[int]]]:
    """Per stage, how many times a schedule runs its forward again after the model's forward
    ran it; the stages whose a_i a recomputation starts from (checkpoints); per stage, the ops
    that make a lone a_i of it (Fck, Fn)."""
    lone: dict[int, set[int]] = {}
    for k, (kind, i) in enumerate(sched.compute):
        if kind in ("Fck", "Fn"):
            lone.setdefault(i, set()).add(k)
    if not sched.has_remat:
        return {}, set(), lone
    remat = RematPlan.of(sched, length)
    recomputes: dict[int, int] = {}
    for k in remat.maker_of_read:
        i = sched.compute[k][1]
        recomputes[i] = recomputes.get(i, 0) + 1
    checkpoints = {sched.compute[m][1] for m in remat.maker_of_read.values() if m >= 0}
    return recomputes, checkpoints, lone


def _sharded(model: nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) manages ``model`` or one of its submodules."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


def _check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    compiled = type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None) is not None
    if compiled:
        raise ValueError(f"model: is compiled; {COMPILE_REFUSAL}")


def offload(
    model: nn.Module,
    sample: Any,
    memory: int | float | str | None = None,
    *,
    blocks: Any = None,
    method: str | None = None,
    device: torch.device | str | None = None,
    keep: Iterable[int] = (),
    on_new_shape: str = "replan",
    host_memory: int | str | None = None,
    cache_size: int = 4,
    platform: co.Platform | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    **options: Any,
) -> Offloader:
    """Offload ``model``'s activations under a memory budget, in place; return the handle.

    Parameters
    ----------
    model
        Any ``nn.Module`` with a list of repeated blocks (a Hugging Face model, a ResNet, an
        ``nn.Sequential``), on its device. It is instrumented with hooks only: no wrapper, no
        new submodule, ``forward`` and ``state_dict`` keys unchanged.
    sample
        What the model is called with: a tensor, a tuple of positional arguments, or a dict of
        keyword arguments (``{"input_ids": ids, "labels": ids}``), shaped as in training.
    memory
        GPU memory for activations: bytes, a string such as ``"6GiB"``, or a float in (0, 1],
        a fraction of the keep-all peak (of each shape planned). ``None``: the platform's
        memory if one is given, else the keep-all peak (nothing offloaded).
    blocks
        The chain's stages. ``None`` finds them: the longest ``nn.ModuleList`` / ``nn.Sequential``
        of repeated blocks that the forward calls in order, each feeding the next (HF
        ``model.layers``, ``transformer.h``, ``encoder.layer``; a ResNet's stages, joined), with
        every other such stack the forward runs before or after it (an encoder-decoder's two,
        CLIP's two towers); a layer called several times (ALBERT's) is one stage per call. Or
        say it: a module path (``"transformer.h"``), a module list, or a list of paths, module
        lists and modules (``["encoder.block", "decoder.block"]``). Code after the last
        block is never offloaded; code before the first is stage 1 of its own where it keeps as
        much as a block (a stem: :attr:`Blocks.prefix`, NOTE [ prefix and suffix ]), else what
        it saves stays resident outside the chain.
    method
        A :func:`chainoffload.methods` name (pure offloading such as ``"best"``, recomputation
        such as ``"rotor"``, or both: ``"joint"``). ``None`` (default): solve with every method
        of :data:`chainoffload_torch.plans.EXECUTABLE_METHODS` and keep the plan of least
        simulated step time that fits (NOTE [ one call chooses ]).
    device
        Where to profile; default the model's device.
    keep
        Units (1-based stages of the chain: block k, or block k - 1 when the code before the
        first block is stage 1) whose activations stay resident whatever the solver would do.
    on_new_shape
        A call with other input shapes than the plan's: ``"replan"`` (profile and solve for
        them once; plans are cached), ``"warn"`` (warn, run the plan in force as it is) or
        ``"error"`` (raise before anything is copied). See NOTE [ plans per shape ].
    host_memory
        Most bytes of (pinned) host buffers: a plan that needs more is refused.
    cache_size
        Plans kept (least recently used dropped first).
    platform
        Use this link instead of measuring one (its memory is used if ``memory`` is None).
        Otherwise it is measured once per device in the process (:func:`~chainoffload_torch.profiler.link_of`).
    repeats, warmup
        Timed profiling steps per plan (the median is kept) and untimed steps before them.
        Both ``None`` (the default): as many as the timings need, one when its forward agrees
        with block discovery's, at most 4 (NOTE [ how many profiling steps ]). One given: the other
        is 3 timed steps or 1 warm-up step.
    **options
        Passed to the solver (e.g. ``time_limit``).

    Returns
    -------
    Offloader
        ``.table()`` shows the decisions; ``.remove()`` restores the model.

    Notes
    -----
    What a plan costs, in the model's own work: one forward with autograd and no backward to
    find the blocks, which warms up the first step (the first plan only; NOTE [ discovery as
    the warm-up ]), the probe's forward alone (NOTE [ storages the forward keeps ]; one
    more when the stem becomes a stage), and the profiling steps after it (NOTE [ the probe's
    forward is not a step ]): one on a warm model, up to 4 otherwise (``warmup + repeats``
    when given). About three training steps in all on a warm model of a few million
    parameters (2.8-3.4 in ``benchmarks/results/offload_time.md``), plus one solve and, once
    per process, the link's host copies.

    Raises
    ------
    ValueError
        Bad ``memory``, ``keep``, ``method``, ``on_new_shape``, ``host_memory``,
        ``cache_size``, ``repeats`` or ``warmup``; no blocks found; a model already offloaded or compiled; no schedule
        fits (the message gives the keep-all peak and the proven floors); the plan needs more
        than ``host_memory``.
    """
    _check_model(model)
    if on_new_shape not in ON_NEW_SHAPE:
        raise ValueError(f"on_new_shape: {on_new_shape!r} is not one of {', '.join(ON_NEW_SHAPE)}")
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
        raise ValueError(f"cache_size: {cache_size!r} must be an integer >= 1")
    if method is not None:
        spec(method)  # an unknown name is refused here, with the list of known ones
    budget = Budget.parse(platform.memory if memory is None and platform is not None else memory)
    repeats, warmup = profiling_steps(repeats, warmup, 3)
    host = None if host_memory is None else parse_bytes(host_memory, field="host_memory")
    check_not_instrumented(model)
    if _sharded(model):
        raise ValueError(
            "model: is sharded by FSDP (fully_shard); call offload() before fully_shard (a profiling step of a sharded "
            "model would leave FSDP's deferred gradient reduction behind)"
        )
    args, kwargs = as_call(sample)
    dev = _device_of(model, args, kwargs, device)
    args, kwargs = _to_device(args, dev), _to_device(kwargs, dev)
    link = platform if platform is not None else co.Platform(memory=1, **link_of(dev, repeats=max(3, repeats or 3)))
    # NOTE [ discovery as the warm-up ]: its forward, with autograd, warms up the first step, so
    # nothing else runs between them (the link's copies did, and every first step of a tiny
    # model looked cold).
    blks, reference = find_blocks_warm(model, args, kwargs, blocks, dev)
    # NOTE [ the code after a block as a stage ] in _instrument.py: so that every block but the
    # last may be recomputed.
    blks = blks.with_tails()
    planner = _Planner(model, dev, link, budget, method, tuple(keep), host, repeats, warmup, options, reference)
    handle = Offloader.__new__(Offloader)
    handle._setup(model, blks, dev, planner, on_new_shape, cache_size, host)
    handle._instrument.install()
    try:
        try:
            plan = planner.plan(handle._instrument, args, kwargs, call_key(model, args, kwargs))
        except ValueError as exc:
            # A solve that found no plan: the draw no step can skip is the refusal that holds for
            # every method and budget, so it is the one named.
            if handle._instrument.untrainable_skip is None:
                raise
            raise _untrainable(handle._instrument.untrainable_skip) from exc
        if handle._instrument.untrainable_skip is not None:
            # NOTE [ a skip no step can carry out ] in _instrument.py: refused before training.
            raise _untrainable(handle._instrument.untrainable_skip)
        # The first plan may have made the prefix a stage (NOTE [ the prefix as a stage ]).
        handle.blocks = blks = handle._instrument.blocks
        handle._use(plan)
    except BaseException:
        handle.remove()
        raise
    sizes = plan.sizes
    kept = [u for u, by in sorted(sizes.held_why.items()) if by == "forward"]
    if kept or sizes.held_bytes.get("forward"):
        # NOTE [ storages the forward keeps ]: say which blocks (held beyond the forward), and that
        # no plan counts on them.
        names = blks.stage_names
        whole = f"the outputs of {', '.join(names[u - 1] for u in kept)} (their units stay resident whole)" if kept else ""
        part = sizes.held_bytes.get("forward", 0)
        some = f"{format_bytes(part)} of other blocks' activations (they stay resident, the rest of those units moves)" if part else ""
        warnings.warn(
            f"chainoffload_torch: the model's forward keeps {' and '.join(x for x in (whole, some) if x)} alive after it "
            "returns (a reference outside autograd: a module attribute, a cache, a tensor kept as a ctx attribute): "
            "offloading them would free nothing, so the plan does not count on them (what it lets go of before it "
            "returns, a list of skips, moves; the documentation's training guide, 'Memory the forward keeps', says more)",
            RuntimeWarning,
            stacklevel=2,
        )
    cover = coverage(plan.chain, plan.sizes, blks)
    if cover.share < 0.5:
        warnings.warn(f"chainoffload_torch: {cover.describe()}", RuntimeWarning, stacklevel=2)
    held = plan.sizes.held_bytes.get("output", 0)
    if held:
        warnings.warn(
            f"chainoffload_torch: the model's output holds {format_bytes(held)} of activations (a key/value cache, hidden "
            "states it returns): they stay resident and the rest of their blocks' activations moves; pass "
            "use_cache=False (and output_hidden_states=False) when training to free them",
            RuntimeWarning,
            stacklevel=2,
        )
    return handle


def budget_curve(
    model: nn.Module,
    sample: Any,
    memories: Iterable[int | float | str] | None = None,
    *,
    points: int = 8,
    methods: Iterable[str] | None = None,
    blocks: Any = None,
    keep: Iterable[int] = (),
    device: torch.device | str | None = None,
    platform: co.Platform | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    time_limit: float | None = None,
    **options: Any,
) -> Any:
    """What each memory budget costs ``model``: overhead against memory, before choosing one.

    Profiles ``model`` once (as :func:`offload` does, the model is left as it was) and runs the
    core's memory / overhead sweep (:func:`chainoffload.tradeoff`, the code behind ``chainoffload
    tradeoff``) on its chain, keeping resident the units :func:`offload` would keep.

    Parameters
    ----------
    model, sample, blocks, keep, device, platform, repeats, warmup
        As for :func:`offload`.
    memories
        Limits to evaluate: bytes, sizes such as ``"6GiB"``, or fractions in (0, 1] of the
        keep-all peak. ``None``: ``points`` limits from the least any schedule needs to the
        keep-all peak, plus the proven offload floor.
    points
        Number of limits when ``memories`` is ``None`` (at least 2).
    methods
        Method names (:func:`chainoffload.methods`); default :data:`BUDGET_METHODS`. Methods
        that recompute (``"rotor"``, ``"joint"``, the fixed policies ``"checkpoint-all"``,
        ``"sqrt-checkpoint"``) are solved as :func:`offload` solves them: on the chain with a
        prohibitive ``fwd_nosave`` for the stages the executor cannot recompute (the last block,
        a block whose a_i the code after it makes, ...; also the code before the first block
        when it is a stage: this sweep's profile does not watch the model's own calls, which
        :func:`offload` does before it recomputes that code), so a point where such a method
        fits only by recomputing one of them shows a prohibitive overhead.
    time_limit
        Seconds per solve for the methods that take one. ``None`` (default): none, each
        method stops by its own work budget, so the same chain gives the same curve on any
        machine (NOTE [ a sweep without a clock ] in ``chainoffload/tradeoff.py``; the
        profile's times are the machine's, of course).
    **options
        Passed to every method.

    Returns
    -------
    chainoffload.tradeoff.Tradeoff
        ``keep_all_peak``, ``offload_floor`` and ``stage_floor`` (proven), ``memories``, per
        method ``overheads(name)`` (``makespan / compute - 1``, ``nan`` where nothing fits; on
        CPU the makespan counts every copy inline with compute, as :func:`offload` predicts
        there) and ``min_memory(name)``, the pure-offloading ``lower_bound`` per memory, ``policy_peaks``
        (the memory each fixed recomputing policy holds); ``.plot(path)``
        draws it, ``.to_dict()`` is the JSON table. Pass one of its memories to :func:`offload`.

    Raises
    ------
    ValueError
        An unknown method, a bad memory, no blocks found.
    """
    from chainoffload.tradeoff import tradeoff

    names = list(BUDGET_METHODS if methods is None else ([methods] if isinstance(methods, str) else methods))
    remat = any(spec(name).remat for name in names)  # an unknown name is refused here, with the known ones
    _check_model(model)
    from .profiler import profile_full

    repeats, warmup = profiling_steps(repeats, warmup, 3)
    # No fwd_nosave, as offload() (NOTE [ how many profiling steps ]): the executor's Fck / Fn
    # cost what F costs in the forward, the chain's default (NOTE [ what an Fck or Fn costs ] in
    # _recompute.py).
    prof = profile_full(
        model, sample, blocks=blocks, device=device, repeats=repeats, warmup=warmup, measure_platform=platform is None,
        nosave=False,
    )
    chain = prof.chain
    if remat:
        # As offload() prices them (NOTE [ what a recomputation costs the executor ] in _recompute.py).
        chain = charge_recomputation(chain, prof.blocks, prof.device)
    link = platform if platform is not None else prof.platform
    # NOTE [ one call chooses ] in plans.py: the stages the executor cannot call again get a
    # prohibitive fwd_nosave, which no pure-offloading method reads.
    solved_on = recompute_chain(chain, prof.sizes, prof.blocks) if remat else chain
    # The sweep runs on the chain; every memory it reports is shifted by the bytes resident
    # outside it, so that its figures are a whole step's, as offload() takes them
    # (NOTE [ resident outside the chain ]).
    resident = prof.sizes.resident_bytes
    limits = None
    if memories is not None:
        limits = [max(1, Budget.parse(m).bytes_for(chain, resident, step_peak(chain, prof.sizes)) - resident) for m in memories]
    keep = co.solvers.check_keep(chain, tuple(keep))
    kept = sorted(resident_units(chain, prof.sizes, keep))
    # A method that takes keep= (the offloading ones, joint included) is told which units stay
    # resident, as offload() tells it; one that takes none (rotor and the other methods that only
    # recompute: they move nothing) is swept without, at the same memories (the first sweep's,
    # which include the fixed policies' peaks).
    with_keep = [n for n in names if "keep" in (_takes(n) or {"keep"})]
    without = [n for n in names if n not in with_keep]
    curve = None
    for group, extra in ((without, {}), (with_keep, {"keep": kept})):
        if not group:
            continue
        part = tradeoff(
            solved_on, link, group, limits if curve is None else list(curve.memories), points=points,
            time_limit=time_limit, **extra, **options,
        )
        if curve is None:
            curve = part
        else:
            curve = dataclasses.replace(
                curve, curves=curve.curves | part.curves, remat=curve.remat | part.remat,
                clocked=curve.clocked + part.clocked, policy_peaks=curve.policy_peaks | part.policy_peaks,
            )
    curve = dataclasses.replace(curve, curves={n: curve.curves[n] for n in names})  # the order given
    if not copies_overlap(prof.device):
        curve = _inline(curve)  # NOTE [ copies on CPU ] in _link.py: as offload() predicts there
    return _shifted(curve, resident)


def _inline(curve: Any) -> Any:
    """``curve`` with every point's makespan and overhead counting its copies one after another
    with compute (``Timeline.serial_makespan``), as :func:`offload` predicts where copies do not
    overlap compute; the lower bounds stay (a serial step is never below the makespan)."""
    def point(p: Any) -> Any:
        if p.result is None or p.result.timeline is None or not p.feasible:
            return p
        t = p.result.timeline.serial_makespan
        return dataclasses.replace(p, makespan=t, overhead=t / curve.compute_time - 1.0 if curve.compute_time > 0 else 0.0)

    return dataclasses.replace(curve, curves={k: tuple(point(p) for p in v) for k, v in curve.curves.items()})


def _shifted(curve: Any, r: int) -> Any:
    """``curve`` (a :class:`chainoffload.tradeoff.Tradeoff`) with every memory ``r`` bytes higher."""
    if not r:
        return curve
    import dataclasses

    def point(p: Any) -> Any:
        return dataclasses.replace(p, memory=p.memory + r, peak_memory=p.peak_memory + r if p.peak_memory else 0)

    return dataclasses.replace(
        curve,
        platform=curve.platform.with_memory(curve.platform.memory + r),
        keep_all_peak=curve.keep_all_peak + r,
        offload_floor=curve.offload_floor + r,
        stage_floor=curve.stage_floor + r,
        memories=tuple(m + r for m in curve.memories),
        curves={k: tuple(point(p) for p in v) for k, v in curve.curves.items()},
        policy_peaks={k: v + r for k, v in curve.policy_peaks.items()},
    )
