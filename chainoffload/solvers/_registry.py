"""The registry of methods: names, where each lives, and what it may do.

Targets are ``"module:function"`` strings imported on first use, so optional dependencies stay
optional and this module imports no method.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from ..result import Result
from ._options import OptionError

__all__ = ["SolverSpec", "DEFAULT_METHOD", "methods", "register", "spec"]


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    """A registered method.

    Attributes
    ----------
    name
        Registry name (``--method NAME``).
    target
        ``"module:function"`` (imported on first use, so optional dependencies stay optional)
        or the callable itself.
    summary
        One line for ``chainoffload methods``.
    remat
        Whether the method may recompute (its schedules may hold Fck / Fn ops).
    remat_option
        For a method that recomputes only when asked: the name of the boolean option that
        allows it (``best``'s ``remat``).
    fits_option
        The name of a boolean option that makes the method stop at the first schedule that fits
        (``best``'s ``first_fit``): a memory search asks only whether one fits, and passes it.
    """

    name: str
    target: str | Callable[..., Result]
    summary: str
    remat: bool = False
    remat_option: str | None = None
    fits_option: str | None = None

    def load(self) -> Callable[..., Result]:
        """The solver function."""
        if callable(self.target):
            return self.target
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


_B = "chainoffload.solvers.baselines"

# The registry: explicit, in the order `chainoffload methods` lists it.
_REGISTRY: dict[str, SolverSpec] = {
    spec.name: spec
    for spec in (
        SolverSpec("keep-all", f"{_B}:keep_all", "no offload; infeasible if the activations do not fit"),
        SolverSpec(
            "offload-all",
            f"{_B}:offload_all",
            "vDNN: offload every unit as soon as it is made, prefetch it one stage ahead",
        ),
        SolverSpec("first-k", f"{_B}:first_k", "TransformerEngine: offload the first k units, smallest k that fits"),
        SolverSpec("largest-first", f"{_B}:largest_first", "torchtitan-style: offload the largest units until it fits"),
        SolverSpec("lp", "chainoffload.solvers.lp:lp", "fluid LP relaxation (proven lower bound), rounded into whole units and planned"),
        SolverSpec("dp", "chainoffload.solvers.dp:dp", "fluid DP over stages with memory in slots, planned and repaired by bisection"),
        SolverSpec("best", "chainoffload.solvers.best:best", "local search from lp, dp and every baseline over units and triggers; never worse than a baseline", remat_option="remat", fits_option="first_fit"),
        SolverSpec("cpsat", "chainoffload.solvers.cpsat:cpsat", "exact CP-SAT model of the rules (small chains); proven optimum or bound"),
        SolverSpec("rotor", "chainoffload.solvers.rotor:rotor", "rotor DP: optimal persistent checkpointing, no offload", remat=True),
        SolverSpec("checkpoint-all", "chainoffload.solvers.remat_baselines:checkpoint_all", "HF gradient_checkpointing_enable / Megatron full: keep every stage's input, recompute each stage before its backward", remat=True),
        SolverSpec("sqrt-checkpoint", "chainoffload.solvers.remat_baselines:sqrt_checkpoint", "Chen et al.: keep the input of every sqrt(L)-stage segment, recompute the rest", remat=True),
        SolverSpec("recompute-all", "chainoffload.solvers.remat_baselines:recompute_all", "keep only a_0; recompute up to each stage before its backward (least memory)", remat=True),
        SolverSpec("joint", "chainoffload.solvers.joint:joint", "joint DP of rematerialization and offloading (best of it, rotor, pure offload)", remat=True),
    )
}

#: The method :func:`solve` uses when none is named.
DEFAULT_METHOD = "best"


def methods() -> dict[str, str]:
    """The registered methods, name to one-line summary, in listing order."""
    return {name: spec.summary for name, spec in _REGISTRY.items()}


def register(name: str, func: Callable[..., Result], summary: str, *, remat: bool = False, replace: bool = False) -> None:
    """Add a method to the registry so that :func:`solve` and the CLI can use it.

    Parameters
    ----------
    name
        Registry name; must not clash with an existing one unless ``replace`` is true.
    func
        ``func(chain, platform, **options) -> Result``.
    summary
        One line for ``chainoffload methods``.
    remat
        Whether its schedules may recompute.
    replace
        Allow replacing a registered method of the same name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: name must be a non-empty string, got {name!r}")
    if not callable(func):
        raise TypeError(f"register: func for {name!r} is not callable")
    if name in _REGISTRY and not replace:
        raise ValueError(f"register: method {name!r} already exists (pass replace=True to replace it)")
    _REGISTRY[name] = SolverSpec(name, func, summary, remat)


def spec(name: str) -> SolverSpec:
    """The registry entry of ``name``; unknown names raise with the list of known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError(f"method: unknown method {name!r}; known: {', '.join(_REGISTRY)}") from None
