"""The memory / time trade-off: each method's overhead over a sweep of memory limits.

Choosing a memory budget means knowing what each byte costs in time. :func:`tradeoff` runs
methods at memory limits from the least any schedule needs (:meth:`Chain.stage_memory_floor`)
up to what keeping every activation needs (:func:`chainoffload.keep_all_peak`), and returns a
:class:`Tradeoff`: per method and memory the status, makespan, overhead and lower bound, with
the proven floors (:func:`chainoffload.bounds.offload_memory_floor` for pure offloading,
:meth:`Chain.stage_memory_floor` for methods that recompute) and the pure-offloading lower
bound at each memory. :func:`chainoffload.plot.plot_tradeoff` draws it; ``chainoffload
tradeoff`` prints or plots it; ``benchmarks/compare.py`` runs it over the shipped networks.

NOTE [ a sweep without a clock ]
--------------------------------
A trade-off table is for choosing a memory budget, and often for quoting it (a README, a
paper, a design review), so by default it must not depend on the machine that made it. With
``time_limit=None`` (the default; the CLI without ``--time-limit``) no method is given a wall
clock: ``best`` stops by its work budget (NOTE [ best's work budget ] in
``chainoffload/solvers/best.py``), ``lp``, ``dp``, ``rotor``, ``joint`` and the baselines run
to their own end by rules that read the instance only, and every bound is the ladder's, whose
rungs are chosen by size rules and work limits (NOTE [ bound ladder ]). So the same call prints
the same table on any machine and at any load, apart from the runtimes. A method whose only
stop is a wall clock of its own (``cpsat``: CP-SAT with several workers is not reproducible
anyway) keeps it and is listed in :attr:`Tradeoff.clocked`; its point is then the machine's
unless it is proven optimal. A ``time_limit`` given by the caller goes to every method that
takes one, which trades that guarantee for a bounded wall time per run (at 10^4+ stages the
default sweep takes minutes: each ``best`` run lets every start finish); every such method is
then in ``clocked``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._progress import progress
from .chain import Chain
from .platform import Platform
from .result import Result, Status
from .units import format_bytes

__all__ = ["tradeoff", "Tradeoff", "TradeoffPoint", "DEFAULT_TRADEOFF_METHODS", "FIXED_REMAT_POLICIES", "sweep_memories",
           "policy_peak"]

#: What :func:`tradeoff` runs when no method is named: the policies users know (offloading:
#: offload-all, first-k, largest-first; recomputing: checkpoint every block, sqrt checkpointing),
#: the default search, and the two that plan recomputation (the exact ``cpsat`` is left out: it
#: is for small chains).
DEFAULT_TRADEOFF_METHODS = ("offload-all", "first-k", "largest-first", "checkpoint-all", "sqrt-checkpoint", "best", "rotor",
                            "joint")

#: The recomputing policies whose schedule does not depend on the memory: each has one peak,
#: which a sweep that runs it adds to its memories (the budget at which it starts to fit).
FIXED_REMAT_POLICIES = ("checkpoint-all", "sqrt-checkpoint", "recompute-all")


@dataclasses.dataclass(frozen=True, eq=False)
class TradeoffPoint:
    """One method at one memory limit.

    Attributes
    ----------
    memory
        The memory limit in bytes.
    status
        The result's :class:`~chainoffload.Status`.
    makespan
        Seconds (the simulator's); ``inf`` without a feasible schedule.
    overhead
        ``makespan / (sum(fwd) + sum(bwd)) - 1``; ``inf`` without a feasible schedule.
    lower_bound
        The result's lower bound in seconds (for pure offloading, the problem's:
        max(sum(fwd) + sum(bwd), fluid LP)); ``nan`` when the method has none.
    peak_memory
        The simulator's peak of the schedule (0 without one).
    runtime
        Seconds the method took.
    result
        The full :class:`~chainoffload.Result` (schedule and timeline included); ``None`` for
        a point read back by :meth:`Tradeoff.from_dict`.
    """

    memory: int
    status: Status
    makespan: float
    overhead: float
    lower_bound: float
    peak_memory: int
    runtime: float
    result: Result | None = None

    @property
    def feasible(self) -> bool:
        """Whether the method found a schedule that fits."""
        return self.status.has_schedule

    def to_dict(self) -> dict[str, Any]:
        """Plain data (no result); non-finite numbers become ``None``."""
        return {
            "memory": self.memory,
            "status": str(self.status),
            "makespan": _finite(self.makespan),
            "overhead": _finite(self.overhead),
            "lower_bound": _finite(self.lower_bound),
            "peak_memory": self.peak_memory,
            "runtime": self.runtime,
        }


@dataclasses.dataclass(frozen=True, eq=False)
class Tradeoff:
    """Overhead against memory per method, with the floors, the keep-all peak and the bound.

    Attributes
    ----------
    chain_name
        The chain's name.
    platform
        The link the sweep ran on (its ``memory`` is the keep-all peak; each point has its own).
    compute_time
        sum(fwd) + sum(bwd) in seconds: the makespan with no overhead.
    keep_all_peak
        Peak memory of keeping every activation (:func:`chainoffload.keep_all_peak`): at or
        above it nothing needs to move and the overhead is 0.
    offload_floor
        :func:`chainoffload.bounds.offload_memory_floor`: no pure-offloading schedule fits
        below it (proven).
    stage_floor
        :meth:`Chain.stage_memory_floor`: no schedule at all fits below it, recomputing or not.
    memories
        The memory limits swept, increasing, in bytes.
    lower_bound
        Per memory, the proven lower bound on the makespan of every pure-offloading schedule
        (seconds): the best bound any pure-offloading result reported there or at a larger
        memory, and at least :func:`chainoffload.bounds.problem_bound` there; ``inf`` below
        ``offload_floor``. (A schedule that fits in some memory fits in more, so the optimum
        only falls as memory grows and a bound at a larger memory holds at a smaller one.)
    curves
        Method name to one :class:`TradeoffPoint` per memory, in the order of ``memories``.
    remat
        Method name to whether it recomputes (its schedules are bound by ``stage_floor`` and
        not by ``lower_bound``).
    time_limit
        The ``time_limit`` the sweep ran with (seconds per run), ``None`` for none (NOTE [ a
        sweep without a clock ]).
    clocked
        The methods whose points a wall clock may have decided (``time_limit`` given: every
        method that takes one; ``None``: only those with a wall-clock default of their own,
        ``cpsat``); every other point is the same on any machine, apart from its runtime.
    policy_peaks
        For each method of :data:`FIXED_REMAT_POLICIES` swept, the peak of its schedule: the
        least memory at which it fits (a default sweep has a point there, so that the methods
        that plan recomputation are seen against it at the memory it holds).
    """

    chain_name: str
    platform: Platform
    compute_time: float
    keep_all_peak: int
    offload_floor: int
    stage_floor: int
    memories: tuple[int, ...]
    lower_bound: tuple[float, ...]
    curves: dict[str, tuple[TradeoffPoint, ...]]
    remat: dict[str, bool]
    time_limit: float | None = None
    clocked: tuple[str, ...] = ()
    policy_peaks: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods swept, in the order they were given."""
        return tuple(self.curves)

    def overheads(self, method: str) -> np.ndarray:
        """``method``'s overhead at each memory (``nan`` where it found no schedule)."""
        points = self._curve(method)
        return np.array([p.overhead if p.feasible else math.nan for p in points], dtype=float)

    def lower_bound_overheads(self) -> np.ndarray:
        """The pure-offloading lower bound at each memory as an overhead (``inf`` below the floor)."""
        base = self.compute_time
        return np.array([lb / base - 1.0 if base > 0 else 0.0 for lb in self.lower_bound], dtype=float)

    def min_memory(self, method: str) -> int | None:
        """The smallest memory of the sweep at which ``method`` found a schedule (``None``: none)."""
        for p in self._curve(method):
            if p.feasible:
                return p.memory
        return None

    def _curve(self, method: str) -> tuple[TradeoffPoint, ...]:
        try:
            return self.curves[method]
        except KeyError:
            raise ValueError(f"tradeoff: method {method!r} was not swept; swept: {', '.join(self.curves)}") from None

    def to_dict(self) -> dict[str, Any]:
        """The table as plain JSON-ready data (``chainoffload tradeoff --json``).

        Keys: ``chain``, ``platform`` (bandwidths, latency, duplex), ``compute_time``,
        ``keep_all_peak``, ``offload_memory_floor``, ``stage_memory_floor``, ``memories``,
        ``lower_bound`` and ``lower_bound_overhead`` (one per memory; ``null`` below the offload
        floor), ``time_limit`` (seconds or ``null``), ``clocked`` (the methods a wall clock may
        have decided), ``policy_peaks`` (name to bytes, :attr:`policy_peaks`), and ``methods``: name to ``{"remat": bool, "min_memory": int | null,
        "points": [...]}`` with one :meth:`TradeoffPoint.to_dict` per memory. Non-finite
        numbers are ``null``.
        """
        link = self.platform.to_dict()
        link.pop("memory", None)
        return {
            "chain": self.chain_name,
            "platform": link,
            "compute_time": self.compute_time,
            "keep_all_peak": self.keep_all_peak,
            "offload_memory_floor": self.offload_floor,
            "stage_memory_floor": self.stage_floor,
            "memories": list(self.memories),
            "lower_bound": [_finite(x) for x in self.lower_bound],
            "lower_bound_overhead": [_finite(x) for x in self.lower_bound_overheads()],
            "time_limit": self.time_limit,
            "clocked": list(self.clocked),
            "policy_peaks": dict(self.policy_peaks),
            "methods": {
                m: {"remat": self.remat[m], "min_memory": self.min_memory(m), "points": [p.to_dict() for p in pts]}
                for m, pts in self.curves.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tradeoff:
        """Read back what :meth:`to_dict` wrote (the points have no ``result``).

        A table written before ``time_limit`` and ``clocked`` existed reads back with ``None``
        and every method clocked (the sweeps then ran under a time limit); one written before
        ``policy_peaks`` with none. Raises
        ``ValueError`` naming the missing key when ``data`` is not such a table.
        """
        try:
            memories = tuple(int(m) for m in data["memories"])
            curves = {
                name: tuple(
                    TradeoffPoint(
                        memory=int(p["memory"]),
                        status=Status(p["status"]),
                        makespan=_number(p["makespan"]),
                        overhead=_number(p["overhead"]),
                        lower_bound=_number(p["lower_bound"], missing=math.nan),
                        peak_memory=int(p["peak_memory"]),
                        runtime=float(p["runtime"]),
                    )
                    for p in entry["points"]
                )
                for name, entry in data["methods"].items()
            }
            platform = Platform.from_dict({**data["platform"], "memory": int(data["keep_all_peak"])})
            return cls(
                chain_name=str(data["chain"]),
                platform=platform,
                compute_time=float(data["compute_time"]),
                keep_all_peak=int(data["keep_all_peak"]),
                offload_floor=int(data["offload_memory_floor"]),
                stage_floor=int(data["stage_memory_floor"]),
                memories=memories,
                lower_bound=_monotone([_number(x) for x in data["lower_bound"]]),
                curves=curves,
                remat={name: bool(entry["remat"]) for name, entry in data["methods"].items()},
                time_limit=None if data.get("time_limit") is None else float(data["time_limit"]),
                clocked=tuple(data["clocked"]) if "clocked" in data else tuple(data["methods"]),
                policy_peaks={str(k): int(v) for k, v in data.get("policy_peaks", {}).items()},
            )
        except KeyError as exc:
            raise ValueError(f"tradeoff: missing key {exc.args[0]!r} in the table") from None

    def plot(self, path: str | None = None, **kwargs: Any):
        """Draw the curves (see :func:`chainoffload.plot.plot_tradeoff`; needs matplotlib)."""
        from .plot import plot_tradeoff

        return plot_tradeoff(self, path, **kwargs)


def _monotone(bounds: Sequence[float]) -> tuple[float, ...]:
    """Each bound raised to the best one at any larger memory (the memories are increasing)."""
    out = [float(b) for b in bounds]
    for j in range(len(out) - 2, -1, -1):
        out[j] = max(out[j], out[j + 1])
    return tuple(out)


def _number(x: float | None, missing: float = math.inf) -> float:
    return missing if x is None else float(x)


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def policy_peak(chain: Chain, name: str) -> int:
    """The peak memory of a fixed recomputing policy's schedule on ``chain``: the least memory
    at which that method fits.

    Parameters
    ----------
    chain
        The chain.
    name
        One of :data:`FIXED_REMAT_POLICIES`.
    """
    from .platform import Platform
    from .simulate import simulate
    from .solvers.remat_baselines import family_schedules

    if name not in FIXED_REMAT_POLICIES:
        raise ValueError(f"policy: {name!r} is not one of {', '.join(FIXED_REMAT_POLICIES)}")
    unlimited = Platform(memory=2**63 - 1, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    return int(simulate(chain, unlimited, family_schedules(chain.length)[name][1]()).peak_memory)


def sweep_memories(chain: Chain, points: int, *, offload_floor: bool = True, policies: Sequence[str] = ()) -> tuple[int, ...]:
    """Memory limits from the stage floor to the keep-all peak, in bytes, increasing.

    ``points`` limits evenly spaced from :meth:`Chain.stage_memory_floor` to
    :func:`chainoffload.keep_all_peak`, and with ``offload_floor`` also
    :func:`chainoffload.bounds.offload_memory_floor` (where pure offloading may start to fit),
    and the peak of each of ``policies`` (names from :data:`FIXED_REMAT_POLICIES`, see
    :func:`policy_peak`) that lies in that range.
    """
    from .bounds import offload_memory_floor
    from .simulate import keep_all_peak

    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points < 2:
        raise ValueError(f"points: expected an integer >= 2, got {points!r}")
    floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
    swept = {int(m) for m in np.linspace(floor, max(peak, floor), int(points))}
    if offload_floor:
        swept.add(min(offload_memory_floor(chain), max(peak, floor)))
    for name in policies:
        m = policy_peak(chain, name)
        if floor <= m <= max(peak, floor):
            swept.add(m)
    return tuple(sorted(swept))


def tradeoff(
    chain: Chain,
    platform: Platform,
    methods: Sequence[str] | None = None,
    memories: Sequence[int] | None = None,
    *,
    points: int = 10,
    time_limit: float | None = None,
    **options: Any,
) -> Tradeoff:
    """Run ``methods`` at each memory limit and return overhead against memory per method.

    Parameters
    ----------
    chain
        The instance's chain.
    platform
        The link (bandwidths, latency, duplex); its ``memory`` is ignored.
    methods
        Registry names (see :func:`chainoffload.methods`); ``None`` means
        :data:`DEFAULT_TRADEOFF_METHODS`.
    memories
        Memory limits in bytes (any order; duplicates dropped); each must be at least
        :meth:`Chain.stage_memory_floor`. ``None`` sweeps ``points`` limits evenly from that
        floor to the keep-all peak, plus the offload floor and the peak of each fixed
        recomputing policy swept (checkpoint-all, sqrt-checkpoint, recompute-all: the memory it
        holds, where the methods that plan recomputation are compared with it; see
        :func:`sweep_memories`).
    points
        Number of memory limits when ``memories`` is ``None`` (at least 2).
    time_limit
        ``None`` (default): no wall clock (NOTE [ a sweep without a clock ]): each method stops
        by its own work budget or runs to its end, so the table is the same on any machine
        apart from the runtimes (``cpsat`` keeps its own default of 60 s and is listed in
        ``clocked``). Seconds (> 0): passed to every method that takes a ``time_limit``, each
        run then bounded in wall time; its points may then depend on the machine.
    **options
        Passed to every method as given (e.g. ``keep=[3, 5]`` for the pure-offloading ones); a
        method that does not take one raises, naming the options it takes.

    Returns
    -------
    Tradeoff
        Every figure in it is the simulator's (each method runs through
        :func:`chainoffload.solve`).

    Raises
    ------
    ValueError
        An unknown method, a memory below the stage floor, or a bad ``points`` / ``time_limit``.

    Examples
    --------
    >>> import chainoffload as co
    >>> from chainoffload.examples import tiny
    >>> link = co.Platform(memory=0, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    >>> t = co.tradeoff(tiny(), link, ["offload-all", "rotor"], points=3)
    >>> t.memories, t.keep_all_peak, t.offload_floor, t.stage_floor
    ((162, 167, 177, 192), 192, 167, 162)
    >>> [p.status.value for p in t.curves["offload-all"]]
    ['infeasible', 'feasible', 'feasible', 'feasible']
    """
    from .bounds import offload_memory_floor
    from .simulate import keep_all_peak
    from .solvers import DEFAULT_METHOD, spec

    if not isinstance(chain, Chain):
        raise TypeError(f"tradeoff: chain must be a Chain, got {type(chain).__name__}")
    if not isinstance(platform, Platform):
        raise TypeError(f"tradeoff: platform must be a Platform, got {type(platform).__name__}")
    if time_limit is not None and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < math.inf
    ):
        raise ValueError(f"time_limit: expected a finite number of seconds > 0 or None, got {time_limit!r}")
    if methods is None:
        methods = DEFAULT_TRADEOFF_METHODS
    elif isinstance(methods, str):
        methods = [methods]
    names = [m or DEFAULT_METHOD for m in methods]
    if not names:
        raise ValueError("methods: expected at least one method name, got none")
    entries = {name: spec(name) for name in dict.fromkeys(names)}  # unknown names raise here
    stage_floor = chain.stage_memory_floor()
    policy_peaks = {name: policy_peak(chain, name) for name in entries if name in FIXED_REMAT_POLICIES}
    if memories is None:
        # sweep_memories(chain, points, policies=...) without simulating each policy twice.
        top = max(keep_all_peak(chain), stage_floor)
        swept = tuple(sorted(set(sweep_memories(chain, points)) | {m for m in policy_peaks.values() if stage_floor <= m <= top}))
    else:
        swept = _check_memories(memories, stage_floor, chain.name)
    offload_floor = offload_memory_floor(chain)
    peak = keep_all_peak(chain)

    extra = dict(options)
    options = {}
    clocked = []
    for name, entry in entries.items():
        params = inspect.signature(entry.load()).parameters
        takes = "time_limit" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        options[name] = {"time_limit": float(time_limit)} if (takes and time_limit is not None) else {}
        options[name].update(extra)
        if "time_limit" in options[name] or _own_clock(params):
            clocked.append(name)

    curves: dict[str, list[TradeoffPoint]] = {name: [] for name in entries}
    bounds: list[float] = []
    base = chain.compute_time
    # A sweep runs len(swept) * len(entries) solves, minutes on a long chain: say how far it is.
    with progress("tradeoff", total=len(swept) * len(entries), unit="run", leave=True) as bar:
        for memory in swept:
            bounds.append(_sweep_one(chain, platform, memory, offload_floor, entries, options, curves, base, bar))
    return Tradeoff(
        chain_name=chain.name,
        platform=platform.with_memory(peak),
        compute_time=base,
        keep_all_peak=peak,
        offload_floor=offload_floor,
        stage_floor=stage_floor,
        memories=swept,
        lower_bound=_monotone(bounds),
        curves={name: tuple(pts) for name, pts in curves.items()},
        remat={name: entry.remat for name, entry in entries.items()},
        time_limit=None if time_limit is None else float(time_limit),
        clocked=tuple(clocked),
        policy_peaks=policy_peaks,
    )


def _own_clock(params: Any) -> bool:
    """Whether a method called without a ``time_limit`` still stops by a wall clock: its
    ``time_limit`` has a number as default (``cpsat``'s 60 s) rather than ``None``."""
    p = params.get("time_limit")
    return p is not None and isinstance(p.default, (int, float)) and not isinstance(p.default, bool)


def _sweep_one(
    chain: Chain,
    platform: Platform,
    memory: int,
    offload_floor: int,
    entries: dict[str, Any],
    options: dict[str, dict[str, Any]],
    curves: dict[str, list[TradeoffPoint]],
    base: float,
    bar: Any,
) -> float:
    """Run every method at ``memory``, append their points to ``curves``; the curve's bound there."""
    from .bounds import problem_bound
    from .solvers import solve

    # One platform object per memory: the LP and MILP behind every pure-offloading bound are
    # cached per (chain, platform), so the methods and the curve's bound share one solve. The
    # curve's bound is the problem's (NOTE [ bound ladder ]): what solve, plot and verify
    # report, whatever time limit the methods had.
    at = platform.with_memory(memory)
    best_bound = math.inf if memory < offload_floor else problem_bound(chain, at).value
    for name, entry in entries.items():
        bar.note(memory=format_bytes(memory), method=name)
        result = solve(chain, at, name, **options[name])
        bar.update(1)
        feasible = result.status.has_schedule
        makespan = result.makespan if feasible else math.inf
        curves[name].append(
            TradeoffPoint(
                memory=memory,
                status=result.status,
                makespan=makespan,
                overhead=makespan / base - 1.0 if (feasible and base > 0) else (0.0 if feasible else math.inf),
                lower_bound=float(result.lower_bound),
                peak_memory=int(result.peak_memory),
                runtime=float(result.runtime),
                result=result,
            )
        )
        pure = not entry.remat and (result.schedule is None or not result.schedule.has_remat)
        if pure and feasible and math.isfinite(result.lower_bound):
            best_bound = max(best_bound, float(result.lower_bound))
    return best_bound


def _check_memories(memories: Sequence[int], floor: int, chain_name: str) -> tuple[int, ...]:
    out = set()
    for q, m in enumerate(memories):
        if isinstance(m, bool) or not isinstance(m, (int, np.integer, float)) or not math.isfinite(m) or m != int(m):
            raise ValueError(f"memories[{q}]: expected a whole number of bytes, got {m!r}")
        if m < floor:
            raise ValueError(
                f"memories[{q}]: {int(m)} B is below {floor} B, the least any schedule of chain {chain_name!r} needs "
                "(Chain.stage_memory_floor)"
            )
        out.add(int(m))
    if not out:
        raise ValueError("memories: expected at least one memory limit, got none")
    return tuple(sorted(out))
