"""The model instrumentation: hook a model and its blocks in place, and report a step's boundaries.

:class:`Instrument` hooks the model and its blocks (the :class:`~chainoffload_torch.Blocks`
that block discovery found, ``_discovery.py``; no wrapper, no new submodule, ``forward``
untouched) and turns one training step into boundary events for a *listener* (the profiler's
recorder or the executor): forward start, start and end of each block, forward end, the start
of each B_i, the end of the backward; and it routes saved tensors to the listener's pack and
unpack hooks while the model's forward runs (NOTE [ boundary events ]).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ._tree import first_tensor, tensors_in

if TYPE_CHECKING:
    from ._discovery import Blocks

__all__ = ["Instrument", "Listener", "SkippedBlocks", "COMPILE_REFUSAL", "CONCURRENT_REFUSAL", "check_not_instrumented", "recomputing"]


#: Depth of recomputations in progress (the executor calling a block again): the blocks' hooks
#: then report nothing, since that call is no step of the model's forward.
RECOMPUTING = [0]

#: While a profiling pass runs the blocks a forward skipped in their place: (the first of them,
#: the block the forward called next), 1-based (NOTE [ the code after a skipped block ]).
IN_PLACE_OF: list[tuple[int, int] | None] = [None]


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    """Mark the block calls inside as a recomputation, which no instrument reports."""
    RECOMPUTING[0] += 1
    try:
        yield
    finally:
        RECOMPUTING[0] -= 1


# The model each installed instrument hooks: a model is instrumented by one at a time.
_INSTALLED: weakref.WeakKeyDictionary[nn.Module, Instrument] = weakref.WeakKeyDictionary()


def check_not_instrumented(model: nn.Module) -> None:
    """Raise if an offloading handle (or a profile in progress) already hooks ``model``."""
    if model in _INSTALLED:
        raise ValueError(
            f"model: this {type(model).__name__} is already offloaded by a handle; call its .remove() first "
            "(or read the handle's .plan.chain)"
        )

#: The one-line reason given when torch.compile reaches an instrumented model.
COMPILE_REFUSAL = (
    "torch.compile: a model instrumented by chainoffload_torch cannot be compiled (Dynamo cannot trace the "
    "saved-tensor hooks that move activations); train it uncompiled, or call handle.remove() before compiling"
)

#: What a forward of one offloaded model from a second thread gets while another runs
#: (NOTE [ one step at a time ] in api.py).
CONCURRENT_REFUSAL = (
    "chainoffload_torch: the offloaded model was called from two threads at once (a forward while another "
    "thread's forward or backward of it was running); one offloaded model runs one training step at a time. Call it "
    "from one thread, or hold a lock around each step's forward and backward"
)


class SkippedBlocks(RuntimeError):
    """A profiling pass whose forward did not call its last block(s), or skipped blocks that a
    call made up from the next block's arguments cannot run: the profile runs it again under
    other random draws (NOTE [ skipped stages ]). ``block``: the skipped block that could not
    be run in its place, if that was the reason."""

    def __init__(self, message: str, block: int | None = None) -> None:
        super().__init__(message)
        self.block = block


def _with_hidden(at: tuple[str, Any], args: tuple, kwargs: dict, h: Any) -> tuple[tuple, dict]:
    """``args, kwargs`` with the hidden state at ``at`` replaced by ``h``."""
    where, key = at
    if where == "arg":
        return args[:key] + (h,) + args[key + 1 :], kwargs
    return args, {**kwargs, key: h}


# -- hooks ----------------------------------------------------------------------------------


class Listener(Protocol):
    """What an :class:`Instrument` tells: the profiler's recorder and the executor implement it.

    ``forward_start`` returns the listener's step object, which every later call of the same
    forward/backward gets back (so a late hook of an abandoned step can be told apart).
    ``stage_skipped`` says that stage ``idx``'s block was not called in this forward (``hidden``:
    the hidden state the next block that runs takes, ``None`` after the last); a listener with
    ``runs_skipped = True`` (the profiler's) gets the skipped blocks called instead, and a
    forward whose last blocks it skipped raises :class:`SkippedBlocks` (NOTE [ skipped stages ]).
    """

    def wants(self) -> bool: ...
    def forward_start(self, args: tuple, kwargs: dict) -> Any: ...
    def stage_start(self, step: Any, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None: ...
    def stage_end(self, step: Any, idx: int, hidden_in: Any, hidden_out: Any) -> None: ...
    def stage_skipped(self, step: Any, idx: int, hidden: Any) -> None: ...
    def forward_end(self, step: Any, outputs: Any) -> None: ...
    def forward_failed(self, step: Any) -> None: ...
    def backward_mark(self, step: Any, idx: int) -> None: ...
    def backward_end(self, step: Any) -> None: ...
    def pack(self, step: Any, t: torch.Tensor) -> Any: ...
    def unpack(self, packed: Any) -> torch.Tensor: ...


class _HookedPass:
    """One instrumented forward (and its backward)."""

    __slots__ = ("listener", "step", "expect", "inputs", "saved_hooks", "callback_queued", "done", "running", "pending")

    def __init__(self, listener: Listener, step: Any) -> None:
        self.listener = listener
        self.step = step
        self.expect = 1
        self.inputs: dict[int, Any] = {}
        self.running: dict[int, list[int]] = {}  # id(module) -> the stages it is running
        #: A block whose end waits for the next one's input: (block, its hidden input, its output,
        #: the stage of its tail when the code after it is one, else 0: NOTE [ the code after a
        #: block as a stage ]).
        self.pending: tuple[int, Any, Any, int] | None = None
        self.saved_hooks: Any = None
        self.callback_queued = False
        self.done = False


_EVAL_FRAME = os.path.join("_dynamo", "eval_frame.py")


def _under_compile() -> bool:
    """Whether a torch.compile'd function is running (Dynamo's frame evaluation is on the stack).

    Dynamo cannot trace ``sys._getframe``: it breaks the graph here and runs this in Python,
    where the compiled caller's frame is visible (NOTE [ torch.compile ]).
    """
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename.endswith(_EVAL_FRAME):
            return True
        f = f.f_back
    return False


# NOTE [ torch.compile ]
# Under torch.compile, Dynamo inlines nn.Module._call_impl and so these hooks. It cannot trace
# saved_tensors_hooks whose pack replaces a tensor by a handle, and fails (after compiling for
# tens of seconds) with misleading errors. The root pre-hook therefore refuses first: it looks
# for Dynamo's frame evaluation on the Python stack, which is there both for torch.compile(model)
# and model.compile(), and raises COMPILE_REFUSAL before anything is compiled (about a second).


# NOTE [ boundary events ]
# Forward: the model's forward pre-hook starts a step (the listener may replan there, running
# profiling passes of its own, re-entrantly) and pushes saved_tensors_hooks; each block's pre-
# and post-hook mark the start and end of its forward; the model's forward post-hook (always
# called, also when the forward raises) pops the hooks and marks the end of F_L: code after the
# last block (head, loss) belongs to stage L, code before the first block to the prefix.
# Backward: a tensor hook on each block's hidden output a_i (i < L) fires once g_i is complete:
# B_{i+1} has ended and B_i starts. B_L starts with the backward itself: hooks on the model's
# output tensors fire first (the suffix's backward is part of B_L); a hook on a_L does the same
# when the model's outputs are not hooked (the context-manager form). The first backward hook
# queues a callback on the autograd engine that marks the end of B_1. Every hook carries its
# pass; a hook of a pass that is not the listener's current step is ignored by the listener.


# NOTE [ the code after a skipped block ]
# A profiling pass runs the blocks a forward skipped in their place, from the next block's
# pre-hook (NOTE [ skipped stages ] in executor.py): the model's code after the skipped places
# has then already run, on the carried hidden state. An in-place write there (h += 1 after
# block 8) lands on block 7's output, and the watch of the blocks (plans._watch_blocks) took it
# for a write after block 7; block 8's own output, handed to block 9 untouched, looked linked.
# With every pass of a profile skipping block 8 (the fuzz's model 4812 of the seed-43
# recomputing run, recompute-all: LayerDrop 0.3 over 12 blocks, two passes), block 8 was
# recomputed, and every step, skipping or not, was refused mid-training by the executor's check
# that a recomputed block takes its predecessor's output as it returned it. IN_PLACE_OF says,
# while the instrument runs skipped blocks in their place, which ones and before which block;
# a write the watch finds on the carried state then marks the block before them and each of
# them not recomputable, since the profile cannot tell after which place the write ran. A pass
# where those blocks run finds the one it is; the others' recomputation is given up for it.
# Skipped first blocks carry the code before the blocks' output, with no block before them to
# compare with: NOTE [ a write on a carried a_0 ] in plans.py.


# NOTE [ a carried view written in place ]
# The gradient mark of stage k (the start of B_k, where a recomputation of block k runs) is a
# tensor hook on a_k. An in-place write on a view rebases it: its base's node becomes CopySlices,
# whose next edge is the base's old node, and the gradient goes around a_k's node, so the hook
# never fires. The profile sees the writes its passes make (plans._watch_blocks); a LayerDrop
# step makes others: block m that writes its hidden input (x.relu_() first) writes a_k when the
# step skips blocks k+1..m-1, and the backward of block k read its recomputation's slots before
# the recomputation ran (the recomputing fuzz of seed 43: models 5870 and 6084, a transpose
# block's reshaped output, relu_ or mul_ two blocks on). Decision: a training step that skips
# blocks after stage k, carrying a view a_k on, also puts stage k's mark before the node of a_k's
# base (a node pre-hook): that node runs once all of a_k's gradient reached it, by a_k's node or
# around it, and before any of block k's own backward that the view's gradient goes through; a
# second mark of a stage is a no-op (the executor's and the recorder's marks only advance), and
# this one never comes before a_k's own hook where that fires. Where the write came before the
# skip was seen (code after a skipped place), the base's node is CopySlices already, whose
# pre-hook fires once every later stage's backward ran: the same point. The common path (no
# skip) registers nothing more. Where the code after block k is a stage (a tail) that made no
# new tensor, a_k and the tail's output are one view and both hooks are lost: the mark is then
# block k's, which the executor's marks reach through the tail's (the fuzz's model 5870 as
# drawn); a tail that made the base gets its own. Not chosen: keeping such blocks from being
# recomputed once the profile saw a skip (it costs their recomputation, and a profile that drew
# no skip misses it).
# Left alone: a view written by the head's code after a step skipped the last blocks.


# NOTE [ a skip no step can carry out ]
# A step that skips blocks (LayerDrop) before a block that takes its hidden state elsewhere (a
# keyword the skipped block did not hand on, the code before the blocks with no output) has no
# a_j to carry to that block: the executor refuses it (RuntimeError), where plain PyTorch trains.
# A profiling pass that draws such a step draws again, and offload() used to plan on: the fuzz's
# model 3725 (recomputing run, seed 43) was then refused in its second training step, when its
# own draw skipped so (or in the measuring forward of a shape whose profile replays the call's
# draws, NOTE [ blocks a profile cannot run ] in _recorder.py). Decision: the instrument
# remembers the first such draw of any profiling pass (untrainable_skip), and offload() refuses
# after its first profile, with a ValueError naming it, before anything trained: the model's own
# random skipping makes that step, at a rate the profile's few draws already met (one in its
# tries at most 32). It is also the refusal named when the first plan's solve finds no plan
# (model 3725 with recompute-all, once the profile's draws after a dropout run in place were the
# call's own: NOTE [ the draws of a block run in place ]), since it holds for every method and
# budget. What stays: a model whose profile never drew such a step, and a profile
# of a new shape in training (its draws are remembered, nothing refuses there), are refused
# at the step that draws it, as before.


# NOTE [ the draws of a block run in place ]
# A profiling pass runs the blocks a forward skipped in their place (NOTE [ skipped stages ] in
# executor.py). A block that draws (dropout) advanced the generators there, so every draw the
# model made after that place, LayerDrop's next skips included, was another than the call's
# own: the first profiling pass, taken as the call's own draws (a block it runs that raises
# raises in the call's training step too, NOTE [ blocks a profile cannot run ] in _recorder.py),
# ran blocks the call skips. The fuzz's model 8093 (recompute-all seed 43: dropout blocks 2-3,
# batch norm last, LayerDrop 0.1, a batch of one) raised batch norm's "Expected more than 1
# value per channel" in the measuring forward of a step that plain PyTorch, skipping it, trains.
# Decision: torch's (and the hidden state's CUDA device's), Python's and NumPy's generators are
# put back after the calls in place, so the pass draws what the call draws; a replay of the
# call's draws (_Replay) replays them too. Its cost: a copy of each generator's state per run of
# skipped blocks, in profiling passes only.


@contextlib.contextmanager
def _draws_kept(hidden: Any) -> Iterator[None]:
    """Put torch's, Python's and NumPy's generators back as they were after the block."""
    devices = [hidden.device] if isinstance(hidden, torch.Tensor) and hidden.is_cuda else []
    np_random = sys.modules.get("numpy.random")
    py, np_state = random.getstate(), (np_random.get_state() if np_random is not None else None)
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        if np_random is not None and np_state is not None:
            np_random.set_state(np_state)


class _Hook:
    """A module hook of an instrument. A copy of the model (``copy.deepcopy``, pickling) gets a
    hook that does nothing: the copy is a plain model, not a second offloaded one."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __deepcopy__(self, memo: dict) -> _Inert:
        return _Inert()

    def __reduce__(self) -> tuple:
        return (_Inert, ())


class _Inert:
    """What a copied model's hook becomes."""

    def __call__(self, *args: Any) -> None:
        return None


class Instrument:
    """Hooks on ``model`` and on its blocks that report boundary events to ``listener``.

    Parameters
    ----------
    model
        The model whose forward is one step; ``None`` for the context-manager form, where the
        caller marks the forward's start and end with :meth:`begin` and :meth:`end`.
    blocks
        The chain's stages.
    listener
        Receives the events; may be swapped (:attr:`listener`) between forwards, or inside
        ``forward_start`` for nested profiling passes.
    """

    def __init__(self, model: nn.Module | None, blocks: Blocks, listener: Listener) -> None:
        self.model = model
        self.blocks = blocks
        self.listener = listener
        self._handles: list[Any] = []
        self._stack: list[_HookedPass | None] = []
        self._ctx: _HookedPass | None = None
        # The thread whose forward runs now and how deep (a replan's passes nest), and the
        # forwards refused on this thread (NOTE [ one step at a time ] in api.py).
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._local = threading.local()
        #: The first draw of a profiling pass that skipped blocks before one that takes its hidden
        #: state elsewhere: a step a training step cannot carry out (NOTE [ a skip no step can
        #: carry out ]).
        self.untrainable_skip: str | None = None

    # -- installation --------------------------------------------------------------------

    def install(self) -> None:
        """Register the hooks (model and blocks)."""
        if self._handles:
            return
        if self.model is not None:
            check_not_instrumented(self.model)
            _INSTALLED[self.model] = self
            self._handles.append(self.model.register_forward_pre_hook(_Hook(self._root_pre), with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(_Hook(self._root_post), with_kwargs=True, always_call=True))
        self._install_blocks()

    def _install_blocks(self) -> None:
        stages: dict[int, tuple[nn.Module, list[int]]] = {}
        for idx, block in enumerate(self.blocks.modules, start=1):
            stages.setdefault(id(block), (block, []))[1].append(idx)
        for block, idxs in stages.values():
            pre, post = functools.partial(self._block_pre, tuple(idxs)), functools.partial(self._block_post, tuple(idxs))
            self._handles.append(block.register_forward_pre_hook(_Hook(pre), with_kwargs=True))
            self._handles.append(block.register_forward_hook(_Hook(post), with_kwargs=True))

    def remove(self) -> None:
        """Remove every hook this instrument registered."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.model is not None and _INSTALLED.get(self.model) is self:
            del _INSTALLED[self.model]

    @property
    def hooks_installed(self) -> int:
        """Module hooks registered now, plus saved-tensor hooks pushed and not yet popped."""
        pushed = sum(1 for p in self._stack + [self._ctx] if p is not None and p.saved_hooks is not None)
        return len(self._handles) + pushed

    # -- the model's forward -----------------------------------------------------------------

    def _root_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        tid = threading.get_ident()
        with self._lock:
            foreign = self._depth > 0 and self._owner != tid
            if not foreign:
                self._owner, self._depth = tid, self._depth + 1
        if foreign:
            # _root_post runs even though this raises: it must leave the other thread's pass alone.
            self._local.refused = getattr(self._local, "refused", 0) + 1
            raise RuntimeError(CONCURRENT_REFUSAL)
        self._stack.append(None)  # popped by _root_post, which runs even if this raises
        if _under_compile():
            raise RuntimeError(COMPILE_REFUSAL)
        listener = self.listener
        if not listener.wants():
            return None
        step = listener.forward_start(args, kwargs)
        self._stack[-1] = self._open(listener, step)
        return None

    def _root_post(self, module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        if getattr(self._local, "refused", 0):
            self._local.refused -= 1
            return None
        with self._lock:
            self._depth = max(0, self._depth - 1)
            if not self._depth:
                self._owner = None
        p = self._stack.pop() if self._stack else None
        if p is None:
            return None
        failed = out is None and sys.exc_info()[0] is not None
        self._close(p, out, failed)
        if not failed:
            for t in tensors_in(out):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._grad_hook, p, self.blocks.stages))
        return None

    def begin(self) -> None:
        """Context-manager form: the forward starts (hooks the blocks for its duration)."""
        if self._ctx is not None:
            raise RuntimeError("OffloadActivations: already entered (nested forward passes are not supported)")
        listener = self.listener
        if not listener.wants():
            return
        step = listener.forward_start((), {})
        try:
            self._install_blocks()
            self._ctx = self._open(listener, step)
        except BaseException:
            self.remove()
            listener.forward_failed(step)
            raise

    def end(self, failed: bool) -> None:
        """Context-manager form: the forward ended (or raised, ``failed``)."""
        p, self._ctx = self._ctx, None
        self.remove()
        if p is not None:
            self._close(p, None, failed)

    def _open(self, listener: Listener, step: Any) -> _HookedPass:
        p = _HookedPass(listener, step)
        if not getattr(step, "passive", False):  # NOTE [ passive steps ] in executor.py
            p.saved_hooks = torch.autograd.graph.saved_tensors_hooks(functools.partial(listener.pack, step), listener.unpack)
            p.saved_hooks.__enter__()
        if self.blocks.prefix:
            # NOTE [ the prefix as a stage ]: stage 1 starts with the forward; its input is the
            # model's arguments, which the listener already holds as the call's (never owned).
            try:
                listener.stage_start(step, 1, None, (), {})
            except BaseException:
                # Refused (a recomputation it cannot carry out): no pass is open to close later.
                if p.saved_hooks is not None:
                    p.saved_hooks.__exit__(None, None, None)
                    p.saved_hooks = None
                listener.forward_failed(step)
                raise
        return p

    def _close(self, p: _HookedPass, out: Any, failed: bool) -> None:
        if p.saved_hooks is not None:
            p.saved_hooks.__exit__(None, None, None)
            p.saved_hooks = None
        n = len(self.blocks)
        if failed:
            p.listener.forward_failed(p.step)
            return
        # A profiling pass that collapses what it cannot run (NOTE [ blocks a profile cannot
        # run ] in _recorder.py) takes skipped last blocks as a training step does.
        draws_again = getattr(p.listener, "runs_skipped", False) and getattr(p.listener, "collapse", None) is None
        if p.expect != n + 1 and draws_again:
            first = ", ".join(self.blocks.names[p.expect - 1 :][:3]) + (", ..." if n - p.expect > 2 else "")
            p.listener.forward_failed(p.step)
            raise SkippedBlocks(f"chainoffload_torch: the forward skipped its last block(s) ({first}) in a profiling pass")
        if p.expect != n + 1:
            # NOTE [ skipped stages ]: the last blocks were not called (LayerDrop, an early exit).
            pending = p.pending[0] + 1 if p.pending is not None else p.expect
            first = ", ".join(self.blocks.names[pending - 1 :][:3]) + (", ..." if n - pending > 2 else "")
            if draws_again:
                p.listener.forward_failed(p.step)
                raise SkippedBlocks(
                    f"chainoffload_torch: the forward skipped its last block(s) ({first}) in a profiling pass"
                )
            if hasattr(p.listener, "stage_skipped") and p.pending is not None:
                # The block before the skipped ones hands its a_i to code the head runs: its own
                # output stands for it (NOTE [ blocks not linked ]).
                prev, prev_in, own, tail = p.pending
                p.pending = None
                self._end(p, prev, prev_in, own, tail)
                del prev_in, own
            if hasattr(p.listener, "stage_skipped") and p.expect != n + 1:
                for k in range(p.expect, n + 1):
                    self._skipped(p, k, None)
                p.expect = n + 1
        if p.expect != n + 1:
            p.listener.forward_failed(p.step)
            raise RuntimeError(
                f"chainoffload_torch: the forward ran blocks 1..{p.expect - 1} of {n} "
                f"({', '.join(self.blocks.names[:3])}{', ...' if n > 3 else ''}); every block must run once, in order"
            )
        p.listener.forward_end(p.step, out)

    def _current(self) -> _HookedPass | None:
        if self._ctx is not None:
            return self._ctx
        return self._stack[-1] if self._stack else None

    # -- the blocks --------------------------------------------------------------------------

    def _block_pre(self, idxs: tuple[int, ...], module: nn.Module, args: tuple, kwargs: dict) -> None:
        p = self._current()
        if p is None or RECOMPUTING[0]:
            return None
        # A module that is several stages (one per call) is the stage expected next, if it is one.
        idx = p.expect if p.expect in idxs else idxs[0]
        if self.blocks.prefix and p.expect == 1 and idx >= 1:
            # The prefix ends where the first block that runs starts; its output is that block's input.
            a1 = self.blocks.hidden_of(idx, args, kwargs)
            if idx > 1 and not isinstance(a1, torch.Tensor):
                # Blocks skipped after the prefix, and the one that runs takes its hidden state
                # elsewhere: a profiling pass draws again; a training step cannot be carried out.
                raise self._untrainable(
                    p,
                    f"chainoffload_torch: this step skipped the first block(s) ({', '.join(self.blocks.names[: idx - 1][:3])}) "
                    f"and block {idx} ({self.blocks.names[idx - 1]}) takes its hidden state elsewhere, so the code before "
                    "the blocks has no output to hand on; turn the skipping off while offloading (Hugging Face: "
                    "config.layerdrop = 0)",
                )
            self._end(p, 0, None, a1)
        own = None
        if p.pending is not None and p.pending[0] < idx:
            # NOTE [ blocks not linked ]: the pending block ends here, its a_i is this block's
            # input (blocks skipped in between hand it on unchanged).
            prev, prev_in, tail = p.pending[0], p.pending[1], p.pending[3]  # not the output: held, it would look late
            if idx > prev + 1 and tail and isinstance(p.pending[2], torch.Tensor):
                # NOTE [ a carried view written in place ]: the storage root of the block's own
                # output, by id (held, the output would look late).
                own = id(p.pending[2]._base if p.pending[2]._is_view() else p.pending[2])
            p.pending = None
            a_prev = self.blocks.hidden_of(idx, args, kwargs)
            if idx > prev + 1 and not isinstance(a_prev, torch.Tensor):
                # Skipped blocks in between, and the one that runs takes its hidden state
                # elsewhere: a profiling pass draws again; a training step cannot be carried out.
                raise self._untrainable(
                    p,
                    f"chainoffload_torch: this step skipped block(s) {', '.join(self.blocks.names[prev : idx - 1][:3])} and "
                    f"block {idx} ({self.blocks.names[idx - 1]}) takes its hidden state elsewhere, so block {prev} has no "
                    "output to hand on; turn the skipping off while offloading (Hugging Face: config.layerdrop = 0)",
                )
            self._end(p, prev, prev_in, a_prev, tail)
            del prev_in, a_prev
        changed = None
        if idx > p.expect:
            # NOTE [ skipped stages ]: blocks expect..idx-1 were not called in this forward.
            if getattr(p.listener, "runs_skipped", False):
                changed = args, kwargs = self._run_skipped(p, idx, args, kwargs)
            elif hasattr(p.listener, "stage_skipped"):
                hidden = self.blocks.hidden_of(idx, args, kwargs)
                self._mark_at_base(p, p.expect - 1, hidden, own)
                for k in range(p.expect, idx):
                    self._skipped(p, k, hidden)
                p.expect = idx
        if idx != p.expect:
            if idx > p.expect:
                skipped = ", ".join(self.blocks.names[p.expect - 1 : idx - 1][:4]) + (", ..." if idx - p.expect > 4 else "")
                raise RuntimeError(
                    f"chainoffload_torch: block {idx} ({self.blocks.names[idx - 1]}) started while block {p.expect} was "
                    f"expected: this step skipped {skipped} (LayerDrop, stochastic depth that skips the call, an early "
                    "exit?). An offloaded model must run every block once per step: turn the skipping off while "
                    "offloading (Hugging Face: config.layerdrop = 0), or scale the block's output instead of skipping it"
                )
            raise RuntimeError(
                f"chainoffload_torch: block {idx} ({self.blocks.names[idx - 1]}) started while block {p.expect} was "
                "expected; the blocks must run once each, in order"
            )
        hidden = self.blocks.hidden_of(idx, args, kwargs)
        p.inputs[idx] = hidden
        p.running.setdefault(id(module), []).append(idx)
        p.listener.stage_start(p.step, self.blocks.stage_of(idx), hidden, args, kwargs)
        return changed

    def _mark_at_base(self, p: _HookedPass, prev: int, hidden: Any, own: Any) -> None:
        """A step skipped the blocks after block ``prev``, whose stage's output ``hidden`` is
        carried on: where it is a view, its gradient mark is also put before its base's node
        (NOTE [ a carried view written in place ]). ``own``: when the code after block ``prev``
        is a stage (a tail), the id of the tensor whose view, or which, the block's own output is."""
        if not isinstance(hidden, torch.Tensor) or not hidden.requires_grad or not hidden._is_view():
            return
        if prev < 1 and not self.blocks.prefix:
            return  # a_0 of no stage: no mark
        base = hidden._base
        node = base.grad_fn
        if node is None:
            return
        stage = self.blocks.stage_of(prev)
        if prev in self.blocks.tails and own != id(base):
            stage += 1  # the tail made the base: its mark, not the block's
        node.register_prehook(functools.partial(self._node_mark, p, stage))

    def _node_mark(self, p: _HookedPass, idx: int, grad_outputs: Any) -> None:
        self._grad_hook(p, idx, None)

    def _untrainable(self, p: _HookedPass, message: str) -> Exception:
        """A step that skipped blocks before one that takes its hidden state elsewhere: a
        profiling pass draws again (:class:`SkippedBlocks`), and the draw is remembered, for
        offload() to refuse up front; a training step cannot be carried out (NOTE [ a skip no
        step can carry out ])."""
        if not getattr(p.listener, "runs_skipped", False):
            return RuntimeError(message)
        if self.untrainable_skip is None:
            self.untrainable_skip = message
        return SkippedBlocks(message)

    def _skipped(self, p: _HookedPass, idx: int, hidden: Any) -> None:
        """Block ``idx`` was not called in this step: its stage collapses, and so does its tail's
        (what that code saved went to the unit running then, as when it was no stage)."""
        stage = self.blocks.stage_of(idx)
        p.listener.stage_skipped(p.step, stage, hidden)
        if idx in self.blocks.tails:
            p.listener.stage_skipped(p.step, stage + 1, hidden)

    def _run_skipped(self, p: _HookedPass, idx: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A profiling pass: call the blocks ``p.expect..idx-1`` that this forward skipped, each
        on the hidden state the one before returned and on block ``idx``'s other arguments, and
        hand block ``idx`` the last one's output (NOTE [ skipped stages ])."""
        h = self.blocks.hidden_of(idx, args, kwargs)
        at = self.blocks.hidden_in[idx - 1]
        carrying = getattr(p.listener, "carrying", None)
        if carrying is not None:
            carrying(p.step, h, tuple(self.blocks.stage_of(k) for k in range(p.expect, idx)))
        collapse = getattr(p.listener, "collapse", None) or ()
        outer, IN_PLACE_OF[0] = IN_PLACE_OF[0], (p.expect, idx)
        try:
            # NOTE [ the draws of a block run in place ]: what those calls draw is put back.
            with _draws_kept(h):
                return self._run_in_place(p, idx, args, kwargs, h, at, collapse)
        finally:
            IN_PLACE_OF[0] = outer

    def _run_in_place(self, p: _HookedPass, idx: int, args: tuple, kwargs: dict, h: Any, at: Any, collapse: Any) -> tuple[tuple, dict]:
        """_run_skipped's calls, from the carried ``h`` (the hidden state at ``at``)."""
        for k in range(p.expect, idx):
            if k in collapse:
                # NOTE [ blocks a profile cannot run ] in _recorder.py: the stage collapses, as
                # in a training step that skips it (and its tail's with it).
                self._skipped(p, k, h)
                p.expect = k + 1
                continue
            if self.blocks.hidden_in[k - 1] != at or not self.blocks.is_linked(k) or not isinstance(h, torch.Tensor):
                # The profile draws again (SkippedBlocks); after many draws it refuses.
                raise SkippedBlocks(
                    f"chainoffload_torch: the forward skipped block {k} ({self.blocks.names[k - 1]}) in a profiling pass, "
                    "which the profile cannot run in its place (it takes its hidden state elsewhere than the next "
                    "block, or the code between blocks changes it)",
                    block=k,
                )
            a, kw = _with_hidden(at, args, kwargs, h)
            try:
                out = self.blocks.modules[k - 1](*a, **kw)
            except Exception as exc:
                # A block that takes other arguments than the next one (an extra input of its
                # own), or that cannot run at these shapes (batch norm in training on a batch
                # of one): this draw cannot be profiled; the profile draws again.
                raise SkippedBlocks(
                    f"chainoffload_torch: the forward skipped block {k} ({self.blocks.names[k - 1]}) in a profiling pass, "
                    f"which cannot run on the next block's arguments ({type(exc).__name__}: {exc})",
                    block=k,
                ) from exc
            h = first_tensor(out)
            del out
        return _with_hidden(at, args, kwargs, h)

    def _block_post(self, idxs: tuple[int, ...], module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        p = self._current()
        if p is None or RECOMPUTING[0]:
            return None
        running = p.running.get(id(module))
        idx = running.pop() if running else idxs[0]
        if not self.blocks.is_linked(idx) and idx in self.blocks.tails:
            # NOTE [ the code after a block as a stage ]: the block ends with its own output, and
            # its tail starts on it; the tail ends at the next block's start.
            own = first_tensor(out)
            self._end(p, idx, p.inputs.pop(idx, None), own)
            tail = self.blocks.stage_of(idx) + 1
            p.listener.stage_start(p.step, tail, own, (), {})
            p.pending = (idx, own, own, tail)
            return None
        if not self.blocks.is_linked(idx):
            p.pending = (idx, p.inputs.pop(idx, None), first_tensor(out), 0)
            p.expect = idx + 1
            return None
        self._end(p, idx, p.inputs.pop(idx, None), first_tensor(out))
        return None

    def _end(self, p: _HookedPass, idx: int, hidden_in: Any, hidden_out: Any, tail: int = 0) -> None:
        """Block ``idx`` (0: the prefix, when it is a stage) ended with ``hidden_out``; with
        ``tail``, the stage of the code after it, that stage did."""
        stage = tail or self.blocks.stage_of(idx)
        p.listener.stage_end(p.step, stage, hidden_in, hidden_out)
        p.expect = idx + 1
        if isinstance(hidden_out, torch.Tensor) and hidden_out.requires_grad:
            hidden_out.register_hook(functools.partial(self._grad_hook, p, stage))

    # NOTE [ the prefix as a stage ]
    # With Blocks.prefix, the code before the first block is stage 1: it starts with the forward
    # (the listener's stage_start(1) follows forward_start at once, with no hidden input: a_0 is
    # the model's arguments, which are the caller's) and ends at the first block's pre-hook with
    # that block's hidden input as its output a_1; a tensor hook on a_1 marks the start of B_1,
    # whose end is the backward's. Block k is stage k + 1 for the listener. The chain then owns
    # what the stem saves as unit 1, which can move, instead of keeping it resident.

    # NOTE [ blocks not linked ]
    # Where block i's output is not block i+1's hidden input (Blocks.linked: the parent adds a
    # residual, h = h + block(h); a stack ends and the next begins, as an encoder and a decoder,
    # or two towers), a_i is block i+1's hidden input: the chain's state at that boundary. Block
    # i's end is then told to the listener at block i+1's start, with that input as its output,
    # so the code between them runs in stage i (as for linked blocks), the ledger makes a_i an
    # entry of unit i, act[i] is its size, and the tensor hook that marks the start of B_i is on
    # it: its gradient is complete once B_{i+1} is done, and every part of it as well (the
    # residual's branch, the encoder's output that every decoder block reads).

    # NOTE [ the code after a block as a stage ]
    # Above, the code between an unlinked block i and block i+1 (T5's final_layer_norm and
    # dropout before the decoder, BART's and Whisper's encoder-decoder boundary, a CNN's
    # downsampling between stages, a U-Net's concatenation with its skip, h = h + block(h)) runs in
    # stage i, so a recomputation of block i could not give back what that code saved (it is no
    # call of the block) and the stage was never recomputed. offload() makes that code a stage
    # of its own instead, a *tail* (Blocks.tails; Blocks.stage_of maps blocks to stages): block i
    # ends at its post-hook with its own output (first tensor) as a_i, and the tail starts there
    # on it (stage_start with no other arguments), ending at block i+1's pre-hook with that
    # block's hidden input as its output, as above. So:
    # * Saved tensors: the listeners attribute what autograd saves to the stage running (the
    #   executor's step.current, the recorder's ledger stage), which is the tail from block i's
    #   end on: what the code after block i saves is the tail's unit, measured as every unit is;
    #   a storage it saves that block i made (its output: a layer norm saves its input) stays
    #   unit i's (the ledger's first owner), as a block saving its input always did.
    # * Backward boundaries: the tensor hook on a_i (block i's output) marks B_i's start, the one
    #   on block i+1's input B_tail's, as for any two stages. a_i's gradient is complete only
    #   once the tail's backward has run (the tail is the only code that reads a_i), so block
    #   i's recomputation, at B_i's start, runs after everything the tail's backward reads.
    # * The tail is never recomputed (plans.not_recomputable): it is no module the executor can
    #   call. Block i is linked to it, and is recomputed from a_{i-1} like any linked block;
    #   block i+1 from the tail's output, the original instance (never a recomputed one).
    # * Where block i's output is freed by the tail (h + block(h): the add saves nothing), the
    #   chain still counts act[i] in unit i until B_i: above the truth, never below. That also
    #   puts a floor under recomputing plans of such a model: a lone a_i per tail until B_tail
    #   (parent-residual: rotor's least memory is above pure offloading's, which the smaller
    #   units take far lower; benchmarks/results/offload_models_tail.md).
    # * A tail that saves a storage of the stage before its block (h = block(h) * h_prev) would
    #   read it in B_tail, two stages after that unit, before its prefetch: held, resident (the
    #   ledger's rule), where in the block's stage B_{i} reads it as the next stage's backward.
    #   The probe of the first plan finds such tails (_recorder._pinning_tails) and leaves their
    #   code in the block's stage (not recomputed, as before); later shapes keep the layout.
    # * A block whose own output something later holds (BART's last encoder layer: every decoder
    #   layer reads it) keeps its tail. An a_i so held keeps its unit resident whole (NOTE [ units
    #   held elsewhere ] in _stages.py: the chain has no room for a_i apart from its unit), but no
    #   stage is recomputed from this one (the tail never is, block i+1 starts from the tail's
    #   output), so _recorder._sizes pins that storage alone, as in the layout without the tail,
    #   and the rest of the unit moves and is recomputed (BART's least memory with recomputation:
    #   269258 B, 46 % above the floor for any schedule, to 183300 B, at it). Its recomputation
    #   makes a twin of a_i that nothing keeps (the later blocks read the original). BART's
    #   encoder holds storages no unit owns until it returns (its inputs_embeds and position
    #   embeddings): counted as docs/model.md's "Storages no unit owns" says.
    # * A step whose LayerDrop skips block i skips its tail's stage too (it collapses: what the
    #   code saved goes to the unit running then, as before tails); a forward that skips every
    #   block after a tail ends the tail with its own input (aliased units: kept, not moved).
    # * Whether the code before the first block is a stage is decided against the blocks' units
    #   alone (_recorder.prefix_pays): a tail's unit is often tiny, and would make every stem pay.
    # offload() alone makes tails (Blocks.with_tails); profile() and find_blocks() do not.

    # -- the backward ------------------------------------------------------------------------

    def _grad_hook(self, p: _HookedPass, idx: int, grad: torch.Tensor) -> None:
        if p.done:
            return None
        if not p.callback_queued:
            p.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(functools.partial(self._backward_end, p))
        p.listener.backward_mark(p.step, idx)
        return None

    def _backward_end(self, p: _HookedPass) -> None:
        if not p.done:
            p.done = True
            p.listener.backward_end(p.step)
