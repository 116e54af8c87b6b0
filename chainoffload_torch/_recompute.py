"""What the executor needs to carry out a rematerializing schedule (ops ``Fck``, ``Fn``, a repeated ``F``).

:class:`RematPlan` reads the schedule once: which op of each stage the user's forward runs (the
first forward op of the stage), which later forward ops re-run it, which instance of a_{i-1}
each of them reads and until when the executor must hold it. :class:`CallRecord` is what the
original forward of a block that will be recomputed leaves behind: its arguments (the hidden
state left out: it is read again, wherever it is, at the recomputation), the RNG states,
autocast state and grad mode it ran under, and the state of its buffers and plain attributes
before it ran (NOTE [ state changes happen once ]). :class:`Slot` is what autograd keeps, in
the original graph, for a tensor a block run without saving (``Fck`` / ``Fn``) would have
saved: the recomputation fills it, autograd's unpack reads it (NOTE [ recomputation ]).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

import chainoffload as co

from ._saved import _describe, version_probe

__all__ = [
    "FORWARD_KINDS", "Act", "CallRecord", "ObjectState", "PrefixRecord", "RematPlan", "Slot", "argument_state",
    "arguments_state", "prefix_state", "recompute_overhead", "state_call_ended", "state_structure", "stateful_argument", "recomputes_without_grad",
]

FORWARD_KINDS = ("F", "Fck", "Fn")

# NOTE [ recomputation ]
# The user's forward runs once, as the schedule's first forward op of every stage (a schedule the
# executor accepts begins with one forward op per stage, 1..L, in order: every recomputation comes
# after the forward). A block whose first op is Fck or Fn runs with autograd as usual -- its graph
# is built, so the gradient flows through the ORIGINAL graph and parameters' .grad are plain
# PyTorch's -- but every tensor it saves is replaced by a Slot that holds nothing: the block keeps
# only its output (a lone a_i). A later forward op of stage i (F, Fck or Fn in the compute sequence
# after the forward) fires at its start event, in the backward's boundary hooks: the block is
# called again on its recorded arguments, with the a_{i-1} instance the schedule says (the one the
# last forward op of stage i-1 before it made: the original, its prefetched copy, or a
# recomputed one), under the RNG states, autocast state and grad mode of the original call, with
# its buffers and plain attributes as they were before that call (and put back after). A
# recomputed F saves through the executor's pack (so its unit is a whole unit again, which the
# schedule may offload), and its k-th saved tensor fills the k-th Slot of the original call: the
# original graph's backward nodes read them through autograd's unpack, as torch.utils.checkpoint's
# non-reentrant mode does. A recomputed Fck / Fn keeps nothing: only its output's values are read
# (by the next recomputation, as its hidden input; the gradient flows through the original
# graph), so it needs no graph, and on CPU it runs under torch.no_grad(); on CUDA it runs with
# autograd, its saved tensors dropped as they are packed and its output detached (NOTE [ what an
# Fck or Fn costs ] says why, and what the chain charges for it).
# A block that can be re-run this way is a block the forward calls as a module whose output is the
# next block's hidden input (a linked block), or the code before the first block when it is a
# stage (NOTE [ recomputing the code before the first block ]): not a block whose a_i is made by
# the code after it, not stage L (which holds the head and the loss); a schedule that recomputes
# one of those is refused.


# NOTE [ a recomputation stops at its last saved tensor ]
# A recomputed F before its backward runs the block again for one thing: the tensors it saves,
# which fill the original call's slots. The code after the last of them (a decoder layer's
# down-projection, whose inputs are its last saved tensors and which autograd saves before it
# computes, and the residual add) makes only the block's output, which nothing reads when no later
# recomputation starts from this instance of a_i and no transfer moves it. So the pack hook of
# such a recomputation raises RecomputationEnd once it filled the last slot, and the executor
# catches it: the rest of the block's forward does not run, as torch.utils.checkpoint's
# non-reentrant mode (early_stop, the default of Hugging Face's gradient_checkpointing_enable())
# does not run it. What the block ran before is unchanged: the same code under the same states,
# every slot filled with what a whole run would save; the states are put back after it as after
# any recomputation (the generators, the buffers and plain attributes, in the record's context
# managers' exits, which an exception runs). RecomputationEnd is a BaseException, so that a
# block's own `except Exception` cannot swallow it; one that did would save more tensors than
# its forward, which the slot count refuses. Not stopped: a recomputation whose a_i a later one
# reads or a transfer moves, one whose block is given a state object (a key/value cache: its
# structure after the call is checked against the forward's), the code before the first block
# (its recomputation ends at the first block's call and returns a_1), and a block that saves
# nothing. On benchmarks/checkpointing.py's Llama at checkpointing's memory the step ran 1.02-1.07x
# Hugging Face's before this; the down-projection is about a fifth of a decoder layer's forward.


class RecomputationEnd(BaseException):
    """Raised by a recomputation's pack hook once it filled the original call's last slot
    (NOTE [ a recomputation stops at its last saved tensor ])."""


class Slot:
    """What autograd holds, in the original graph, for a tensor a block run without saving saved.

    ``record`` is the executor's pack record of the same tensor from the recomputation (``None``
    until the recomputation ran). The slot also carries what autograd's in-place check needs of
    the original tensor (a version probe, its version, what made it: NOTE [ version discipline ]
    in _saved.py), so that a saved tensor modified in place after the block ran raises as in
    plain PyTorch, although the recomputation made a fresh one.
    """

    __slots__ = ("_type_name", "index", "made_by", "output_nr", "probe", "record", "size", "stage", "version")

    def __init__(self, stage: int, index: int, t: torch.Tensor) -> None:
        self.stage = stage
        self.index = index
        self.record: Any = None
        self.probe = version_probe(t)
        self.version = t._version
        self.made_by, self.output_nr = _describe(t)
        # Read only to raise: a plain tensor's probe has its dtype and device, so its type()
        # string is the tensor's, and is built then (about 1 us a slot on CPU).
        self._type_name = None if type(t) is torch.Tensor else t.type()
        self.size = t.size()

    @property
    def type_name(self) -> str:
        """``t.type()`` of the tensor the slot stands for (autograd's in-place message names it)."""
        return self.probe.type() if self._type_name is None else self._type_name


class Act:
    """One instance of a_i the executor holds for a later recomputation to read.

    ``tensor`` is the tensor on the device while it is there (``None`` once an offload released
    it: it is then read from ``entry``'s prefetched copy, viewed as ``meta`` says); ``original``:
    the user's forward made it (not a recomputation); ``probe`` shares its version counter.
    """

    __slots__ = ("entry", "meta", "original", "probe", "requires_grad", "tensor")

    def __init__(self, tensor: torch.Tensor, entry: Any, original: bool) -> None:
        self.tensor = tensor.detach()
        self.entry = entry
        self.meta = (tensor.dtype, tensor.size(), tensor.stride(), tensor.storage_offset(), tensor.is_conj(), tensor.is_neg())
        self.original = original
        self.probe = version_probe(tensor) if original else None
        self.requires_grad = tensor.requires_grad


def rebuild_act(act: Act, storage_of: torch.Tensor) -> torch.Tensor:
    """The tensor ``act`` describes over the storage of ``storage_of``."""
    dtype, size, stride, offset, conj, neg = act.meta
    t = torch.empty(0, dtype=dtype, device=storage_of.device).set_(storage_of.untyped_storage(), offset, size, stride)
    if neg:
        t = torch._neg_view(t)
    if conj:
        t = t.conj()
    return t


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """The rematerializing schedule read once for the executor.

    Attributes
    ----------
    first
        Per stage (index i - 1), the kind of its first forward op, the one the user's forward runs.
    orig
        Per stage (index i - 1), the index of that op in the compute sequence.
    recomputed
        Stages with a forward op after the forward (their calls are recorded).
    maker_of_read
        Per recompute op k of stage i: the index of the forward op that made the instance of
        a_{i-1} it reads (the last forward op of stage i - 1 before k; ``-1`` for a_0).
    last_read
        Per forward op m (``-1``: a_0): the last recompute op that reads the a_i it made; the
        executor holds that instance until then, and no longer.
    """

    length: int
    first: tuple[str, ...]
    recomputed: frozenset[int]
    maker_of_read: dict[int, int]
    last_read: dict[int, int]
    orig: tuple[int, ...]

    @classmethod
    def of(cls, schedule: co.Schedule, length: int) -> RematPlan:
        """Read ``schedule`` (a validated rematerializing schedule of ``length`` stages).

        Raises
        ------
        ValueError
            The first forward ops of the stages are not in the order 1..L (the model's forward
            runs its blocks in order), or stage L runs without saving or is recomputed.
        """
        comp = schedule.compute
        orig: dict[int, int] = {}
        for k, (kind, i) in enumerate(comp):
            if kind in FORWARD_KINDS and i not in orig:
                orig[i] = k
        order = [orig[i] for i in range(1, length + 1)]
        if order != sorted(order):
            raise ValueError(
                "schedule: the first forward ops of the stages must come in the order 1..L, as the model's forward "
                f"runs its blocks; got {' '.join(f'{comp[k][0]}_{comp[k][1]}' for k in sorted(order)[:8])}"
                f"{' ...' if length > 8 else ''}"
            )
        first = tuple(comp[k][0] for k in order)
        if first[-1] != "F":
            raise ValueError(f"schedule: stage {length} (the last block, the head and the loss) must run F, not {first[-1]}")
        recomputed: set[int] = set()
        last_fwd: dict[int, int] = {}  # the last forward op of each stage so far
        maker_of_read: dict[int, int] = {}
        last_read: dict[int, int] = {}
        for k, (kind, i) in enumerate(comp):
            if kind not in FORWARD_KINDS:
                continue
            if k != orig[i]:
                if i == length:
                    raise ValueError(
                        f"schedule: recomputes stage {length} (op {k}, {kind}_{i}); the last block holds the head and the loss"
                    )
                recomputed.add(i)
                m = last_fwd[i - 1] if i > 1 else -1
                maker_of_read[k] = m
                last_read[m] = k
            last_fwd[i] = k
        return cls(length, first, frozenset(recomputed), maker_of_read, last_read, tuple(order))


# NOTE [ state changes happen once ]
# A block's forward may change the model's state: BatchNorm's running statistics and
# num_batches_tracked, a counter attribute. Recomputing it must neither change that state a
# second time nor see it as changed: the recomputation must see what the original call saw. The
# executor snapshots, at the start of the original call of every block it will recompute, its
# plain attributes (ints, floats, bools, strings: a step counter) and its buffers; at the
# recomputation it saves the state as it is then, puts the snapshot back, runs the block, and
# restores the state it saved. Buffers are cloned only when they may change: in the first step
# every buffer of a recomputed block is cloned, and the ones a call changed (its version moved, or
# its value: batch norm's kernel updates the running statistics in place without moving the
# version counter) are remembered and cloned from then on. One whose version moves later for the
# first time (a code path the first step did not take) cannot be put back, and the recomputation
# refuses rather than train on state the original call did not see. So the buffers of torch's
# norm layers that track running statistics are cloned at every call, learned or not: a step
# whose LayerDrop skipped a batch norm inside the code before the first block (blocks discovery
# left out of the chain) learned nothing of it, and the next step that ran it raised (fuzz
# recompute 1200); a few bytes per norm layer per step. Others stay as said; one changed later for the
# first time inside a kernel that moves no version counter is not seen. torch.utils.checkpoint updates BatchNorm's running
# statistics twice; this executor once. State it cannot see (a dict or list attribute a forward
# appends to, a Python object outside the module) is not restored: such a block must not be
# recomputed (keep it out of the chain's recomputation with method="best").

_PLAIN = frozenset((bool, int, float, str))  # by exact type, as _plain_attrs reads it


# NOTE [ arguments a recomputation would change again ]
# A recomputation calls a block again on the arguments of its original call. Those the executor
# can call it again on as they are: values that the call cannot change behind the executor's back
# -- tensors (whose in-place changes move a version counter), numbers, bools, strings, None,
# dtypes, devices, and tuples / lists / dicts of those. A list or dict argument is watched: the
# profile sees a block whose forward changes one (appends to a list it was given), and the
# executor refuses to recompute a block whose arguments changed (an element replaced, a tensor
# modified in place) between its call and the recomputation. Any other object -- a transformers
# Cache (DynamicCache, EncoderDecoderCache: the decoder layer appends its keys and values, or
# caches its cross-attention's), a user's state object -- holds state the block's forward
# changes: the executor puts that state back around the recomputation (NOTE [ state a
# recomputation puts back ]) where it can, and otherwise never recomputes the block: the profile
# records it among the blocks a recomputation would get wrong, and the executor refuses at every
# step to recompute it.

# NOTE [ state a recomputation puts back ]
# A block given a state object (a key/value cache) changes it once, in the forward: a decoder
# layer appends its keys and values (DynamicLayer.update: self.keys = torch.cat([self.keys, k])),
# a cross-attention layer stores the encoder's and sets is_updated[layer]. Its recomputation must
# see the object as the original call saw it, and leave it as it finds it. The executor keeps, at
# the original call's start, a shallow picture of the object graph the arguments reach (the
# ObjectState): every object's __dict__, every list, dict and set, their contents by reference
# (tensors by reference, with their version; no tensor is copied), down to tensors and values.
# At the call's end it checks that the call changed no tensor of the picture in place (its
# version moved: a StaticCache writes its preallocated keys with index_copy_) and dropped none
# that holds bytes (a cache that replaces its tensors: the picture would keep the old ones alive),
# and takes the structure of the graph after the call (types, values, tensors' shapes, dtypes,
# strides and storage sizes, in visit order). A recomputation then takes a picture of the graph
# as it is now, puts the picture before the call back (reassigning attributes and elements), runs
# the block, checks that the graph it left has the structure the original call left (else it
# raises: never train on), and puts the picture of now back: the cache holds exactly its original
# tensors again, and every change made after the call (the later layers' keys) is kept. A block
# whose graph holds what a picture cannot put back -- an object without __dict__ (a C object,
# __slots__), a module, a stream, a function, a graph deeper or larger than the limits below --
# or whose call changed a tensor of it in place or dropped one, is never recomputed, with the
# reason in handle.table(). What a picture cannot see -- state outside the arguments' graph --
# is not restored (as for NOTE [ state changes happen once ]).
# Sharing: every block is given the same cache, so a picture covers all of it; a recomputation
# of block i puts the other layers back as they were at block i's call too, and the picture of
# now restores them after. Objects are put back in place (the same objects, their contents
# reassigned), so whoever else holds them (the model's output) sees exactly what it saw. The
# pictures hold no tensor a plain step would not hold: they hold what the cache held at the
# call's start, and a call that drops a tensor with bytes is refused.
# Memory: a recomputation makes the keys and values again, twins of tensors the cache holds,
# which the plan counts resident for the whole step (NOTE [ what a state object holds ] in
# _recorder.py). The twins the recomputation saves for the backward would stay alive until B_i
# beside the originals; the executor therefore hands autograd views of the originals' storages
# instead (the plain step's own saved tensors), after checking that every twin and its original
# hold the same bytes (a recomputation that made other keys raises: state outside the picture
# changed them), and the twins die with the recomputation. While it runs they are alive, so the
# chain charges a stage whose call takes a state object the bytes its call put into the object
# as fwd_tmp (Sizes.restore_tmp): what a recomputed F_i allocates beyond its unit, counted (on
# the safe side) in the forward's F_i too.

_VALUE_TYPES = (
    type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout, torch.memory_format,
    slice, type(Ellipsis),
)

#: Limits of the object graph an ObjectState takes a picture of.
_STATE_DEPTH = 32
_STATE_OBJECTS = 65536


def _is_value(obj: Any) -> bool:
    return isinstance(obj, _VALUE_TYPES) or isinstance(obj, type)


def _attributes_restorable(obj: Any) -> bool:
    """Whether ``obj``'s state is its ``__dict__`` alone: a Python object without ``__slots__``
    of its own, not a C object, a function, a callable or a module."""
    cls = type(obj)
    if not hasattr(obj, "__dict__") or cls.__module__ == "builtins" or cls.__module__.startswith("torch._C"):
        return False
    if isinstance(obj, (nn.Module, torch.Stream)) or callable(obj):
        return False
    for c in cls.__mro__[:-1]:
        slots = c.__dict__.get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else tuple(slots)
        if set(slots) - {"__dict__", "__weakref__"}:
            return False
    return True


class ObjectState:
    """A picture of the object graph ``roots`` reach, by reference (NOTE [ state a
    recomputation puts back ]): per object its ``__dict__``, per list, dict and set its contents;
    tensors by reference with their version. ``why`` says what it cannot put back (``None``:
    everything). ``also``: further objects whose contents are pictured (not walked into)."""

    __slots__ = ("roots", "containers", "tensors", "why")

    def __init__(self, roots: Sequence[Any], also: Iterable[Any] = ()) -> None:
        self.roots = tuple(roots)
        self.containers: list[tuple[str, Any, Any]] = []
        self.tensors: dict[int, tuple[torch.Tensor, int]] = {}
        self.why: str | None = None
        seen: set[int] = set()
        stack: list[tuple[Any, int]] = [(r, 0) for r in reversed(self.roots)]
        for obj in also:
            if id(obj) not in seen:
                self._picture(obj, seen)
        while stack and self.why is None:
            obj, depth = stack.pop()
            if isinstance(obj, torch.Tensor):
                self.tensors.setdefault(id(obj), (obj, obj._version))
                continue
            if _is_value(obj) or id(obj) in seen:
                continue
            if depth >= _STATE_DEPTH or len(seen) >= _STATE_OBJECTS:
                self.why = f"it holds a graph of objects deeper than {_STATE_DEPTH} or larger than {_STATE_OBJECTS} objects"
                break
            if isinstance(obj, (tuple, frozenset)):
                seen.add(id(obj))
                stack.extend((v, depth + 1) for v in reversed(tuple(obj)))
                continue
            contents = self._picture(obj, seen)
            if contents is not None and len(contents) > _STATE_OBJECTS:
                self.why = f"it holds a graph of objects deeper than {_STATE_DEPTH} or larger than {_STATE_OBJECTS} objects"
                break
            if contents is None:
                what = "no attributes of its own to put back: a C object, __slots__, a module or a function"
                self.why = what if depth == 0 else f"it holds {_a(type(obj).__name__)}: {what}"
                break
            stack.extend((v, depth + 1) for v in reversed(contents))

    def _picture(self, obj: Any, seen: set[int]) -> list | None:
        """Record ``obj``'s contents; return the values inside it (``None``: it cannot be pictured)."""
        seen.add(id(obj))
        out: list = []
        if isinstance(obj, list):
            self.containers.append(("list", obj, list(obj)))
            out += obj
        elif isinstance(obj, dict):
            self.containers.append(("dict", obj, dict.copy(obj)))
            out += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, set):
            self.containers.append(("set", obj, set(obj)))
            out += list(obj)
        if type(obj) not in (list, dict, set):  # an object, or a subclass with attributes of its own
            if not _attributes_restorable(obj):
                return None
            attrs = dict(vars(obj))
            self.containers.append(("obj", obj, attrs))
            out += list(attrs.values())
        return out

    def apply(self) -> None:
        """Put every pictured object's contents back as they were (by reference)."""
        for kind, obj, contents in self.containers:
            if kind == "obj":
                d = vars(obj)
                d.clear()
                d.update(contents)
            elif kind == "list":
                list.__setitem__(obj, slice(None), contents)
            elif kind == "dict":
                dict.clear(obj)
                dict.update(obj, contents)
            else:
                set.clear(obj)
                set.update(obj, contents)

    def moved(self) -> list[torch.Tensor]:
        """The pictured tensors modified in place since the picture (their version moved)."""
        return [t for t, v in self.tensors.values() if t._version != v]


def state_structure(roots: Sequence[Any]) -> tuple[tuple, list[torch.Tensor]]:
    """The structure of the graph ``roots`` reach (types, values, tensors' metadata, in visit
    order, revisits by number) and its tensors in that order: two graphs of one structure hold
    their tensors at the same places (NOTE [ state a recomputation puts back ])."""
    numbers: dict[int, int] = {}
    tensors: list[torch.Tensor] = []
    # A module-level walk, not a closure over itself: a closure that calls itself is a reference
    # cycle, which would keep the tensors it saw (a recomputation's twins) until the next gc.
    return tuple(_structure(r, 0, numbers, tensors) for r in roots), tensors


def _structure(obj: Any, depth: int, numbers: dict[int, int], tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        if id(obj) in numbers:
            return ("seen", numbers[id(obj)])
        numbers[id(obj)] = len(numbers)
        tensors.append(obj)
        return ("t", obj.dtype, tuple(obj.shape), obj.stride(), obj.storage_offset(), str(obj.device),
                obj.untyped_storage().nbytes(), obj.is_conj(), obj.is_neg())
    if _is_value(obj):
        return ("v", type(obj), obj if not isinstance(obj, float) or obj == obj else "nan")
    if isinstance(obj, nn.Module) or callable(obj):
        return ("opaque", type(obj), id(obj))  # not looked into (a picture refuses them)
    if id(obj) in numbers:
        return ("seen", numbers[id(obj)])
    numbers[id(obj)] = len(numbers)
    if depth >= _STATE_DEPTH or len(numbers) > _STATE_OBJECTS or len(getattr(obj, "__dict__", ())) > _STATE_OBJECTS or (
        isinstance(obj, (tuple, list, dict, set, frozenset)) and len(obj) > _STATE_OBJECTS
    ):
        return ("big", type(obj))  # beyond what a picture takes (it refuses such a graph)
    parts: list = [type(obj)]
    if isinstance(obj, (tuple, list, frozenset, set)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        parts.append(tuple(_structure(v, depth + 1, numbers, tensors) for v in items))
    if isinstance(obj, dict):
        parts.append(tuple((_structure(k, depth + 1, numbers, tensors), _structure(v, depth + 1, numbers, tensors)) for k, v in obj.items()))
    if hasattr(obj, "__dict__"):
        parts.append(tuple((k, _structure(v, depth + 1, numbers, tensors)) for k, v in vars(obj).items()))
    return tuple(parts)


def _state_objects(value: Any, out: list, depth: int = 0) -> None:
    """Collect into ``out`` the objects in ``value`` other than tensors, values and (nested)
    tuples, lists and dicts of those."""
    if isinstance(value, torch.Tensor) or isinstance(value, _VALUE_TYPES):
        return
    if depth < 16 and isinstance(value, (tuple, list)):  # a torch.Size, a named tuple too
        for v in value:
            _state_objects(v, out, depth + 1)
    elif depth < 16 and isinstance(value, dict):  # a ModelOutput too
        for v in value.values():
            _state_objects(v, out, depth + 1)
    else:
        out.append(value)


def _stateful_in(obj: Any, depth: int = 0) -> Any:
    """The first object in ``obj`` that is not a tensor, a value or a container of those."""
    found: list = []
    _state_objects(obj, found, depth)
    return found[0] if found else None


def _argument_name(module: nn.Module, k: int) -> str:
    import inspect

    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[k].name if k < len(params) else f"positional argument {k}"


def _arguments(args: tuple, kwargs: dict, hidden_at: tuple[str, Any] | None) -> list[tuple[int | str, Any]]:
    """The call's arguments but the hidden state, each with its position or keyword. A
    position's name is read from the forward's signature only for a message (``_name``):
    inspect.signature at every argument of every recorded call was about 2 ms of a step of
    benchmarks/checkpointing.py's T5, whose blocks take eight positional arguments."""
    where, key = hidden_at if hidden_at is not None else (None, None)
    named: list[tuple[int | str, Any]] = [(j, a) for j, a in enumerate(args) if not (where == "arg" and j == key)]
    named += [(k, v) for k, v in kwargs.items() if not (where == "kw" and k == key)]
    return named


def _name(module: nn.Module, at: int | str) -> str:
    return at if isinstance(at, str) else _argument_name(module, at)


def _a(kind: str) -> str:
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def stateful_argument(module: nn.Module, args: tuple, kwargs: dict, hidden_at: tuple[str, Any]) -> str | None:
    """Why ``module`` called on ``args`` / ``kwargs`` must not be recomputed with the state its
    arguments hold as it is, or ``None``: the first argument other than the hidden state (at
    ``hidden_at``; ``None``: none) that holds an object other than a tensor, a value or a
    container of those (NOTE [ arguments a recomputation would change again ]). Used where no
    state is put back: the model's own call, which the code before the first block reruns."""
    for at, value in _arguments(args, kwargs, hidden_at):
        found = _stateful_in(value)
        if found is not None:
            kind = type(found).__name__
            return (
                f"takes {_a(kind)} argument ({_name(module, at)}) that its forward may change: a recomputation would change it "
                f"again{' (a key/value cache: call the model with use_cache=False)' if 'Cache' in kind else ''}"
            )
    return None


def argument_state(
    module: nn.Module, args: tuple, kwargs: dict, hidden_at: tuple[str, Any] | None
) -> tuple[ObjectState | None, str | None]:
    """The picture of the state objects among a block call's arguments (``None``: none), or why
    a recomputation cannot put their state back (NOTE [ state a recomputation puts back ])."""
    roots: list = []
    places: list[int | str] = []
    for at, value in _arguments(args, kwargs, hidden_at):
        found: list = []
        _state_objects(value, found)
        roots += found
        places += [at] * len(found)
    if not roots:
        return None, None
    state = ObjectState(roots)
    if state.why is not None:
        kinds = ", ".join(dict.fromkeys(
            f"{_a(type(r).__name__)} ({_name(module, at)})" for r, at in zip(roots, places, strict=True)
        ))
        hf = any(type(r).__module__.startswith("transformers") for r in roots)
        cache = "; call the model with use_cache=False" if hf else ""
        return None, f"takes {kinds}, whose state a recomputation cannot put back ({state.why}){cache}"
    return state, None


def state_call_ended(before: ObjectState) -> tuple[tuple, list[torch.Tensor], list[int], str | None]:
    """At the end of the original call: the structure after it, its tensors and their versions, or
    why its state cannot be put back around a recomputation (a tensor changed in place or
    dropped: NOTE [ state a recomputation puts back ])."""
    moved = before.moved()
    if moved:
        t = moved[0]
        return (), [], [], (
            f"changes a tensor of its state argument in place ({t.dtype} {list(t.shape)}: a static cache's "
            "preallocated keys), so its state before the call is gone"
        )
    structure, tensors = state_structure(before.roots)
    now = {id(t) for t in tensors}
    dropped = [t for t, _ in before.tensors.values() if id(t) not in now and t.untyped_storage().nbytes()]
    if dropped:
        t = dropped[0]
        return (), [], [], (
            f"replaces a tensor its state argument held ({t.dtype} {list(t.shape)}), so keeping the state before "
            "the call would hold memory no plan counts"
        )
    return structure, tensors, [t._version for t in tensors], None


def arguments_state(obj: Any, depth: int = 0) -> Any:
    """What a call's arguments are now, to compare with later (NOTE [ arguments a recomputation
    would change again ]): every list's and dict's identity and elements, a tuple's elements,
    every tensor's identity and version, every other object's identity."""
    if isinstance(obj, torch.Tensor):
        return ("t", id(obj), obj._version)
    if depth < 16 and isinstance(obj, tuple):  # immutable: its elements alone
        return ("tuple", tuple(arguments_state(v, depth + 1) for v in obj))
    if depth < 16 and isinstance(obj, list):
        return ("list", id(obj), tuple(arguments_state(v, depth + 1) for v in obj))
    if depth < 16 and isinstance(obj, dict):
        return ("dict", id(obj), tuple((k, arguments_state(v, depth + 1)) for k, v in obj.items()))
    return ("o", id(obj))


# NOTE [ what an Fck or Fn costs ]
# No autograd, only where the numbers stay the original's bit for bit. A forward without grad may
# take other kernels where a kernel is chosen by requires_grad, which no_grad turns off for every
# tensor the block makes. The known cases: CUDA's scaled_dot_product_attention picks its backend
# (flash, memory-efficient, cuDNN, math) partly on whether q, k, v require grad, and those
# backends give different bits; ATen's matmul folds a batched operand into one mm when the other
# operand requires grad and runs bmm otherwise. On CPU the attention choice reads no
# requires_grad, and mm and bmm give the same bits (tests/test_torch_recompute.py checks that
# fold, dropout, batch norm and Hugging Face blocks with torch.equal), so a recomputed Fck / Fn
# runs under no_grad there. On a GPU the folded and batched products are different cuBLAS
# kernels, and no GPU has checked them here: it runs with autograd.
# What the chain charges: the core model costs every Fck_i and Fn_i fwd_nosave[i], the first run
# in the forward as much as a recomputation. The executor's first run is the model's own forward
# with autograd (its graph carries the gradient; NOTE [ recomputation ]): it costs fwd[i], and
# more for the slots it packs. So offload()'s chain keeps fwd_nosave = fwd (plus, on CPU, the
# executor's host work: NOTE [ what a recomputation costs the executor ]): exact for the
# forward's Fck / Fn, an upper bound for a recomputed one on CPU (the forward without autograd
# that profile() measures as fwd_nosave: 55 ms against 68.6 ms of fwd summed over the 8 stages of
# benchmarks/checkpointing.py's Llama on CPU, one profile). A measured fwd_nosave would predict
# every plan that runs stages without saving in its forward faster than it runs.


# NOTE [ what a recomputation costs the executor ]
# Beyond the block's own compute, each stage the executor recomputes costs it host work no
# profile times: at the original call, the record (CallRecord: the arguments' picture, the torch,
# Python and NumPy generator states, the block's plain attributes and buffers, every module of the
# block walked), and at each recomputation the states put back and restored after (the generators
# read and set twice, the attributes and buffers). On CPU that host work is on the step's only
# thread: for a decoder layer of benchmarks/checkpointing.py's Llama, 0.42 ms for the record and
# 0.81 ms for the states entered and left (timeit, load average 8 on the project's 2-core
# machine), 0.26 to 0.30 ms for both by offload()'s own timing below at a lighter moment; NumPy's
# state read and set was about 0.1 ms of it, and 0.27 ms of each of T5's recomputations inside a
# step, before it was compared as its words (NOTE [ NumPy's generator read as its words ]).
# Where no prediction counts it, offload() picks, at checkpointing's memory, a plan the simulator
# calls as fast as checkpointing that runs slower (issue 31). So on CPU offload()'s chain charges
# it: recompute_overhead times this very code on each block (a record and an enter / exit of its
# states, no call of the block; the median of a few) and the chain's fwd_nosave[i] is fwd[i] plus that time (Fck_i and Fn_i are the
# ops that start a recomputed stage: the forward's Fck_i pays the record, each recomputation its
# states; a stage recomputed twice is charged one record too many, an upper bound). The solvers
# then plan with it and the simulator judges with it. On CUDA the host work overlaps the
# device's kernels (launches are asynchronous) and nothing is added.


def recompute_overhead(module: nn.Module, hidden_at: tuple[str, Any], device: torch.device, repeats: int = 5) -> float:
    """The executor's host seconds for recomputing ``module`` beyond its compute: one
    :class:`CallRecord` and one enter / exit of its states (NOTE [ what a recomputation costs
    the executor ]), the median of ``repeats``; ``module`` is not called."""
    import statistics
    import time

    where, key = hidden_at
    hidden = torch.zeros(1, device=device)
    args: tuple = tuple(None for _ in range(key)) + (hidden,) if where == "arg" else ()
    kwargs = {key: hidden} if where == "kw" else {}
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        rec = CallRecord(module, 1, args, kwargs, hidden_at, hidden, device, set())
        with rec._state():
            pass
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def recomputes_without_grad(device: torch.device | str) -> bool:
    """Whether the executor runs a recomputed ``Fck`` / ``Fn`` (after the forward) under
    ``torch.no_grad()`` on ``device``: on CPU, not on CUDA (NOTE [ what an Fck or Fn costs ])."""
    return torch.device(device).type == "cpu"


def _plain_attrs(modules: Iterable[nn.Module]) -> list[tuple[nn.Module, str, Any]]:
    out = []
    for m in modules:
        for k, v in vars(m).items():
            if type(v) in _PLAIN and not k.startswith("_"):
                out.append((m, k, v))
    return out


def _tracks_statistics(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's norm layers that update running statistics in
    training: its buffers may change in any call, whether or not an earlier step's did
    (NOTE [ state changes happen once ])."""
    return isinstance(module, nn.modules.batchnorm._NormBase) and bool(module.track_running_stats)


def _same_numpy_state(na: Any, nb: Any) -> bool:
    """Whether two ``np.random.get_state()`` tuples (``None``: NumPy not imported) are one state."""
    if na is None or nb is None:
        return na is nb
    if len(na) != len(nb) or na[0] != nb[0] or tuple(na[2:]) != tuple(nb[2:]):
        return False
    import numpy as np

    return bool(np.array_equal(na[1], nb[1]))


# NOTE [ NumPy's generator read as its words ]
# A recomputation puts back Python's and NumPy's global generators as its block's forward found
# them, and after it the states it found (NOTE [ state changes happen once ]). NumPy's full state
# read (get_state: the 624 words copied into a new array, in a tuple) and set each cost 35 to
# 100 us on CPU, and a recomputation took three (read, compare, set back): 0.27 ms of each of
# T5's, almost half of what its states cost (benchmarks/host_work.py, "a recomputation's states").
# The legacy generator's whole state is MT19937's 624 words and position, whose address the bit
# generator's ctypes interface gives, and the Gaussian it caches (has_gauss, gauss), which the
# RandomState object holds in its own struct. Read as bytes (the words, then the 16 bytes of the
# cache) they cost about 1 us, and the same bytes are the same state: a draw that empties the
# cache moves no word but changes has_gauss, so the words alone would not tell it. The cache's
# offset in the object is not published: at first use it is found by setting a state whose
# cached Gaussian is a value no other field holds and reading where it lands, then checked by
# setting others (has_gauss 0 and 1, two values; the state the program had is put back after).
# The words' bytes are checked against get_state() the same way. So a recomputation whose bytes
# at its start are its record's sets nothing, one whose bytes after it are those at its start
# puts nothing back, and a record whose bytes are the last record's reuses that full state.
# Anything else -- NumPy's global generator not an MT19937, a layout the checks do not confirm --
# takes the full reads as before. (Read only, after the checks: the bytes are compared, never
# written.)

#: NumPy's global generator and how to read it as bytes: (the RandomState, its bit generator, the
#: words' address, the cache's offset in the RandomState), the last two None where unconfirmed.
_WORDS: tuple[Any, Any, int | None, int | None] | None = None
_WORDS_BYTES = 624 * 4 + 4
_CACHE_BYTES = 16  # int has_gauss, its padding, double gauss
#: The last full state read for a record and its bytes (NOTE [ NumPy's generator read as its words ]).
_LAST_NUMPY: tuple[bytes, Any] | None = None


def _numpy_words() -> bytes | None:
    """NumPy's global generator's whole legacy state as bytes (its MT19937 words and position and
    its cached Gaussian), or ``None`` where it cannot be read so (NOTE [ NumPy's generator read
    as its words ])."""
    global _WORDS
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        return None
    try:
        state = np_random.mtrand._rand
        bitgen = state._bit_generator
    except AttributeError:
        return None
    words = _WORDS
    if words is None or words[0] is not state or words[1] is not bitgen:
        address, cache = _words_address(bitgen, state)
        _WORDS = words = (state, bitgen, address, cache)
    if words[2] is None or words[3] is None:
        return None
    return ctypes.string_at(words[2], _WORDS_BYTES) + ctypes.string_at(id(state) + words[3], _CACHE_BYTES)


def _words_address(bitgen: Any, state: Any) -> tuple[int | None, int | None]:
    """The address of ``bitgen``'s words and position, and the offset of ``state``'s cached
    Gaussian in ``state``, each checked against ``state.get_state()`` (``None`` where not)."""
    import struct

    import numpy as np

    try:
        if type(bitgen).__name__ != "MT19937":
            return None, None
        address = int(bitgen.ctypes.state_address)
        saved = state.get_state(legacy=True)
        expected = np.ascontiguousarray(saved[1], dtype=np.uint32).tobytes() + np.int32(saved[2]).tobytes()
        if len(expected) != _WORDS_BYTES or ctypes.string_at(address, _WORDS_BYTES) != expected:
            return None, None
    except Exception:
        return None, None
    size = type(state).__basicsize__
    cache = None
    try:
        marks = (-1.2345678901234567e-123, 9.876543210987654e+210)
        state.set_state((saved[0], saved[1], saved[2], 1, marks[0]))
        raw = ctypes.string_at(id(state), size)
        found = [i for i in range(8, size - 7) if raw[i:i + 8] == struct.pack("d", marks[0])]
        if len(found) == 1:
            at = found[0] - 8  # aug_bitgen_t: the bit generator's pointer, int has_gauss, double gauss
            fits = True
            for has, value in ((1, marks[1]), (0, marks[0]), (1, marks[0])):
                state.set_state((saved[0], saved[1], saved[2], has, value))
                got = ctypes.string_at(id(state) + at, _CACHE_BYTES)
                fits &= struct.unpack("i", got[:4])[0] == has and struct.unpack("d", got[8:])[0] == value
            cache = at if fits else None
    except Exception:
        cache = None
    finally:
        state.set_state(saved)
    return address, cache


def _numpy_state() -> tuple[Any, bytes | None]:
    """NumPy's global state now (``np.random.get_state()``, ``None`` where NumPy is not imported)
    and its bytes (``None`` where they cannot be read): the last record's state where the bytes
    are its (NOTE [ NumPy's generator read as its words ])."""
    global _LAST_NUMPY
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        return None, None
    words = _numpy_words()
    last = _LAST_NUMPY
    if words is not None and last is not None and last[0] == words:
        return last[1], words
    state = np_random.get_state()
    if words is not None:
        _LAST_NUMPY = (words, state)
    return state, words


class CallRecord:
    """The original call of a block the schedule recomputes: enough to call it again as it ran.

    Parameters
    ----------
    module
        The block.
    stage
        Its stage in the chain.
    args, kwargs
        Its arguments; the hidden state at ``hidden_at`` is left out (read again at each
        recomputation from the a_{i-1} instance the schedule names).
    hidden_at
        ``("arg", k)`` or ``("kw", name)``; ``None`` for :class:`PrefixRecord` (no hidden input).
    hidden
        The hidden input as the call got it (for its version and ``requires_grad``; not kept).
    device
        The device of the step (for its RNG state and autocast).
    mutable
        ids of buffers known to change in a forward (cloned); ``None``: clone every buffer.
    state
        The modules whose buffers and plain attributes the call may change (each without its
        submodules); by default ``module`` and all its submodules.
    objects
        The picture of the state objects among the arguments (a key/value cache) taken as the
        call started, put back around every recomputation (NOTE [ state a recomputation puts
        back ]); ``None``: none.
    """

    def __init__(
        self,
        module: nn.Module,
        stage: int,
        args: tuple,
        kwargs: dict,
        hidden_at: tuple[str, Any] | None,
        hidden: torch.Tensor | None,
        device: torch.device,
        mutable: set[int] | None,
        state: Sequence[nn.Module] | None = None,
        objects: ObjectState | None = None,
    ) -> None:
        where, key = hidden_at if hidden_at is not None else (None, None)
        if where == "arg":
            self.args = tuple(None if j == key else a for j, a in enumerate(args))
            self.kwargs = dict(kwargs)
        else:
            self.args = tuple(args)
            self.kwargs = {k: (None if where == "kw" and k == key else v) for k, v in kwargs.items()}
        self.module = module
        self.stage = stage
        self.hidden_at = hidden_at
        self.arguments = arguments_state((self.args, self.kwargs))
        self.hidden_version = hidden._version if hidden is not None else None
        self.hidden_requires_grad = hidden.requires_grad if hidden is not None else False
        self.device = device
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        # Python's and NumPy's global generators too: code that runs again draws from them (the
        # code before the first block scaling by random.random(), a stochastic depth drawn with
        # NumPy), and a recomputation must draw what the forward drew.
        np_state, self.host_words = _numpy_state()
        self.host_rng = (random.getstate(), np_state)
        self.grad = torch.is_grad_enabled()
        dev_type = device.type
        self.autocast = {
            dt: (torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt))
            for dt in {dev_type, "cpu"}
            if torch.amp.is_autocast_available(dt)
        }
        self.autocast_cache = torch.is_autocast_cache_enabled()
        # One walk of the modules (named_modules' order, as modules() gives it), their buffers
        # read from _buffers (named_buffers(recurse=False) less its generator; None is no buffer).
        paths = list(module.named_modules()) if state is None else [("", m) for m in state]
        owners = [m for _, m in paths]
        self.attrs = _plain_attrs(owners)
        self.buffers: list[tuple[str, torch.Tensor, int, torch.Tensor | None]] = []
        named = (
            (f"{p}.{n}" if p and state is None else n, b, m)
            for p, m in paths for n, b in m._buffers.items() if b is not None
        )
        seen: set[int] = set()
        for name, b, m in named:
            if id(b) in seen:
                continue
            seen.add(id(b))
            clone = b.detach().clone() if mutable is None or id(b) in mutable or _tracks_statistics(m) else None
            self.buffers.append((name, b, b._version, clone))
        #: Set by :meth:`ended`: the buffers' versions were checked at the end of the call.
        self.checked = False
        self.objects = objects
        #: The state objects' structure after the original call, their tensors in its order and
        #: those tensors' versions then (set by :meth:`ended`).
        self.after: tuple = ()
        self.after_tensors: list[torch.Tensor] = []
        self.after_versions: list[int] = []
        #: After a recomputation: (the tensor it made, the original at the same place in the
        #: state objects) for every tensor the original call put there.
        self.twins: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def ended(self) -> None:
        """The original call returned: refuse now if it moved the version of a buffer it holds
        no snapshot of (NOTE [ state changes happen once ]). Checked here, not at the
        recomputation, when code that runs later (the blocks after the code before the first
        block, the head) moves the versions of buffers the record covers."""
        self._check_versions()
        self.checked = True
        if self.objects is not None:
            self.after, self.after_tensors, self.after_versions, why = state_call_ended(self.objects)
            if why is not None:
                raise RuntimeError(
                    f"chainoffload_torch: {self._what()} {why}; the schedule recomputes it, and a recomputation would "
                    "not see the state the forward saw. Train with method='best' (no recomputation), or let offload() "
                    "plan (it never recomputes such a block)"
                )

    def _check_versions(self) -> None:
        for name, b, v, snap in self.buffers:
            if snap is None and b._version != v:
                raise RuntimeError(
                    f"chainoffload_torch: {self._what()}'s forward changed its buffer {name!r} in this step, which no "
                    "earlier step did, so the executor holds no copy of its value before the change and cannot "
                    "recompute it as it ran; train this model with method='best' (no recomputation), or "
                    "profile again (handle.remove(), then offload())"
                )

    def _what(self) -> str:
        return f"block {self.stage}"

    def changed_buffers(self) -> list[torch.Tensor]:
        """The buffers the call changed, of those it holds a snapshot of: their version moved,
        or their value (a kernel such as batch norm's updates its running statistics in place
        without moving the version counter)."""
        return [b for _, b, v, c in self.buffers if c is not None and (b._version != v or not torch.equal(b, c))]

    def call(self, hidden: torch.Tensor, hooks: Any, grad: bool = True) -> Any:
        """Run the block again on ``hidden`` under the original call's states; return its output.

        ``grad=False`` runs it under ``torch.no_grad()`` (a recomputed ``Fck`` / ``Fn`` on CPU:
        NOTE [ what an Fck or Fn costs ]); otherwise under the original call's grad mode.
        """
        where, key = self.hidden_at
        args, kwargs = self.args, self.kwargs
        if arguments_state((args, kwargs)) != self.arguments:
            raise RuntimeError(
                f"chainoffload_torch: the arguments block {self.stage} was called with changed after its forward read "
                "them (a list or dict appended to or modified, a tensor among them modified in place), so a "
                "recomputation would not run the block as it ran; train this model with method='best' (no "
                "recomputation)"
            )
        if where == "arg":
            args = tuple(hidden if j == key else a for j, a in enumerate(args))
        else:
            kwargs = {**kwargs, key: hidden}
        with self._state(), hooks, torch.set_grad_enabled(self.grad and grad):
            if self.objects is None:
                return self.module(*args, **kwargs)
            return self._call_with_objects(args, kwargs)

    def _call_with_objects(self, args: tuple, kwargs: dict) -> Any:
        """Call the block with its state objects as the original call found them, and put them
        back as they are now after (NOTE [ state a recomputation puts back ])."""
        before = self.objects
        moved = before.moved()
        if moved or not self.after:
            raise RuntimeError(
                f"chainoffload_torch: a tensor of the state argument (a key/value cache) of block {self.stage} was "
                "modified in place after its forward read it, so a recomputation would not run the block as it ran; "
                "train this model with method='best' (no recomputation)"
            )
        now = ObjectState(before.roots, also=[c[1] for c in before.containers])
        before.apply()
        try:
            out = self.module(*args, **kwargs)
            structure, made = state_structure(before.roots)
        finally:
            now.apply()
        if structure != self.after:
            raise RuntimeError(
                f"chainoffload_torch: recomputing block {self.stage} left its state argument (a key/value cache) other "
                "than its forward did (other objects, shapes or dtypes), so the recomputation did not run the block as "
                "it ran; train this model with method='best' (no recomputation)"
            )
        self.twins = [
            (t, o, v) for t, o, v in zip(made, self.after_tensors, self.after_versions, strict=True) if t is not o
        ]
        return out

    @contextlib.contextmanager
    def _state(self) -> Iterator[None]:
        if not self.checked:
            self._check_versions()
        now_attrs = [(m, k, getattr(m, k, None)) for m, k, _ in self.attrs]
        restore = [(b, snap) for _, b, _, snap in self.buffers if snap is not None]
        now_bufs = [(b, b.detach().clone()) for b, _ in restore]
        # The torch generators read and set directly: fork_rng's checks and context cost more
        # than the reads (NOTE [ NumPy's generator read as its words ] measures the rest).
        cpu_now = torch.get_rng_state()
        cuda_now = torch.cuda.get_rng_state(self.device) if self.cuda_rng is not None else None
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)
        try:
            py_now = random.getstate()
            if py_now != self.host_rng[0]:
                random.setstate(self.host_rng[0])
            words = self.host_words
            same_words = words is not None and _numpy_words() == words
            np_random = sys.modules.get("numpy.random")
            np_now = None
            if not same_words and np_random is not None:
                np_now = np_random.get_state()
                if self.host_rng[1] is not None and not _same_numpy_state(np_now, self.host_rng[1]):
                    np_random.set_state(self.host_rng[1])
            with contextlib.ExitStack() as stack:
                for dt, (enabled, dtype) in self.autocast.items():
                    # Entered only where it changes something: autocast off, and off now with the
                    # same dtype and cache setting, is the state the block ran in.
                    if (
                        enabled or torch.is_autocast_enabled(dt) or torch.get_autocast_dtype(dt) != dtype
                        or torch.is_autocast_cache_enabled() != self.autocast_cache
                    ):
                        stack.enter_context(torch.amp.autocast(dt, enabled=enabled, dtype=dtype, cache_enabled=self.autocast_cache))
                stack.enter_context(torch.set_grad_enabled(self.grad))
                # Through .data: the version counter stays (autograd holds these buffers as saved
                # tensors, batch norm's running statistics, and checks their version at unpack).
                if restore:
                    with torch.no_grad():
                        for b, snap in restore:
                            b.data.copy_(snap)
                for m, k, v in self.attrs:
                    object.__setattr__(m, k, v)
                try:
                    yield
                finally:
                    random.setstate(py_now)
                    if same_words:
                        # The state at the start was the record's: put it back if the block drew.
                        if _numpy_words() != words:
                            np_random.set_state(self.host_rng[1])
                    elif np_now is not None:
                        np_random.set_state(np_now)
                    for m, k, v in now_attrs:
                        object.__setattr__(m, k, v)
                    if now_bufs:
                        with torch.no_grad():
                            for b, v in now_bufs:
                                b.data.copy_(v)
        finally:
            torch.set_rng_state(cpu_now)
            if cuda_now is not None:
                torch.cuda.set_rng_state(cuda_now, self.device)


# NOTE [ recomputing the code before the first block ]
# When the code before the first block (embeddings, a CNN stem) is stage 1 (NOTE [ the prefix as
# a stage ] in _instrument.py), it is no module call: it is the start of the model's own forward,
# up to the first block's call. Its inputs are the model's arguments, which the executor records
# as it records a block's (the caller holds them; a_0 is 0 bytes). A recomputation therefore runs
# the model's forward again, model.forward(*args, **kwargs) -- the root module's hooks are not
# run: the instrument's would start a step, and a model with forward pre-hooks of its own is not
# recomputed -- and stops it at the first block's call, by a forward pre-hook put first on that
# block which raises _PrefixEnd (a BaseException: the forward's own `except Exception` cannot
# swallow it) with the block's hidden input: a_1. Everything the forward ran until then is the
# prefix's code, run under the RNG states, autocast state and grad mode the original forward
# started with, so its saved tensors and a_1 are the original's bit for bit, and what it saved
# fills the original's slots in order (NOTE [ recomputation ]). The state put back and restored
# (NOTE [ state changes happen once ]) is that of the model's modules outside the blocks (the
# stem's batch norm, a step counter of the root module): the blocks' own do not run in it. It is
# not recomputed (and the profile says so in the table) when the model has forward pre-hooks of
# its own, when its first block has (a pre-hook put first would see other arguments than the
# instrument saw), or when the model's call takes an object that may hold state (a cache) or the
# prefix changes one of the model's arguments; the executor checks again at every step.


class _PrefixEnd(BaseException):
    """Raised at the first block's call to stop a recomputation of the code before it."""

    def __init__(self, hidden: Any) -> None:
        super().__init__()
        self.hidden = hidden


def prefix_state(model: nn.Module, blocks: Iterable[nn.Module]) -> list[nn.Module]:
    """The modules of ``model`` outside every block: the state the code before the first block
    may change (NOTE [ recomputing the code before the first block ])."""
    inside = {id(m) for b in blocks for m in b.modules()}
    return [m for m in model.modules() if id(m) not in inside]


class PrefixRecord(CallRecord):
    """The original call of the code before the first block, when it is stage 1: the model's
    arguments, and the state it started from (NOTE [ recomputing the code before the first block ]).

    Parameters
    ----------
    model
        The model whose forward is the step.
    first
        The first block (its call ends the prefix).
    hidden_of
        Where block b's call holds its hidden state: ``hidden_of(b, args, kwargs)``.
    args, kwargs, device, mutable, state
        The model's call and as for :class:`CallRecord`.
    blocks, skipped
        Every block in order, and the set of stages the step skipped: the rerun stops at the
        first block it calls, which must be the first one the step ran.
    """

    def __init__(
        self,
        model: nn.Module,
        first: nn.Module,
        hidden_of: Any,
        args: tuple,
        kwargs: dict,
        device: torch.device,
        mutable: set[int] | None,
        state: Sequence[nn.Module],
        blocks: Sequence[nn.Module] = (),
        skipped: Any = None,
    ) -> None:
        super().__init__(model, 1, args, kwargs, None, None, device, mutable, state=state)
        self.first = first
        self.hidden_of = hidden_of
        #: Every block, in order, and the stages the step skipped (a set the step fills as its
        #: forward goes): a step that skipped its first blocks (LayerDrop) went from the code
        #: before them to the first block it called, and the recomputation stops there too.
        self.blocks = tuple(blocks) or (first,)
        self.skipped = skipped if skipped is not None else set()

    def _what(self) -> str:
        return "the code before the first block"

    def call(self, hidden: Any, hooks: Any, grad: bool = True, whole: bool = False) -> Any:
        """Run the model's forward again, up to its first block's call; return that call's
        hidden input (a_1). ``hidden`` is unused (the prefix has no hidden input). ``whole``: the
        step called no block, and neither must the rerun; return the forward's output
        (NOTE [ a step that calls no block ] in executor.py).

        ``grad`` is ignored: the prefix always reruns under the original call's grad mode. It is
        the model's own code, not a block's, and may read the grad mode where a block's layers do
        not; the no_grad evidence of NOTE [ what an Fck or Fn costs ] covers blocks only."""
        if arguments_state((self.args, self.kwargs)) != self.arguments:
            raise RuntimeError(
                "chainoffload_torch: the model's arguments changed after its forward read them (a list or dict "
                "modified, a tensor among them modified in place), so a recomputation of the code before the first "
                "block would not run it as it ran; train this model with method='best' (no recomputation)"
            )

        def stopper(b: int) -> Any:
            def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
                raise _PrefixEnd((b, self.hidden_of(b, args, kwargs)))

            return stop

        # The first block the forward calls ends the code before the blocks: block 1, or, in a
        # step that skipped its first blocks, the first one it ran (the same draws, restored, skip
        # the same blocks again). One module may be several blocks (called again): its first call.
        handles, seen = [], set()
        for b, module in enumerate(self.blocks, start=1):
            if id(module) not in seen:
                seen.add(id(module))
                handles.append(module.register_forward_pre_hook(stopper(b), with_kwargs=True, prepend=True))
        try:
            with self._state(), hooks:
                out = self.module.forward(*self.args, **self.kwargs)
            if whole:
                return out
        except _PrefixEnd as end:
            b, hidden = end.hidden
            if whole:
                raise RuntimeError(
                    f"chainoffload_torch: the model's forward, run again on the same arguments to recompute a step that "
                    f"called no block, called block {b}; train this model with method='best' (no recomputation)"
                ) from None
            # Stage b + 1 is block b; the step must have skipped stages 2..b as the rerun did, or
            # the rerun did not run the code the forward ran.
            if b == 1 or all(k in self.skipped for k in range(2, b + 1)):
                return hidden
            raise RuntimeError(
                f"chainoffload_torch: the model's forward, run again on the same arguments to recompute the code before "
                f"its first block, called block {b} first, which the step's forward did not; train this model with "
                "method='best' (no recomputation)"
            ) from None
        finally:
            for handle in handles:
                handle.remove()
        raise RuntimeError(
            "chainoffload_torch: the model's forward, run again on the same arguments to recompute the code before "
            "its first block, returned without calling that block; train this model with method='best' (no "
            "recomputation)"
        )
