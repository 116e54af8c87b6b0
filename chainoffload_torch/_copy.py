"""Copies between the device and host buffers: side CUDA streams on a GPU, plain copies on CPU.

Everything device-specific in the executor is here, and kept small. On CUDA (see NOTE [ stream
discipline ]) offloads run on a D2H stream and prefetches on an H2D stream (one shared stream
when the platform is half duplex), each ordered after the compute stream at its trigger, and
the compute stream waits on a copy's event before it reads the data or frees the source. On
CPU the "device" is host memory: the same calls copy at once and their events are already
complete, so every decision the executor takes runs the same way and can be tested.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HostPool", "Copier"]


class HostPool:
    """Host buffers reused across steps (pinned on CUDA), keyed by exact size.

    Allocating pinned memory costs about a millisecond and synchronises the device, so a
    buffer, once made, is kept and handed out again. A buffer given back carries a *guard*:
    the event of the last copy that reads it; the next copy into it waits for that event.

    Parameters
    ----------
    pin
        Pin buffers (only with CUDA).
    """

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._free: dict[int, list[tuple[torch.Tensor, Any]]] = {}
        self.buffers = 0  #: buffers made so far
        self.total_bytes = 0  #: bytes of all buffers made so far
        self.in_use = 0  #: buffers handed out and not given back
        self.in_use_bytes = 0

    def take(self, nbytes: int) -> tuple[torch.Tensor, Any]:
        """A ``uint8`` buffer of ``nbytes`` and its guard (``None`` or an event to wait on)."""
        stack = self._free.get(nbytes)
        if stack:
            buf, guard = stack.pop()
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            guard = None
            self.buffers += 1
            self.total_bytes += nbytes
        self.in_use += 1
        self.in_use_bytes += nbytes
        return buf, guard

    def give(self, buf: torch.Tensor, guard: Any = None) -> None:
        """Return ``buf``; ``guard`` is the event of the last copy that reads it (or ``None``)."""
        self.in_use -= 1
        self.in_use_bytes -= buf.numel()
        self._free.setdefault(buf.numel(), []).append((buf, guard))

    def clear(self) -> None:
        """Free every buffer not in use (pinned memory goes back to the driver)."""
        for stack in self._free.values():
            for buf, _ in stack:
                self.total_bytes -= buf.numel()
                self.buffers -= 1
        self._free.clear()


class _Done:
    """The event of a copy that already happened (CPU)."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_DONE = _Done()


class Copier:
    """Queues D2H and H2D copies of whole storages and lets the compute stream wait for them.

    Parameters
    ----------
    device
        The chain's device (``cuda:N`` or ``cpu``).
    duplex
        CUDA only: one stream per direction (True) or one shared copy stream (False).
    """

    def __init__(self, device: torch.device, duplex: bool = True) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.d2h = torch.cuda.Stream(device=device)
            self.h2d = torch.cuda.Stream(device=device) if duplex else self.d2h
        else:
            self.d2h = self.h2d = None

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

    def offload(self, src: torch.Tensor, host: torch.Tensor, guard: Any) -> Any:
        """Copy the device bytes ``src`` into ``host``; return the copy's event."""
        if not self.cuda:
            host.copy_(src)
            return _DONE
        compute = torch.cuda.current_stream(self.device)
        self.d2h.wait_stream(compute)
        if guard is not None:
            self.d2h.wait_event(guard)
        with torch.cuda.stream(self.d2h):
            host.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.d2h)
        return event

    def prefetch(self, host: torch.Tensor, after: Any) -> tuple[torch.Tensor, Any]:
        """Allocate device bytes and copy ``host`` into them after event ``after``; return both."""
        dev = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        if not self.cuda:
            dev.copy_(host)
            return dev, _DONE
        compute = torch.cuda.current_stream(self.device)
        self.h2d.wait_stream(compute)
        if after is not None and after is not _DONE:
            self.h2d.wait_event(after)
        with torch.cuda.stream(self.h2d):
            dev.copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.h2d)
        return dev, event

    def wait(self, event: Any) -> None:
        """Make the compute stream wait for ``event`` (a no-op on CPU)."""
        if self.cuda and event is not None and event is not _DONE:
            torch.cuda.current_stream(self.device).wait_event(event)

    def synchronize(self) -> None:
        """Wait on the host for every queued copy (used when a step is aborted)."""
        if self.cuda:
            self.d2h.synchronize()
            self.h2d.synchronize()
