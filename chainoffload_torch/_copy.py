"""Copies between the device and host buffers, and the synchronization around them.

:class:`Copier` holds every decision about ordering (see NOTE [ stream discipline ]): offloads
go on a D2H stream and prefetches on an H2D stream (one shared stream when the platform is half
duplex); a copy stream waits for the compute stream at the copy's trigger and for a host
buffer's guard before writing it; the compute stream waits on an offload's event before the
source is let go and on a prefetch's event before its data is read. What a stream, an event and
a copy *are* comes from a copy engine (NOTE [ copy engines ]): CUDA's on a GPU, the immediate
one on CPU (``chainoffload_torch._engines``), or the threaded test engine
(:mod:`chainoffload_torch.testing_engine`), on which a missing wait fails a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._engine_choice import engine_for

if TYPE_CHECKING:
    from ._engines import CopyEngine

__all__ = ["Copier"]


class Copier:
    """Queues D2H and H2D copies of whole storages and orders them against the compute stream.

    All the synchronization of the executor's copies is here; ``engine`` supplies the streams,
    events and copies (NOTE [ copy engines ]).

    Parameters
    ----------
    device
        The chain's device (``cuda:N`` or ``cpu``).
    duplex
        One stream per direction (True) or one shared copy stream (False).
    engine
        The copy engine; by default :func:`engine_for` ``device``.
    """

    def __init__(self, device: torch.device, duplex: bool = True, engine: CopyEngine | None = None) -> None:
        self.device = device
        self.engine = engine if engine is not None else engine_for(device)
        self.d2h = self.engine.stream(device, "d2h" if duplex else "both")
        self.h2d = self.engine.stream(device, "h2d") if duplex else self.d2h

    # NOTE [ stream discipline ]
    # * Read the compute stream *before* entering a side-stream context: inside it,
    #   current_stream() is the side stream.
    # * A copy stream waits for the compute stream at the trigger: the data to offload is made
    #   there, and a prefetch's destination was allocated there and may still be in use by the
    #   kernels of its previous owner.
    # * The compute stream waits on an offload's event before the source is freed (the caching
    #   allocator may hand the block to a compute kernel at once) and on a prefetch's event
    #   before the data is read. Blocks are allocated on the compute stream and last used there,
    #   so no record_stream is needed (record_stream delays every free and grows memory).
    # * A host buffer is reused only after the copy that last read it: its guard event.
    # * A prefetch waits on its offload's event: the host buffer it reads is filled by the D2H
    #   stream, which the H2D stream is not otherwise ordered after.

    def offload(self, src: torch.Tensor, host: torch.Tensor, guard: Any) -> Any:
        """Copy the device bytes ``src`` into ``host`` once ``guard`` (or ``None``) has completed;
        return the copy's event."""
        engine = self.engine
        compute = engine.current_stream(self.device)
        engine.wait_stream(self.d2h, compute)
        if guard is not None:
            engine.wait_event(self.d2h, guard)
        engine.copy(self.d2h, host, src)
        return engine.record(self.d2h)

    def prefetch(self, host: torch.Tensor, after: Any) -> tuple[torch.Tensor, Any]:
        """Allocate device bytes and copy ``host`` into them after event ``after``; return both."""
        engine = self.engine
        dev = engine.device_empty(host.numel(), self.device)
        compute = engine.current_stream(self.device)
        engine.wait_stream(self.h2d, compute)
        if after is not None:
            engine.wait_event(self.h2d, after)
        engine.copy(self.h2d, dev, host)
        return dev, engine.record(self.h2d)

    def wait(self, event: Any) -> None:
        """Make the compute stream wait for ``event`` (``None``: nothing to wait for)."""
        if event is not None:
            self.engine.wait_event(self.engine.current_stream(self.device), event)

    def await_prefetch(self, event: Any, dev: torch.Tensor) -> None:
        """Make the compute stream wait for a prefetch's ``event`` before ``dev``, its
        destination, is read."""
        if event is not None:
            self.engine.wait_event(self.engine.current_stream(self.device), event)
        self.engine.reading(dev)

    def release(self, src: torch.Tensor, event: Any) -> None:
        """Let go of the device storage ``src`` once the compute stream has waited for
        ``event``, the offload that reads it (the caller then drops its reference)."""
        if event is not None:
            self.engine.wait_event(self.engine.current_stream(self.device), event)
        self.engine.freed(src)

    def synchronize(self) -> None:
        """Wait on the host for every queued copy (used when a step is aborted)."""
        self.engine.synchronize_stream(self.d2h)
        self.engine.synchronize_stream(self.h2d)
