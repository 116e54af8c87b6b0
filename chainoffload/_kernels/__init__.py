"""Numba kernels (private). Import them through :func:`lazy` so that importing the package
does not import Numba, and so that a cold start may run them interpreted (``NOTE [ lazy
kernels ]`` in ``chainoffload._compile``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

__all__ = ["lazy", "module", "INTERPRETED"]

#: Whether :func:`lazy` kernels run as interpreted copies now (set by ``chainoffload._compile``).
INTERPRETED = [False]


def module(name: str, interpreted: bool = False) -> ModuleType:
    """The kernel module ``chainoffload._kernels.<name>``, jitted or as an interpreted copy.

    The interpreted copy is the same source loaded a second time with ``njit`` turned into
    the identity, so its kernels call each other as plain Python and nothing is compiled.
    """
    full = f"chainoffload._kernels.{name}"
    if not interpreted:
        return importlib.import_module(full)
    alias = f"chainoffload._kernels._interpreted_{name}"
    hit = sys.modules.get(alias)
    if hit is not None:
        return hit
    from .config import INTERPRETED_BUILD

    spec = importlib.util.find_spec(full)
    copy_spec = importlib.util.spec_from_file_location(alias, spec.origin)
    copy = importlib.util.module_from_spec(copy_spec)
    INTERPRETED_BUILD[0] = True
    try:
        copy_spec.loader.exec_module(copy)
    finally:
        INTERPRETED_BUILD[0] = False
    sys.modules[alias] = copy
    return copy


class _Lazy:
    """A kernel module, imported on the first attribute looked up (jitted or interpreted)."""

    __slots__ = ("_name", "_jit", "_py")

    def __init__(self, name: str) -> None:
        self._name = name
        self._jit: ModuleType | None = None
        self._py: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if INTERPRETED[0]:
            mod = self._py
            if mod is None:
                mod = module(self._name, interpreted=True)
                object.__setattr__(self, "_py", mod)
        else:
            mod = self._jit
            if mod is None:
                mod = module(self._name)
                object.__setattr__(self, "_jit", mod)
        return getattr(mod, attr)


def lazy(name: str) -> Any:
    """The kernel module ``chainoffload._kernels.<name>``, imported on first use."""
    return _Lazy(name)
