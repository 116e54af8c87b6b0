"""The device-host link: bandwidth each way, latency and duplex, measured by copies.

:func:`measure_link` times pinned-host copies on a side stream on CUDA (a host memcpy on CPU),
each direction alone at two sizes, then both at once; :func:`link_of` measures once per device
in a process, since the link is the machine's, not the model's. What they return is the
:class:`chainoffload.Platform`'s link, less its memory. :func:`copies_overlap` says whether the
executor's copies on a device run beside compute, as the simulator's channels do (NOTE [ copies
on CPU ]).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ._engine_choice import engine_for
from ._stages import canonical_device

__all__ = ["measure_link", "link_of", "copies_overlap"]


def measure_link(device: torch.device | str, *, nbytes: int | None = None, small: int = 4096, repeats: int = 5) -> dict[str, Any]:
    """Bandwidth each way, latency and duplex of the device-host link (a memcpy on CPU).

    Parameters
    ----------
    device
        ``cuda:N`` or ``cpu``.
    nbytes, small
        Sizes of the large and small copies; latency + size / bandwidth is fitted through the
        medians at these two sizes. ``nbytes`` defaults to 64 MiB: on CPU too, where a copy
        that fits the cache is timed at cache speed (NOTE [ copies on CPU ]).
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
        nbytes = 64 * 2**20
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
            # One copy (one direction) or two (both at once), each on a stream of its own.
            for (dst, src), s in zip(pairs, streams, strict=False):
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
        return float(statistics.median([timed(pairs) for _ in range(repeats)]))

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


#: Links measured in this process, by device and measurement: see :func:`link_of`.
_LINKS: dict[tuple[str, int | None, int], dict[str, Any]] = {}


def link_of(device: torch.device | str, *, nbytes: int | None = None, repeats: int = 5) -> dict[str, Any]:
    """:func:`measure_link`, measured once per device (and sizes) in a process.

    The link is the machine's, not the model's: every plan after the first (another shape,
    another model) reuses it instead of copying tens of MiB again (NOTE [ how many profiling
    steps ]). ``measure_link`` itself always measures.
    """
    dev = canonical_device(device)
    key = (str(dev), nbytes, repeats)
    if key not in _LINKS:
        _LINKS[key] = measure_link(dev, nbytes=nbytes, repeats=repeats)
    return dict(_LINKS[key])


# NOTE [ copies on CPU ]
# On a GPU the executor's copies run on side streams, beside the kernels, as the simulator's
# channels run beside compute. On CPU the "device" is host memory and the copy engine is the
# immediate one (_engines.py): a copy is a memcpy on the compute thread at its trigger, so it
# hides behind nothing. The link measure_link times there is that memcpy, and taken as a
# platform of the core model it would claim copies that overlap compute, and offload() would
# predict (and choose by) step times its plans cannot reach. So the adapter asks the copy engine
# (copies_overlap) and, where copies do not overlap, predicts a plan's step as compute and
# copies one after another, Timeline.serial_makespan (NOTE [ copies that do not overlap compute ]
# in chainoffload/simulate.py): offload() chooses among its methods by that time (so on CPU it
# prefers recomputation wherever a copy costs more than the forward it spares), Plan.makespan is
# that time, budget_curve's overheads are, and handle.table() says that copies do not overlap
# compute. The solvers still plan
# as if they did (their models have no such mode); only the choice between their plans and the
# figures shown are serial. On CUDA nothing changes: copies_overlap is True there.
# The CPU link is timed on 64 MiB copies, as CUDA's: the executor copies a step's units from
# memory the forward wrote long before, not from cache, and an 8 MiB copy repeated between the
# same buffers stays in the cache (on the project's 2-core machine, one thread: 13.8 GB/s device
# to host and 25.6 GB/s back at 8 MiB, 3.35 and 4.22 GB/s at 64 MiB; by cProfile, the executor's
# copies in a step of benchmarks/checkpointing.py's Llama, 43.6 MB both ways, took 6.5 ms).


def copies_overlap(device: torch.device | str) -> bool:
    """Whether the executor's copies on ``device`` run beside compute (CUDA's side streams) or
    inline on the compute thread (CPU's immediate copy engine): NOTE [ copies on CPU ].

    Parameters
    ----------
    device
        ``cuda:N`` or ``cpu``.
    """
    return bool(engine_for(torch.device(device)).overlaps)
