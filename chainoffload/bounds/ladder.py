"""The bound ladder: the one lower bound every command reports, by a rule that ignores the clock.

NOTE [ bound ladder ]
---------------------
Every pure-offloading result carries a proven lower bound on the makespan, and ``solve``,
``plot``, ``verify`` and ``tradeoff`` all take it from one function, :func:`problem_bound`.
Bounds differ in strength and cost by orders of magnitude (the fluid LP takes ~2 s of CPU at
L = 1000 and ~60 s at L = 10,000), so it climbs a ladder of rungs, cheapest first, and keeps the
largest value reached:

1. ``trivial``: sum(fwd) + sum(bwd), free;
2. ``volume``: :func:`chainoffload.bounds.volume_lower_bound`, closed form, O(L);
3. ``fluid-lp``: :func:`chainoffload.bounds.lower_bound`, the fluid LP solved to optimality by
   GLOP, on chains of at most :data:`FLUID_LP_MAX_STAGES` stages;
4. ``unit-milp``: :func:`chainoffload.bounds.unit_milp`, the whole-move relaxation, when its
   model is at most :data:`UNIT_MILP_WORK_SIZE` (``_unit_milp_size``: binding memory checks x
   moves^2); SCIP stops after :func:`unit_milp_nodes` branch-and-bound nodes (a work budget:
   :data:`UNIT_MILP_NODE_WORK` / the model's size, at least 1, the root with its cuts) and
   the bound it has proven then is the rung's value;
5. any rung added with :func:`add_rung`.

**Which rungs run depends on the instance and the options only, never on the clock**: each
rung's rule is a size threshold, and the LP and the MILP are stopped by work limits (GLOP runs
to its optimum; SCIP by a node count; both are deterministic single-threaded solvers), so the
same command prints the same bound on any machine and at any load. The one exception is a
time limit the caller sets (``solve --time-limit``, ``co.solve(..., time_limit=T)``): then a
rung also runs only if its estimated cost (:attr:`Rung.cost`) fits what is left of the
limit, the LP and the MILP get what is left as a wall-clock limit as well, and the bound may
be weaker on a slower machine (never stronger than without the limit). Without a limit this
process's clock is never read; SCIP has a guard of ``chainoffload.bounds.milp.GUARD_SECONDS``
(600 s) of its own wall time, which should never fire on
the sizes the rules admit; if it does, the rung is skipped with a note saying so (the figure
then depends on the machine, and the note says that too).

A rung whose solver fails (``RuntimeError``, e.g. GLOP ending ``abnormal``) is skipped with a
note in ``Result.info["lower_bound_note"]``, and so is a rung that a caller's time limit skipped
(its estimate did not fit) or cut short (SCIP stopped by the clock before its node limit: its
value is what it had proven then).

**One way to combine bounds.** Every caller climbs this ladder: ``solve``, ``plot``, ``verify``
and ``tradeoff`` through :func:`problem_bound` (no clock), ``cpsat`` through
:func:`chainoffload.bounds.stronger_bound` (the same climb against a wall-clock limit), and
``best`` before its exact improver (NOTE [ large neighbourhood search ]), whose whole CP-SAT
solve may then prove a stronger bound of its own. The climb stops early once the bound reaches the
``target`` (the result's makespan: it is then proven optimal) and is not made at all for a
result without a schedule. ``Result.info["bound"]`` names the rung whose value was kept.

**The stronger rungs.** :data:`STRONGER` holds rungs climbed after the ladder only when a
caller asks (``climb(..., stronger=True)``, ``problem_bound(..., stronger=True)``): today the
``cpsat`` rung (NOTE [ cpsat bound rung ] in ``cpsat_bound.py``: CP-SAT proves, on a
deterministic work limit, that no schedule ends before the target). It needs a target (a rung
with ``needs_target`` is skipped without one) and costs seconds where the ladder costs ~1 s, so
it is not in :data:`LADDER`: ``solve``, ``plot`` and ``verify`` climb that on the README's main
job, whose cold run must stay under 15 s. ``best`` climbs it when its exact improver leaves a
gap (and takes the schedule the rung's search may find below the target, through
:func:`chainoffload.bounds.cpsat_bound.found_schedules`: the ladder itself returns bounds only);
:func:`stronger_bound` has no target and does not. Its rule (at most
``CPSAT_BOUND_MAX_STAGES`` stages) and its work limit ignore the clock like every other rung's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..chain import Chain
from ..platform import Platform

if TYPE_CHECKING:
    from . import milp

__all__ = [
    "stronger_bound",
    "FLUID_LP_MAX_STAGES",
    "LADDER",
    "STRONGER",
    "UNIT_MILP_NODE_WORK",
    "UNIT_MILP_WORK_SIZE",
    "ProblemBound",
    "Rung",
    "add_rung",
    "climb",
    "fluid_lp_cost",
    "problem_bound",
    "unit_milp_nodes",
]

#: Longest chain whose fluid LP the ladder solves (GLOP, to optimality): ~6 s of CPU at 2000
#: stages on this project's machine; ``lp`` solves the same LP up to the same length, so with
#: ``lp`` or ``best`` the rung is free (cached).
FLUID_LP_MAX_STAGES = 2000

#: Largest unit MILP (``_unit_milp_size``: binding memory checks x moves^2) the ladder builds:
#: the resnet50 main job's is 24,276 (root node: 1.3 s of CPU).
UNIT_MILP_WORK_SIZE = 60_000

#: The unit MILP's work budget: SCIP may process UNIT_MILP_NODE_WORK / size nodes (at least 1,
#: the root with its cuts, where most of the bound is proven). Measured (CPU, load ~3.5): the
#: resnet50 main job (size 24,276) 109.112 ms at 1 node, 109.118 ms at 10 and 100 nodes,
#: 109.124 ms at 1000, for 1.3, 2.4, 7 and 12 s; a 6-stage random chain (size 200): 1.038 s at 1
#: node, its optimum 1.255 s at 10 nodes (0.02 s); 20 stages (size 17,328): 4.347 s at 1-10
#: nodes (0.5-1.2 s), optimal 4.392 s at 1000 (4.8 s).
UNIT_MILP_NODE_WORK = 100_000


def unit_milp_nodes(size: int) -> int:
    """The node limit of the unit MILP rung for a model of ``size`` (``_unit_milp_size``)."""
    return max(1, UNIT_MILP_NODE_WORK // max(int(size), 1))



@dataclasses.dataclass(frozen=True)
class Rung:
    """One bound of the ladder.

    Attributes
    ----------
    name
        What ``Result.info["bound"]`` says when this rung gives the bound.
    bound
        ``bound(chain, platform, limit) -> float``: a proven lower bound on the makespan of
        every pure-offloading schedule the simulator accepts (``inf`` proves none fits), or
        ``(float, note)`` when it stopped before its own end (``note`` says why; the value is
        still proven). ``limit`` is ``None`` (no time limit: the value must depend on the
        instance only) or seconds of wall time; may raise ``TimeoutError``.
    runs
        ``runs(chain, platform) -> bool``: the rule that says whether the rung is climbed at
        all; it must not look at the clock.
    cost
        ``cost(chain, platform) -> float``: the estimated seconds, consulted only under a
        caller's time limit (0 when the answer is cached).
    needs_target
        ``True``: ``bound`` is called as ``bound(chain, platform, limit, target, floor, work)``,
        with the climb's ``target`` (a schedule's makespan, finite), the largest bound reached
        so far and the work the caller gives the stronger rungs (``None``: the rung's own
        default; ``cost`` gets it too, as ``cost(chain, platform, work)``), and the rung is
        skipped when the climb has no finite target.
    """

    name: str
    bound: Callable[..., float]
    runs: Callable[[Chain, Platform], bool]
    cost: Callable[[Chain, Platform], float]
    needs_target: bool = False


@dataclasses.dataclass(frozen=True)
class ProblemBound:
    """What :func:`problem_bound` found.

    Attributes
    ----------
    value
        Seconds: a proven lower bound on the makespan of every pure-offloading schedule the
        simulator accepts for this chain and platform (``inf``: none fits).
    rung
        The rung that gave it (``trivial``, ``volume``, ``fluid-lp``, ``unit-milp``, ...).
    tried
        Every rung that ran, in order.
    notes
        Why a rung that should have run gave nothing.
    """

    value: float
    rung: str
    tried: tuple[str, ...]
    notes: tuple[str, ...]


def fluid_lp_cost(stages: int) -> float:
    """Estimated seconds of one fluid LP solve with GLOP on a chain of ``stages`` stages.

    Fitted on this project's 2-core machine (CPU time: 0.14 s at L = 100, 2.0 s at 1000, 5.8 s
    at 2000: growth ~L^1.5).
    """
    return 0.05 + 2.0 * (stages / 1000.0) ** 1.5


def _trivial(chain: Chain, platform: Platform, limit: float | None) -> float:
    return chain.compute_time


def _volume(chain: Chain, platform: Platform, limit: float | None) -> float:
    from . import volume

    return volume.volume_lower_bound(chain, platform)


def _fluid(chain: Chain, platform: Platform, limit: float | None) -> float:
    from . import fluid

    # No limit: GLOP runs to its optimum (the size rule bounds its work).
    return fluid.lower_bound(chain, platform, time_limit=None if limit is None else max(limit, 1e-3))


def _fluid_cost(chain: Chain, platform: Platform) -> float:
    from . import fluid

    return 0.0 if fluid.lp_cached(chain, platform) else fluid_lp_cost(chain.length)


def _unit_milp(chain: Chain, platform: Platform, limit: float | None) -> float:
    from . import milp

    seconds = None if limit is None else max(limit, 1e-3)
    answer = milp.unit_milp(chain, platform, time_limit=seconds, nodes=unit_milp_nodes(milp._unit_milp_size(chain, platform)))
    if limit is None and answer.status == "time limit":
        raise TimeoutError(f"the unit MILP's guard of {milp.GUARD_SECONDS:g} s of SCIP's wall time ran out")
    value = answer.bound if math.isfinite(answer.bound) or answer.status == "infeasible" else -math.inf
    if answer.status == "time limit":
        # Cut by the caller's time limit before its node limit: weaker than without it.
        return value, f"SCIP stopped at the time limit ({seconds:.3g} s) with the bound it had proven"
    return value


def _unit_milp_runs(chain: Chain, platform: Platform) -> bool:
    from . import milp

    return 0 < milp._unit_milp_size(chain, platform) <= UNIT_MILP_WORK_SIZE


def _unit_milp_cost(chain: Chain, platform: Platform) -> float:
    from . import milp

    hit = milp._MILP_CACHE.get((id(chain), platform, unit_milp_nodes(milp._unit_milp_size(chain, platform))))
    if hit is not None and hit[0] is chain and hit[1].status in milp._FINAL + ("node limit",):
        return 0.0  # the rung's own answer is cached
    # unit_milp_seconds estimates the time to a settled bound; the root node takes less.
    return milp.unit_milp_seconds(chain, platform)


def _always(chain: Chain, platform: Platform) -> bool:
    return True


#: The rungs, cheapest first.
LADDER: list[Rung] = [
    Rung("trivial", _trivial, _always, lambda chain, platform: 0.0),
    Rung("volume", _volume, _always, lambda chain, platform: 2e-6 * chain.length),
    Rung("fluid-lp", _fluid, lambda chain, platform: chain.length <= FLUID_LP_MAX_STAGES, _fluid_cost),
    Rung("unit-milp", _unit_milp, _unit_milp_runs, _unit_milp_cost),
]


def _cpsat(chain: Chain, platform: Platform, limit: float | None, target: float, floor: float, work: float | None = None):
    from . import cpsat_bound as cb

    work = cb.CPSAT_BOUND_WORK if work is None else work
    got = cb.cpsat_bound(chain, platform, target, floor=floor if math.isfinite(floor) else None, time_limit=limit, work=work)
    cb._report(got)  # a schedule under the target goes to best's side channel, never into the ladder's answer
    if got.status in ("proven", "beaten"):  # the target proven, or the model's optimum below it
        return got.value
    why = {"work limit": f"its work limit of {work:g} deterministic s ran out before a proof",
           "time limit": "the time limit came before a proof",
           "guard": f"its guard of {cb.GUARD_SECONDS:g} s of wall time ran out before a proof; this may depend on the machine"}
    return got.value, why[got.status]


def _cpsat_runs(chain: Chain, platform: Platform) -> bool:
    from . import cpsat_bound as cb

    return chain.length <= cb.CPSAT_BOUND_MAX_STAGES and platform.can_transfer


def _cpsat_cost(chain: Chain, platform: Platform, work: float | None = None) -> float:
    from . import cpsat_bound as cb

    return cb.cpsat_bound_seconds(chain, cb.CPSAT_BOUND_WORK if work is None else work)


#: Rungs climbed after the ladder only with ``stronger=True`` (NOTE [ bound ladder ]).
STRONGER: list[Rung] = [Rung("cpsat", _cpsat, _cpsat_runs, _cpsat_cost, needs_target=True)]


def add_rung(rung: Rung, *, after: str | None = None) -> None:
    """Add ``rung`` to the ladder (at the end, or right after the rung named ``after``)."""
    if any(r.name == rung.name for r in LADDER):
        raise ValueError(f"bound ladder: a rung named {rung.name!r} exists already")
    if after is None:
        LADDER.append(rung)
        return
    names = [r.name for r in LADDER]
    if after not in names:
        raise ValueError(f"bound ladder: no rung named {after!r}; rungs: {', '.join(names)}")
    LADDER.insert(names.index(after) + 1, rung)


def climb(
    chain: Chain,
    platform: Platform,
    time_limit: float | None = None,
    *,
    target: float = math.inf,
    notes: list[str] | None = None,
    stronger: bool | float = False,
) -> tuple[float, str, list[str]]:
    """Climb the ladder (``NOTE [ bound ladder ]``); stop once the bound reaches ``target``.

    ``stronger``: climb the rungs of :data:`STRONGER` after the ladder's (``True``: with their
    own default work; a number: that many deterministic seconds each).

    ``time_limit`` ``None``: every rung whose rule admits the instance runs, to its work limit
    (the answer depends on the instance only). Seconds: a rung also needs its estimated cost
    to fit what is left (the first rung always runs), and gets what is left as its own limit.

    ``notes`` (a list) receives one line per rung that did not give its full answer: skipped
    because its estimate did not fit the time left, stopped by the time limit (its value is
    what it had proven then), or failed.

    Returns
    -------
    value, name, tried
        The largest bound reached, the rung that gave it, and every rung that ran.
    """
    t0 = time.perf_counter()
    value, name, tried = -math.inf, "trivial", []

    def note(line: str) -> None:
        if notes is not None:
            notes.append(line)

    work = None if stronger is True or stronger is False else float(stronger)
    for rung in LADDER + (STRONGER if stronger is not False and (work is None or work > 0) else []):
        if value >= target * (1 - 1e-12):
            break
        if rung.needs_target and not math.isfinite(target):
            continue
        if not rung.runs(chain, platform):
            continue
        left = None
        if time_limit is not None:
            left = max(time_limit - (time.perf_counter() - t0), 0.0)
            cost = rung.cost(chain, platform, work) if rung.needs_target else rung.cost(chain, platform)
            if tried and cost > left:
                note(f"the {rung.name} bound was skipped (estimated {cost:.3g} s, {left:.3g} s of the time limit left)")
                continue
        try:
            got = rung.bound(chain, platform, left, target, value, work) if rung.needs_target else rung.bound(chain, platform, left)
        except TimeoutError as exc:
            why = " ".join(str(exc).split()) or "time limit"
            suffix = "; this figure may depend on the machine" if time_limit is None else ""
            note(f"the {rung.name} bound stopped early ({why}){suffix}")
            continue
        except RuntimeError as exc:
            note(f"the {rung.name} bound is not available ({' '.join(str(exc).split())})")
            continue
        if isinstance(got, tuple):  # (value, a note: the rung stopped before its own end)
            got, why = got
            if why:
                note(f"the {rung.name} bound stopped early ({why})")
        tried.append(rung.name)
        if got > value:
            value, name = got, rung.name
    return value, name, tried


def problem_bound(
    chain: Chain, platform: Platform, *, target: float = math.inf, time_limit: float | None = None,
    stronger: bool | float = False,
) -> ProblemBound:
    """The lower bound of the pure-offloading problem that ``solve``, ``plot``, ``verify`` and
    ``tradeoff`` report (``NOTE [ bound ladder ]``).

    Parameters
    ----------
    chain, platform
        The instance.
    target
        Stop climbing once the bound reaches it (a schedule's makespan: the bound then proves
        it optimal and no stronger one exists).
    time_limit
        ``None`` (default): the answer depends on ``chain``, ``platform`` and ``target`` only.
        Seconds: rungs that do not fit are skipped (may depend on the machine).
    stronger
        Climb :data:`STRONGER` too (the ``cpsat`` rung: seconds of CP-SAT where ``target`` is
        finite and the chain short; NOTE [ cpsat bound rung ]): ``True`` with its default work,
        a number of deterministic seconds for that work (0: not climbed).

    Returns
    -------
    ProblemBound
        At least ``chain.compute_time``.
    """
    notes: list[str] = []
    value, name, tried = climb(chain, platform, time_limit, target=target, notes=notes, stronger=stronger)
    if not value >= chain.compute_time:  # no rung ran (a rung added before trivial failed)
        value, name = chain.compute_time, "trivial"
    return ProblemBound(value, name, tuple(tried), tuple(notes))


def stronger_bound(chain: Chain, platform: Platform, *, time_limit: float = 10.0) -> milp.Bound:
    """The best proven lower bound within ``time_limit`` seconds: the bound ladder
    (:func:`chainoffload.bounds.ladder.climb`, the one way bounds are combined) against a clock.

    Each rung runs when the ladder's size rule admits the instance and its estimated cost fits
    what is left of ``time_limit``, and gets what is left as its own limit: the fluid LP (free
    when cached) up to ``FLUID_LP_MAX_STAGES`` stages, then the whole-move relaxation
    (:func:`unit_milp`, ``NOTE [ unit MILP lower bound ]``), which keeps what the fluid LP
    loses (a move is freed only when its whole offload has ended and comes back whole when its
    prefetch starts), up to ``UNIT_MILP_WORK_SIZE`` and its node limit. ``cpsat`` states this
    bound in its model; ``solve`` reports :func:`chainoffload.bounds.problem_bound`, the same
    ladder without a clock.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds for the whole call (> 0).

    Returns
    -------
    Bound
        The largest value reached, and which rung gave it (``compute time``, ``volume``,
        ``fluid LP``, ``unit MILP`` or ``unit MILP, optimal``, or an added rung's name).

    Raises
    ------
    ValueError
        If ``time_limit`` is not a number of seconds > 0.
    """
    from . import milp
    from ._common import _check_pair, _check_time_limit

    _check_pair(chain, platform, "stronger_bound")
    _check_time_limit(time_limit)
    # One way to combine bounds (NOTE [ bound ladder ]): this is the ladder, climbed against a
    # wall-clock limit.
    t0 = time.perf_counter()
    value, rung, _ = climb(chain, platform, float(time_limit))
    if not value >= chain.compute_time:
        value, rung = chain.compute_time, "trivial"
    kind = _KINDS.get(rung, rung)
    if rung == "unit-milp":
        hit = milp._MILP_CACHE.get((id(chain), platform, unit_milp_nodes(milp._unit_milp_size(chain, platform))))
        if hit is not None and hit[0] is chain and hit[1].status == "optimal":
            kind = "unit MILP, optimal"
    return milp.Bound(value, kind, time.perf_counter() - t0)


#: The ladder's rung names as :class:`Bound` names them.
_KINDS = {"trivial": "compute time", "volume": "volume", "fluid-lp": "fluid LP", "unit-milp": "unit MILP"}
