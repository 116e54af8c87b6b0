"""Profile a chain of modules into a :class:`chainoffload.Chain` and its link into a Platform.

What is measured, and how (see NOTE [ what the profiler measures ]):

* ``act[i]``: bytes of the output a_i (numel x element size); ``act[0]`` is the sample's.
* ``saved[i]``: bytes of the storages unit i owns after one forward of the whole chain under
  ``saved_tensors_hooks`` (:class:`~chainoffload_torch._stages.UnitLedger`: what F_i saves
  for its backward that is not an earlier unit's, a parameter or a buffer, plus its output),
  each storage counted once, whole. The executor moves exactly these storages.
* ``fwd[i]``, ``bwd[i]``, ``fwd_nosave[i]``: each stage alone on a detached copy of its input,
  the median of ``repeats`` runs after ``warmup`` runs; CUDA events on a GPU, ``perf_counter``
  on CPU.
* ``fwd_tmp[i]``, ``bwd_tmp[i]``: on CUDA, the allocator's peak during F_i above what is
  allocated after it, and during B_i above what is allocated before it plus the input gradient
  g_{i-1}. On CPU there is no allocator peak to read: both are 0.
* The link: on CUDA, pinned-host copies on a side stream, each direction alone at two sizes
  (latency + bytes / bandwidth fitted through them), then both at once on two streams
  (``duplex`` when together they take clearly less than one after the other). On CPU, the
  "link" is a host memcpy measured the same way, and ``duplex`` is true (no copy engines).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

import chainoffload as co

from ._stages import UnitLedger, as_stages, model_state, resident_storages

__all__ = ["Sizes", "measure_sizes", "measure_link", "profile", "profile_full", "Profile"]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Sizes of a chain, in bytes.

    Attributes
    ----------
    act
        Output sizes a_0..a_L (length L + 1).
    saved
        Unit sizes, stages 1..L: ``max(owned[i], act[i])`` (the chain needs saved >= act).
    owned
        Bytes of the storages each unit really owns (what the executor moves for it).
    aliased
        Stages whose units share storage with a neighbour (a stage that writes its input in
        place or returns a view of it): they must stay resident.
    """

    act: tuple[int, ...]
    saved: tuple[int, ...]
    owned: tuple[int, ...]
    aliased: frozenset[int]


@dataclasses.dataclass(frozen=True)
class Profile:
    """Everything :func:`profile_full` measured."""

    chain: co.Chain
    platform: co.Platform
    sizes: Sizes
    device: torch.device


def _device_of(stages: Sequence[nn.Module], sample: torch.Tensor, device: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    param = next((p for s in stages for p in s.parameters()), None)
    return param.device if param is not None else sample.device


def _check_sample(sample: Any) -> torch.Tensor:
    if not isinstance(sample, torch.Tensor):
        raise TypeError(f"sample: expected a tensor (the chain's input a_0), got {type(sample).__name__}")
    return sample


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def measure_sizes(model: Any, sample: torch.Tensor) -> Sizes:
    """The sizes (act, saved) of ``model``'s chain for input ``sample``, without timing.

    Runs one forward with autograd under ``saved_tensors_hooks``; the model's buffers, grads
    and the RNG state are restored afterwards.

    Parameters
    ----------
    model
        An ``nn.Sequential`` or a list of modules (the stages).
    sample
        The chain's input a_0, on the model's device.

    Returns
    -------
    Sizes
    """
    stages = as_stages(model)
    sample = _check_sample(sample)
    device = _device_of(stages, sample, None)
    if sample.device != device:
        raise ValueError(f"sample: is on {sample.device} but the model is on {device}")
    ledger = UnitLedger(device, resident_storages(stages))
    current: list[int | None] = [None]

    def pack(t: torch.Tensor) -> torch.Tensor:
        ledger.pack(t, current[0])
        return t

    act = [_nbytes(sample)]
    with model_state(stages), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = sample
        for i, stage in enumerate(stages, start=1):
            version = ledger.stage_start(i, x)
            current[0] = i
            out = stage(x)
            current[0] = None
            ledger.stage_end(i, x, version, out)
            act.append(_nbytes(out))
            x = out
        owned = tuple(ledger.unit_bytes(i) for i in range(1, len(stages) + 1))
        del x, out
    aliased = set(ledger.aliased)
    saved = []
    for i, own in enumerate(owned, start=1):
        if own < act[i]:
            aliased.add(i)  # its output is not a storage it owns: moving it would not move act[i]
        saved.append(max(own, act[i]))
    return Sizes(tuple(act), tuple(saved), owned, frozenset(aliased))


# -- timing ---------------------------------------------------------------------------------


class _Timer:
    """Times a callable on ``device``: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _grad_like(y: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(y)


def _time_stages(stages: Sequence[nn.Module], sample: torch.Tensor, device: torch.device, act: Sequence[int], repeats: int, warmup: int):
    timer = _Timer(device)
    cuda = device.type == "cuda"
    fwd, bwd, nosave, fwd_tmp, bwd_tmp = [], [], [], [], []
    x = sample.detach()
    for i, stage in enumerate(stages, start=1):
        needs_grad = sample.requires_grad if i == 1 else x.is_floating_point() or x.is_complex()
        leaf = x.detach().requires_grad_(needs_grad)
        f_times, b_times, n_times = [], [], []
        f_tmp = b_tmp = 0
        for r in range(warmup + repeats):
            keep = r >= warmup
            # A fresh non-leaf copy per run, made outside the timer: a stage may write its
            # input in place (ReLU(inplace=True)), which autograd forbids on a leaf.
            with torch.no_grad():
                inp = leaf.detach().clone()
                t, _ = timer(lambda: stage(inp))
            if keep:
                n_times.append(t)
            with torch.enable_grad():
                inp = leaf.clone()
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            with torch.enable_grad():
                t, y = timer(lambda: stage(inp))
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"stage {i} returned a {type(y).__name__}; a chain's stages must each return one tensor")
            if cuda:
                after = torch.cuda.memory_allocated(device)
                f_tmp = max(f_tmp, torch.cuda.max_memory_allocated(device) - after)
            if keep:
                f_times.append(t)
            if y.requires_grad:
                grad = _grad_like(y)
                if cuda:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device)
                t, _ = timer(lambda: torch.autograd.backward(y, grad))
                if cuda:
                    extra = torch.cuda.max_memory_allocated(device) - before - (act[i - 1] if needs_grad else 0)
                    b_tmp = max(b_tmp, extra)
                if keep:
                    b_times.append(t)
                del grad
            elif keep:
                b_times.append(0.0)
            x_next = y.detach()
            del y, inp
        fwd.append(_median(f_times))
        bwd.append(_median(b_times))
        nosave.append(_median(n_times))
        fwd_tmp.append(max(0, int(f_tmp)))
        bwd_tmp.append(max(0, int(b_tmp)))
        x = x_next
    return fwd, bwd, nosave, fwd_tmp, bwd_tmp


# -- the link -------------------------------------------------------------------------------


def measure_link(device: torch.device | str, *, nbytes: int | None = None, small: int = 4096, repeats: int = 5) -> dict[str, Any]:
    """Bandwidth each way, latency and duplex of the device-host link (a memcpy on CPU).

    Parameters
    ----------
    device
        ``cuda:N`` or ``cpu``.
    nbytes, small
        Sizes of the large and small copies; latency + size / bandwidth is fitted through the
        medians at these two sizes. ``nbytes`` defaults to 64 MiB on CUDA, 8 MiB on CPU.
    repeats
        Copies per size and direction (after one warm-up copy).

    Returns
    -------
    dict
        ``bandwidth_d2h``, ``bandwidth_h2d`` (bytes/s), ``latency`` (s), ``duplex`` (bool):
        the keyword arguments of :class:`chainoffload.Platform` less ``memory``.
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = 64 * 2**20 if device.type == "cuda" else 8 * 2**20
    for name, v in (("nbytes", nbytes), ("small", small), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {v!r} must be a positive integer")
    if small >= nbytes:
        raise ValueError(f"small: {small} must be below nbytes={nbytes}")
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host.fill_(1)
    dev.fill_(2)
    if cuda:
        streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))

        def timed(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
            torch.cuda.synchronize(device)
            starts, ends = [], []
            for (dst, src), s in zip(pairs, streams):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(s):
                    a.record(s)
                    dst.copy_(src, non_blocking=True)
                    b.record(s)
                starts.append(a)
                ends.append(b)
            torch.cuda.synchronize(device)
            # Both copies start together; the span is from the first start to the last end.
            return max(starts[0].elapsed_time(e) for e in ends) / 1e3
    else:

        def timed(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
            t0 = time.perf_counter()
            for dst, src in pairs:
                dst.copy_(src)
            return time.perf_counter() - t0

    def med(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        timed(pairs)  # warm-up: first touch of the pages, thread pool start
        timed(pairs)
        return _median([timed(pairs) for _ in range(repeats)])

    def fit(big_t: float, small_t: float) -> tuple[float, float]:
        span = max(big_t - small_t, 1e-12)
        bw = (nbytes - small) / span
        lat = max(0.0, small_t - small / bw)
        return bw, lat

    d2h_big, d2h_small = med([(host, dev)]), med([(host[:small], dev[:small])])
    h2d_big, h2d_small = med([(dev2, host2)]), med([(dev2[:small], host2[:small])])
    bw_d2h, lat_d2h = fit(d2h_big, d2h_small)
    bw_h2d, lat_h2d = fit(h2d_big, h2d_small)
    if cuda:
        both = med([(host, dev), (dev2, host2)])
        duplex = both < 0.75 * (d2h_big + h2d_big)
    else:
        duplex = True
    return {
        "bandwidth_d2h": float(bw_d2h),
        "bandwidth_h2d": float(bw_h2d),
        "latency": float((lat_d2h + lat_h2d) / 2),
        "duplex": bool(duplex),
    }


# NOTE [ what the profiler measures ]
# Sizes come from one forward of the whole chain, not of stages in isolation, because who owns
# a storage depends on its neighbours (stage i saving its input a_{i-1} adds nothing to unit i).
# Times come from stages in isolation, on detached inputs, because that is how the chain model
# charges them (F_i and B_i one at a time). A stage's input then requires grad whenever it is
# floating point (stage 1: as the sample does), as it would inside the chain. Each timed
# backward gets a gradient of ones; the values do not change the work done.


def profile_full(
    model: Any,
    sample_input: torch.Tensor,
    *,
    device: torch.device | str | None = None,
    repeats: int = 5,
    warmup: int = 1,
    memory: int | None = None,
    name: str | None = None,
    measure_platform: bool = True,
    link_bytes: int | None = None,
) -> Profile:
    """:func:`profile`, also returning the :class:`Sizes` (with the aliased stages) and device."""
    stages = as_stages(model)
    sample = _check_sample(sample_input)
    for fname, v, least in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{fname}: {v!r} must be an integer >= {least}")
    dev = _device_of(stages, sample, device)
    if sample.device != dev:
        sample = sample.to(dev)
    sizes = measure_sizes(stages, sample)
    with model_state(stages):
        fwd, bwd, nosave, fwd_tmp, bwd_tmp = _time_stages(stages, sample, dev, sizes.act, repeats, warmup)
    chain = co.Chain(
        fwd,
        bwd,
        list(sizes.act),
        list(sizes.saved),
        fwd_tmp,
        bwd_tmp,
        nosave,
        name=name or (type(model).__name__ if isinstance(model, nn.Module) else "chain"),
    )
    if measure_platform:
        link = measure_link(dev, nbytes=link_bytes, repeats=max(3, repeats))
    else:
        link = {"bandwidth_d2h": float("inf"), "bandwidth_h2d": float("inf"), "latency": 0.0, "duplex": True}
    mem = co.keep_all_peak(chain) if memory is None else int(memory)
    return Profile(chain, co.Platform(memory=mem, **link), sizes, dev)


def profile(
    model: Any,
    sample_input: torch.Tensor,
    *,
    device: torch.device | str | None = None,
    repeats: int = 5,
    warmup: int = 1,
    memory: int | None = None,
    name: str | None = None,
) -> tuple[co.Chain, co.Platform]:
    """Profile ``model`` on ``sample_input`` into a chain and the platform it runs on.

    Parameters
    ----------
    model
        An ``nn.Sequential`` or a list of modules: the chain's stages, on their device.
    sample_input
        A representative batch (moved to ``device`` if elsewhere).
    device
        Where to profile; default the model's (first parameter's) device.
    repeats, warmup
        Timed runs per stage (the median is kept) and untimed runs before them.
    memory
        The platform's memory; default the keep-all peak of the profiled chain (so every
        schedule that offloads nothing fits, and a smaller value asks for offloading).
    name
        The chain's name; default the model's class name.

    Returns
    -------
    (Chain, Platform)
        Both save as docs/model.md's JSON with ``.save(path)``. See the module docstring for what
        each field measures on CUDA and on CPU.
    """
    prof = profile_full(model, sample_input, device=device, repeats=repeats, warmup=warmup, memory=memory, name=name)
    return prof.chain, prof.platform
