"""Numba compile time: told once on stderr, and measured apart from a method's runtime.

Private. NOTE [ lazy kernels ]
------------------------------
Kernels compile on their first call (Numba's dispatchers are lazy) and are cached on disk
(``cache=True``): a second process loads them instead of compiling. ``import chainoffload`` does
not import Numba at all: the modules that hold kernels (``chainoffload._kernels``) are imported
inside the functions that call them, so ``chainoffload methods`` and ``--help`` never pay
Numba's import, and a call compiles only the kernels it runs. :func:`compiling` measures the
seconds spent compiling during a call (Numba's ``numba:compile`` events fire only for real
compiles, not for cache loads), so that :func:`chainoffload.solve` reports them apart
(``Result.info["compile_time"]``) instead of in ``runtime``; the first real compile of a
process prints one line on stderr saying so.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

__all__ = ["compiling", "COLD_ESTIMATE"]

#: Seconds a cold start of the default method compiles for, about (README, "Measured").
COLD_ESTIMATE = 10

_STATE = {"installed": False, "depth": 0, "start": 0.0, "total": 0.0}
_LOCK = threading.Lock()


class _Meter:
    def __init__(self) -> None:
        self.seconds = 0.0


def _install() -> None:
    if _STATE["installed"]:
        return
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev: object) -> None:
            with _LOCK:
                if _STATE["depth"] == 0:
                    _STATE["start"] = time.perf_counter()
                    from ._progress import note_once

                    note_once(f"compiling solver kernels, once: ~{COLD_ESTIMATE} s (cached for later runs)")
                _STATE["depth"] += 1

        def on_end(self, ev: object) -> None:
            with _LOCK:
                _STATE["depth"] -= 1
                if _STATE["depth"] == 0:
                    _STATE["total"] += time.perf_counter() - _STATE["start"]

    event.register("numba:compile", _Listener())
    _STATE["installed"] = True


@contextlib.contextmanager
def compiling() -> Iterator[_Meter]:
    """Measure the seconds Numba spends compiling inside the ``with`` block (``.seconds``)."""
    from ._kernels.config import JIT_DISABLED

    meter = _Meter()
    if JIT_DISABLED:
        yield meter
        return
    _install()
    before = _STATE["total"]
    try:
        yield meter
    finally:
        meter.seconds = _STATE["total"] - before
