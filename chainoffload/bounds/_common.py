"""Argument checks shared by the bounds (private)."""

from __future__ import annotations

from ..chain import Chain
from ..platform import Platform

#: LP back ends :func:`chainoffload.bounds.fluid_lp` accepts (see ``fluid``).
LP_SOLVERS = ("glop", "pdlp")


def _check_pair(chain: Chain, platform: Platform, who: str) -> None:
    if not isinstance(chain, Chain):
        raise TypeError(f"{who}: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"{who}: platform must be a Platform, got {type(platform).__name__}")


def _check_time_limit(time_limit: object) -> None:
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise ValueError(f"time_limit: {time_limit!r} must be a number of seconds > 0")


def _check_solver(solver: object) -> str:
    if not isinstance(solver, str) or solver.lower() not in LP_SOLVERS:
        raise ValueError(f"solver: unknown LP solver {solver!r}; known: {', '.join(LP_SOLVERS)}")
    return solver.lower()

