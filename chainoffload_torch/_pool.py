"""Host buffers for offloaded storages, reused across steps and plans by size class.

:class:`HostPool` hands out host buffers (pinned on CUDA) and takes them back with the event of
the last copy that reads them, so that reusing or freeing a buffer waits for that copy; its size
stays bounded by the plan in force (NOTE [ host pool ]). The buffers come from a copy engine
(``chainoffload_torch._engines``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._engine_choice import engine_for

if TYPE_CHECKING:
    from ._engines import CopyEngine

__all__ = ["HostPool", "size_class"]


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
    engine
        The copy engine that makes and checks the buffers (NOTE [ copy engines ]); by default
        :func:`engine_for` the device ``pin`` implies.
    """

    def __init__(self, pin: bool, limit: int | None = None, engine: CopyEngine | None = None) -> None:
        self.pin = pin
        self.limit = limit
        self.engine = engine if engine is not None else engine_for("cuda" if pin else "cpu")
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
            self.engine.reused(buf, guard)
        else:
            if self.limit is not None and self.total_bytes + cls > self.limit:
                self._free_idle(self.total_bytes + cls - self.limit)
                if self.total_bytes + cls > self.limit:
                    raise RuntimeError(
                        f"host_memory: a {cls} B host buffer would take the pool to {self.total_bytes + cls} B, "
                        f"above host_memory={self.limit} B ({self.in_use_bytes} B in use)"
                    )
            buf = self.engine.host_empty(cls, self.pin)
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
                buf, guard = stack.pop()
                if guard is not None:
                    guard.synchronize()  # the copy that reads it must end before it is freed
                self.engine.host_freed(buf)
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
