"""Block discovery: find the chain's blocks in a model, and where each takes its hidden state.

:func:`find_blocks` finds the blocks (the chain's stages) of any ``nn.Module``: the longest
``nn.ModuleList`` / ``nn.Sequential`` of repeated blocks that the forward calls in order, each
feeding its hidden state to the next (NOTE [ finding the blocks ]), from one traced forward;
:func:`resolve_blocks` reads the ``blocks=`` a user names instead. What they return,
:class:`Blocks`, is what the instrument (``_instrument.py``) hooks.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ._stages import as_stages
from ._state import training_state
from ._timer import Timer
from ._tree import first_tensor, signature

__all__ = ["Blocks", "find_blocks", "find_blocks_warm", "resolve_blocks"]


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The chain's stages inside a model, and where each takes its hidden state.

    Attributes
    ----------
    modules
        Stage i is a call of ``modules[i - 1]``. One module may be several stages, one per call
        (ALBERT's shared layer): its k-th call in a forward is its k-th stage.
    names
        Their paths in the model (``"transformer.h.0"``; ``"path#k"`` for the k-th call of a
        shared module), for tables and messages.
    hidden_in
        Per block, where the hidden state a_{i-1} enters: ``("arg", k)`` (the k-th positional
        argument) or ``("kw", name)``.
    linked
        Per block, whether the next block takes its output as hidden state. ``False`` where the
        hidden state is made between them (the parent adds a residual, ``h = h + block(h)``, or
        one stack ends and the next begins): a_i is then the next block's hidden input
        (NOTE [ blocks not linked ]). Empty: all linked.
    left_out
        Module lists of repeated blocks the search found running wholly before or after the
        chain: (path, number of blocks, whether before): what ``blocks=`` could add (empty when
        the blocks were given).
    prefix
        Whether the code before the first block (a stem, embeddings) is stage 1 of the chain,
        from the start of the forward to the first block's start, its output the first block's
        hidden input (NOTE [ the prefix as a stage ]). Block k is then stage k + 1.
    tails
        Unlinked blocks (1-based) whose code after them, up to the next block's call, is a stage
        of its own (NOTE [ the code after a block as a stage ] in _instrument.py): its input is
        the block's own output, its output the next block's hidden input. :meth:`stage_of` maps
        a block to its stage.
    """

    modules: tuple[nn.Module, ...]
    names: tuple[str, ...]
    hidden_in: tuple[tuple[str, Any], ...]
    linked: tuple[bool, ...] = ()
    left_out: tuple[tuple[str, int, bool], ...] = ()
    prefix: bool = False
    tails: tuple[int, ...] = ()

    @property
    def stages(self) -> int:
        """The chain's length: one stage per block, plus the prefix's and the tails' where they are stages."""
        return len(self.modules) + int(self.prefix) + len(self.tails)

    @property
    def stage_names(self) -> tuple[str, ...]:
        """One name per stage of the chain: the blocks', after ``"(before <first block>)"``
        for the prefix when it is a stage, and ``"(after <block>)"`` after a block whose tail is one."""
        names: list[str] = [f"(before {self.names[0]})"] if self.prefix else []
        for b, name in enumerate(self.names, start=1):
            names.append(name)
            if b in self.tails:
                names.append(f"(after {name})")
        return tuple(names)

    def with_tails(self) -> Blocks:
        """These blocks with the code after every unlinked block as a stage of its own."""
        return dataclasses.replace(self, tails=tuple(b for b in range(1, len(self.modules)) if not self.is_linked(b)))

    def stage_of(self, idx: int) -> int:
        """The stage of block ``idx`` (1-based; 0: the code before the first block)."""
        return idx + int(self.prefix) + sum(1 for b in self.tails if b < idx)

    def block_at(self, stage: int) -> int | None:
        """The block whose call stage ``stage`` is (0: the prefix's stage); ``None`` for a tail."""
        for b in range(len(self.modules) + 1):
            s = self.stage_of(b)
            if s == stage and (b or self.prefix):
                return b
            if b in self.tails and s + 1 == stage:
                return None
        return None

    @property
    def lists(self) -> tuple[str, ...]:
        """The module lists the blocks come from, in order (a block's path less its last part)."""
        out: list[str] = []
        for n in self.names:
            # "path#k" is the k-th call of the module at path: the path itself names them all.
            parent = n.partition("#")[0] if "#" in n else n.rpartition(".")[0]
            if parent and parent not in out:
                out.append(parent)
        return tuple(out)

    def __len__(self) -> int:
        return len(self.modules)

    @classmethod
    def of(cls, stages: Any, names: Sequence[str] | None = None) -> Blocks:
        """Stages called one after the other with the hidden state as first argument."""
        mods = as_stages(stages)
        if names is None:
            names = [str(i) for i in range(len(mods))]
        return cls(tuple(mods), tuple(names), tuple(("arg", 0) for _ in mods))

    def is_linked(self, idx: int) -> bool:
        """Whether block ``idx`` (1-based) hands its output to block ``idx + 1`` (true for the last)."""
        return not self.linked or idx >= len(self.modules) or self.linked[idx - 1]

    def hidden_of(self, idx: int, args: tuple, kwargs: dict) -> Any:
        """The hidden state among the arguments of block ``idx`` (1-based); ``None`` if absent."""
        where, key = self.hidden_in[idx - 1]
        if where == "arg":
            return args[key] if key < len(args) else None
        return kwargs.get(key)


# NOTE [ blocks a forward skipped ]
# LayerDrop (HF Wav2Vec2 and HuBERT train with layerdrop=0.1 by default; BART, Whisper expose
# it) skips some layers in a training forward, so the one forward discovery traces may call only
# a subset of a module list: the run then broke at the first skipped layer, and which list won
# depended on the draw (HuBERT: with one seed the 3 conv layers, 4 % coverage). A child of a
# list not called between two children that were (each once, in order), or before the first,
# is therefore a stage too, while at most as many were skipped as called (LayerDrop skips a
# minority; a list the forward picks one child from is no chain). Its call is made up from its
# neighbours' (the next one's arguments, the previous one's output; before the first one
# called, that one's hidden input), and the list's run goes on through it: the blocks are the
# whole list whatever the draw; after the last one called, each takes the one before's output
# where that one took its input. A forward that skipped more of a list than it called (LayerDrop
# at 0.5 over 8 layers, a third of the draws) is traced again under other draws of the torch,
# Python and NumPy generators (seeded inside the trace, restored after), at most RETRACES times,
# and the trace that skipped least is kept. So is one that skipped a list's first or last child:
# the call made up for it takes its link to its neighbour for granted (the first one's output is
# the next one's input by construction), while the parent's code may make a new hidden state
# there (h = h * s): an unlinked block taken for linked would be recomputed from its own output,
# not from the state the next block took (the fuzz found that silent). A training step that skips a block collapses its
# stage (NOTE [ skipped stages ] in executor.py).
# Inside a gap the made-up calls all take the next called block's arguments and hand on the
# output of the last block called. That output is never looked for among the next call's other
# arguments: where the parent's code made a new hidden state in the gap (h = h * s), the link
# after a made-up call is then not found and the run ends there (the longest run is the chain),
# as it always did; but where that output is also passed as another argument (a skip connection,
# skip=outputs[j]), it was found there and taken for the hidden state, and a step that ran the
# block handed it none, or another tensor than its block before's output (the fuzz's models
# 1250, 5570 and 6313, seed 43: tests/test_torch_layerdrop_recompute.py).

# NOTE [ finding the blocks ]
# One forward of the sample (no autograd, model state restored after) with hooks on every child
# of every nn.ModuleList / nn.Sequential of the model records which is called, when (start and
# end), with what and returning what. A container gives a run of stages when its children are
# called once each, in the container's order (or when its one child is called several times:
# ALBERT's shared layer, one stage per call), and each stage's hidden state comes from the one
# before: either the returned tensor itself (or its first tensor when it returns a tuple or a
# dict, found among the next call's arguments; an alias with the same storage, offset, shape,
# stride and dtype counts, as wrappers such as FSDP hand blocks a new tensor object), or a new
# tensor of the same shape and dtype made between the two calls (the parent adds a residual:
# h = h + block(h)), never an input an earlier stage already took (blocks reading one input in
# parallel are no chain). The chain is then built in three steps:
# 1. The main run: the one with the most blocks of one class (repeated blocks), then the
#    longest, then the shallowest; the model itself counts as a container when it is an
#    nn.Sequential. A run needs two blocks.
# 2. Refined: a block of it that runs a whole run of blocks of one class in a module list of
#    its own (a CNN stage whose forward runs its list of residual blocks: HF ResNet's,
#    ConvNeXt's; a SegFormer stage, patch embedding, its layers, a norm; a U-Net down block, its
#    resnets, a downsampler) is replaced by that run (NOTE [ stacks inside stages ]). A block
#    whose sub-layers differ (T5's attention and feed-forward) or that is itself the list (an
#    nn.Sequential block) stays whole.
# 3. Extended: every other run that lies wholly before or after the chain so far (not inside one
#    of its blocks, not around one) and is of the same kind, by the same container name
#    (encoder.block and decoder.block, each tower's encoder.layers, Swin's per-stage blocks) or
#    the same block class, or as the two halves of one network (down and up, encoder and
#    decoder: _HALVES), joins it, in the order the forward calls them. A ResNet's layer1 ..
#    layer4 are joined this way, and a U-Net's down and up paths (whose up blocks take a new
#    hidden state, torch.cat([h, skip]), of another shape: same dtype, rank and batch size).
# `blocks=` names the stages instead: a path or a container (its children), a list of paths,
# modules and containers, or a module called several times (one stage per call); they must be
# called in that order, each stage's hidden state coming from the one before as above.


# NOTE [ stacks inside stages ]
# A block of the main run may run a stack of layers of its own between code of its own: a
# SegFormer stage embeds its patches, runs its layers and normalizes; a diffusers down block
# runs its resnets and then its downsampler; a MobileViT layer convolves, runs its transformer
# layers and fuses. As one stage, each such block is one unit: the floor is at least the largest
# stage's activations (a SegFormer at 4 stages was one unit per resolution). Refined, the stack's
# layers are the stages: the block's code before the stack runs in the first layer's stage (as
# code between blocks always does: stage i runs from the end of block i-1), and its code after
# the stack in the next stage (the next block's hidden input is then made between the two, an
# unlinked pair: NOTE [ blocks not linked ] in _instrument.py), or in the suffix after the last
# block, which unit L holds resident in either case. Every unit of the refined chain holds a part
# of what one of the block's unit held, so no unit grows and the floor can only go down; the
# chain spans the same code, and coverage goes up by what the last block ran before its last
# layer (unit L, resident, shrinks to that layer and the code after it). Tiny SegFormer: floor
# 58 % -> 40 % of the keep-all peak, coverage 58 % -> 63 %; a diffusers-shaped U-Net: 68 % ->
# 33 %, 30 % -> 85 % (tests/test_torch_coverage.py checks floor down, coverage not down). What the code after the stack reads of
# the code before it (MobileViT's fusion reads the block's input) is a storage held beyond its
# unit, which the profile finds and keeps resident (NOTE [ units held elsewhere ] in
# _stages.py), as it does for any later block's reads. A residual around the stack (the stack
# starts from the block's input, and the block returns a new tensor of the stack's output shape:
# a ResNet layer's act(layers(x) + shortcut(x))) stays one block: refined, its input would be
# held from the first layer to the add, resident beyond its unit, and coverage would drop. Only
# a whole run (every child of the
# list called once, in order, each taking its hidden state from the one before or a tensor made
# between them) of one class refines a block, the longest if the block runs several.


@dataclasses.dataclass
class _Call:
    """One call of a candidate block: its arguments and output as tensor signatures, so that
    tracing keeps no activation alive (but the last output, see ``_trace``)."""

    order: int
    args: tuple
    kwargs: dict
    out: Any = None
    end: int = 0
    #: Not called in the traced forward (NOTE [ blocks a forward skipped ]): made up from the
    #: next block's arguments and the previous block's output.
    skipped: bool = False


@dataclasses.dataclass
class _Run:
    """Consecutive stages (module, call) and how each takes its hidden state."""

    stages: list[tuple[nn.Module, _Call]]
    locs: list[tuple[str, Any] | None]  # per stage; None for the first (filled in at the end)
    linked: list[bool]  # per stage but the last: the next stage takes this one's output
    name: str
    container: tuple[nn.Module, ...] = ()  # the module list whose children it calls

    @property
    def start(self) -> int:
        return self.stages[0][1].order

    @property
    def stop(self) -> int:
        return self.stages[-1][1].end


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


def _at(call: _Call, loc: tuple[str, Any] | None) -> Any:
    if loc is None:
        return None
    where, key = loc
    if where == "arg":
        return call.args[key] if key < len(call.args) else None
    return call.kwargs.get(key)


def _trace(
    model: nn.Module, args: tuple, kwargs: dict, modules: Sequence[nn.Module], timer: Timer | None = None, seed: int | None = None
) -> tuple[dict[int, list[_Call]], float | None]:
    """The calls of ``modules`` in one forward of ``model``, by module id, and with ``timer``
    that forward's seconds, run with autograd as a training step's forward runs (NOTE [ discovery
    as the warm-up ]); without one, no autograd and no seconds (``None``). ``seed``: the forward
    draws from torch, Python and NumPy generators seeded so (restored after), a trace made again
    when one skipped most of a list (NOTE [ blocks a forward skipped ])."""
    calls: dict[int, list[_Call]] = collections.defaultdict(list)
    counter = [0]
    handles = []
    running: dict[int, list[_Call]] = collections.defaultdict(list)
    last: list[Any] = []

    def pre(mod: nn.Module, a: tuple, kw: dict) -> None:
        counter[0] += 1
        call = _Call(counter[0], tuple(map(signature, a)), {k: signature(v) for k, v in kw.items()})
        calls[id(mod)].append(call)
        running[id(mod)].append(call)
        last.append((a, kw))

    def post(mod: nn.Module, a: tuple, kw: dict, out: Any) -> None:
        counter[0] += 1
        call = running[id(mod)].pop()
        call.out = signature(first_tensor(out))
        call.end = counter[0]
        # Every input and output is held until the trace ends: its address cannot be reused by
        # a tensor made later (which would look like this output, or like a new hidden state).
        last.append(out)

    for m in {id(m): m for m in modules}.values():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with training_state([model]), torch.set_grad_enabled(timer is not None):
            if seed is not None:
                _reseed(seed)
            if timer is None:
                model(*args, **kwargs)
            else:
                timer.sync()
                start = time.perf_counter()
                out = model(*args, **kwargs)
                timer.sync()
                seconds = time.perf_counter() - start
                del out  # and with it what autograd saved, no backward following
    finally:
        for h in handles:
            h.remove()
        last.clear()
    return calls, (seconds if timer is not None else None)


def _reseed(seed: int) -> None:
    """Seed torch's, Python's and NumPy's global generators (a trace's caller restores them)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed(seed)


#: Traces of discovery's forward at most, when one skips most of a module list's children, or
#: its first or last child.
RETRACES = 16


def _skipped_most(containers: Sequence[nn.Module], calls: dict[int, list[_Call]]) -> tuple[int, int]:
    """How a forward skipped children of lists it called in part: the most it left out of one
    list where it left out more than it called (LayerDrop's draw, which discovery does not take
    for a chain), and how many lists lost their first or last child (whose link to its
    neighbour a made-up call cannot tell: NOTE [ blocks a forward skipped ]). (0, 0): none."""
    worst = edges = 0
    for cont in containers:
        called = sum(1 for c in cont if calls.get(id(c)))
        if 0 < called < len(cont) and (len(cont) - called > called or called < 2):
            worst = max(worst, len(cont) - called)
        if 0 < called < len(cont) and len(cont) > 1 and not (calls.get(id(cont[0])) and calls.get(id(cont[-1]))):
            edges += 1
    return worst, edges


def _link(
    prev: _Call, prev_in: Any, cur: _Call, seen: set, same_shape: bool, usual: tuple[str, Any] | None
) -> tuple[tuple[str, Any] | None, bool | None]:
    """How ``cur`` takes its hidden state after ``prev``: (location, linked) with linked True
    (``prev``'s output), False (a new tensor made between them), or None (neither).

    ``usual`` is where the stages before took theirs: ``prev``'s output there links them; a new
    tensor there comes before ``prev``'s output found elsewhere (a decoder block's first one
    takes its embeddings there and the encoder's output as ``encoder_hidden_states``).
    """
    if cur.order <= prev.end or prev.out is None:
        return None, None

    def fresh(h: Any) -> bool:
        if h is None or h in seen or h == prev_in or h == prev.out:
            return False
        # The same kind of tensor: dtype, rank and batch size. Not the same shape: a U-Net's up
        # block takes torch.cat([h, skip]), twice the channels of the block before's output.
        return not same_shape or (len(h[3]), h[3][:1], h[5]) == (len(prev.out[3]), prev.out[3][:1], prev.out[5])

    here = _at(cur, usual)
    if here is not None and here == prev.out:
        return usual, True
    if fresh(here):
        return usual, False
    # A made-up call's output is the last called block's, handed on: found as another argument
    # (a skip connection), it is no hidden state (NOTE [ blocks a forward skipped ]).
    loc = _hidden_location(prev.out, cur.args, cur.kwargs) if not prev.skipped else None
    if loc is not None:
        return loc, True
    loc = _first_location(cur.args, cur.kwargs)
    return (loc, False) if fresh(_at(cur, loc)) else (None, None)


def _chain(stages: list[tuple[nn.Module, _Call]], same_shape: bool = True) -> tuple[int, int, list, list, str]:
    """The longest run [a, b) of ``stages`` in which each takes its hidden state from the one
    before; its locations and links, and why a longer one failed."""
    why = ""
    best = (0, 0, [], [])
    start, locs, links = 0, [None], []
    seen: set = set()
    usual = _first_location(stages[0][1].args, stages[0][1].kwargs) if stages else None
    prev_in: Any = _at(stages[0][1], usual) if stages else None
    for j in range(1, len(stages)):
        prev, cur = stages[j - 1][1], stages[j][1]
        loc, linked = _link(prev, prev_in, cur, seen, same_shape, usual)
        if linked is None:
            why = why or (
                f"block {j} was called before block {j - 1} ended" if cur.order <= prev.end else f"block {j} does not take block {j - 1}'s output"
            )
            start, locs, links, seen = j, [None], [], set()
            usual = _first_location(cur.args, cur.kwargs)
            prev_in = _at(cur, usual)
            continue
        seen.update(x for x in (prev_in, prev.out) if x is not None)
        prev_in, usual = _at(cur, loc), loc
        locs.append(loc)
        links.append(linked)
        if j + 1 - start > best[1] - best[0]:
            best = (start, j + 1, list(locs), list(links))
    return best[0], best[1], best[2], best[3], why


def _container_stages(children: Sequence[nn.Module], calls: dict[int, list[_Call]]) -> tuple[list, str]:
    """The calls of a container's children as stages: each child once, in order; or its one
    child called several times (one stage per call). A child that was not called between two
    that were (LayerDrop skipped it in this forward) is a stage too, with a call made up from
    its neighbours' (NOTE [ blocks a forward skipped ])."""
    if len(children) == 1 and len(calls.get(id(children[0]), [])) >= 2:
        return [(children[0], c) for c in calls[id(children[0])]], ""
    stages: list = []
    gap: list[nn.Module] = []
    for j, child in enumerate(children):
        cs = calls.get(id(child), [])
        if not cs:
            gap.append(child)
            continue
        if len(cs) != 1:
            return stages, f"block {j} was called {len(cs)} times"
        call = cs[0]
        if stages:
            before, out = stages[-1][1].end, stages[-1][1].out
        else:  # skipped first blocks: they hand on the hidden input the first one called takes
            before, out = call.order - 1, _at(call, _first_location(call.args, call.kwargs))
        for k, skipped in enumerate(gap, start=1):
            at = before + k / (len(gap) + 1)  # between the two calls, in order
            stages.append((skipped, _Call(at, call.args, call.kwargs, out, at, True)))
        gap = []
        stages.append((child, call))
    if gap and stages:
        # Skipped last blocks: each takes the one before's output where that one took its input.
        last = stages[-1][1]
        loc = _first_location(last.args, last.kwargs)
        args, kwargs = list(last.args), dict(last.kwargs)
        if loc is not None and loc[0] == "arg":
            args[loc[1]] = last.out
        elif loc is not None:
            kwargs[loc[1]] = last.out
        for k, skipped in enumerate(gap, start=1):
            at = last.end + k / (len(gap) + 1)
            stages.append((skipped, _Call(at, tuple(args), kwargs, last.out, at, True)))
        gap = []
    made_up = sum(1 for _, c in stages if c.skipped)
    if made_up and (made_up > len(stages) - made_up or len(stages) - made_up < 2):
        # More skipped than run (or one run): not LayerDrop, a list the forward picks from.
        first = next(k for k, (_, c) in enumerate(stages) if c.skipped)
        return stages[:first], f"block {first} was not called"
    if gap:
        return stages, f"block {len(children) - len(gap)} was not called"
    return stages, ""


def _finish(run: _Run) -> list[tuple[str, Any]]:
    """Where each stage takes its hidden state; the first: where the second does (if it has a
    tensor there), else its first tensor argument."""
    first = run.stages[0][1]
    loc = run.locs[1] if len(run.locs) > 1 and run.linked and run.linked[0] else None
    if _at(first, loc) is None:
        loc = _first_location(first.args, first.kwargs)
    if loc is None:
        raise ValueError("blocks: the first block takes no tensor argument (its hidden state)")
    return [loc] + list(run.locs[1:])


def _label(name: str) -> str:
    return name or "(the model itself)"


def _stage_names(run: _Run, names: dict[int, str]) -> tuple[str, ...]:
    counts = collections.Counter(id(m) for m, _ in run.stages)
    seen: collections.Counter = collections.Counter()
    out = []
    for k, (m, _) in enumerate(run.stages):
        base = names.get(id(m), f"blocks[{k}]")
        seen[id(m)] += 1
        out.append(f"{base}#{seen[id(m)]}" if counts[id(m)] > 1 else base)
    return tuple(out)


def _as_blocks(run: _Run, names: dict[int, str]) -> Blocks:
    locs = _finish(run)
    linked = tuple(run.linked) + (True,)
    return Blocks(tuple(m for m, _ in run.stages), _stage_names(run, names), tuple(locs), () if all(linked) else linked)


def _join(runs: list[_Run]) -> _Run:
    """Runs in time order joined into one (each one's first stage takes a new hidden state)."""
    runs = sorted(runs, key=lambda r: r.start)
    out = _Run(list(runs[0].stages), list(runs[0].locs), list(runs[0].linked), runs[0].name)
    for r in runs[1:]:
        prev = out.stages[-1][1]
        first = r.stages[0][1]
        # Where the run's own blocks take their hidden state: the previous stack's output may be
        # among the first block's other arguments (a decoder's encoder_hidden_states).
        loc = None
        nxt = r.locs[1] if len(r.locs) > 1 and r.linked and r.linked[0] else None
        for guess in (nxt, r.locs[0], _hidden_location(prev.out, first.args, first.kwargs), _first_location(first.args, first.kwargs)):
            if _at(first, guess) is not None:
                loc = guess
                break
        linked = loc is not None and _at(first, loc) == prev.out
        out.stages += r.stages
        out.locs += [loc] + list(r.locs[1:])
        out.linked += [linked] + list(r.linked)
    return out


def find_blocks_warm(model: nn.Module, args: tuple, kwargs: dict, blocks: Any, device: torch.device) -> tuple[Blocks, float]:
    """:func:`find_blocks` through a forward with autograd, as a training step's forward runs,
    and that forward's seconds: the profile's warm-up and its timing reference (NOTE [ discovery
    as the warm-up ])."""
    found, seconds = _find_blocks(model, args, kwargs, blocks, Timer(device))
    return found, float(seconds)


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
        ``nn.ModuleList`` or ``nn.Sequential``: its children), a container module, or a list of
        modules, paths and containers (``["encoder.block", "decoder.block"]``); a module the
        forward calls several times is one stage per call.

    Returns
    -------
    Blocks

    Raises
    ------
    ValueError
        No run of blocks is found (the message lists the module lists seen and why each was
        not taken, and how to pass ``blocks=``), or the given blocks are not called in order,
        each taking its hidden state from the one before.
    TypeError
        ``blocks`` is of another type.
    """
    return _find_blocks(model, args, kwargs, blocks, None)[0]


def _find_blocks(
    model: nn.Module, args: tuple, kwargs: dict, blocks: Any, timer: Timer | None
) -> tuple[Blocks, float | None]:
    """:func:`find_blocks`, and with ``timer`` the seconds of its forward with autograd (``_trace``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    names = {id(m): n for n, m in model.named_modules()}
    if blocks is not None:
        mods = resolve_blocks(model, blocks, repeat=True)
        calls, seconds = _trace(model, args, kwargs, mods, timer)
        stages: list[tuple[nn.Module, _Call]] = []
        done: set[int] = set()
        for k, m in enumerate(mods):
            if id(m) in done:
                continue
            done.add(id(m))
            cs = calls.get(id(m), [])
            if not cs:
                raise ValueError(f"blocks: {names.get(id(m), f'blocks[{k}]')} is not called by the forward")
            stages += [(m, c) for c in cs]
        start, end, locs, links, why = _chain(stages, same_shape=False)
        if start != 0 or end != len(stages):
            raise ValueError(
                "blocks: the given blocks are not called in order, each taking its hidden state from the one before "
                f"({why or 'the run breaks'})"
            )
        return _as_blocks(_Run(stages, locs, links, ""), names), seconds

    containers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m)]
    children_all = [c for _, m in containers for c in m]
    calls, seconds = _trace(model, args, kwargs, children_all, timer)
    worst = _skipped_most([m for _, m in containers], calls)
    for attempt in range(RETRACES - 1):
        if worst == (0, 0):
            break
        # NOTE [ blocks a forward skipped ]: the draw left out most of a list; trace again under
        # other draws (no autograd: the first trace's seconds stand) and keep the best trace.
        again, _ = _trace(model, args, kwargs, children_all, None, seed=0x5EED + attempt)
        bad = _skipped_most([m for _, m in containers], again)
        if bad < worst:
            calls, worst = again, bad
    runs: list[tuple[tuple, _Run]] = []
    whole: dict[int, _Run] = {}  # id(container) -> its run, when it covers the container
    seen: list[str] = []
    for name, cont in containers:
        children = list(cont)
        stages, why_calls = _container_stages(children, calls)
        kind = f"{type(cont).__name__} of {_classes(children)}"
        start, end, locs, links, why = _chain(stages) if stages else (0, 0, [], [], "")
        why = why_calls if why_calls and (end - start == len(stages)) else why or why_calls
        if end - start < 2:
            # One block is no chain (offloading the last unit frees nothing): not a candidate.
            seen.append(f"{_label(name)} ({kind}): {why or 'not called'}")
            continue
        run = _Run(stages[start:end], locs, links, name, (cont,))
        full = (start, end) == (0, len(stages)) and not why_calls
        note = "" if full else f", only blocks {start}..{end - 1} ({why})"
        seen.append(f"{_label(name)} ({kind}): a run of {end - start}{note}")
        runs.append((_score(run), run))
        if full:
            whole[id(cont)] = run
    if not runs:
        listing = "; ".join(seen) if seen else "none (the model has no nn.ModuleList or nn.Sequential)"
        raise ValueError(
            f"blocks: found no list of blocks that {type(model).__name__}.forward calls in order, each feeding the next. "
            f"Module lists seen: {listing}. Pass blocks='path.to.list' (an nn.ModuleList or nn.Sequential) "
            "or blocks=[module, ...] in the order the forward calls them"
        )
    _, main = max(runs, key=lambda r: r[0])
    main = _refine(main, list(whole.values()))
    main = _extend(main, [r for _, r in runs if r.name != main.name], list(whole.values()))
    found = _as_blocks(main, names)
    # Runs of repeated blocks wholly before or after the chain (code between its blocks already
    # runs in its stages), not inside one another: what blocks= could add.
    first, last = main.stages[0][1].order, main.stages[-1][1].end
    outside: list[tuple[str, int, bool]] = []
    spans: list[tuple[int, int]] = []
    for _, r in sorted(runs, key=lambda r: (-len(r[1].stages), r[1].start)):
        if r.name and (r.stop < first or r.start > last) and _score(r)[0] >= 2:
            if not any(a <= r.start and r.stop <= b for a, b in spans):
                outside.append((r.name, len(r.stages), r.stop < first))
                spans.append((r.start, r.stop))
    return dataclasses.replace(found, left_out=tuple(outside)), seconds


def _refine(run: _Run, whole: list[_Run]) -> _Run:
    """Step 2 of NOTE [ finding the blocks ]: a block that runs a stack of its own becomes that stack."""
    parts: list[_Run] = []
    changed = False
    for k, (m, call) in enumerate(run.stages):
        inside = [
            r for r in whole
            if call.order < r.start and r.stop < call.end
            and len({type(b) for b, _ in r.stages}) == 1 and not any(b is m for b in r.container)
        ]
        # The block's own stacks, not those inside one of their layers (a ResNet stage's
        # layers, not the conv layers inside each of them).
        outer = [r for r in inside if not any(o is not r and _within(r, o) for o in inside)]
        inner = [r for r in outer if r.stages[-1][1].out == call.out or not _residual_around(call, r)]
        if inner:
            # The longest stack; of two as long, the one that ends the block (its output is
            # the block's), else the first called.
            parts.append(max(inner, key=lambda r: (len(r.stages), r.stages[-1][1].out == call.out, -r.start)))
            changed = True
        else:
            parts.append(_Run([(m, call)], [run.locs[k]], [], run.name))
    if not changed:
        return run
    joined = _join(parts)
    joined.name = run.name
    # Where two consecutive parts were linked in the run, they stay linked.
    return joined


def _within(r: _Run, o: _Run) -> bool:
    """Whether run ``r`` runs inside the call of one of ``o``'s stages."""
    return any(c.order < r.start and r.stop < c.end for _, c in o.stages)


def _residual_around(call: _Call, stack: _Run) -> bool:
    """Whether a block's call looks like a residual around ``stack`` (NOTE [ stacks inside
    stages ]): the stack starts from the block's own hidden input and the block returns a tensor
    of the stack's output shape made after it (``act(layers(x) + shortcut(x))``, a ResNet layer):
    refined, the block's input would be read after its layers, held beyond their units."""
    first = stack.stages[0][1]
    taken = _at(first, _first_location(first.args, first.kwargs))
    given = _at(call, _first_location(call.args, call.kwargs))
    out, last = call.out, stack.stages[-1][1].out
    return taken is not None and taken == given and out is not None and last is not None and out[3] == last[3]


def _extend(main: _Run, others: list[_Run], whole: list[_Run]) -> _Run:
    """Step 3 of NOTE [ finding the blocks ]: runs of the same kind before or after the chain
    join it, each refined as the main run was (step 2)."""
    tail = main.name.rpartition(".")[2]
    cls = _dominant(main)
    chosen = [main]
    for r in sorted(others, key=lambda r: (-len(r.stages), r.start)):
        mine = r.name.rpartition(".")[2]
        if mine != tail and _dominant(r) is not cls and not _counterparts(mine, tail):
            continue
        if any(not (r.stop < c.start or r.start > c.stop) for c in chosen):
            continue
        chosen.append(_refine(r, whole))
    if len(chosen) == 1:
        return main
    joined = _join(chosen)
    joined.name = main.name
    return joined


#: Names of module lists that are two halves of one network (a U-Net's down and up paths, an
#: encoder and its decoder): their blocks differ in class but run one after the other.
_HALVES = ({"down", "up"}, {"encoder", "decoder"}, {"enc", "dec"}, {"contract", "expand"}, {"contracting", "expansive"})


def _counterparts(a: str, b: str) -> bool:
    """Whether module lists named ``a`` and ``b`` (last path parts: ``down_blocks``, ``ups``)
    are the two halves of :data:`_HALVES`."""

    def stem(name: str) -> str:
        word = name.lower().replace("-", "_").split("_")[0]
        return word[:-1] if word.endswith("s") and word[:-1] in {w for h in _HALVES for w in h} else word

    return {stem(a), stem(b)} in _HALVES


def _dominant(run: _Run) -> type:
    return collections.Counter(type(m) for m, _ in run.stages).most_common(1)[0][0]


def _classes(mods: Sequence[nn.Module]) -> str:
    counts = collections.Counter(type(m).__name__ for m in mods)
    return ", ".join(f"{c} {n}" for n, c in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")


def _score(run: _Run) -> tuple[int, int, int]:
    repeated = collections.Counter(type(m) for m, _ in run.stages).most_common(1)[0][1]
    return (repeated, len(run.stages), -run.name.count(".") - (1 if run.name else 0))


def resolve_blocks(model: nn.Module, blocks: Any, repeat: bool = False) -> list[nn.Module]:
    """The modules ``blocks`` names in ``model``: a path, a module list, or a list of modules,
    paths and module lists (each list's children, in order). ``repeat``: one module may be
    named once and be several stages (one per call), so it is not refused as a duplicate."""
    def get(path: str) -> nn.Module:
        try:
            return model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"blocks: {type(model).__name__} has no submodule {path!r}") from None

    def expand(item: Any) -> list[Any]:
        item = get(item) if isinstance(item, str) else item
        return list(item) if isinstance(item, (nn.ModuleList, nn.Sequential)) else [item]

    if isinstance(blocks, str):
        blocks = get(blocks)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return as_stages(blocks)
    if isinstance(blocks, nn.Module):
        if repeat:
            return [blocks]
        raise TypeError(f"blocks: a single {type(blocks).__name__}; pass an nn.ModuleList, an nn.Sequential or a list of modules")
    if isinstance(blocks, (list, tuple)):
        return as_stages([m for b in blocks for m in expand(b)])
    raise TypeError(f"blocks: expected None, a module path, a module list or a list of modules, got {type(blocks).__name__}")
