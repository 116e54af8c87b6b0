"""The model instrumentation: find the chain's blocks in a model, and hook the model in place.

:func:`find_blocks` finds the blocks (the chain's stages) of any ``nn.Module``: the longest
``nn.ModuleList`` / ``nn.Sequential`` of repeated blocks that the forward calls in order, each
feeding its hidden state to the next (NOTE [ finding the blocks ]). :class:`Instrument` hooks
the model and its blocks (no wrapper, no new submodule, ``forward`` untouched) and turns one
training step into boundary events for a *listener* (the profiler's recorder or the
executor): forward start, start and end of each block, forward end, the start of each B_i, the
end of the backward; and it routes saved tensors to the listener's pack and unpack hooks
while the model's forward runs (NOTE [ boundary events ]).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import sys
import weakref
from typing import Any, Protocol, Sequence

import torch
from torch import nn

from ._stages import as_stages, model_state
from ._tree import first_tensor, signature, tensors_in

__all__ = ["Blocks", "find_blocks", "Instrument", "Listener", "COMPILE_REFUSAL", "check_not_instrumented", "resolve_blocks"]

# The model each installed instrument hooks: a model is instrumented by one at a time.
_INSTALLED: "weakref.WeakKeyDictionary[nn.Module, Instrument]" = weakref.WeakKeyDictionary()


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


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The chain's stages inside a model, and where each takes its hidden state.

    Attributes
    ----------
    modules
        Stage i is ``modules[i - 1]``.
    names
        Their paths in the model (``"transformer.h.0"``), for tables and messages.
    hidden_in
        Per block, where the hidden state a_{i-1} enters: ``("arg", k)`` (the k-th positional
        argument) or ``("kw", name)``.
    """

    modules: tuple[nn.Module, ...]
    names: tuple[str, ...]
    hidden_in: tuple[tuple[str, Any], ...]

    def __len__(self) -> int:
        return len(self.modules)

    @classmethod
    def of(cls, stages: Any, names: Sequence[str] | None = None) -> "Blocks":
        """Stages called one after the other with the hidden state as first argument."""
        mods = as_stages(stages)
        if names is None:
            names = [str(i) for i in range(len(mods))]
        return cls(tuple(mods), tuple(names), tuple(("arg", 0) for _ in mods))

    def hidden_of(self, idx: int, args: tuple, kwargs: dict) -> Any:
        """The hidden state among the arguments of block ``idx`` (1-based); ``None`` if absent."""
        where, key = self.hidden_in[idx - 1]
        if where == "arg":
            return args[key] if key < len(args) else None
        return kwargs.get(key)


# -- finding the blocks ----------------------------------------------------------------------

# NOTE [ finding the blocks ]
# One forward of the sample (no autograd, model state restored after) with hooks on every child
# of every nn.ModuleList / nn.Sequential of the model records which is called, when, with what
# and returning what. A container's children form a run when each is called exactly once, in
# the container's order, and each takes the hidden state the previous one returned (the
# returned tensor itself, or its first tensor when it returns a tuple or a dict, found among
# the next block's positional or keyword arguments; an alias with the same storage, offset,
# shape, stride and dtype counts, as wrappers such as FSDP hand blocks a new tensor object). Sibling
# containers whose runs cover them entirely and chain into each other are joined, so a ResNet's
# layer1..layer4 make one run of all its bottleneck blocks. The run kept is the one with the
# most blocks of one class (repeated blocks), then the longest, then the shallowest; the
# model itself counts as a container when it is an nn.Sequential. A run needs two blocks.


@dataclasses.dataclass
class _Call:
    """One call of a candidate block: its arguments and output as tensor signatures, so that
    tracing keeps no activation alive (but the last output, see ``_trace``)."""

    order: int
    args: tuple
    kwargs: dict
    out: Any = None


def _hidden_location(prev_out: Any, args: tuple, kwargs: dict) -> tuple[str, Any] | None:
    if prev_out is None:
        return None
    for k, a in enumerate(args):
        if a == prev_out:
            return ("arg", k)
    for name, v in kwargs.items():
        if v == prev_out:
            return ("kw", name)
    return None


def _first_location(args: tuple, kwargs: dict) -> tuple[str, Any] | None:
    for k, a in enumerate(args):
        if a is not None:
            return ("arg", k)
    if kwargs.get("hidden_states") is not None:
        return ("kw", "hidden_states")
    for name, v in kwargs.items():
        if v is not None:
            return ("kw", name)
    return None


def _trace(model: nn.Module, args: tuple, kwargs: dict, modules: Sequence[nn.Module]) -> dict[int, list[_Call]]:
    calls: dict[int, list[_Call]] = collections.defaultdict(list)
    counter = [0]
    handles = []

    def pre(mod: nn.Module, a: tuple, kw: dict) -> None:
        counter[0] += 1
        calls[id(mod)].append(_Call(counter[0], tuple(map(signature, a)), {k: signature(v) for k, v in kw.items()}))

    last: list[Any] = [None]

    def post(mod: nn.Module, a: tuple, kw: dict, out: Any) -> None:
        calls[id(mod)][-1].out = signature(first_tensor(out))
        # Held until the next block's output: its address cannot be reused by a tensor made
        # between this call and the next one (which would look like this output).
        last[0] = out

    for m in {id(m): m for m in modules}.values():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with model_state([model]), torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls


def _run_of(
    children: Sequence[nn.Module], calls: dict[int, list[_Call]]
) -> tuple[int, int, list[tuple[str, Any]] | None, str]:
    """The longest chained run [a, b) of ``children``, the hidden-input locations of its blocks
    (the first one's filled in later), and why a longer one failed."""
    why = ""
    best = (0, 0, None)
    start = 0
    locs: list[tuple[str, Any] | None] = []
    for j, child in enumerate(children):
        cs = calls.get(id(child), [])
        ok = len(cs) == 1
        if not ok:
            why = why or (f"block {j} was not called" if not cs else f"block {j} was called {len(cs)} times")
        loc = None
        if ok and j > start:
            prev = calls[id(children[j - 1])][0]
            if cs[0].order <= prev.order:
                ok, why = False, why or f"block {j} was called before block {j - 1}"
            else:
                loc = _hidden_location(prev.out, cs[0].args, cs[0].kwargs)
                if loc is None:
                    why = why or f"block {j} does not take block {j - 1}'s output"
        if not ok:
            start, locs = j + 1, []
            continue
        if j > start and loc is None:
            start, locs = j, []
        locs.append(loc)
        if j + 1 - start > best[1] - best[0]:
            best = (start, j + 1, list(locs))
    return best[0], best[1], best[2], why


def _finish_locations(modules: list[nn.Module], locs: list, calls: dict[int, list[_Call]]) -> list[tuple[str, Any]]:
    """Fill in where the first block takes its hidden state: where the second one does (if it
    has a tensor there), else its first tensor argument."""
    first = calls[id(modules[0])][0]
    loc = locs[1] if len(locs) > 1 else None
    if loc is not None:
        where, key = loc
        value = first.args[key] if where == "arg" and key < len(first.args) else first.kwargs.get(key) if where == "kw" else None
        if value is None:
            loc = None
    loc = loc or _first_location(first.args, first.kwargs)
    if loc is None:
        raise ValueError("blocks: the first block takes no tensor argument (its hidden state)")
    return [loc] + list(locs[1:])


def _label(name: str) -> str:
    return name or "(the model itself)"


def find_blocks(model: nn.Module, args: tuple, kwargs: dict, blocks: Any = None) -> Blocks:
    """The chain's blocks in ``model`` and where each takes its hidden state.

    Parameters
    ----------
    model
        The model, called as ``model(*args, **kwargs)``.
    args, kwargs
        A representative call (one untimed forward without autograd is run; the model's
        buffers and the RNG are restored after).
    blocks
        ``None``: found (NOTE [ finding the blocks ]). A module path (``"transformer.h"``, an
        ``nn.ModuleList`` or ``nn.Sequential``: its children), a list of modules or of paths,
        or a container module.

    Returns
    -------
    Blocks

    Raises
    ------
    ValueError
        No run of blocks is found (the message lists the module lists seen and why each was
        not taken, and how to pass ``blocks=``), or the given blocks are not called once each,
        in order, each feeding the next.
    TypeError
        ``blocks`` is of another type.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    names = {id(m): n for n, m in model.named_modules()}
    if blocks is not None:
        mods = resolve_blocks(model, blocks)
        calls = _trace(model, args, kwargs, mods)
        start, end, locs, why = _run_of(mods, calls)
        if start != 0 or end != len(mods):
            raise ValueError(
                f"blocks: the given blocks are not called once each, in order, each feeding the next ({why or 'the run breaks'})"
            )
        locs = _finish_locations(mods, locs, calls)
        return Blocks(tuple(mods), tuple(names.get(id(m), f"blocks[{k}]") for k, m in enumerate(mods)), tuple(locs))

    containers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m)]
    calls = _trace(model, args, kwargs, [c for _, m in containers for c in m])
    runs: list[tuple[tuple, list[nn.Module], list]] = []
    seen: list[str] = []
    full: dict[str, list[tuple[int, str, list[nn.Module], list]]] = collections.defaultdict(list)
    for name, cont in containers:
        children = list(cont)
        start, end, locs, why = _run_of(children, calls)
        kind = f"{type(cont).__name__} of {_classes(children)}"
        if end - start < 2:
            # One block is no chain (offloading the last unit frees nothing): not a candidate.
            seen.append(f"{_label(name)} ({kind}): {why or 'not called'}")
            continue
        run = children[start:end]
        note = "" if (start, end) == (0, len(children)) else f", only blocks {start}..{end - 1} ({why})"
        seen.append(f"{_label(name)} ({kind}): a run of {end - start}{note}")
        runs.append((_score(run, name), run, locs))
        if (start, end) == (0, len(children)) and name:
            parent = name.rpartition(".")[0]
            full[parent].append((calls[id(run[0])][0].order, name, run, locs))
    for group in full.values():
        group.sort(key=lambda g: g[0])
        cur_run, cur_locs = list(group[0][2]), list(group[0][3])
        for _, name, run, locs in group[1:]:
            loc = _hidden_location(calls[id(cur_run[-1])][0].out, calls[id(run[0])][0].args, calls[id(run[0])][0].kwargs)
            if loc is not None and calls[id(run[0])][0].order > calls[id(cur_run[-1])][0].order:
                cur_run += run
                cur_locs += [loc] + list(locs[1:])
                runs.append((_score(cur_run, name), list(cur_run), list(cur_locs)))
            else:
                cur_run, cur_locs = list(run), list(locs)
    if not runs:
        listing = "; ".join(seen) if seen else "none (the model has no nn.ModuleList or nn.Sequential)"
        raise ValueError(
            f"blocks: found no list of blocks that {type(model).__name__}.forward calls in order, each feeding the next. "
            f"Module lists seen: {listing}. Pass blocks='path.to.list' (an nn.ModuleList or nn.Sequential) "
            "or blocks=[module, ...] in the order the forward calls them"
        )
    _, run, locs = max(runs, key=lambda r: r[0])
    locs = _finish_locations(run, locs, calls)
    return Blocks(tuple(run), tuple(names.get(id(m), "?") for m in run), tuple(locs))


def _classes(mods: Sequence[nn.Module]) -> str:
    counts = collections.Counter(type(m).__name__ for m in mods)
    return ", ".join(f"{c} {n}" for n, c in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")


def _score(run: Sequence[nn.Module], name: str) -> tuple[int, int, int]:
    repeated = collections.Counter(type(m) for m in run).most_common(1)[0][1]
    return (repeated, len(run), -name.count(".") - (1 if name else 0))


def resolve_blocks(model: nn.Module, blocks: Any) -> list[nn.Module]:
    """The modules ``blocks`` names in ``model``: a path, a module list, or a list of modules or paths."""
    def get(path: str) -> nn.Module:
        try:
            return model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"blocks: {type(model).__name__} has no submodule {path!r}") from None

    if isinstance(blocks, str):
        blocks = get(blocks)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return as_stages(blocks)
    if isinstance(blocks, nn.Module):
        raise TypeError(f"blocks: a single {type(blocks).__name__}; pass an nn.ModuleList, an nn.Sequential or a list of modules")
    if isinstance(blocks, (list, tuple)):
        return as_stages([get(b) if isinstance(b, str) else b for b in blocks])
    raise TypeError(f"blocks: expected None, a module path, a module list or a list of modules, got {type(blocks).__name__}")


# -- hooks ----------------------------------------------------------------------------------


class Listener(Protocol):
    """What an :class:`Instrument` tells: the profiler's recorder and the executor implement it.

    ``forward_start`` returns the listener's step object, which every later call of the same
    forward/backward gets back (so a late hook of an abandoned step can be told apart).
    """

    def wants(self) -> bool: ...
    def forward_start(self, args: tuple, kwargs: dict) -> Any: ...
    def stage_start(self, step: Any, idx: int, hidden: Any, args: tuple, kwargs: dict) -> None: ...
    def stage_end(self, step: Any, idx: int, hidden_in: Any, hidden_out: Any) -> None: ...
    def forward_end(self, step: Any, outputs: Any) -> None: ...
    def forward_failed(self, step: Any) -> None: ...
    def backward_mark(self, step: Any, idx: int) -> None: ...
    def backward_end(self, step: Any) -> None: ...
    def pack(self, step: Any, t: torch.Tensor) -> Any: ...
    def unpack(self, packed: Any) -> torch.Tensor: ...


class _Pass:
    """One instrumented forward (and its backward)."""

    __slots__ = ("listener", "step", "expect", "inputs", "saved_hooks", "callback_queued", "done")

    def __init__(self, listener: Listener, step: Any) -> None:
        self.listener = listener
        self.step = step
        self.expect = 1
        self.inputs: dict[int, Any] = {}
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


class _Hook:
    """A module hook of an instrument. A copy of the model (``copy.deepcopy``, pickling) gets a
    hook that does nothing: the copy is a plain model, not a second offloaded one."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __deepcopy__(self, memo: dict) -> "_Inert":
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
        self._stack: list[_Pass | None] = []
        self._ctx: _Pass | None = None

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
        for idx, block in enumerate(self.blocks.modules, start=1):
            pre, post = functools.partial(self._block_pre, idx), functools.partial(self._block_post, idx)
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
        p = self._stack.pop() if self._stack else None
        if p is None:
            return None
        failed = out is None and sys.exc_info()[0] is not None
        self._close(p, out, failed)
        if not failed:
            for t in tensors_in(out):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._grad_hook, p, len(self.blocks)))
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

    def _open(self, listener: Listener, step: Any) -> _Pass:
        p = _Pass(listener, step)
        p.saved_hooks = torch.autograd.graph.saved_tensors_hooks(functools.partial(listener.pack, step), listener.unpack)
        p.saved_hooks.__enter__()
        return p

    def _close(self, p: _Pass, out: Any, failed: bool) -> None:
        p.saved_hooks.__exit__(None, None, None)
        p.saved_hooks = None
        n = len(self.blocks)
        if failed:
            p.listener.forward_failed(p.step)
            return
        if p.expect != n + 1:
            p.listener.forward_failed(p.step)
            raise RuntimeError(
                f"chainoffload_torch: the forward ran blocks 1..{p.expect - 1} of {n} "
                f"({', '.join(self.blocks.names[:3])}{', ...' if n > 3 else ''}); every block must run once, in order"
            )
        p.listener.forward_end(p.step, out)

    def _current(self) -> _Pass | None:
        if self._ctx is not None:
            return self._ctx
        return self._stack[-1] if self._stack else None

    # -- the blocks --------------------------------------------------------------------------

    def _block_pre(self, idx: int, module: nn.Module, args: tuple, kwargs: dict) -> None:
        p = self._current()
        if p is None:
            return None
        if idx != p.expect:
            raise RuntimeError(
                f"chainoffload_torch: block {idx} ({self.blocks.names[idx - 1]}) started while block {p.expect} was "
                "expected; the blocks must run once each, in order"
            )
        hidden = self.blocks.hidden_of(idx, args, kwargs)
        p.inputs[idx] = hidden
        p.listener.stage_start(p.step, idx, hidden, args, kwargs)
        return None

    def _block_post(self, idx: int, module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        p = self._current()
        if p is None:
            return None
        hidden_out = first_tensor(out)
        p.listener.stage_end(p.step, idx, p.inputs.pop(idx, None), hidden_out)
        p.expect = idx + 1
        if isinstance(hidden_out, torch.Tensor) and hidden_out.requires_grad:
            hidden_out.register_hook(functools.partial(self._grad_hook, p, idx))
        return None

    # -- the backward ------------------------------------------------------------------------

    def _grad_hook(self, p: _Pass, idx: int, grad: torch.Tensor) -> None:
        if p.done:
            return None
        if not p.callback_queued:
            p.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(functools.partial(self._backward_end, p))
        p.listener.backward_mark(p.step, idx)
        return None

    def _backward_end(self, p: _Pass) -> None:
        if not p.done:
            p.done = True
            p.listener.backward_end(p.step)
