"""One place for Numba's flags, so every kernel is compiled the same way.

``cache=True`` writes the compiled code next to the module (``__pycache__``, or under
``NUMBA_CACHE_DIR``) so a second process does not pay the compile again. ``fastmath`` stays
off: the simulator must give the same makespan on every call, and solvers compare sums of
times exactly. Kernels also run as plain Python with ``NUMBA_DISABLE_JIT=1``, which the tests
use to cover them, and as an interpreted copy of their module when a cold start runs them
without compiling (``NOTE [ lazy kernels ]`` in ``chainoffload._compile``). Numba itself is
imported only when a kernel is compiled.
"""

from __future__ import annotations

import os

__all__ = ["njit", "JIT_OPTIONS", "JIT_DISABLED"]

JIT_OPTIONS = {"cache": True, "nogil": True, "fastmath": False}
JIT_DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")

# True while chainoffload._kernels loads an interpreted copy of a kernel module.
INTERPRETED_BUILD = [False]


def njit(func=None, **overrides):
    """``numba.njit`` with the project's flags; usable bare (``@njit``) or with overrides."""
    if INTERPRETED_BUILD[0]:
        return func if func is not None else (lambda f: f)
    import numba

    options = {**JIT_OPTIONS, **overrides}
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
