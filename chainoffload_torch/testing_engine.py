"""The threaded copy engine: a test engine on which a missing wait of the copier fails a test.

:class:`ThreadedEngine` implements the :class:`~chainoffload_torch._engines.CopyEngine` contract
as adversarially as CUDA allows (NOTE [ copy engines ]): each copy stream is a worker thread that
runs its copies later, in order, after a seeded random delay; events, waits and queries behave
as CUDA's; a prefetch's destination and a new host buffer start as NaN bytes; and every access
it sees is checked against the order the waits create, so every ordering the copier leaves out
shows as wrong data or a :class:`CopyEngineError` instead of passing by luck.

Use it on CPU with ``chainoffload_torch._engine_choice.use_engine(ThreadedEngine())``, or for a
whole test run with ``CHAINOFFLOAD_COPY_ENGINE=threaded`` (:func:`from_env` reads the delay and
the seed). It is test machinery: it never runs unless asked for.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ._engines import CopyEngine

__all__ = ["ThreadedEngine", "CopyEngineError", "from_env", "WAIT_LIMIT"]


class CopyEngineError(RuntimeError):
    """A copy or an access the threaded engine found out of order (a missing wait)."""


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

    def __init__(self, seq: int, delay: float, run: Callable[[], None] | None, event: _Event | None, what: str) -> None:
        self.seq = seq
        self.delay = delay
        self.run = run
        self.event = event
        self.what = what


class _Stream:
    """A copy stream of the threaded engine: the handle a copier holds; its worker stops with it."""

    def __init__(self, engine: ThreadedEngine, lane: _Lane) -> None:
        self.lane = lane
        self.direction = lane.direction
        weakref.finalize(self, engine._close, lane)

    def __repr__(self) -> str:
        return f"<threaded stream {self.lane.name}>"


class _Event:
    """An event of the threaded engine: operation ``seq`` of ``lane`` and the clock it carries."""

    __slots__ = ("engine", "lane", "seq", "clock")

    def __init__(self, engine: ThreadedEngine, lane: _Lane, seq: int, clock: dict[int, int]) -> None:
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
                        # Bound now, though the wait returns before the loop moves on (ruff B023).
                        self._wait_for(lambda other=other, seq=seq: other.done >= seq, f"operation {seq} of the {other.name} stream")
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


def from_env() -> ThreadedEngine:
    """A new :class:`ThreadedEngine` configured from the environment.

    ``CHAINOFFLOAD_COPY_DELAY`` is the delay range as ``LOW,HIGH`` seconds (``0,0.002`` by
    default) and ``CHAINOFFLOAD_COPY_SEED`` the seed (``0`` by default).

    Raises
    ------
    ValueError
        ``CHAINOFFLOAD_COPY_DELAY`` or ``CHAINOFFLOAD_COPY_SEED`` is not a number pair or an integer.
    """
    raw = os.environ.get("CHAINOFFLOAD_COPY_DELAY", "0,0.002")
    try:
        lo, hi = (float(v) for v in raw.split(","))
    except ValueError:
        raise ValueError(f"CHAINOFFLOAD_COPY_DELAY={raw!r}: expected LOW,HIGH in seconds") from None
    if not 0.0 <= lo <= hi:
        raise ValueError(f"CHAINOFFLOAD_COPY_DELAY={raw!r}: expected 0 <= LOW <= HIGH seconds")
    seed = os.environ.get("CHAINOFFLOAD_COPY_SEED", "0")
    try:
        return ThreadedEngine((lo, hi), seed=int(seed))
    except ValueError:
        raise ValueError(f"CHAINOFFLOAD_COPY_SEED={seed!r}: expected an integer") from None
