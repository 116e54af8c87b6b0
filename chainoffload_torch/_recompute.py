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
import dataclasses
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

import chainoffload as co

__all__ = [
    "FORWARD_KINDS", "Act", "CallRecord", "PrefixRecord", "RematPlan", "Slot", "arguments_state", "prefix_state",
    "stateful_argument", "recomputes_without_grad",
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


class Slot:
    """What autograd holds, in the original graph, for a tensor a block run without saving saved.

    ``record`` is the executor's pack record of the same tensor from the recomputation (``None``
    until the recomputation ran). The slot also carries what autograd's in-place check needs of
    the original tensor (a version probe, its version, what made it: NOTE [ version discipline ]
    in _saved.py), so that a saved tensor modified in place after the block ran raises as in
    plain PyTorch, although the recomputation made a fresh one.
    """

    __slots__ = ("index", "made_by", "output_nr", "probe", "record", "size", "stage", "type_name", "version")

    def __init__(self, stage: int, index: int, t: torch.Tensor) -> None:
        from ._saved import _describe, version_probe

        self.stage = stage
        self.index = index
        self.record: Any = None
        self.probe = version_probe(t)
        self.version = t._version
        self.made_by, self.output_nr = _describe(t)
        self.type_name = t.type()
        self.size = t.size()


class Act:
    """One instance of a_i the executor holds for a later recomputation to read.

    ``tensor`` is the tensor on the device while it is there (``None`` once an offload released
    it: it is then read from ``entry``'s prefetched copy, viewed as ``meta`` says); ``original``:
    the user's forward made it (not a recomputation); ``probe`` shares its version counter.
    """

    __slots__ = ("entry", "meta", "original", "probe", "requires_grad", "tensor")

    def __init__(self, tensor: torch.Tensor, entry: Any, original: bool) -> None:
        from ._saved import version_probe

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
# refuses rather than train on state the original call did not see; one changed later for the
# first time inside a kernel that moves no version counter is not seen. torch.utils.checkpoint updates BatchNorm's running
# statistics twice; this executor once. State it cannot see (a dict or list attribute a forward
# appends to, a Python object outside the module) is not restored: such a block must not be
# recomputed (keep it out of the chain's recomputation with method="best").

_PLAIN = (bool, int, float, str)


# NOTE [ arguments a recomputation would change again ]
# A recomputation calls a block again on the arguments of its original call. Those the executor
# can call it again on are values that the call cannot change behind the executor's back: tensors
# (whose in-place changes move a version counter), numbers, bools, strings, None, dtypes,
# devices, and tuples / lists / dicts of those. Any other object -- a transformers Cache
# (DynamicCache, EncoderDecoderCache: the decoder layer appends its keys and values, or caches
# its cross-attention's, and a second call appends them again or finds them there and saves
# other tensors), a user's state object -- may hold state the block's forward changes, which
# the executor cannot restore exactly (deep-copying a cache costs its bytes and cannot see state
# outside it), so such a block is never recomputed: the profile records it among the blocks a
# recomputation would get wrong, and the executor refuses at every step to recompute a block
# whose call received one. A list or dict argument is watched too: the profile sees a block
# whose forward changes one (appends to a list it was given), and the executor refuses to
# recompute a block whose arguments changed (an element replaced, a tensor modified in place)
# between its call and the recomputation.

_VALUE_TYPES = (
    type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout, torch.memory_format,
    slice, type(Ellipsis),
)


def _stateful_in(obj: Any, depth: int = 0) -> Any:
    """The first object in ``obj`` that is not a tensor, a value or a container of those."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, _VALUE_TYPES):
        return None
    if depth < 16 and isinstance(obj, (tuple, list)):
        return next((x for x in (_stateful_in(v, depth + 1) for v in obj) if x is not None), None)
    if depth < 16 and isinstance(obj, dict):
        return next((x for x in (_stateful_in(v, depth + 1) for v in obj.values()) if x is not None), None)
    return obj


def _argument_name(module: nn.Module, k: int) -> str:
    import inspect

    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[k].name if k < len(params) else f"positional argument {k}"


def stateful_argument(module: nn.Module, args: tuple, kwargs: dict, hidden_at: tuple[str, Any]) -> str | None:
    """Why ``module`` called on ``args`` / ``kwargs`` must not be recomputed, or ``None``: the
    first argument other than the hidden state (at ``hidden_at``; ``None``: none) that holds an object other
    than a tensor, a value or a container of those (NOTE [ arguments a recomputation would
    change again ])."""
    where, key = hidden_at if hidden_at is not None else (None, None)
    named = [(_argument_name(module, j), a) for j, a in enumerate(args) if not (where == "arg" and j == key)]
    named += [(k, v) for k, v in kwargs.items() if not (where == "kw" and k == key)]
    for name, value in named:
        found = _stateful_in(value)
        if found is not None:
            kind = type(found).__name__
            return (
                f"takes {'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} argument ({name}) that its forward may change: a recomputation would change it "
                f"again{' (a key/value cache: call the model with use_cache=False)' if 'Cache' in kind else ''}"
            )
    return None


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
# more for the slots it packs. So offload()'s chain keeps fwd_nosave = fwd: exact for the
# forward's Fck / Fn, an upper bound for a recomputed one on CPU (the forward without autograd
# that profile() measures as fwd_nosave: 55 ms against 68.6 ms of fwd summed over the 8 stages of
# benchmarks/checkpointing.py's Llama on CPU, one profile). A measured fwd_nosave would predict
# every plan that runs stages without saving in its forward faster than it runs.


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


def _host_rng_state() -> tuple[Any, Any]:
    """Python's global generator state, and NumPy's where NumPy is imported (``None`` otherwise)."""
    np_random = sys.modules.get("numpy.random")
    return random.getstate(), (np_random.get_state() if np_random is not None else None)


def _set_host_rng_state(state: tuple[Any, Any]) -> None:
    py, np_state = state
    random.setstate(py)
    np_random = sys.modules.get("numpy.random")
    if np_state is not None and np_random is not None:
        np_random.set_state(np_state)


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
        self.host_rng = _host_rng_state()
        self.grad = torch.is_grad_enabled()
        dev_type = device.type
        self.autocast = {
            dt: (torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt))
            for dt in {dev_type, "cpu"}
            if torch.amp.is_autocast_available(dt)
        }
        self.autocast_cache = torch.is_autocast_cache_enabled()
        owners = list(module.modules()) if state is None else list(state)
        self.attrs = _plain_attrs(owners)
        self.buffers: list[tuple[str, torch.Tensor, int, torch.Tensor | None]] = []
        named = module.named_buffers() if state is None else ((n, b) for m in owners for n, b in m.named_buffers(recurse=False))
        for name, b in named:
            clone = b.detach().clone() if mutable is None or id(b) in mutable else None
            self.buffers.append((name, b, b._version, clone))
        #: Set by :meth:`ended`: the buffers' versions were checked at the end of the call.
        self.checked = False

    def ended(self) -> None:
        """The original call returned: refuse now if it moved the version of a buffer it holds
        no snapshot of (NOTE [ state changes happen once ]). Checked here, not at the
        recomputation, when code that runs later (the blocks after the code before the first
        block, the head) moves the versions of buffers the record covers."""
        self._check_versions()
        self.checked = True

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
            return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def _state(self) -> Iterator[None]:
        if not self.checked:
            self._check_versions()
        now_attrs = [(m, k, getattr(m, k, None)) for m, k, _ in self.attrs]
        restore = [(b, snap) for _, b, _, snap in self.buffers if snap is not None]
        now_bufs = [(b, b.detach().clone()) for b, _ in restore]
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if self.cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type if devices else "cuda"):
            torch.set_rng_state(self.cpu_rng)
            if self.cuda_rng is not None:
                torch.cuda.set_rng_state(self.cuda_rng, self.device)
            host_now = _host_rng_state()
            _set_host_rng_state(self.host_rng)
            with contextlib.ExitStack() as stack:
                for dt, (enabled, dtype) in self.autocast.items():
                    stack.enter_context(torch.amp.autocast(dt, enabled=enabled, dtype=dtype, cache_enabled=self.autocast_cache))
                stack.enter_context(torch.set_grad_enabled(self.grad))
                # Through .data: the version counter stays (autograd holds these buffers as saved
                # tensors, batch norm's running statistics, and checks their version at unpack).
                with torch.no_grad():
                    for b, snap in restore:
                        b.data.copy_(snap)
                for m, k, v in self.attrs:
                    object.__setattr__(m, k, v)
                try:
                    yield
                finally:
                    _set_host_rng_state(host_now)
                    for m, k, v in now_attrs:
                        object.__setattr__(m, k, v)
                    with torch.no_grad():
                        for b, v in now_bufs:
                            b.data.copy_(v)


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

    def call(self, hidden: Any, hooks: Any, grad: bool = True) -> Any:
        """Run the model's forward again, up to its first block's call; return that call's
        hidden input (a_1). ``hidden`` is unused (the prefix has no hidden input).

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
                self.module.forward(*self.args, **self.kwargs)
        except _PrefixEnd as end:
            b, hidden = end.hidden
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
