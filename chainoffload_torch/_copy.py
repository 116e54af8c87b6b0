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

__all__ = ["HostPool", "Copier", "size_class"]


def size_class(nbytes: int) -> int:
    """The buffer size the pool hands out for ``nbytes``: the next of 8 steps per power of two.

    Buffers of one class serve every request up to their size, so a plan for other shapes
    reuses them; the waste is below 1/8 of a request (NOTE [ host pool ]).
    """
    if nbytes <= 4096:
        return 4096
    step = 1 << max(0, (nbytes - 1).bit_length() - 4)  # 1/8 of the power of two above
    return -(-nbytes // step) * step


class HostPool:
    """Host buffers reused across steps and plans (pinned on CUDA), by size class.

    Allocating pinned memory costs about a millisecond and synchronises the device, so a
    buffer, once made, is kept and handed out again. A buffer given back carries a *guard*:
    the event of the last copy that reads it; the next copy into it waits for that event.
    See NOTE [ host pool ] for how its size stays bounded.

    Parameters
    ----------
    pin
        Pin buffers (only with CUDA).
    limit
        Most bytes of buffers the pool may hold at once (``host_memory``); ``None``: no limit.
    """

    def __init__(self, pin: bool, limit: int | None = None) -> None:
        self.pin = pin
        self.limit = limit
        #: Idle bytes kept after a step: the plan in force's need, or ``None`` for what the
        #: last step used at most (a plan given by hand, whose need is not known ahead).
        self.retain: int | None = None
        self._step_high = 0
        self._free: dict[int, list[tuple[torch.Tensor, Any]]] = {}
        self.buffers = 0  #: buffers held now (in use or idle)
        self.total_bytes = 0  #: bytes of the buffers held now
        self.high_water = 0  #: the most bytes held at once
        self.made = 0  #: buffers allocated so far
        self.freed = 0  #: buffers freed so far
        self.in_use = 0  #: buffers handed out and not given back
        self.in_use_bytes = 0

    def take(self, nbytes: int) -> tuple[torch.Tensor, Any]:
        """A ``uint8`` buffer of ``nbytes`` and its guard (``None`` or an event to wait on).

        Raises
        ------
        RuntimeError
            Making the buffer would take the pool above its ``limit`` even after freeing every
            idle buffer.
        """
        cls = size_class(nbytes)
        stack = self._free.get(cls)
        if stack:
            buf, guard = stack.pop()
        else:
            if self.limit is not None and self.total_bytes + cls > self.limit:
                self._free_idle(self.total_bytes + cls - self.limit)
                if self.total_bytes + cls > self.limit:
                    raise RuntimeError(
                        f"host_memory: a {cls} B host buffer would take the pool to {self.total_bytes + cls} B, "
                        f"above host_memory={self.limit} B ({self.in_use_bytes} B in use)"
                    )
            buf = torch.empty(cls, dtype=torch.uint8, pin_memory=self.pin)
            guard = None
            self.buffers += 1
            self.made += 1
            self.total_bytes += cls
            self.high_water = max(self.high_water, self.total_bytes)
        self.in_use += 1
        self.in_use_bytes += cls
        self._step_high = max(self._step_high, self.in_use_bytes)
        return buf[:nbytes], guard

    def give(self, buf: torch.Tensor, guard: Any = None) -> None:
        """Return a buffer from :meth:`take`; ``guard`` is the event of the last copy that reads it."""
        whole = torch.empty(0, dtype=torch.uint8).set_(buf.untyped_storage())
        cls = whole.numel()
        self.in_use -= 1
        self.in_use_bytes -= cls
        self._free.setdefault(cls, []).append((whole, guard))

    def _free_idle(self, nbytes: int) -> None:
        """Free idle buffers, largest first, until ``nbytes`` are freed or none is idle."""
        for cls in sorted(self._free, reverse=True):
            stack = self._free[cls]
            while stack and nbytes > 0:
                _, guard = stack.pop()
                if guard is not None:
                    guard.synchronize()  # the copy that reads it must end before it is freed
                self.buffers -= 1
                self.freed += 1
                self.total_bytes -= cls
                nbytes -= cls
            if not stack:
                del self._free[cls]
            if nbytes <= 0:
                return

    def trim(self) -> None:
        """Free idle buffers beyond :attr:`retain` bytes (called between steps)."""
        keep = self._step_high if self.retain is None else self.retain
        self._step_high = self.in_use_bytes
        idle = self.total_bytes - self.in_use_bytes
        if idle > keep:
            self._free_idle(idle - keep)

    def clear(self) -> None:
        """Free every buffer not in use (pinned memory goes back to the driver)."""
        self._free_idle(self.total_bytes)


# NOTE [ host pool ]
# A host buffer is handed out in a size class (8 classes per power of two above 4 KiB), so the
# buffers of one plan serve another plan's storages of nearby sizes: a batch of 37 reuses what
# a batch of 36 made. After each step the pool keeps at most `retain` idle bytes, the host bytes
# the plan in force needs (the size classes of the storages it offloads, known from its
# profile); what other plans left behind is freed then, largest first. So the pool holds at most
# max(the plan in force's need, what the step in flight uses), and with `limit` (host_memory)
# never more than that: a plan that needs more is refused before it runs, and a buffer that
# would cross the limit is made only after idle ones are freed.


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
