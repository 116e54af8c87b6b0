"""Passes of the model that plain training would not run, leaving no trace in training.

:func:`training_state` wraps every pass ``offload()`` runs of its own (block discovery's
forward, the profiling steps, a replan's): on top of the model's buffers, gradients and torch
generators (:func:`~chainoffload_torch._stages.model_state`), it holds back the hooks that
would act on parameters from a profiling backward (an optimizer stepped from gradient hooks),
restores Python's and NumPy's global generators and the modules' own plain attributes, and
refuses if a parameter changed anyway (NOTE [ profiling leaves no trace ]).
"""

from __future__ import annotations

import contextlib
import random
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ._stages import model_state

__all__ = ["ProfilingSideEffect", "training_state"]

#: The attributes ``nn.Module.__init__`` makes: torch's own bookkeeping, not the model's state.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) - {"training"}


class ProfilingSideEffect(RuntimeError):
    """A pass run to profile the model changed its parameters (something the adapter could not
    hold back did): the model no longer is as plain training would have it."""


@contextlib.contextmanager
def training_state(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Run passes of ``modules`` that plain training would not run, leaving its state as it was.

    Restores buffers, ``.grad``, the torch generators (CPU and the parameters' CUDA devices),
    Python's ``random`` and NumPy's global generator, generator objects and plain attributes the
    modules hold, and holds back the parameters' gradient hooks (``register_hook``,
    ``register_post_accumulate_grad_hook``) and the modules' backward hooks for the duration.

    Raises
    ------
    ProfilingSideEffect
        A parameter was modified in place during the passes (by a hook not held back).
    """
    mods = _unique_modules(modules)
    # Each module's own (mods holds every submodule): recursing from each would walk the tree
    # once per module, a cost paid at every new shape's measuring forward.
    params = _unique(p for m in mods for p in m.parameters(recurse=False))
    versions = [p._version for p in params]
    memo: dict[int, int] = {}  # plain objects snapshotted, and at what depth
    attrs = [(m, _snapshot(vars(m), _MODULE_INTERNALS, memo=memo)) for m in mods]
    py_state = random.getstate()
    np_random = sys.modules.get("numpy.random")
    np_state = np_random.get_state() if np_random is not None else None
    with model_state(list(modules)), _hooks_held_back(params, mods), _forward_hooks_kept(mods):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_state is not None:
                np_random.set_state(np_state)
            for m, snap in attrs:
                _restore(vars(m), snap)
    moved = [k for k, (p, v) in enumerate(zip(params, versions, strict=True)) if p._version != v]
    if moved:
        named = _named(mods, params)  # names only for the message
        changed = [named[k][0] for k in moved]
        raise ProfilingSideEffect(
            f"chainoffload_torch: profiling changed {len(changed)} parameter(s) of the model in place "
            f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}), so it is no longer as plain training would "
            "have it. Something ran by the model's forward or backward writes its weights (an optimizer stepped from a "
            "hook other than a parameter's gradient hooks, which profiling holds back). Call offload() before "
            "attaching that hook, or step the optimizer in the training loop"
        )


def _unique_modules(modules: Sequence[nn.Module]) -> list[nn.Module]:
    return _unique(m for root in modules for m in root.modules())


def _unique(items: Any) -> list:
    seen: set[int] = set()
    out = []
    for x in items:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _named(mods: list[nn.Module], params: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    names = {id(p): n for n, p in mods[0].named_parameters(remove_duplicate=True)} if mods else {}
    return [(names.get(id(p), f"parameter {k}"), p) for k, p in enumerate(params)]


@contextlib.contextmanager
def _hooks_held_back(params: list[torch.Tensor], mods: list[nn.Module]) -> Iterator[None]:
    """Empty the hook dictionaries autograd reads (it holds the dict objects themselves, so they
    are emptied and refilled in place, never replaced)."""
    held: list[tuple[dict, dict]] = []
    for p in params:
        for name in ("_post_accumulate_grad_hooks", "_backward_hooks"):
            d = getattr(p, name, None)
            if d:
                held.append((d, dict(d)))
    for m in mods:
        for name in ("_backward_hooks", "_backward_pre_hooks"):
            d = getattr(m, name, None)
            if d:
                held.append((d, dict(d)))
    for d, _ in held:
        d.clear()
    try:
        yield
    finally:
        for d, saved in held:
            added = dict(d)  # hooks registered meanwhile (none expected) stay, after the user's
            d.clear()
            d.update(saved)
            d.update(added)


#: The forward hook dictionaries of a module, and those keyed by the same hook ids.
_FORWARD_HOOKS = (
    ("_forward_pre_hooks", ("_forward_pre_hooks_with_kwargs",)),
    ("_forward_hooks", ("_forward_hooks_with_kwargs", "_forward_hooks_always_called")),
)


@contextlib.contextmanager
def _forward_hooks_kept(mods: list[nn.Module]) -> Iterator[None]:
    """Remove the forward hooks the passes registered on the modules (NOTE [ profiling leaves no
    trace ]): a model that installs hooks lazily at its first forward and marks it with an
    attribute (transformers' output capturing) gets its attribute removed with the other
    attributes the passes added, and would install its hooks again at the next forward, twice."""
    before = [(m, {name: set(getattr(m, name, {})) for name, _ in _FORWARD_HOOKS}) for m in mods]
    try:
        yield
    finally:
        for m, had in before:
            for name, keyed in _FORWARD_HOOKS:
                d = getattr(m, name, None)
                if not d:
                    continue
                for k in [k for k in d if k not in had[name]]:
                    del d[k]
                    for other in keyed:
                        extra = getattr(m, other, None)
                        if extra is not None:
                            extra.pop(k, None)


# -- attributes -------------------------------------------------------------------------------

_CONTAINERS = (list, dict, set, bytearray)
_OPAQUE = (nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)


def _generator_state(v: Any) -> Any:
    """The state of a random generator object (``random.Random``, NumPy's, torch's), else ``None``."""
    if isinstance(v, random.Random):
        return ("random", v.getstate())
    if isinstance(v, torch.Generator):
        return ("torch", v.get_state())
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        if isinstance(v, np_random.Generator):
            return ("numpy", v.bit_generator.state)
        if isinstance(v, np_random.RandomState):
            return ("numpy-legacy", v.get_state())
    return None


def _set_generator_state(v: Any, state: Any) -> None:
    kind, s = state
    if kind == "random":
        v.setstate(s)
    elif kind == "torch":
        v.set_state(s)
    elif kind == "numpy":
        v.bit_generator.state = s
    else:
        v.set_state(s)


def _value(v: Any, depth: int, memo: dict[int, int] | None = None) -> Any:
    """What restoring ``v`` in place needs: a container's items, a generator's state, a plain
    object's attributes (one level down); ``None`` when its binding alone is restored (and for
    the adapter's own objects, such as a handle kept as a module attribute, whose plans a replan
    inside these passes must keep)."""
    if type(v).__module__.startswith("chainoffload"):
        return None
    gen = _generator_state(v)
    if gen is not None:
        return ("gen", gen)
    if isinstance(v, list):
        return ("list", list(v), [_value(x, depth - 1, memo) for x in v] if depth else None)
    if isinstance(v, dict):
        return ("dict", dict(v), {k: _value(x, depth - 1, memo) for k, x in v.items()} if depth else None)
    if isinstance(v, set):
        return ("set", set(v), None)
    if isinstance(v, bytearray):
        return ("bytes", bytes(v), None)
    if depth and not isinstance(v, _OPAQUE) and isinstance(getattr(v, "__dict__", None), dict):
        if memo is not None:
            # An object many modules hold (a transformers config: every layer's attention and
            # MLP keep it) is snapshotted once, as deep as any holder asks; the first holder's
            # restore puts back its contents, the others' their bindings.
            if memo.get(id(v), -1) >= depth:
                return None
            memo[id(v)] = depth
        return ("obj", _snapshot(vars(v), frozenset(), depth - 1, memo), None)
    return None


def _snapshot(d: dict, skip: frozenset, depth: int = 2, memo: dict[int, int] | None = None) -> dict:
    return {k: (v, _value(v, depth, memo)) for k, v in d.items() if k not in skip}


def _restore_value(v: Any, how: Any) -> None:
    kind = how[0]
    if kind == "gen":
        _set_generator_state(v, how[1])
    elif kind == "list":
        if len(v) != len(how[1]) or any(a is not b for a, b in zip(v, how[1], strict=True)):
            v[:] = how[1]
        _restore_items(how[1], how[2])
    elif kind == "dict":
        if v.keys() != how[1].keys() or any(v[k] is not x for k, x in how[1].items()):
            v.clear()
            v.update(how[1])
        _restore_items(how[1], how[2])
    elif kind == "set":
        v.clear()
        v.update(how[1])
    elif kind == "bytes":
        v[:] = how[1]
    elif kind == "obj":
        _restore(vars(v), how[1])


def _restore_items(items: Any, hows: Any) -> None:
    if hows is None:
        return
    pairs = zip(items, hows, strict=True) if isinstance(items, list) else ((items[k], h) for k, h in hows.items())
    for x, h in pairs:
        if h is not None:
            _restore_value(x, h)


def _restore(d: dict, snap: dict) -> None:
    """Put the bindings of ``snap`` back into ``d`` (removing names bound meanwhile, except the
    module internals the snapshot skipped) and the contents of what they hold."""
    for k in [k for k in d if k not in snap and k not in _MODULE_INTERNALS]:
        del d[k]
    for k, (v, how) in snap.items():
        if d.get(k, _MISSING) is not v:
            d[k] = v
        if how is not None:
            _restore_value(v, how)


_MISSING = object()


# NOTE [ profiling leaves no trace ]
# offload() runs passes of the model that plain training does not: block discovery's forward and
# the profiling steps, and again for every new shape's plan, inside the call of the training
# step that meets it. Training after offload() must be the training the same loop would do
# without it, number for number, so each such pass runs under training_state, which sets back
# what a pass can change:
# * torch's generators, buffers (batch norm's statistics) and .grad (model_state);
# * Python's random and NumPy's global generator (stochastic depth drawn with random.random(),
#   a NumPy mask), and generator objects the modules hold (random.Random, numpy Generator,
#   torch.Generator);
# * the modules' own attributes (everything but torch's bookkeeping): a call counter, a
#   schedule driven by it, a list the forward appends to. Each binding is put back, names the
#   passes added are removed, and lists, dicts, sets and plain objects are restored in place two
#   levels down (a counter in a config object the module holds). Tensors are put back as
#   objects, not as data: a tensor attribute written in place is a buffer's job (registered
#   buffers are restored by value);
# * forward hooks the passes registered on the modules: transformers installs its output
#   capturing hooks at a model's first forward and marks it with _output_capturing_hooks_installed;
#   with that attribute removed and the hooks left, the first training forward installed them
#   again and a SegFormer's decode head got every stage's output twice (a shape error). Hooks
#   added during the passes are removed with the attribute, and plain training's first forward
#   installs them, as it would have without offload();
# * hooks that act on parameters from a backward: an optimizer stepped from gradient hooks
#   (register_post_accumulate_grad_hook: torchtune's optimizer-in-backward, which took hidden
#   AdamW steps in every profiling backward: loss 4.26 plain against 18.27 at step 0), gradient
#   clipping or logging in register_hook, the modules' full backward hooks. They are held back
#   for the passes (their dictionaries emptied in place and refilled), so they run exactly as
#   often as in plain training. The profile's backward times then leave out what those hooks
#   do; the schedule errs on the side of less time to hide transfers behind.
# What the adapter cannot hold back (a forward hook or a module's forward that writes the
# weights, a backward hook registered elsewhere) is caught after the fact: every parameter's
# version counter is compared, and offload() refuses with ProfilingSideEffect rather than
# train from other weights. State outside the model (a global counter in the user's module, a
# logger) is not restored; forward hooks run during the passes as in any forward.
# The alternative, profiling inside the user's own first steps (no extra pass at all), was
# weighed: the adaptive profile needs a probe pass and its own timed step before a plan exists,
# a first step that is a profile cannot already offload, and a replan in the middle of a run
# would need the step it replans for to run twice anyway. Restoring what a pass changes keeps
# the profile's cost (about two steps) and makes every pass invisible to training.
