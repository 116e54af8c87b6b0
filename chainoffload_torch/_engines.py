"""Copy engines: the primitives a :class:`~chainoffload_torch._copy.Copier` and a host pool are built on.

An engine supplies streams, events, copies and buffers, and nothing about their order, which is
the copier's alone (NOTE [ copy engines ]). Two engines are here:

* ``cuda``: CUDA streams and events, ``non_blocking`` copies, pinned host buffers (the default
  on a CUDA device);
* ``immediate``: on CPU, where the "device" is host memory, a copy happens at once and its event
  is already complete (the default on CPU).

The third, ``threaded``, is a test engine and lives with the testing code
(:mod:`chainoffload_torch.testing_engine`); which engine a device gets is
``chainoffload_torch._engine_choice``'s.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CopyEngine", "CudaEngine", "ImmediateEngine"]


# NOTE [ copy engines ]
# The ordering rules of NOTE [ stream discipline ] are the part of the executor that can go
# wrong silently: a missing wait on a GPU corrupts an activation only when the copy happens to
# be slower than the kernel that races it, and on CPU, where copies used to happen at once, no
# test could tell a missing wait from a present one. So the copier keeps every ordering decision
# in one place and asks an engine only for primitives (a stream, the compute stream, wait_stream,
# record, wait_event, copy, buffers). The CUDA engine is those primitives on torch.cuda; the
# threaded engine implements the same contract as adversarially as CUDA allows, so that the
# logic the GPU runs is the logic the CPU tests exercise:
# * copies run late: a copy starts only after the one ahead of it on its stream has ended and
#   a random delay has passed, unless something waits for it (then at once, to keep tests fast);
#   a prefetch's destination and a new host buffer start as 0xFF bytes (NaN as floats), so a
#   read that did not wait sees poison;
# * compute is the host thread: compute waiting on an event blocks until the copy ran, and
#   wait_stream(compute) is met at enqueue time since CPU compute is synchronous;
# * since a race that loses only sometimes makes a flaky test, the engine also checks every
#   access it sees against the happens-before order the waits create (a vector clock per
#   stream, as in CUDA's stream sanitizers): a copy, a free or a read that is not ordered after
#   a conflicting access raises CopyEngineError whether or not the copy happened to finish in
#   time. Compute may have run between any two host calls, so the source of an offload counts
#   as written by compute just before the copy is enqueued, and a copy stream must have waited
#   for compute since the host's previous call (NOTE [ compute positions ]);
# * a stream carries copies of one direction in duplex mode (a prefetch behind an offload
#   would run, but serialize what the platform says is two channels);
# * a source let go is poisoned when nothing else holds it, as the caching allocator would hand
#   its block to the next kernel; so is a host buffer freed, or handed out again once its guard
#   has passed, as its next owner may write it at once.


class _Done:
    """The event of a copy that already happened (the immediate engine)."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_DONE = _Done()


class CopyEngine:
    """The primitives a :class:`Copier` and a :class:`HostPool` are built on.

    Streams and events are the engine's own objects; an event has ``query()`` (whether the work
    before it has run) and ``synchronize()`` (block the host until it has). The ``reused``,
    ``freed``, ``reading`` and ``host_freed`` hooks tell the engine what the executor does with
    buffers; they check and poison on the threaded engine and do nothing elsewhere.
    """

    name = "engine"
    #: Whether a copy runs beside compute (on a stream or thread of its own), as the simulator's
    #: channels do, or inline on the compute thread (NOTE [ copies on CPU ] in _link.py).
    overlaps = True

    def stream(self, device: torch.device, direction: str) -> Any:
        """A new copy stream for ``direction``: ``"d2h"``, ``"h2d"`` or ``"both"`` (half duplex)."""
        raise NotImplementedError

    def current_stream(self, device: torch.device) -> Any:
        """The compute stream (read outside any side-stream context)."""
        raise NotImplementedError

    def wait_stream(self, stream: Any, other: Any) -> None:
        """Later work on ``stream`` waits for the work queued on ``other`` so far."""
        raise NotImplementedError

    def record(self, stream: Any) -> Any:
        """An event that completes when the work queued on ``stream`` so far has run."""
        raise NotImplementedError

    def wait_event(self, stream: Any, event: Any) -> None:
        """Later work on ``stream`` waits for ``event`` (on the compute stream: the host may block)."""
        raise NotImplementedError

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Queue the copy of ``src`` into ``dst`` (same bytes) on ``stream``."""
        raise NotImplementedError

    def synchronize_stream(self, stream: Any) -> None:
        """Block the host until the work queued on ``stream`` has run."""
        raise NotImplementedError

    def host_empty(self, nbytes: int, pin: bool) -> torch.Tensor:
        """A ``uint8`` host buffer of ``nbytes`` (pinned when ``pin``)."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)

    def device_empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A ``uint8`` device buffer of ``nbytes``, allocated on the compute stream."""
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def reused(self, buf: torch.Tensor, guard: Any) -> None:
        """The pool hands ``buf`` out again; ``guard`` is the event of the last copy that reads it."""

    def host_freed(self, buf: torch.Tensor) -> None:
        """The pool frees ``buf`` (after synchronizing its guard)."""

    def freed(self, src: torch.Tensor) -> None:
        """The executor lets go of the device storage ``src`` (the compute stream has waited)."""

    def reading(self, dev: torch.Tensor) -> None:
        """Compute is about to read ``dev``, a prefetch's destination (the compute stream has waited)."""


class ImmediateEngine(CopyEngine):
    """CPU: a copy happens when it is queued, every event is already complete."""

    name = "immediate"
    overlaps = False  # the copy is a memcpy on the compute thread, at its trigger

    def stream(self, device: torch.device, direction: str) -> Any:
        return None

    def current_stream(self, device: torch.device) -> Any:
        return None

    def wait_stream(self, stream: Any, other: Any) -> None:
        return None

    def record(self, stream: Any) -> Any:
        return _DONE

    def wait_event(self, stream: Any, event: Any) -> None:
        return None

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def synchronize_stream(self, stream: Any) -> None:
        return None


class CudaEngine(CopyEngine):
    """CUDA streams and events; copies are ``non_blocking`` from and to pinned host memory."""

    name = "cuda"

    def stream(self, device: torch.device, direction: str) -> Any:
        return torch.cuda.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def synchronize_stream(self, stream: Any) -> None:
        stream.synchronize()
