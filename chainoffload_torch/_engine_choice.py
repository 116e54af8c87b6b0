"""Which copy engine a copier or a host pool gets when none is given.

CUDA's on a GPU; on CPU the one :func:`use_engine` installed, else the one
``CHAINOFFLOAD_COPY_ENGINE`` names: ``immediate`` (the default) or ``threaded``, the test engine
of :mod:`chainoffload_torch.testing_engine`, which only this choice imports, and only when the
variable asks for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ._engines import CopyEngine, CudaEngine, ImmediateEngine

if TYPE_CHECKING:
    from .testing_engine import ThreadedEngine

__all__ = ["ENGINE_ENV", "engine_for", "use_engine"]

#: Environment variable naming the copy engine of CPU copiers and pools: ``immediate`` (default)
#: or ``threaded``; ``CHAINOFFLOAD_COPY_DELAY`` (``LO,HI`` seconds) and ``CHAINOFFLOAD_COPY_SEED``
#: configure the threaded one.
ENGINE_ENV = "CHAINOFFLOAD_COPY_ENGINE"

_IMMEDIATE = ImmediateEngine()
_CUDA = CudaEngine()
_override: CopyEngine | None = None
_from_env: ThreadedEngine | None = None  # one threaded engine per process, made on first use
_env_lock = threading.Lock()


def _threaded_from_env() -> ThreadedEngine:
    global _from_env
    with _env_lock:
        if _from_env is None:
            from .testing_engine import from_env

            _from_env = from_env()
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
    """Make ``engine`` the one every CPU copier and host pool made inside the block uses (they
    keep it afterwards).

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
