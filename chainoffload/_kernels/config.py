"""One place for Numba's flags, so every kernel is compiled the same way.

``cache=True`` writes the compiled code next to the module (``__pycache__``) so a second process
does not pay the compile again. ``fastmath`` stays off: the simulator must give the same
makespan on every call, and solvers compare sums of times exactly. Kernels also run as plain
Python with ``NUMBA_DISABLE_JIT=1``, which the tests use to cover them.
"""

from __future__ import annotations

import os

import numba

__all__ = ["njit", "JIT_OPTIONS", "JIT_DISABLED"]

JIT_OPTIONS = {"cache": True, "nogil": True, "fastmath": False}
JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")


def njit(func=None, **overrides):
    """``numba.njit`` with the project's flags; usable bare (``@njit``) or with overrides."""
    options = {**JIT_OPTIONS, **overrides}
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
