"""Numba compile time: paid once, told on stderr, kept out of time limits and runtimes.

Private. NOTE [ lazy kernels ]
------------------------------
Kernels compile on their first call and are cached on disk (``cache=True``): a later process
loads them (measured: 0.7-0.9 s of CPU, Numba's import included) instead of compiling them
(~30 s of CPU for the four kernels of the default method). So:

* ``import chainoffload`` does not import Numba: kernel modules are reached through
  :func:`chainoffload._kernels.lazy`, imported on first use, and ``chainoffload methods`` or
  ``--help`` never pay Numba's import;
* :func:`prepare`, called by :func:`chainoffload.solve` before its clock starts, makes the
  kernels the method needs (and only those) ready by calling them on a tiny chain: loaded
  from the cache when it is warm, else compiled right away, with one line on stderr ("compiling solver
  kernels, once: ~N s"), the seconds reported in ``Result.info["compile_time"]`` and not in
  ``runtime`` or against ``time_limit``;
* with ``cold="interpret"`` (the CLI's default for chains of at most ``INTERPRET_MAX_LENGTH``
  stages, or ``CHAINOFFLOAD_COLD=interpret``), a cold cache is not waited for: the call runs
  an interpreted copy of the kernel modules (the same source with ``njit`` as the identity;
  ~30-80x slower per call, but the default method on a 20-stage chain needs ~2 s of CPU that
  way against ~30 s of compiling) while a background process, at low priority, compiles and
  caches them for the next run. ``Result.info["kernels"]`` says which way a call ran.

``numba:compile`` events fire only for real compiles (not for cache loads), which is how
:func:`compiling` measures the compile seconds of a call; the stderr line is printed only for
this package's kernels, not for a registered method's own Numba functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

__all__ = ["compiling", "prepare", "configure", "COLD_ESTIMATE", "INTERPRET_MAX_LENGTH"]

#: Seconds of CPU the first compile of the default method's kernels takes, about.
COLD_ESTIMATE = 30

#: Longest chain a cold start runs interpreted when ``cold="interpret"``.
INTERPRET_MAX_LENGTH = 64

# kernel module -> dispatchers whose cache says whether it is warm
_DISPATCHERS = {
    "structure": ("resolve_kernel",),
    "simulate": ("replay_kernel",),
    "planner": ("plan_kernel",),
    "dp": ("fluid_dp",),
    "rotor": ("bound_table", "exact_entries", "bound_at", "_memo_slot"),
}
_JUDGE = ("structure", "simulate")
_PLANNED = _JUDGE + ("planner",)
_NEEDS = {
    "keep-all": _PLANNED,
    "offload-all": _PLANNED,
    "first-k": _PLANNED,
    "largest-first": _PLANNED,
    "lp": _PLANNED,
    "dp": _PLANNED + ("dp",),
    "best": _PLANNED + ("dp",),
    "rotor": _JUDGE + ("rotor",),
}

# Warm-ups that live in solver modules, reached by name like the solver registry's targets:
# those modules import chainoffload.solvers, whose solve() imports this module.
_WARM_UP_TARGETS = {"dp": "chainoffload.solvers.dp:fluid_plan", "rotor": "chainoffload.solvers.rotor:_warm_up"}

_STATE = {"installed": False, "depth": 0, "start": 0.0, "total": 0.0, "cold": None, "spawned": False}
_LOCK = threading.Lock()


def configure(cold: str | None) -> None:
    """What a cold start does: ``"compile"`` (wait for the compile), ``"interpret"`` (run
    interpreted kernels on short chains and compile in the background) or ``None`` (the
    ``CHAINOFFLOAD_COLD`` environment variable, else ``"compile"``)."""
    if cold not in (None, "compile", "interpret"):
        raise ValueError(f"cold: expected 'compile', 'interpret' or None, got {cold!r}")
    _STATE["cold"] = cold


def _cold_mode() -> str:
    mode = _STATE["cold"] or os.environ.get("CHAINOFFLOAD_COLD", "compile")
    return mode if mode in ("compile", "interpret") else "compile"


class _Meter:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.kernels = "compiled"


def _install() -> None:
    if _STATE["installed"]:
        return
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev: object) -> None:
            with _LOCK:
                if _STATE["depth"] == 0:
                    _STATE["start"] = time.perf_counter()
                    if _ours(ev):  # not a user's own Numba function (a registered method's)
                        from ._progress import note_once

                        note_once(f"compiling solver kernels, once: ~{COLD_ESTIMATE} s of CPU (cached for later runs)")
                _STATE["depth"] += 1

        def on_end(self, ev: object) -> None:
            with _LOCK:
                _STATE["depth"] -= 1
                if _STATE["depth"] == 0:
                    _STATE["total"] += time.perf_counter() - _STATE["start"]

    event.register("numba:compile", _Listener())
    _STATE["installed"] = True


def _ours(ev: object) -> bool:
    """Whether a ``numba:compile`` event compiles one of this package's kernels."""
    try:
        func = ev.data["dispatcher"].py_func
    except Exception:  # Numba's event data changed: say nothing rather than something wrong
        return False
    return getattr(func, "__module__", "").startswith("chainoffload._kernels.")


@contextlib.contextmanager
def compiling() -> Iterator[_Meter]:
    """Measure the seconds Numba spends compiling inside the ``with`` block (``.seconds``)."""
    from ._kernels.config import JIT_DISABLED

    meter = _Meter()
    if JIT_DISABLED:
        meter.kernels = "interpreted"
        yield meter
        return
    _install()
    before = _STATE["total"]
    try:
        yield meter
    finally:
        meter.seconds = _STATE["total"] - before


def _loaded(name: str) -> bool:
    """Whether the kernels of module ``name`` are compiled or loaded in this process already."""
    from ._kernels import module

    mod = module(name)
    return all(getattr(mod, attr).signatures for attr in _DISPATCHERS[name])


def _warm(name: str) -> bool:
    """Whether the kernels of module ``name`` are compiled in this process or cached on disk."""
    from ._kernels import module

    mod = module(name)
    for attr in _DISPATCHERS[name]:
        disp = getattr(mod, attr)
        if disp.signatures:
            continue
        try:
            if not disp._cache._cache_file._load_index():
                return False
        except Exception:  # Numba internals changed: assume warm, compile if not
            continue
    return True


def _warm_up(names: tuple[str, ...]) -> None:
    """Call each kernel of ``names`` once on a tiny chain, with the argument types real calls use."""
    from .chain import Chain
    from .platform import Platform
    from .schedule import Schedule
    from .simulate import simulate

    chain = Chain(fwd=[1.0, 2.0, 1.0], bwd=[2.0, 4.0, 2.0], act=[10, 20, 30, 40], saved=[25, 35, 45], fwd_tmp=[5, 5, 5], bwd_tmp=[7, 7, 7], name="warm-up")
    platform = Platform(memory=10**6, bandwidth_d2h=1e3, bandwidth_h2d=1e3)
    if "structure" in names or "simulate" in names:
        simulate(chain, platform, Schedule.keep_all(3))
    if "planner" in names:
        from .planner import plan_transfers

        plan_transfers(chain, platform, [1])
    for name in names:
        if name in _WARM_UP_TARGETS:
            module, _, func = _WARM_UP_TARGETS[name].partition(":")
            getattr(importlib.import_module(module), func)(chain, platform)


@contextlib.contextmanager
def prepare(method: str, length: int) -> Iterator[_Meter]:
    """Make the kernels ``method`` needs ready before a solve's clock starts (``NOTE [ lazy kernels ]``).

    Inside the block, kernels run jitted, or interpreted when the cache is cold, the chain is
    short and the cold mode is ``"interpret"``. ``.seconds`` is the compile time spent here.
    """
    from ._kernels import INTERPRETED
    from ._kernels.config import JIT_DISABLED

    meter = _Meter()
    names = _NEEDS.get(method, _JUDGE)
    if JIT_DISABLED or INTERPRETED[0]:
        # Numba is off, or an enclosing prepare() runs this process's kernels interpreted
        # (minimum_memory's solves inside the CLI's, say): one decision per command, so a
        # nested call neither compiles in the middle of it nor turns the interpreter off.
        meter.kernels = "interpreted"
        yield meter
        return
    if all(_loaded(n) for n in names):
        yield meter
        return
    if _cold_mode() == "interpret" and length <= INTERPRET_MAX_LENGTH and not all(_warm(n) for n in names):
        from ._progress import note_once

        spawned = _background_compile(names)
        later = "; compiling them in the background for the next runs" if spawned else ""
        note_once(f"solver kernels not compiled yet: this run interprets them{later}")
        meter.kernels = "interpreted"
        INTERPRETED[0] = True
        try:
            yield meter
        finally:
            INTERPRETED[0] = False
        return
    with compiling() as jit:
        _warm_up(names)
    meter.seconds = jit.seconds
    yield meter


def _lock_path() -> str:
    where = os.environ.get("NUMBA_CACHE_DIR", "") + os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"chainoffload-compile-{digest}.lock")


def _background_compile(names: tuple[str, ...]) -> bool:
    """Compile ``names`` in a detached, low-priority process (once at a time per cache);
    whether one is running for this cache now."""
    if os.environ.get("CHAINOFFLOAD_BACKGROUND_COMPILE", "1") == "0":
        return False
    if _STATE["spawned"]:
        return True
    _STATE["spawned"] = True
    lock = _lock_path()
    try:
        if time.time() - os.path.getmtime(lock) < 600:
            return True  # another process is compiling the same cache
    except OSError:
        pass
    try:
        with open(lock, "w") as fh:
            fh.write(str(os.getpid()))
        subprocess.Popen(
            [sys.executable, "-m", "chainoffload._compile", lock, *names],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    return True


def _main(argv: list[str]) -> int:
    lock, names = argv[0], tuple(argv[1:])
    try:
        if hasattr(os, "nice"):
            os.nice(10)
        _warm_up(names)
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock)
    return 0


if __name__ == "__main__":  # the background compile of _background_compile
    sys.exit(_main(sys.argv[1:]))
