"""Plans: a budget, and the schedule made for one set of input shapes.

:class:`Budget` is the memory given (bytes or a fraction of the keep-all peak); :class:`Plan`
a schedule with the chain and platform it was solved for; ``_Planner`` profiles one call of the
model and solves for it (what :func:`chainoffload_torch.offload` does once, and again for every
new input shape); :func:`solve_for` keeps resident what cannot move and, when nothing fits,
says what would (NOTE [ nothing fits ]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

import chainoffload as co
from chainoffload.bounds import offload_memory_floor
from chainoffload.units import format_bytes, parse_bytes

from ._coverage import Coverage, coverage, step_peak
from ._instrument import Instrument
from ._link import copies_overlap
from ._recorder import WRITTEN, Sizes, chain_of, held_grad_tmp, measure_call_sizes, measure_chain
from ._tree import describe_key

__all__ = [
    "Budget", "Plan", "solve_for", "resident_units", "nothing_fits", "exact_bytes", "Coverage", "coverage", "step_peak",
    "EXECUTABLE_METHODS", "not_recomputable", "recompute_chain", "stage_floor", "step_time",
]

#: What :func:`~chainoffload_torch.offload` solves with when no method is named: every method whose
#: schedules the executor carries out (pure offloading, recomputation, both); the plan with the least
#: simulated step time that fits is taken (NOTE [ one call chooses ]).
EXECUTABLE_METHODS = ("best", "rotor", "joint")


@dataclasses.dataclass(frozen=True)
class Budget:
    """The GPU memory given to activations: bytes, or a fraction of each plan's keep-all peak.

    Parameters
    ----------
    value
        Bytes (an int, or a string such as ``"6GiB"``), a float in (0, 1] (a fraction of the
        keep-all peak of the shapes being planned), or ``None`` (the keep-all peak: nothing
        offloaded).
    """

    value: int | float | None

    @classmethod
    def parse(cls, memory: Any) -> Budget:
        """Validate ``memory`` (the message names the field and the value)."""
        if memory is None:
            return cls(None)
        if isinstance(memory, str):
            return cls(parse_bytes(memory, field="memory"))
        if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not math.isfinite(memory) or memory <= 0:
            raise ValueError(
                f"memory: {memory!r} must be bytes > 0, a size such as '6GiB', or a fraction in (0, 1] of the keep-all peak"
            )
        if isinstance(memory, float) and memory <= 1.0:
            return cls(float(memory))
        return cls(int(memory))

    def bytes_for(self, chain: co.Chain, resident: int = 0, keep_all: int | None = None) -> int:
        """The memory limit for a step of ``chain`` with ``resident`` bytes outside it.

        A fraction is of the whole step's keep-all peak ``keep_all`` (:func:`step_peak`; by
        default the chain's plus ``resident``); ``None`` is the chain's own keep-all figure plus
        ``resident``, at which the keep-all schedule fits: it counts the storages the forward
        releases late twice (NOTE [ late release ] in _recorder.py), so it may be above ``keep_all``.
        """
        peak = co.keep_all_peak(chain) + int(resident)
        if self.value is None:
            return peak
        if isinstance(self.value, float):
            return int(self.value * (peak if keep_all is None else keep_all))
        return self.value

    def __str__(self) -> str:
        if self.value is None:
            return "the keep-all peak"
        if isinstance(self.value, float):
            return f"{self.value:g} of the keep-all peak"
        return format_bytes(self.value)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A schedule for one set of input shapes, and what it was made from.

    Attributes
    ----------
    key
        The call's shapes (:func:`~chainoffload_torch._tree.call_key`); ``None`` for a plan
        given by hand, which applies to any call.
    chain, platform, schedule, result
        The profiled chain, the platform (its memory is the limit solved for), the schedule
        and the solver's result (``None`` for a plan given by hand).
    sizes
        The profile's sizes (``None`` for a plan given by hand).
    keep
        Units kept because the user asked.
    host_bytes
        Host buffer bytes the plan takes in the pool's size classes (``None`` if unknown).
    reused_from
        The shapes whose schedule this plan runs, checked against this call's own sizes
        (NOTE [ one plan for many shapes ] in api.py); ``None`` for a plan solved for its own.
    times_from
        For a plan solved for its own sizes (measured) on times scaled from another plan's
        profile, that plan's shapes (NOTE [ one plan for many shapes ] in api.py); ``None`` when
        its times were profiled at its own shapes.
    not_recomputable
        The stages no plan of a method that recomputes may recompute, each with why
        (NOTE [ one call chooses ]); empty when no such method was solved with.
    overlap
        Whether the executor's copies run beside compute on the plan's device (False on CPU,
        where they run inline: NOTE [ copies on CPU ] in _link.py); :attr:`makespan` counts
        them one after another with compute where they do not.
    fallback
        For shapes met after offload() whose budget fits no plan of the method asked: what the
        plan does instead (another method, or more memory for a fraction), as the warning said
        (NOTE [ a later shape that fits no plan ]); ``None`` otherwise.
    """

    key: tuple | None
    chain: co.Chain
    platform: co.Platform | None
    schedule: co.Schedule
    result: co.Result | None = None
    sizes: Sizes | None = None
    keep: frozenset[int] = frozenset()
    host_bytes: int | None = None
    reused_from: tuple | None = None
    not_recomputable: dict[int, str] = dataclasses.field(default_factory=dict)
    overlap: bool = True
    fallback: str | None = None
    times_from: tuple | None = None

    @property
    def resident_bytes(self) -> int:
        """Bytes resident for the whole step outside the chain (NOTE [ resident outside the chain ])."""
        return 0 if self.sizes is None else self.sizes.resident_bytes

    @property
    def memory(self) -> int | None:
        """The budget: the platform's memory (the chain's share) plus :attr:`resident_bytes`."""
        return None if self.platform is None else int(self.platform.memory) + self.resident_bytes

    @property
    def keep_all_peak(self) -> int:
        """The step's peak when nothing is offloaded (:func:`step_peak`)."""
        return step_peak(self.chain, self.sizes)

    @property
    def predicted_peak(self) -> int | None:
        """The simulator's peak of the schedule plus :attr:`resident_bytes` (needs a platform)."""
        if self.platform is None:
            return None
        return co.simulate(self.chain, self.platform, self.schedule).peak_memory + self.resident_bytes

    @property
    def makespan(self) -> float | None:
        """The simulator's time of one step under the schedule (needs a platform): its makespan
        where copies overlap compute, else compute and copies one after another
        (``Timeline.serial_makespan``; NOTE [ copies on CPU ] in _link.py)."""
        if self.platform is None:
            return None
        return step_time(co.simulate(self.chain, self.platform, self.schedule), self.overlap)

    @property
    def offloaded_bytes(self) -> int:
        """Bytes the schedule moves to the host per step: the chain's, less the offloads of an
        a_i alone that the profile pinned (NOTE [ a pinned a_i never moves ])."""
        return moved_bytes(self.schedule, self.chain, self.sizes)

    @property
    def shapes(self) -> str:
        """The input shapes the plan was made for, as text."""
        return describe_key(self.key)


# NOTE [ plans per shape ]
# A plan belongs to the input shapes it was profiled with: another batch size moves other bytes
# and peaks elsewhere. The model's forward pre-hook computes the call's key (shapes, dtypes,
# plain arguments, training mode, autocast) before any copy starts. With on_new_shape="replan"
# a new key is profiled (the model's own forward and backward, run re-entrantly from the hook
# with a recorder in place of the executor, model state restored after) and solved once; plans
# are kept in an LRU of `cache_size`, like Dynamo's guards. "warn" runs the plan in force as it
# is (its units, other bytes) after a warning; "error" raises. Under DDP every rank must see
# the same shapes at the same step (a replan runs the model, so its collectives, on every rank).
# Under FSDP2 a profiling step of the sharded model would leave FSDP's deferred gradient
# reduction behind (measured: the next step's gradients were off), so a plan is made only before
# fully_shard (offload(), then prepare() for every other shape) and a new shape is refused.


class _Planner:
    """Profiles and solves for one call's shapes (the part of :func:`offload` that repeats)."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        link: co.Platform,
        budget: Budget,
        method: str | None,
        keep: tuple,
        host_memory: int | None,
        repeats: int | None,
        warmup: int | None,
        options: dict[str, Any],
        reference: float | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.link = link
        self.budget = budget
        self.method = method
        self.keep = keep
        self.host_memory = host_memory
        self.repeats = repeats
        self.warmup = warmup
        self.options = options
        #: The block discovery's forward seconds, for the first plan's profile alone (NOTE
        #: [ discovery as the warm-up ]): a later shape's profile has no such forward before it.
        self.reference = reference
        #: Whether the first plan may make the prefix a stage (NOTE [ the prefix as a stage ]);
        #: the chain's layout is the handle's, so later plans keep it.
        self.may_split_prefix = True
        #: Whether the executor's copies overlap compute here (NOTE [ copies on CPU ] in _link.py).
        self.overlap = copies_overlap(device)
        #: Whether offload()'s own plan was made: a later shape that fits no plan falls back
        #: (NOTE [ a later shape that fits no plan ]) where offload() itself refuses.
        self.planned = False
        #: The blocks any profile saw to be unsafe to recompute (NOTE [ blocks a recomputation
        #: would get wrong ]), for plans solved without a profile of their own.
        self.unsafe: dict[int, str] = {}
        #: The blocks any profile saw read an input written after the block before returned it
        #: (NOTE [ an input written after its block returned ]).
        self.inputs_written: dict[int, str] = {}

    def plan(self, instrument: Instrument, args: tuple, kwargs: dict, key: tuple) -> Plan:
        # No fwd_nosave (NOTE [ how many profiling steps ]): the chain's default, fwd, is what the
        # executor's Fck / Fn cost in the forward, where they run with autograd, and at most what
        # a recomputed one costs (NOTE [ what an Fck or Fn costs ] in _recompute.py).
        remat = self.method is None or co.solvers.spec(self.method).remat
        with _watch_blocks(instrument.blocks, self.model) as unsafe:
            chain, sizes = measure_chain(
                instrument, self.model, args, kwargs, self.device, repeats=self.repeats, warmup=self.warmup,
                name=type(self.model).__name__, nosave=False, split_prefix=self.may_split_prefix, reference=self.reference,
            )
        for b, why in unsafe.items():
            self.unsafe.setdefault(b, why)
        for b, why in unsafe.inputs.items():
            self.inputs_written.setdefault(b, why)
        if remat:
            # NOTE [ what a recomputation costs the executor ] in _recompute.py.
            chain = charge_recomputation(chain, instrument.blocks, self.device)
        blocks = _Unsafe(instrument.blocks, unsafe, prefix_watched=True)
        self.may_split_prefix = False
        self.reference = None
        keep = co.solvers.check_keep(chain, self.keep)
        resident = sizes.resident_bytes
        # NOTE [ resident outside the chain ]: the solver gets the budget less what stays resident.
        platform = self.link.with_memory(max(0, self.budget.bytes_for(chain, resident, step_peak(chain, sizes)) - resident))
        fallback = None
        try:
            result = solve_for(chain, platform, self.method, keep, sizes, self.options, key, blocks=blocks, overlap=self.overlap)
        except ValueError as exc:
            # NOTE [ what would help ]: the coverage and the blocks= to paste.
            refusal = f"{exc}; {what_would_help(chain, sizes, instrument.blocks)}"
            if not self.planned:
                raise ValueError(refusal) from None
            result, platform, fallback = self._later_shape(chain, platform, keep, sizes, key, blocks, refusal)
        self.planned = True
        host = sizes.host_bytes(result.schedule.offloaded_units)
        if self.host_memory is not None and host > self.host_memory:
            raise ValueError(
                f"host_memory: the plan for {describe_key(key)} offloads "
                f"{format_bytes(moved_bytes(result.schedule, chain, sizes))} per step and needs {format_bytes(host)} of host "
                f"buffers, above host_memory={format_bytes(self.host_memory)}; give more GPU memory or more host memory"
            )
        banned = plan_not_recomputable(chain, sizes, blocks, result.schedule) if remat else {}
        return Plan(
            key, chain, platform, result.schedule, result, sizes, keep, host, not_recomputable=banned,
            overlap=self.overlap, fallback=fallback,
        )

    def _later_shape(
        self, chain: co.Chain, platform: co.Platform, keep: set[int], sizes: Sizes, key: tuple, blocks: Any, refusal: str,
    ) -> tuple[co.Result, co.Platform, str]:
        """A plan for shapes met after offload() whose budget fits no plan of the method asked
        (NOTE [ a later shape that fits no plan ]): the result, its platform and what was done,
        after a warning; raises ``ValueError`` (``refusal`` and what to do) for a budget in bytes."""
        resident = sizes.resident_bytes
        asked = exact_bytes(int(platform.memory) + resident)
        shapes = describe_key(key)

        def default(memory: int) -> co.Result | None:
            try:
                return solve_for(chain, platform.with_memory(memory), None, keep, sizes, self.options, key, blocks=blocks, overlap=self.overlap)
            except ValueError:
                return None

        if self.method is not None:
            result = default(int(platform.memory))
            if result is not None:
                done = (
                    f"method={self.method!r} finds no schedule in {asked} for {shapes}, which offload() did not plan "
                    f"for; offload()'s own choice among {', '.join(EXECUTABLE_METHODS)} fits (method {result.method!r}), "
                    "so these shapes train with its plan: the same numbers, other copies or recomputations"
                )
                _warn(f"{done}. Pass method=None to offload() to let it choose for every shape, or plan the shapes you "
                      "will train with up front with handle.prepare(sample) to see what each gets")
                return result, platform, done
        if not isinstance(self.budget.value, float):
            raise ValueError(
                f"{refusal}. These shapes came after offload() planned for others, and memory= in bytes caps every "
                "shape: give at least the least memory known to work above, give memory= as a fraction of each "
                "shape's keep-all peak, or train with shapes that fit (handle.prepare(sample) tells before training)"
            ) from None
        # A fraction: the least memory a plan of offload()'s own choice is found to fit in, by
        # bisection from the proven floor of any schedule up to a pure-offloading schedule known
        # to fit (largest-first's least memory), or the keep-all peak.
        resident_u = resident_units(chain, sizes, keep)
        lo = max(int(platform.memory), stage_floor(chain, sizes) - 1)
        top = int(co.keep_all_peak(chain))
        works = co.minimum_memory(chain, platform, "largest-first", keep=sorted(resident_u))
        best, hi = None, top
        if works is not None and lo < int(works) < top:
            best = default(int(works))
            hi = int(works) if best is not None else top
        if best is None:
            best = default(top)
            if best is None:
                raise ValueError(refusal) from None
        for _ in range(_BISECTIONS):
            if hi - lo <= max(1, hi // 200):
                break
            mid = (lo + hi) // 2
            result = default(mid)
            if result is not None:
                best, hi = result, mid
            else:
                lo = mid
        peak = step_peak(chain, sizes)
        given = hi + resident
        other = f" of offload()'s own choice (method {best.method!r}, not {self.method!r})" if self.method is not None else ""
        done = (
            f"memory={self.budget.value:g} of the keep-all peak is {asked} for {shapes}, which offload() did not plan "
            f"for, and no schedule fits in it; these shapes train with a plan{other} for {exact_bytes(given)} "
            f"({given / peak:.3g} of their keep-all peak {exact_bytes(peak)}, the least memory a plan was found to fit "
            "in): more than asked, no more than plain PyTorch's keep-all peak, the same numbers"
        )
        _warn(f"{done}. Give a larger fraction, or memory= in bytes to cap every shape (a shape that fits no plan is "
              "then refused); handle.prepare(sample) plans a shape before training")
        return best, platform.with_memory(hi), done


    def measure(
        self, instrument: Instrument, args: tuple, kwargs: dict, like: Plan | None = None, *, redraw: bool = True
    ) -> Sizes:
        """The sizes of one call from one forward (no backward, no timing), with the units
        ``like``'s profile found written where no version counter sees (NOTE [ writes no version
        counter sees ] in _recorder.py: found in a backward, which this measure has not).
        ``redraw=False``: measured under the call's own draws alone (NOTE [ blocks a profile
        cannot run ] in _recorder.py)."""
        # Watched as a profile is (NOTE [ blocks a recomputation would get wrong ]): under the
        # call's own draws this pass may run a block no profile ran (one it collapsed), and a plan
        # solved on these sizes avoids recomputing what any watched pass saw unsafe.
        with _watch_blocks(instrument.blocks, self.model) as unsafe:
            sizes = measure_call_sizes(instrument, self.model, args, kwargs, self.device, redraw=redraw)
        for b, why in unsafe.items():
            self.unsafe.setdefault(b, why)
        for b, why in unsafe.inputs.items():
            self.inputs_written.setdefault(b, why)
        return self.with_written(sizes, like)

    def with_written(self, sizes: Sizes, like: Plan | None) -> Sizes:
        """``sizes`` with the units ``like``'s profile found written where no version counter
        sees (NOTE [ writes no version counter sees ] in _recorder.py) unmovable too, and, when
        ``sizes`` come of a pass with no backward, the gradients ``like``'s held storages wait
        for, scaled (NOTE [ the gradient a held storage waits for ])."""
        if like is not None and like.sizes is not None:
            written = {u: w for u, w in like.sizes.unmovable.items() if WRITTEN in w and u <= len(sizes.saved)}
            if written:
                sizes = dataclasses.replace(sizes, unmovable={**sizes.unmovable, **written})
            if not sizes.held_grad and like.sizes.held_grad and len(like.sizes.act) == len(sizes.act):
                # A pass with no backward measures no gradient: the gradients held storages wait
                # for (NOTE [ the gradient a held storage waits for ] in _recorder.py) are like's,
                # scaled as its transients are, by the ratio of the unit's output.
                act0, act = like.sizes.act, sizes.act
                scaled = tuple(
                    (i, j, math.ceil(g * act[i] / act0[i]) if act0[i] else g, out, i in sizes.held)
                    for i, j, g, out, _ in like.sizes.held_grad
                )
                sizes = dataclasses.replace(sizes, held_grad=scaled)
        return sizes

    def reuse(self, ref: Plan, sizes: Sizes, key: tuple) -> Plan | None:
        """``ref``'s schedule as the plan of a call with ``sizes``, if it fits this call's budget
        when simulated on this call's chain (sizes measured, times scaled from ``ref``'s by the
        ratio of each stage's output): NOTE [ one plan for many shapes ] in api.py."""
        chain = scaled_chain(ref, sizes)
        if chain is None or ref.platform is None:
            return None
        keep = co.solvers.check_keep(chain, self.keep)
        if resident_units(chain, sizes, keep) & set(ref.schedule.offloaded_units):
            return None  # a unit the schedule moves cannot move at these shapes
        written = {u for u, why in sizes.unmovable.items() if WRITTEN in why}
        if written & _recomputed(ref.schedule):
            return None  # a write found at these shapes that a recomputation would miss (NOTE [ writes no version counter sees ])
        resident = sizes.resident_bytes
        platform = self.link.with_memory(max(0, self.budget.bytes_for(chain, resident, step_peak(chain, sizes)) - resident))
        try:
            timeline = co.simulate(chain, platform, ref.schedule)
        except (ValueError, co.PlatformError):
            return None
        if not timeline.feasible:
            return None
        host = sizes.host_bytes(ref.schedule.offloaded_units)
        if self.host_memory is not None and host > self.host_memory:
            return None
        return Plan(
            key, chain, platform, ref.schedule, None, sizes, frozenset(keep), host, reused_from=ref.key,
            not_recomputable=ref.not_recomputable, overlap=self.overlap,
        )

    def rescale(self, instrument: Instrument, ref: Plan, sizes: Sizes, key: tuple) -> Plan | None:
        """A plan solved for a call of measured ``sizes`` on times scaled from ``ref``'s profile
        (NOTE [ one plan for many shapes ] in api.py); ``None`` when the chains do not match or
        nothing fits (a profile then says why)."""
        chain = scaled_chain(ref, sizes)
        if chain is None:
            return None
        # Every profile watched the model's own calls, and what any of them saw unsafe (the code
        # before the first block included, key 0) is in self.unsafe; the executor checks again.
        blocks = _Unsafe(instrument.blocks, dict(self.unsafe), prefix_watched=True, inputs=self.inputs_written)
        keep = co.solvers.check_keep(chain, self.keep)
        resident = sizes.resident_bytes
        platform = self.link.with_memory(max(0, self.budget.bytes_for(chain, resident, step_peak(chain, sizes)) - resident))
        try:
            result = solve_for(chain, platform, self.method, keep, sizes, self.options, key, blocks=blocks, overlap=self.overlap)
        except ValueError:
            return None
        host = sizes.host_bytes(result.schedule.offloaded_units)
        if self.host_memory is not None and host > self.host_memory:
            return None
        remat = self.method is None or co.solvers.spec(self.method).remat
        banned = plan_not_recomputable(chain, sizes, blocks, result.schedule) if remat else {}
        return Plan(key, chain, platform, result.schedule, result, sizes, keep, host, not_recomputable=banned, overlap=self.overlap,
                    times_from=ref.key)


def scaled_chain(ref: Plan, sizes: Sizes) -> co.Chain | None:
    """The chain of a call with measured ``sizes``, its times and transients ``ref``'s scaled
    by the ratio of each stage's output size (NOTE [ one plan for many shapes ] in api.py);
    ``None`` when ``ref`` has no profile or another number of stages."""
    chain0, sizes0 = ref.chain, ref.sizes
    n = chain0.length
    if sizes0 is None or len(sizes.saved) != n:
        return None
    ratio = [sizes.act[i] / sizes0.act[i] if sizes0.act[i] else 1.0 for i in range(1, n + 1)]
    late0 = sizes0.late_tmp or (0,) * n
    again0 = sizes0.restore_tmp or (0,) * n  # chain_of adds this call's own
    held_f0, held_b0 = held_grad_tmp(sizes0, n)  # and these (Planner.with_written carries ref's over)
    unowned0 = sizes0.unowned_tmp or (0,) * n  # NOTE [ storages no unit owns ] in _recorder.py
    fwd_tmp = [
        int(max(0, int(chain0.fwd_tmp[i]) - int(late0[i]) - int(again0[i]) - held_f0[i] - int(unowned0[i])) * ratio[i])
        for i in range(n)
    ]
    bwd_tmp = [
        int(max(0, int(chain0.bwd_tmp[i]) - (sizes0.output_bytes if i < n - 1 else 0) - held_b0[i]) * ratio[i]) for i in range(n)
    ]
    fwd = [float(chain0.fwd[i]) * ratio[i] for i in range(n)]
    # The executor's host work per recomputation (NOTE [ what a recomputation costs the
    # executor ] in _recompute.py) does not grow with the shapes: carried over as it was.
    extra = [max(0.0, float(chain0.fwd_nosave[i]) - float(chain0.fwd[i])) for i in range(n)]
    nosave = [f + e for f, e in zip(fwd, extra, strict=True)] if any(extra) else None
    return chain_of(
        sizes, fwd, [float(chain0.bwd[i]) * ratio[i] for i in range(n)], fwd_tmp, bwd_tmp, nosave, chain0.name,
    )


def charge_recomputation(chain: co.Chain, blocks: Any, device: torch.device | str) -> co.Chain:
    """``chain`` with, on CPU, the executor's host seconds per recomputation of each block added
    to its ``fwd_nosave`` (NOTE [ what a recomputation costs the executor ] in _recompute.py);
    ``chain`` itself elsewhere. Stages with no block of their own (the code before the first
    block, a block's tail) are never recomputed by the executor and get nothing."""
    from ._recompute import recompute_overhead

    device = torch.device(device)
    if device.type != "cpu":
        return chain
    nosave = [float(t) for t in chain.fwd_nosave]
    for stage in range(1, chain.length + 1):
        b = blocks.block_at(stage)
        if not b:
            continue
        nosave[stage - 1] += recompute_overhead(blocks.modules[b - 1], blocks.hidden_in[b - 1], device)
    return chain.replace(fwd_nosave=nosave)


#: Solves the search for a later shape's least memory may take (NOTE [ a later shape that fits no plan ]).
_BISECTIONS = 8


def _warn(text: str) -> None:
    warnings.warn(f"chainoffload_torch: {text}", RuntimeWarning, stacklevel=5)


# NOTE [ a later shape that fits no plan ]
# offload() refuses up front a budget that fits no plan: the user chooses again before training.
# A shape met later (on_new_shape="replan", or handle.prepare) is planned inside training, where
# a refusal stops a run that plain PyTorch would carry on, so the planner tries, in order:
# * a method named by the user that finds nothing (a heuristic such as largest-first can miss a
#   schedule that exists: the fuzz's model 4457 at 781 B, floors at 592 B): offload()'s own
#   choice among EXECUTABLE_METHODS at the same budget, after a warning;
# * a budget given as a fraction: the fraction is of each shape's keep-all peak, and the floors
#   are not the same fraction of it at every shape (the fuzz's model 4991: 0.34 fit at a batch
#   of 2, the floor of any schedule is 0.344 of the peak at a batch of 4). The plan is made at
#   the least memory offload()'s own choice is found to fit in, by a bisection of at most
#   _BISECTIONS solves, after a warning that names both figures: more memory than asked, never
#   more than the keep-all peak plain PyTorch needs;
# * a budget in bytes is a cap the user set for every shape: refused, with what to do.
# The numbers trained are the same in every case; the plan's `fallback` and handle.table() say
# what was done. docs/model.md states the rule ("Budgets at later shapes").


# NOTE [ resident outside the chain ]
# Some activations stay on the device for the whole step whatever the schedule does, and are no
# unit's: what the code before the first block saves besides a_0 (when it is not a stage of its
# own: NOTE [ prefix and suffix ] in _recorder.py), and the storages pinned because something
# holds them beyond their unit's backward (a key/value cache in the output, a tensor later blocks
# read, a list of skips in the forward: NOTE [ units held elsewhere ] in _stages.py). Their bytes
# R (Sizes.resident_bytes) are counted outside the chain, as weights are: the chain's act[0] is
# a_0 alone (so g_0, which docs/model.md makes act[0] bytes at B_1, is a_0's gradient and not
# the stem twice), the solver gets the budget less R, and the step's peak is the simulated peak
# plus R (Plan.predicted_peak, StepStats.predicted_peak). R is a superset of their lifetime
# (made in the forward, gone by the end of the backward), so the prediction errs only on the
# safe side there; a fraction such as memory=0.6 is of the step's keep-all peak, the chain's
# plus R (step_peak). docs/model.md states the rule ("The PyTorch adapter's chain").


# NOTE [ a pinned a_i never moves ]
# A block's a_i that later blocks hold, when the next stage is its block's tail, is pinned
# alone (NOTE [ units held elsewhere ] in _stages.py): resident outside the chain, never owned,
# so no transfer of its unit moves it; the rest of the unit moves (saved[i] leaves it out).
# The chain still has act[i] (the tail reads it, B_{i+1} makes g_i of its size), and a
# schedule may offload the a_i an Fck_i / Fn_i made alone: that transfer moves nothing
# (the executor's ledger pins a_i in an Fck_i / Fn_i too: NOTE [ pins in a stage run without
# saving ] in _stages.py). The plan's bytes moved leave it out, so they are the executor's;
# the simulated timeline keeps it (a copy that takes time and frees act[i] it never held:
# the pinned bytes are counted resident besides, so its memory is an upper bound).


def moved_bytes(schedule: co.Schedule, chain: co.Chain, sizes: Sizes | None) -> int:
    """Bytes the offloads of ``schedule`` move: :meth:`chainoffload.Schedule.offloaded_bytes`
    less those of an a_i alone of a unit in ``sizes.pinned_act`` (NOTE [ a pinned a_i never moves ])."""
    moved = schedule.transfer_bytes(chain)
    pinned = sizes.pinned_act if sizes is not None else frozenset()
    parts = schedule.transfer_parts(chain)
    return int(
        sum(
            moved[k]
            for k, t in enumerate(schedule.transfers)
            if t.kind == "offload" and not (t.unit in pinned and parts[k] == "act")
        )
    )


def resident_units(chain: co.Chain, sizes: Sizes, keep: Iterable[int] = ()) -> set[int]:
    """The units no plan may offload: the user's, the aliased and held ones (they cannot
    move), and unit L (moving it gains nothing, and it holds the suffix: NOTE [ prefix and
    suffix ])."""
    return set(keep) | set(sizes.resident) | {chain.length}


def solve_for(
    chain: co.Chain,
    platform: co.Platform,
    method: str | None,
    keep: Iterable[int],
    sizes: Sizes,
    options: dict[str, Any],
    key: tuple | None = None,
    blocks: Any = None,
    overlap: bool = True,
) -> co.Result:
    """Solve keeping resident the user's units, the ones that cannot move, and unit L.

    ``method=None`` with ``blocks`` solves with every method of :data:`EXECUTABLE_METHODS` and
    returns the result of least step time (ties: the first); a method that recomputes is solved on
    :func:`recompute_chain` (never recomputing what the executor cannot run again) and its
    result holds the simulator's figures on ``chain`` itself. The step time is the makespan, or
    with ``overlap=False`` (copies inline with compute, as on CPU) compute and copies one after
    another (:func:`step_time`).

    Raises
    ------
    ValueError
        Nothing fits: the message gives the keep-all peak, the proven floors and the least
        memory known to work (NOTE [ nothing fits ]).
    """
    resident = resident_units(chain, sizes, keep)
    if method is None and blocks is not None:
        methods: tuple[str | None, ...] = EXECUTABLE_METHODS
    else:
        methods = (method,)
    best: co.Result | None = None
    best_time = math.inf
    last: co.Result | None = None
    refused: str | None = None
    for name in methods:
        if len(methods) > 1:
            # Choosing: each method gets the options it takes (time_limit is every method's).
            takes = _takes(name)
            opts = {k: v for k, v in options.items() if k == "time_limit" or takes is None or k in takes}
        else:
            opts = options
        result, why = _solve_one(chain, platform, name, resident, sizes, opts, blocks, overlap)
        last = result if result is not None else last
        refused = why or refused
        if result is None or not result.feasible:
            continue
        mine = _result_time(chain, platform, result, overlap)
        if best is None or mine < best_time:
            best, best_time = result, mine
    if best is not None:
        return best
    if len(methods) == 1:
        if refused and blocks is not None:
            # A forced method the executor cannot carry out: what to do instead, in the message itself.
            refused += (
                f"; method=None lets offload() choose among {', '.join(EXECUTABLE_METHODS)} around it, method='best' "
                "recomputes nothing"
            )
        raise ValueError(nothing_fits(chain, platform, method, resident, keep, sizes, last, key, tried=refused))
    tried = f"no plan of {', '.join(methods)} fits, nor recomputes only what the executor can call again"
    if refused:
        tried += f" ({refused})"
    raise ValueError(nothing_fits(chain, platform, None, resident, keep, sizes, None, key, tried=tried))


def _solve_one(
    chain: co.Chain, platform: co.Platform, method: str | None, resident: set[int], sizes: Sizes,
    options: dict[str, Any], blocks: Any, overlap: bool = True,
) -> tuple[co.Result | None, str | None]:
    """``method``'s result (``None`` when it has none the executor can carry out) and, then, why."""
    remat = method is not None and co.solvers.spec(method).remat
    solved_on = recompute_chain(chain, sizes, blocks) if remat and blocks is not None else chain
    takes = _takes(method)
    kept = {"keep": sorted(resident)} if takes is None or "keep" in takes else {}
    try:
        result = co.solve(solved_on, platform, method, **kept, **options)
    except co.PlatformError:
        return None, None
    if solved_on is not chain:
        result = _checkpointing_if_faster(chain, platform, result, not_recomputable(chain, sizes, blocks), overlap)
    if not result.feasible:
        return result, None
    moved = sorted(set(result.schedule.offloaded_units) & resident)
    if not kept and moved:
        # A method that takes no keep= (a registered one; every built-in method that offloads,
        # joint included, takes it) moved a unit that cannot move (aliased, held, saving what a
        # byte copy cannot carry): the executor would free less than planned.
        return None, f"method {method}: its plan offloads unit(s) {moved}, which must stay resident"
    if solved_on is chain:
        return result, None
    stale = stale_inputs(chain, blocks, result.schedule)
    if stale:
        # NOTE [ an input written after its block returned ]: solved again, never recomputing those blocks.
        strict = _Unsafe(
            getattr(blocks, "blocks", blocks), {**getattr(blocks, "unsafe", {}), **blocks.inputs},
            getattr(blocks, "prefix_watched", False), inputs={},
        )
        return _solve_one(chain, platform, method, resident, sizes, options, strict, overlap)
    banned = not_recomputable(chain, sizes, blocks)
    comp = result.schedule.compute
    seen: set[int] = set()
    for kind, s in comp:
        if kind == "B":
            continue
        if (kind != "F" or s in seen) and s in banned:
            return None, f"method {method}: fits only by recomputing stage {s}, which the executor cannot: {banned[s]}"
        seen.add(s)
    timeline = co.simulate(chain, platform, result.schedule)
    if not timeline.feasible:
        return None, f"method {method}: {timeline.violation}"
    return dataclasses.replace(result, makespan=timeline.makespan, peak_memory=timeline.peak_memory, timeline=timeline), None


# NOTE [ checkpointing what the executor can recompute ]
# rotor never loses to checkpoint-all on the chain it solves (NOTE [ never lose to the family ]
# in chainoffload/solvers/rotor.py), but a method that recomputes is solved on recompute_chain,
# where checkpoint-all's Fck of a stage the executor cannot run again (the prefix stage, a stage
# whose a_i the code after it makes) costs a prohibitive time: the family member a user compares
# with -- gradient_checkpointing_enable(), which leaves the embeddings unwrapped -- is
# checkpoint-all with those stages run F once and kept whole. It is the plan's candidate too,
# simulated on the profiled chain: where it fits and is faster (or the method found nothing that
# fits), it is the method's plan, so offload() is never slower than checkpointing every block the
# executor can recompute, at any memory where that fits.


def _checkpointing_if_faster(
    chain: co.Chain, platform: co.Platform, result: co.Result, banned: dict[int, str], overlap: bool = True,
) -> co.Result:
    """``result``, or checkpoint-all keeping ``banned`` stages whole where it fits and is faster
    (by :func:`step_time`: ``overlap=False`` counts ``result``'s copies inline)."""
    from chainoffload.solvers.remat_baselines import checkpoint_all_schedule

    whole = {i for i in banned if i < chain.length}
    schedule = checkpoint_all_schedule(chain.length, whole=whole)
    timeline = co.simulate(chain, platform, schedule)
    if not timeline.feasible:
        return result
    if result.feasible:
        mine = co.simulate(chain, platform, result.schedule)
        if mine.feasible and step_time(mine, overlap) <= step_time(timeline, overlap):
            return result
    info = {**(result.info or {}), "source": "checkpoint-all of the blocks the executor can recompute"}
    return dataclasses.replace(
        result, status=co.Status.FEASIBLE, schedule=schedule, makespan=timeline.makespan,
        peak_memory=timeline.peak_memory, timeline=timeline, offloaded_bytes=0, min_memory=None, info=info, message="",
    )


def step_time(timeline: co.Timeline, overlap: bool = True) -> float:
    """A step's predicted time under ``timeline``'s schedule: its makespan where copies overlap
    compute, else ``timeline.serial_makespan`` (compute and copies one after another, as the
    executor's copies run on CPU: NOTE [ copies on CPU ] in _link.py)."""
    return timeline.makespan if overlap else timeline.serial_makespan


def _result_time(chain: co.Chain, platform: co.Platform, result: co.Result, overlap: bool) -> float:
    """``result``'s step time on ``chain`` (:func:`step_time`); its own makespan where copies overlap."""
    if overlap:
        return result.makespan
    return step_time(co.simulate(chain, platform, result.schedule), overlap)


def _takes(method: str | None) -> set[str] | None:
    """The options ``method`` takes (``None``: any)."""
    import inspect

    func = co.solvers.spec(method or co.solvers.DEFAULT_METHOD).load()
    params = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return set(list(params)[2:])


# NOTE [ one call chooses ]
# offload(model, batch, memory=...) with no method solves with pure offloading (best), with
# recomputation (rotor) and with both (joint), each on the same profile, and keeps the plan of
# least simulated step time that fits (ties: pure offloading first, which recomputes nothing);
# where copies do not overlap compute (CPU) that time counts every copy inline (NOTE [ copies on
# CPU ] in _link.py), so a plan that copies more than it would recompute loses there.
# A method that recomputes is solved on the chain with a prohibitive fwd_nosave for the stages
# the executor cannot call again (not_recomputable): the code before the first block when it is
# a stage, a block's tail (NOTE [ the code after a block as a stage ] in _instrument.py), a block
# whose a_i the code after it makes where that code is no tail, the last block (head and loss), a block
# that returns its input or a view of it. Its schedule is then simulated on the profiled chain
# itself, so the step time compared is the real chain's; a schedule that still recomputes one of
# them (the only way to fit) counts as not fitting. method= forces one method.


class _Found(dict):
    """What a watch of the blocks found: {block: why it must not be recomputed}, and ``inputs``:
    {block: why it must not be recomputed from an offloaded copy of its input} (NOTE [ an input
    written after its block returned ])."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: dict[int, str] = {}


class _Unsafe:
    """The chain's blocks, with the blocks a profile saw to be unsafe to recompute (key 0: the
    code before the first block) and whether the profile watched the model's own calls
    (``prefix_watched``: only then may the code before the first block be recomputed);
    ``inputs``: the blocks never recomputed from an offloaded copy of their input (default:
    ``unsafe.inputs``, NOTE [ an input written after its block returned ])."""

    def __init__(
        self, blocks: Any, unsafe: dict[int, str], prefix_watched: bool = False, inputs: dict[int, str] | None = None,
    ) -> None:
        self.blocks = blocks
        self.unsafe = unsafe
        self.prefix_watched = prefix_watched
        self.inputs = dict(getattr(unsafe, "inputs", {}) if inputs is None else inputs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.blocks, name)


def _recomputed(schedule: co.Schedule) -> set[int]:
    """The stages ``schedule`` recomputes: a first forward op that saves nothing, or a later one."""
    seen: set[int] = set()
    redone: set[int] = set()
    for kind, i in schedule.compute:
        if kind == "B":
            continue
        if kind != "F" or i in seen:
            redone.add(i)
        seen.add(i)
    return redone


# NOTE [ blocks a recomputation would get wrong ]
# Some blocks can be called again and still not give what the forward gave, and a schedule must
# not recompute them (the executor checks again at every step and refuses mid-training rather
# than train wrong). The profiling passes are watched for them, with module hooks of their own
# around every block call: a block that modifies its hidden input in place (the checkpoint it
# would start from is gone), a block whose output the code after it modifies in place before the
# next block reads it (a recomputed a_i would miss the change; the next block is then not
# recomputed from an offloaded copy of it: NOTE [ an input written after its block returned ]), a block with forward pre-hooks
# of its own (a recomputation would run them again on arguments they already changed), a block
# given an object that holds state its forward changes which a recomputation cannot put back (a
# cache whose tensors the call writes in place, an object without __dict__: NOTE [ state a
# recomputation puts back ] in _recompute.py; a transformers DynamicCache or EncoderDecoderCache
# is put back, and the block recomputed), a block that changes an argument it is given (appends to a list): NOTE [ arguments a recomputation
# would change again ] in _recompute.py, and a block whose output is a view that is modified in
# place after the block returns (by the next block, the code between, or any later code).
#
# That last one: the executor's recomputation of block i runs at the start of B_i, marked by a
# tensor hook on a_i, and fills the slots of the graph the no-save forward made. An in-place op
# on a view rebases the view's history onto its base (CopySlices on the base, whose next edge is
# the base's own node in block i's graph), so the gradient enters block i's graph around a_i's
# node: a_i's hook never fires, and block i's saved tensors are unpacked before anything
# recomputed them (the executor then raises; the fuzz found it with a transpose block's
# reshaped output and a next block starting with relu_). An in-place op on a_i itself, or on a
# view of an a_i that is no view, keeps a_i's node on the path and its hook fires. Such a block
# is kept, not recomputed; offloading it stays safe (a read before its prefetch fetches it).
#
# Which passes are watched: every profile's, and every measuring forward's (_Planner.measure: a
# new shape's sizes, or a call's own LayerDrop draws when its shapes' plan holds only for calls
# that skip the blocks its profile could not run). What any of them saw is the handle's
# (self.unsafe), and a plan solved on measured sizes avoids it. A block a profile collapsed
# (NOTE [ blocks a profile cannot run ] in _recorder.py) is first run by such a measuring pass:
# unwatched, the fuzz's model 2747 (seed 43) got a plan recomputing a block that adds to its
# input in place, and the executor raised mid-step (tests/test_torch_layerdrop_recompute.py).


# NOTE [ an input written after its block returned ]
# The code between blocks i and i+1 may modify a_i in place (h.mul_(0.9)). Block i is then never
# recomputed (a recomputed a_i would miss the write: above). Block i+1 reads the written a_i, and
# a recomputation of it starts from the a_i the executor holds: the tensor itself, written, when
# unit i stays on the device (right), but a copy taken when unit i's offload was queued, at the
# end of F_i, before the write, when unit i is offloaded: the executor then refused in the
# backward, mid-step (the recomputing fuzz's model 4301 of seed 43: offload()'s own choice,
# joint, offloaded unit 2 and recomputed stage 3 from it). Pure offloading is safe (block i+1
# saves a_i again after the write, and a storage saved again after its offload was queued is
# copied again), and so is a plan that keeps unit i resident (rotor). Decision: the watch
# records such a block i+1 apart (_Found.inputs); a schedule that recomputes it and offloads
# unit i is solved again with it never recomputed (_solve_one), and the plan's not_recomputable
# names it, with why, where the schedule offloads unit i (handle.table()). Not chosen: keeping
# unit i resident whenever block i+1 is recomputed (keep= cannot say "whenever": it would keep
# unit i in plans that never recompute block i+1), or banning block
# i+1's recomputation for every method (rotor lost it: 4301 at 0.5 of the keep-all peak).


# NOTE [ a write on a carried a_0 ]
# A profiling pass whose forward skipped the first block(s) (LayerDrop) runs them in their place
# from the next block's pre-hook (NOTE [ the code after a skipped block ] in _instrument.py), after
# the model's code past their places ran on the carried a_0, the output of the code before the
# blocks. A write there (h.mul_ after block 0) is a write on block 0's output in a step that
# runs block 0, but the watch compares a block's input with the output of the block before, and
# block 0 has none: with every watched pass skipping block 0 (the recomputing fuzz's model 878 of
# seed 43, LayerDrop 0.1, recompute-all), block 0 was recomputed and the first step that ran it
# was refused at block 1's start. The carried a_0's version is now compared with the one it had
# when the code before the blocks returned it: 0 for a tensor that code made, the version the
# model's call got for an argument handed on (a view of one included). A difference marks the
# code before the blocks (when it is a stage), each block skipped and the blocks reading their
# outputs, as a write after a skipped block does. It may over-mark: a prefix that writes its own
# output in place (version 1 at its end) loses recomputation of those blocks in a pass that
# skips them; it never under-marks a write a version counter sees.


@contextlib.contextmanager
def _watch_blocks(blocks: Any, model: nn.Module | None = None) -> Iterator[dict[int, str]]:
    """Watch the blocks' calls while profiling; yield {block index (1-based): why it must not
    be recomputed}, filled when the context exits. With ``model``, its calls are watched too,
    for the code before the first block (key 0: NOTE [ recomputing the code before the first
    block ] in _recompute.py)."""
    from ._instrument import IN_PLACE_OF, _Hook
    from ._recompute import argument_state, arguments_state, state_call_ended, stateful_argument
    from ._saved import version_probe

    found = _Found()
    n = len(blocks.modules)
    calls = [0]  # the block called last in this pass (0: none yet)
    places: dict[int, list[int]] = {}
    for b, module in enumerate(blocks.modules, start=1):
        places.setdefault(id(module), []).append(b)

    # "root": the model's call and its arguments' state (NOTE [ recomputing the code before the
    # first block ] in _recompute.py); "views": per block of this pass whose output is a view,
    # (block, a probe of the output's version counter that holds none of its storage, the
    # version at the block's end).
    state: dict[str, Any] = {"open": [], "last": None, "root": None, "views": [], "versions": {}}

    def root_pre(module: nn.Module, a: tuple, kw: dict) -> None:
        # A new pass: one before it may have stopped inside a block (a profiling pass that
        # skipped its last blocks, drawn again), which would shift every count after it.
        calls[0] = 0
        state["open"], state["last"] = [], None
        why = stateful_argument(module, a, kw, None)
        if why is not None:
            found.setdefault(0, f"the model's call {why}")
        state["root"] = ((a, kw), arguments_state((a, kw)))
        state["versions"] = {id(t): t._version for t in _tensors((a, kw))}

    def root_post(module: nn.Module, a: tuple, kw: dict, out: Any) -> None:
        # Changed anywhere in the step's forward (a loss that fills labels in place): a
        # recomputation in the backward would read other arguments than the forward did.
        root = state["root"]
        state["root"] = None
        if root is not None and arguments_state(root[0]) != root[1]:
            found.setdefault(0, "the model's forward changes an argument it is given, so a recomputation would read other values")

    def views_modified() -> None:
        for b, probe, ver in state["views"]:
            if probe._version != ver:
                found.setdefault(
                    b, "its output is a view that later code modifies in place, so the backward reaches the block "
                    "around its output, before a recomputation could run"
                )

    def written(outputs: Iterable[int], unsure: bool) -> None:
        # Each block of ``outputs`` (0: the code before the first block) may have had its output
        # modified in place by the code after it, and the block after it then read the written
        # tensor (NOTE [ an input written after its block returned ]).
        outputs = tuple(outputs)
        for k in outputs:
            if k == 0:
                found.setdefault(
                    0, "its output a_0 is modified in place by the code after the first block's place when a step skips "
                    "that block, so a recomputed a_0 would miss the write"
                )
            elif unsure:
                found.setdefault(
                    k, "its output is modified in place by the code after it, or after the blocks a step skipped "
                    "after it (the profile cannot tell which), before the next block reads it"
                )
            else:
                found.setdefault(k, "its output is modified in place by the code after it, before the next block reads it")
        for k in outputs:
            if k + 1 <= n:
                found.inputs.setdefault(
                    k + 1, "the code before it modifies its input in place after the block before returned it, so a copy "
                    "of that input offloaded at the end of the block before would miss the write"
                )

    def a0_written(hidden: Any) -> bool:
        # The carried a_0's version against the one it had when the prefix returned it: 0 for
        # a tensor the prefix made, the model's call's for an argument handed on as it is.
        if not isinstance(hidden, torch.Tensor):
            return False
        root = state["root"]
        made = 0
        if root is not None:
            for t in _tensors(root[0]):
                if t is hidden or (t._base if t._is_view() else t) is (hidden._base if hidden._is_view() else hidden):
                    made = state["versions"].get(id(t), 0)
                    break
        return hidden._version != made

    def pre(module: nn.Module, a: tuple, kw: dict) -> None:
        # The next of this module's places after the block called last: a block a pass leaves
        # out (NOTE [ blocks a profile cannot run ] in _recorder.py) is never called.
        at = places[id(module)]
        b = next((x for x in at if x >= calls[0] % n + 1), at[0])
        calls[0] = b
        root = state["root"]
        if b == 1 and root is not None and arguments_state(root[0]) != root[1]:
            found.setdefault(0, "it changes an argument the model is given: a recomputation would change it again")
        views_modified()
        if b == 1:
            state["views"] = []  # a new pass: the last one's outputs were checked up to here
        hidden = blocks.hidden_of(b, a, kw)
        last = state["last"]
        skipped = IN_PLACE_OF[0]
        if last is not None and last[0] == b - 1 and last[1]() is hidden and hidden._version != last[3]:
            if skipped is not None and skipped[0] == b:
                # NOTE [ the code after a skipped block ] in _instrument.py: the write was made by
                # the code after block b - 1 or after the place of a block the forward skipped.
                written(range(b - 1, skipped[1]), True)
            else:
                written((b - 1,), False)
        elif b == 1 and skipped is not None and skipped[0] == 1 and a0_written(hidden):
            # NOTE [ a write on a carried a_0 ]: the forward skipped the first block(s), and the
            # code after their places wrote the prefix's output before the instrument ran them.
            written(range(0, skipped[1]), True)
        elif last is not None and last[0] == b - 1 and b - 1 in getattr(blocks, "tails", ()) and last[2]._version != last[3]:
            # The tail (NOTE [ the code after a block as a stage ] in _instrument.py) wrote the
            # block's output: a recomputed one would not have that write.
            found.setdefault(b - 1, "its output is modified in place by the code after it")
        state["last"] = None
        ver = hidden._version if isinstance(hidden, torch.Tensor) else None
        # NOTE [ arguments a recomputation would change again ] in _recompute.py.
        hidden_at = blocks.hidden_in[b - 1]
        # NOTE [ state a recomputation puts back ]: a state object (a cache) is put back around a
        # recomputation, unless its graph cannot be pictured or the call changes it in a way the
        # picture cannot undo (checked at the call's end).
        objects, why = argument_state(module, a, kw, hidden_at)
        if why is not None:
            found.setdefault(b, why)
        where, key = hidden_at
        others = (
            tuple(x for j, x in enumerate(a) if not (where == "arg" and j == key)),
            {k: v for k, v in kw.items() if not (where == "kw" and k == key)},
        )
        state["open"].append((b, hidden, ver, others, arguments_state(others), objects))

    def post(module: nn.Module, a: tuple, kw: dict, out: Any) -> None:
        if not state["open"]:
            return
        b, hidden, ver, others, before, objects = state["open"].pop()
        if objects is not None:
            why = state_call_ended(objects)[3]
            if why is not None:
                found.setdefault(b, why)
        if ver is not None and hidden._version != ver:
            found.setdefault(b, "modifies its hidden input in place")
        if arguments_state(others) != before:
            found.setdefault(
                b, "changes an argument it is given (appends to a list, modifies a tensor in place): a recomputation "
                "would change it again"
            )
        views_modified()
        first = next(iter(t for t in _tensors(out)), None)
        # By weak reference and a version probe: held here, the output would look held by the
        # forward's code past its tail (NOTE [ late release ] in _recorder.py).
        state["last"] = (b, weakref.ref(first), version_probe(first), first._version) if first is not None else None
        if first is not None and first.requires_grad and first._is_view():
            state["views"].append((b, version_probe(first), first._version))

    handles = []
    for b, module in enumerate(blocks.modules, start=1):
        if any(not isinstance(h, _Hook) for h in module._forward_pre_hooks.values()):
            found.setdefault(b, "has forward pre-hooks of its own (a recomputation would run them again)")
    if model is not None:
        if any(not isinstance(h, _Hook) for h in model._forward_pre_hooks.values()) or nn.modules.module._global_forward_pre_hooks:
            found.setdefault(0, "the model has forward pre-hooks of its own (a recomputation would not run them)")
        if 1 in found and "pre-hooks" in found[1]:
            found.setdefault(0, "its first block has forward pre-hooks of its own (a recomputation would stop before them)")
        # First among the model's pre-hooks: it sees the arguments as the model's call got them.
        handles.append(model.register_forward_pre_hook(root_pre, with_kwargs=True, prepend=True))
        handles.append(model.register_forward_hook(root_post, with_kwargs=True))
    for module in {id(m): m for m in blocks.modules}.values():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        yield found
    finally:
        views_modified()  # the last pass's outputs, modified by the code after the last block
        state["views"] = []
        for h in handles:
            h.remove()


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    from ._tree import tensors_in

    return tensors_in(obj)


def not_recomputable(chain: co.Chain, sizes: Sizes | None, blocks: Any) -> dict[int, str]:
    """The stages the executor cannot recompute, each with why (NOTE [ one call chooses ])."""
    length = chain.length
    out: dict[int, str] = {length: "the last block, with the head and the loss"}
    off = int(getattr(blocks, "prefix", False))
    tails = tuple(getattr(blocks, "tails", ()))

    def stage_of(b: int) -> int:
        return b + off + sum(1 for t in tails if t < b)

    for b, why in getattr(blocks, "unsafe", {}).items():
        if stage_of(b) >= 1:  # key 0 is the code before the first block, a stage only with the prefix
            out.setdefault(stage_of(b), why)
    if off and not getattr(blocks, "prefix_watched", False):
        # NOTE [ recomputing the code before the first block ] in _recompute.py: only where the
        # profile watched the model's calls (its hooks, its arguments).
        out.setdefault(1, "the code before the first block, whose model calls the profile did not watch")
    if blocks is not None:
        for b in range(1, len(blocks.modules)):
            if b in tails:
                # NOTE [ the code after a block as a stage ] in _instrument.py: the block is linked
                # to its tail, which is no module call.
                out.setdefault(stage_of(b) + 1, "the code after a block, before the next one: no module call to run again")
            elif not blocks.is_linked(b):
                out.setdefault(stage_of(b), "its a_i is made by the code after the block")
    for u in getattr(sizes, "aliased", ()) or ():
        out.setdefault(u, "returns its input or a view of it (units share storage)")
    for u in sorted(getattr(sizes, "held", ()) or ()):
        # NOTE [ a held unit is never recomputed ]
        out.setdefault(
            u,
            f"{_held_reason((getattr(sizes, 'held_why', None) or {}).get(u))}: the original stays alive while that holds "
            "it, so a recomputation frees none of it (the chain would count it freed)",
        )
    for u, why in (getattr(sizes, "unmovable", None) or {}).items():
        if WRITTEN in why:
            # Running the block again cannot replay a write its caller made through .data.
            out.setdefault(u, "its tensors are written after its forward where no version counter sees it (.data)")
    return out


def input_written(chain: co.Chain, blocks: Any) -> dict[int, str]:
    """The stages whose input the code before them modifies in place after the stage before
    returned it, each with why (NOTE [ an input written after its block returned ])."""
    inputs = getattr(blocks, "inputs", None) or {}
    off = int(getattr(blocks, "prefix", False))
    tails = tuple(getattr(blocks, "tails", ()))
    out: dict[int, str] = {}
    for b, why in inputs.items():
        s = b + off + sum(1 for t in tails if t < b)
        if 2 <= s < chain.length:
            out[s] = why
    return out


def stale_inputs(chain: co.Chain, blocks: Any, schedule: co.Schedule) -> dict[int, str]:
    """The stages ``schedule`` recomputes from an offloaded copy of an input written after its
    offload was queued (NOTE [ an input written after its block returned ])."""
    written = input_written(chain, blocks)
    if not written:
        return {}
    offloaded = set(schedule.offloaded_units)
    return {s: why for s, why in written.items() if s - 1 in offloaded and s in _recomputed(schedule)}


def plan_not_recomputable(chain: co.Chain, sizes: Sizes | None, blocks: Any, schedule: co.Schedule) -> dict[int, str]:
    """:func:`not_recomputable`, and the stages whose written input ``schedule`` offloads (NOTE
    [ an input written after its block returned ]): what handle.table() says is never recomputed."""
    out = not_recomputable(chain, sizes, blocks)
    offloaded = set(schedule.offloaded_units)
    for s, why in input_written(chain, blocks).items():
        if s - 1 in offloaded:
            out.setdefault(s, why)
    return out


# NOTE [ a held unit is never recomputed ]
# A unit held whole (a later block's call takes its output: a U-Net's skip given to the up block
# as an argument; the model's output or the forward's code holding it) keeps its original a_i
# alive until the holder lets go of it: the forward's code to the holder's call, the holder's
# call record to B_holder (NOTE [ a record ends with its stage's backward ] in executor.py). An
# Fck_i / Fn_i would make a lone a_i that the chain frees at Fn_{i+1} or B_{i+1}, while that
# original lives on: no chain field counts a lone a_i to another stage's backward, so a held
# unit is never recomputed (its unit then stays whole from F_i to B_i, which covers every
# holder, and the gradient its holder hands it is counted: NOTE [ the gradient a held storage
# waits for ] in _recorder.py). Recomputing it would free nothing anyway while it is held.


def stage_floor(chain: co.Chain, sizes: Sizes | None) -> int:
    """The least memory any schedule the adapter may run needs on ``chain``, off the budget (add
    ``sizes.resident_bytes`` for a step's): :meth:`Chain.stage_memory_floor` with the units kept
    whole counted where they must be alive (NOTE [ the floor counts held units ]) and, for each
    stage, what its saving forward or the backward after it holds beside it (NOTE [ the floor
    counts the saving forward ])."""
    base = int(chain.stage_memory_floor())
    n = chain.length
    whole = set(getattr(sizes, "held", ()) or ()) | set(getattr(sizes, "aliased", ()) or ())
    whole |= {u for u, why in (getattr(sizes, "unmovable", None) or {}).items() if WRITTEN in why}
    whole = {u for u in whole if 1 <= u <= n}
    act, saved = [int(a) for a in chain.act], [int(v) for v in chain.saved]
    fwd_tmp, bwd_tmp = [int(f) for f in chain.fwd_tmp], [int(b) for b in chain.bwd_tmp]

    # held(k): the units kept whole before stage k, alive whole at every op of stage k and at B_k.
    kept = [0] * (n + 1)
    for i in range(1, n + 1):
        kept[i] = kept[i - 1] + (saved[i - 1] if i in whole else 0)

    def held(k: int) -> int:
        return kept[k - 1]

    def inp(k: int) -> int:
        """a_{k-1} where it is not a_0 nor inside a unit kept whole (counted once)."""
        return act[k - 1] if k > 1 and (k - 1) not in whole else 0

    floor = base
    for k in range(1, n + 1):
        f_need = act[0] + inp(k) + saved[k - 1] + fwd_tmp[k - 1] + held(k)
        b_need = act[0] + inp(k) + saved[k - 1] + act[k] + act[k - 1] + bwd_tmp[k - 1] + held(k)
        floor = max(floor, f_need, b_need)
        if k == n:
            break
        # The F_k whose unit B_k frees ran after B_{k+1} (g_k alive) or before it (unit k whole
        # at B_{k+1}, on the GPU or prefetched back): NOTE [ the floor counts the saving forward ].
        before = act[0] + saved[k - 1] + saved[k] + act[k + 1] + act[k] + bwd_tmp[k] + held(k)
        after = act[0] + inp(k) + saved[k - 1] + fwd_tmp[k - 1] + act[k] + held(k)
        floor = max(floor, before if k in whole else min(before, after))
    return floor


# NOTE [ the floor counts held units ]
# Chain.stage_memory_floor is what one stage needs alone (docs/model.md). A unit held whole is
# never offloaded (resident_units) nor recomputed (NOTE [ a held unit is never recomputed ]), so
# every schedule the adapter runs has it whole from F_i to B_i: at F_k and B_k for k > i it is
# alive beside what stage k needs, and the floor the adapter states (a refusal, handle.table(),
# the search for the least memory that fits) adds it there. So is an aliased unit (it returns
# its input or a view of it: resident, and not_recomputable from the sizes alone) and one
# written where no version counter sees (WRITTEN: unmovable, never recomputed): a U-Net whose up
# blocks take their skips as arguments has its unit 8 aliased, 8 KiB alive at every later op,
# which left the floor 8192 B under what best's plan needs (3.7 % in offload_models.md). Still a
# floor: every term is alive at that op in every schedule the adapter may run, on the chain the
# solver is given.

# NOTE [ the floor counts the saving forward ]
# B_k frees the whole unit k made by the last F_k before it (docs/model.md: Fck and Fn make a
# lone a_k). That F_k ran either after B_{k+1} -- then g_k, allocated at B_{k+1}'s start and
# freed at B_k's end, is alive at its start beside a_0, a_{k-1}, saved[k] and fwd_tmp[k] -- or
# before it, and then unit k is whole on the GPU at B_{k+1}: B_{k+1} reads a_k, a backward op
# reads an offloaded instance through its prefetched copy, allocated when the prefetch starts
# (moves "act" leaves the rest on the GPU), so saved[k] is there beside what B_{k+1} needs. The
# floor takes the lesser of the two for each k < L (the latter only, for a unit kept whole:
# never recomputed, its one F_k runs before B_{k+1}). BART's encoder stages (saved 114 KiB,
# fwd_tmp 32 KiB, its a_k 8 KiB) make it the F_2 run in the backward: 166144 -> 174336 B on the
# chain, what rotor, joint and recompute-all are each found to need (offload_models.md, +4.4 %
# before). A floor on the chain model alone: no executor or solver change.


def recompute_chain(chain: co.Chain, sizes: Sizes | None, blocks: Any) -> co.Chain:
    """``chain`` with a prohibitive ``fwd_nosave`` (and so Fck / Fn) for the stages of
    :func:`not_recomputable`, so that a method that recomputes leaves them alone."""
    banned = not_recomputable(chain, sizes, blocks)
    big = 1e3 * (float(sum(chain.fwd)) + float(sum(chain.bwd)) + 1.0)
    nosave = [big if i in banned else float(t) for i, t in enumerate(chain.fwd_nosave, start=1)]
    return chain.replace(fwd_nosave=nosave)


# NOTE [ nothing fits ]
# The error says what a user needs to choose again: the keep-all peak (enough memory for no
# offloading at all), the proven floors (offload_memory_floor: below it no pure-offloading
# schedule fits whatever is moved; stage_memory_floor: below it no schedule of any kind fits),
# which units had to stay resident and why, and the least memory at which largest-first (fast,
# and keeping the same units) was seen to fit: a budget known to work.


def nothing_fits(
    chain: co.Chain,
    platform: co.Platform,
    method: str | None,
    resident: set[int],
    keep: Iterable[int],
    sizes: Sizes,
    result: co.Result | None,
    key: tuple | None,
    tried: str | None = None,
) -> str:
    """The message of NOTE [ nothing fits ]; ``tried`` says what was solved when several methods were."""
    why = []
    for u in sorted(resident):
        reasons = [r for r, s in (("user", set(keep)), ("aliased", sizes.aliased)) if u in s]
        if u in sizes.held:
            reasons.append(_held_reason(sizes.held_why.get(u)))
        if u in sizes.unmovable:
            reasons.append(f"saves a {sizes.unmovable[u]}")
        if u == chain.length and not reasons:
            reasons = ["last"]
        why.append(f"{u} ({', '.join(reasons)})")
    works = co.minimum_memory(chain, platform, "largest-first", keep=sorted(resident))
    status = f"method {result.method}: {result.status}" if result is not None else (tried or "below any schedule's floor")
    shapes = f" for {describe_key(key)}" if key is not None else ""
    # Every figure is a whole step's: the chain's plus what stays resident outside it.
    r = sizes.resident_bytes
    outside = (f"; {exact_bytes(r)} of it resident outside the chain (held by the forward's output or code, whatever "
               "the plan; the solver gets the budget less it)") if r else ""
    return (
        f"memory: no schedule fits in {exact_bytes(platform.memory + r)}{shapes} ({status}); "
        f"keep-all peak {exact_bytes(step_peak(chain, sizes))}{outside}; proven floors {exact_bytes(offload_memory_floor(chain) + r)} "
        f"for any pure-offloading schedule, {exact_bytes(stage_floor(chain, sizes) + r)} for any schedule at all; "
        f"units kept resident: {', '.join(why)}"
        + (f"; least memory known to work: {exact_bytes(works + r)}" if works is not None else "")
    )


def what_would_help(chain: co.Chain, sizes: Sizes, blocks: Any) -> str:
    """The tail of a refusal (NOTE [ what would help ]): the floor as a share of the keep-all
    peak, what the chain can move, and the ``blocks=`` in use or to try, to paste."""
    cover = coverage(chain, sizes, blocks)
    floor = offload_memory_floor(chain) + sizes.resident_bytes
    peak = cover.keep_all
    text = f"the pure-offloading floor is {100 * floor / peak:.0f} % of the keep-all peak" if peak else ""
    text += ("; " if text else "") + cover.describe()
    lists = tuple(getattr(blocks, "lists", ()))
    if lists and not cover.left_out:
        text += f"; the chain's blocks are blocks={list(lists)!r} (pass other module lists, or a list of paths, to cover more)"
    return text


# NOTE [ what would help ]
# A refusal names the figures a user chooses from (NOTE [ nothing fits ]) and, when the floor is
# high because the chain covers little of the step, why: the share of the keep-all peak the chain
# can move and what it leaves out (before the first block, the last block and after it, units
# kept resident), with a blocks= to paste: the module lists outside the chain the search saw
# added to the chain's own (a vision-language model whose text and vision towers are two lists),
# or the chain's own lists to edit. The floor is given as a share too: a floor of 73 % at a
# budget of 0.6 says at once that no schedule of these blocks can do it.


def _held_reason(by: str | None) -> str:
    """Why a held unit stays, in words."""
    if by == "forward":
        return "held: the forward keeps its output alive after it returns (a module attribute, a cache)"
    if by == "output":
        return "held: the model's output returns its output"
    if by:
        return f"held: {by} reads its output"
    return "held"


def exact_bytes(n: int) -> str:
    """``n`` as a figure to paste back: the exact bytes first, then rounded for reading.

    A rounded figure such as ``731.25 KiB`` is up to 5 KiB below the bytes it stands for, so
    given back as ``memory=`` it can fall under the floor it names (NOTE [ nothing fits ]).
    """
    return f"{int(n)} B ({format_bytes(n)})" if n >= 1024 else f"{int(n)} B"
