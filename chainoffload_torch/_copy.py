"""Copies between the device and host buffers, and the synchronization around them.

:class:`Copier` holds every decision about ordering (see NOTE [ stream discipline ]): offloads
go on a D2H stream and prefetches on an H2D stream (one shared stream when the platform is half
duplex); a copy stream waits for the compute stream at the copy's trigger and for a host
buffer's guard before writing it; the compute stream waits on an offload's event before the
source is let go and on a prefetch's event before its data is read. What a stream, an event and
a copy *are* comes from a copy engine (NOTE [ copy engines ]), which supplies only primitives:

* ``cuda``: CUDA streams and events, ``non_blocking`` copies, pinned host buffers (the default
  on a CUDA device);
* ``immediate``: on CPU, where the "device" is host memory, a copy happens at once and its event
  is already complete (the default on CPU);
* ``threaded``: the test engine. Each copy stream is a worker thread that runs its copies later,
  in order, after a random delay; events, waits and queries behave as CUDA's; and every
  ordering the copier leaves out shows as wrong data or a :class:`CopyEngineError`.

``CHAINOFFLOAD_COPY_ENGINE=threaded`` (or :func:`use_engine`) puts every CPU copier and host pool
on the test engine, so the adapter's whole test suite can run against it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import threading
import time
import weakref
from typing import Any, Callable, Iterator

import torch

__all__ = [
    "HostPool",
    "Copier",
    "size_class",
    "CopyEngine",
    "CudaEngine",
    "ImmediateEngine",
    "ThreadedEngine",
    "CopyEngineError",
    "engine_for",
    "use_engine",
    "ENGINE_ENV",
]

#: Environment variable naming the copy engine of CPU copiers and pools: ``immediate`` (default)
#: or ``threaded``; ``CHAINOFFLOAD_COPY_DELAY`` (``LO,HI`` seconds) and ``CHAINOFFLOAD_COPY_SEED``
#: configure the threaded one.
ENGINE_ENV = "CHAINOFFLOAD_COPY_ENGINE"


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

    def __init__(self, pin: bool, limit: int | None = None, engine: "CopyEngine | None" = None) -> None:
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


class CopyEngineError(RuntimeError):
    """A copy or an access the threaded engine found out of order (a missing wait)."""


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


# -- the threaded test engine -------------------------------------------------------------------

_POISON = 0xFF  # every float format reads 0xFF... bytes as NaN
WAIT_LIMIT = 60.0  # seconds a wait of the threaded engine may take before it is called a deadlock


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _sole_owner(t: torch.Tensor) -> bool:
    """Whether ``t`` is the only tensor holding its storage (so that a GPU would reuse it once
    ``t`` goes); ``False`` when torch cannot say."""
    try:
        st = t.untyped_storage()
        return torch._C._storage_Use_Count(st._cdata) <= 2  # ``t`` and ``st`` itself
    except (AttributeError, RuntimeError):
        return False


class _Lane:
    """The state of one stream of the threaded engine (the compute stream has no worker)."""

    def __init__(self, ident: int, name: str, direction: str | None) -> None:
        self.ident = ident
        self.name = name
        self.direction = direction
        self.count = 0  # operations queued; operation k (1-based) is the k-th
        self.done = 0  # operations that have run (FIFO: the first `done`)
        self.demand = 0  # operations someone waits for: they run without their delay
        self.clock: dict[int, int] = {}  # vector clock: per stream, the operations this one is ordered after
        self.queue: collections.deque[_Op] = collections.deque()
        self.closed = False
        self.worker = False  # a thread is serving the queue


class _Op:
    __slots__ = ("seq", "delay", "run", "event", "what")

    def __init__(self, seq: int, delay: float, run: Callable[[], None] | None, event: "_Event | None", what: str) -> None:
        self.seq = seq
        self.delay = delay
        self.run = run
        self.event = event
        self.what = what


class _Stream:
    """A copy stream of the threaded engine: the handle a copier holds; its worker stops with it."""

    def __init__(self, engine: "ThreadedEngine", lane: _Lane) -> None:
        self.lane = lane
        self.direction = lane.direction
        weakref.finalize(self, engine._close, lane)

    def __repr__(self) -> str:
        return f"<threaded stream {self.lane.name}>"


class _Event:
    """An event of the threaded engine: operation ``seq`` of ``lane`` and the clock it carries."""

    __slots__ = ("engine", "lane", "seq", "clock")

    def __init__(self, engine: "ThreadedEngine", lane: _Lane, seq: int, clock: dict[int, int]) -> None:
        self.engine = engine
        self.lane = lane
        self.seq = seq
        self.clock = clock

    def query(self) -> bool:
        """Whether the work before the event has run (then the host is ordered after it)."""
        return self.engine._query(self)

    def synchronize(self) -> None:
        """Block the host until the work before the event has run."""
        self.engine._synchronize(self)


class _Record:
    """The accesses to one storage since it was last written: (lane, operation) pairs."""

    __slots__ = ("write", "reads")

    def __init__(self, write: tuple[int, int] | None) -> None:
        self.write = write
        self.reads: list[tuple[int, int]] = []


# NOTE [ compute positions ]
# The compute stream is the host thread, and its operations are the host's calls into the
# engine: its position advances after each copy queued, buffer made, storage freed or read,
# so that each call of the copier starts a new position (compute may have run kernels in
# between). An access on a copy stream is ordered after compute position p only if that stream
# has waited for compute at p or later, directly (wait_stream) or through an event. The source
# of an offload counts as written by compute at the position where its copy is queued: it was
# made by compute before the trigger.


class ThreadedEngine(CopyEngine):
    """The test engine: copy streams are worker threads that run copies late, in order.

    Parameters
    ----------
    delay
        (low, high) seconds: each copy starts a uniform random delay in that range after it
        reaches the head of its stream, unless the host or another stream waits for it.
    seed
        Seed of the delays.
    check
        Check every access against the order the waits create (NOTE [ copy engines ]). Off,
        a missing wait shows only as wrong data, when the copy it skipped was late.

    Attributes
    ----------
    violations
        Messages of every :class:`CopyEngineError` raised so far (also kept when the exception
        was swallowed on its way up).
    copies
        Copies queued so far.
    late
        Copies that had not run yet when the host's call that queued them returned.
    """

    name = "threaded"

    def __init__(self, delay: tuple[float, float] = (0.0, 0.002), seed: int = 0, check: bool = True) -> None:
        lo, hi = (float(d) for d in delay)
        if not 0.0 <= lo <= hi:
            raise ValueError(f"delay: expected 0 <= low <= high seconds, got {delay!r}")
        self.delay = (lo, hi)
        self.check = check
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._compute = _Lane(next(self._ids), "compute", None)
        self._compute.count = 1
        self._compute.clock[self._compute.ident] = 1
        self._lanes: dict[int, _Lane] = {self._compute.ident: self._compute}
        self._records: dict[int, _Record] = {}
        self._hosts: set[int] = set()  # storages of the host buffers it made
        self._failed: list[BaseException] = []  # copies that raised on a worker
        # Streams whose handle was collected. The finalizer only appends here: it may run in any
        # thread at any allocation, e.g. in a worker thread that has not yet signalled its start
        # to the thread that started it while holding the lock, so it must never wait for it.
        self._closing: collections.deque[_Lane] = collections.deque()
        self.violations: list[str] = []
        self.copies = 0
        self.late = 0

    # -- streams and events ---------------------------------------------------------------------

    def stream(self, device: torch.device, direction: str) -> _Stream:
        if direction not in ("d2h", "h2d", "both"):
            raise ValueError(f"direction: expected 'd2h', 'h2d' or 'both', got {direction!r}")
        with self._cond:
            lane = _Lane(next(self._ids), f"{direction}#{len(self._lanes)}", direction)
            lane.clock[lane.ident] = 0
            self._lanes[lane.ident] = lane
        return _Stream(self, lane)

    def current_stream(self, device: torch.device) -> _Lane:
        return self._compute

    def _lane(self, stream: Any) -> _Lane:
        return stream if isinstance(stream, _Lane) else stream.lane

    def record(self, stream: Any) -> _Event:
        lane = self._lane(stream)
        with self._cond:
            return _Event(self, lane, lane.count, dict(lane.clock))

    def wait_stream(self, stream: Any, other: Any) -> None:
        # CPU compute is synchronous: its event is complete when it is recorded.
        self.wait_event(stream, self.record(other))

    def wait_event(self, stream: Any, event: Any) -> None:
        lane = self._lane(stream)
        if lane is self._compute:
            self._synchronize(event)
            return
        with self._cond:
            self._raise_failed()
            lane.count += 1
            self._enqueue(lane, _Op(lane.count, 0.0, None, event, "wait"))
            self._merge(lane, event.clock)
            lane.clock[lane.ident] = lane.count

    def synchronize_stream(self, stream: Any) -> None:
        self._synchronize(self.record(stream))

    def _query(self, event: _Event) -> bool:
        with self._cond:
            self._raise_failed()
            if event.lane.done < event.seq and event.lane is not self._compute:
                return False
            self._merge(self._compute, event.clock)
            return True

    def _synchronize(self, event: _Event) -> None:
        lane = event.lane
        with self._cond:
            if lane is not self._compute:
                lane.demand = max(lane.demand, event.seq)
                self._cond.notify_all()
                self._wait_for(lambda: lane.done >= event.seq, f"operation {event.seq} of the {lane.name} stream")
            self._merge(self._compute, event.clock)
            self._raise_failed()

    @staticmethod
    def _merge(lane: _Lane, clock: dict[int, int]) -> None:
        for k, v in clock.items():
            if lane.clock.get(k, 0) < v:
                lane.clock[k] = v

    # -- copies ---------------------------------------------------------------------------------

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        lane = self._lane(stream)
        if lane is self._compute:
            raise CopyEngineError("threaded engine: a copy queued on the compute stream; copies go on a copy stream")
        if dst.numel() * dst.element_size() != src.numel() * src.element_size():
            raise ValueError(f"copy: {src.numel() * src.element_size()} B into {dst.numel() * dst.element_size()} B")
        with self._cond:
            self._raise_failed()
            dst_key, src_key = _storage_key(dst), _storage_key(src)
            if dst_key in self._hosts and src_key not in self._hosts:
                direction = "d2h"
            elif src_key in self._hosts and dst_key not in self._hosts:
                direction = "h2d"
            else:
                raise CopyEngineError("threaded engine: a copy must go between a host buffer of the pool and the device")
            if lane.direction not in (direction, "both"):
                self._violate(f"a {direction.upper()} copy queued on the {lane.direction.upper()} stream (duplex: one direction per stream)")
            compute = self._compute
            if direction == "d2h":
                self._records[src_key] = _Record((compute.ident, compute.count))
            seq = lane.count + 1
            self._check(lane, seq, src_key, write=False, what=f"the {direction.upper()} copy's read of its source")
            self._check(lane, seq, dst_key, write=True, what=f"the {direction.upper()} copy's write of its destination")
            lane.count = seq
            lane.clock[lane.ident] = seq
            self._access(lane, seq, src_key, write=False)
            self._access(lane, seq, dst_key, write=True)
            lo, hi = self.delay
            self._enqueue(lane, _Op(seq, self._rng.uniform(lo, hi), lambda: dst.copy_(src), None, direction))
            self.copies += 1
            self._tick()
        with self._cond:
            if lane.done < seq:
                self.late += 1

    def _enqueue(self, lane: _Lane, op: _Op) -> None:
        self._drain_closing()
        lane.queue.append(op)
        if not lane.worker:
            # Not a daemon: a worker ends once its queue has been idle a moment, so the
            # interpreter's exit waits for the copies in flight instead of killing them mid-copy.
            lane.worker = True
            threading.Thread(target=self._work, args=(lane,), name=f"chainoffload-{lane.name}").start()
        self._cond.notify_all()

    def _work(self, lane: _Lane) -> None:
        cond = self._cond
        while True:
            with cond:
                self._drain_closing()
                cond.wait_for(lambda: lane.queue or lane.closed, timeout=0.1)
                if not lane.queue:
                    lane.worker = False
                    if lane.closed:
                        self._lanes.pop(lane.ident, None)
                    return
                op = lane.queue[0]
                start = time.monotonic() + op.delay
                while not lane.closed and lane.demand < op.seq and (left := start - time.monotonic()) > 0:
                    cond.wait(left)
                if op.event is not None and op.event.lane is not self._compute:
                    other, seq = op.event.lane, op.event.seq
                    other.demand = max(other.demand, seq)
                    cond.notify_all()
                    try:
                        self._wait_for(lambda: other.done >= seq, f"operation {seq} of the {other.name} stream")
                    except CopyEngineError as exc:
                        self._failed.append(exc)
            if op.run is not None:
                try:
                    op.run()
                except BaseException as exc:  # noqa: BLE001 - handed to the host at its next call
                    with cond:
                        self._failed.append(exc)
            with cond:
                # Before anyone learns it ran, a copy lets go of its tensors: the idle worker
                # would keep the last one alive, which a test counting live tensors sees as a leak.
                op.run = None
                lane.queue.popleft()
                lane.done = op.seq
                cond.notify_all()

    def _close(self, lane: _Lane) -> None:
        self._closing.append(lane)  # taken up under the lock (see self._closing)

    def _drain_closing(self) -> None:
        while self._closing:
            lane = self._closing.popleft()
            lane.closed = True
            lane.demand = lane.count
            if not lane.worker:
                self._lanes.pop(lane.ident, None)
            self._cond.notify_all()

    def _wait_for(self, done: Callable[[], bool], what: str) -> None:
        # A test that hangs says nothing: a wait this long is a bug of the engine or of its
        # caller, reported instead.
        if not self._cond.wait_for(done, timeout=WAIT_LIMIT):
            states = ", ".join(f"{lane.name}: {lane.done}/{lane.count} run" for lane in self._lanes.values() if lane.direction)
            raise CopyEngineError(f"threaded engine: {what} did not run within {WAIT_LIMIT:.0f} s ({states})")

    def _raise_failed(self) -> None:
        if self._failed:
            exc = self._failed.pop(0)
            raise CopyEngineError(f"threaded engine: a copy failed on its stream: {exc!r}") from exc

    # -- the happens-before check ------------------------------------------------------------------

    def _tick(self) -> None:
        compute = self._compute
        compute.count += 1
        compute.clock[compute.ident] = compute.count

    def _ordered(self, lane: _Lane, access: tuple[int, int]) -> bool:
        who, seq = access
        return who == lane.ident or lane.clock.get(who, 0) >= seq

    def _name(self, access: tuple[int, int]) -> str:
        lane = self._lanes.get(access[0])
        return f"operation {access[1]} of the {lane.name if lane else 'closed'} stream"

    def _check(self, lane: _Lane, seq: int, key: int, write: bool, what: str) -> None:
        rec = self._records.get(key)
        if rec is None or not self.check:
            return
        others = ([rec.write] if rec.write is not None else []) + (rec.reads if write else [])
        for access in others:
            if not self._ordered(lane, access):
                self._violate(f"{what} (on the {lane.name} stream) is not ordered after {self._name(access)} that "
                              f"{'writes' if access == rec.write else 'reads'} the same storage: a wait is missing")

    def _access(self, lane: _Lane, seq: int, key: int, write: bool) -> None:
        if write:
            self._records[key] = _Record((lane.ident, seq))
        else:
            self._records.setdefault(key, _Record(None)).reads.append((lane.ident, seq))

    def _host(self, key: int, write: bool, what: str) -> None:
        """A compute (host) access at the current position, checked, recorded, then a tick."""
        compute = self._compute
        self._check(compute, compute.count, key, write, what)
        self._access(compute, compute.count, key, write)
        self._tick()

    def _violate(self, message: str) -> None:
        message = f"threaded engine: {message}"
        self.violations.append(message)
        raise CopyEngineError(message)

    # -- buffers --------------------------------------------------------------------------------

    def host_empty(self, nbytes: int, pin: bool) -> torch.Tensor:
        buf = torch.full((nbytes,), _POISON, dtype=torch.uint8)
        with self._cond:
            key = _storage_key(buf)
            self._hosts.add(key)
            self._records.pop(key, None)
            self._host(key, True, "a new host buffer")
        return buf

    def device_empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        # Allocated on the compute stream: the H2D copy into it must wait for compute.
        dev = torch.full((nbytes,), _POISON, dtype=torch.uint8, device=device)
        with self._cond:
            key = _storage_key(dev)
            self._records.pop(key, None)
            self._host(key, True, "a prefetch's destination")
        return dev

    def reused(self, buf: torch.Tensor, guard: Any) -> None:
        if guard is not None and not guard.query():
            return  # its next copy waits for the guard on its stream; the host must not touch it
        with self._cond:
            self._host(_storage_key(buf), True, "a host buffer handed out again")
            buf.fill_(_POISON)

    def host_freed(self, buf: torch.Tensor) -> None:
        with self._cond:
            key = _storage_key(buf)
            self._host(key, True, "a host buffer freed")
            self._hosts.discard(key)
            self._records.pop(key, None)
            buf.fill_(_POISON)

    def freed(self, src: torch.Tensor) -> None:
        with self._cond:
            self._raise_failed()
            key = _storage_key(src)
            self._host(key, True, "a device source let go")
            self._records.pop(key, None)
            if _sole_owner(src):
                src.fill_(_POISON)

    def reading(self, dev: torch.Tensor) -> None:
        with self._cond:
            self._raise_failed()
            self._host(_storage_key(dev), False, "compute's read of a prefetched storage")


# -- choosing an engine -----------------------------------------------------------------------

_IMMEDIATE = ImmediateEngine()
_CUDA = CudaEngine()
_override: CopyEngine | None = None
_from_env: ThreadedEngine | None = None
_env_lock = threading.Lock()


def _threaded_from_env() -> ThreadedEngine:
    global _from_env
    with _env_lock:
        if _from_env is None:
            raw = os.environ.get("CHAINOFFLOAD_COPY_DELAY", "0,0.002")
            try:
                lo, hi = (float(v) for v in raw.split(","))
            except ValueError:
                raise ValueError(f"CHAINOFFLOAD_COPY_DELAY={raw!r}: expected LOW,HIGH in seconds") from None
            _from_env = ThreadedEngine((lo, hi), seed=int(os.environ.get("CHAINOFFLOAD_COPY_SEED", "0")))
        return _from_env


def engine_for(device: torch.device | str) -> CopyEngine:
    """The copy engine for ``device``: CUDA's on a GPU; on CPU the one :func:`use_engine`
    installed, else the one ``CHAINOFFLOAD_COPY_ENGINE`` names (``immediate`` by default).

    Raises
    ------
    ValueError
        ``CHAINOFFLOAD_COPY_ENGINE`` names no CPU engine.
    """
    if torch.device(device).type == "cuda":
        return _CUDA
    if _override is not None:
        return _override
    name = os.environ.get(ENGINE_ENV, "").strip().lower() or "immediate"
    if name == "immediate":
        return _IMMEDIATE
    if name == "threaded":
        return _threaded_from_env()
    raise ValueError(f"{ENGINE_ENV}={name!r}: expected 'immediate' or 'threaded' (CUDA devices always use 'cuda')")


@contextlib.contextmanager
def use_engine(engine: CopyEngine) -> Iterator[CopyEngine]:
    """Make ``engine`` the one every CPU :class:`Copier` and :class:`HostPool` made inside the
    block uses (they keep it afterwards).

    Parameters
    ----------
    engine
        A copy engine, e.g. ``ThreadedEngine(delay=(0, 0.002), seed=1)``.
    """
    global _override
    previous, _override = _override, engine
    try:
        yield engine
    finally:
        _override = previous


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
