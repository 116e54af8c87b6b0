"""One front door, :func:`solve`, over an explicit registry of methods.

Every method has the same call shape, ``func(chain, platform, **options) -> Result``, and every
result goes through the one simulator here before it is returned: the makespan, peak and
offloaded bytes a caller sees are the simulator's, and a schedule the simulator rejects is never
reported as feasible.

The package is split in three: ``_registry`` (the methods and their names), ``_front``
(:func:`solve`, :func:`judge`, :func:`minimum_memory`, :func:`memory_search`) and ``_options`` (the validators, a leaf
that every method module may import). Method modules import those, never this package.
"""

from __future__ import annotations

from ._front import MemorySearch, judge, memory_search, minimum_memory, solve
from ._options import OptionError, check_keep, check_memory_floor, check_time_limit
from ._registry import DEFAULT_METHOD, SolverSpec, methods, register, spec

__all__ = [
    "solve",
    "judge",
    "spec",
    "methods",
    "register",
    "SolverSpec",
    "DEFAULT_METHOD",
    "OptionError",
    "check_memory_floor",
    "check_keep",
    "minimum_memory",
    "memory_search",
    "MemorySearch",
    "check_time_limit",
]
