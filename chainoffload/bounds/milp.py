"""The whole-move relaxation (``NOTE [ unit MILP lower bound ]``), solved by SCIP;
:func:`~chainoffload.bounds.ladder.stronger_bound` climbs it with the other rungs against a clock.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from .. import _interrupt
from .._interrupt import SCIP_NO_CTRL_C
from ..chain import Chain
from ..platform import Platform
from ._common import _check_pair, _check_time_limit
from .floor import keep_all_start_memory
from .fluid import _LPBuilder

__all__ = ["UNIT_MILP_MAX_SIZE", "Bound", "UnitMILP", "moves_of", "unit_milp", "unit_milp_seconds"]

# NOTE [ unit MILP lower bound ]
# ------------------------------
# Why the fluid LP is loose. On instances where CP-SAT proves the optimum (benchmarks/
# results/relaxations.md) the fluid LP is often far below it: 2.9x on a 6-stage chain with
# tight memory and a slow link, 1.3x on average over small chains. Making its x_i integral
# gains nothing, because the LP still *moves memory fluidly*: a unit half copied out counts
# as half freed, a prefetch allocates its bytes as they arrive, and a prefetch may trail its
# own offload byte by byte. In the simulator a unit is freed only when its whole offload has
# ended, a prefetch allocates the whole unit when it starts, and starts after the whole
# offload. On the 6-stage chain the one large unit must leave during a wait and come back
# during another wait, each a full transfer time; the fluid LP overlaps both with compute.
# This relaxation keeps whole moves (a unit moves whole, or a_i alone, never a fraction) and
# their memory, and relaxes only the channels (each is a preemptive machine: only its total
# busy time in a window is bounded).
#
# Ops k = 0..n-1 (n = 2L) in the fixed order, F_i at f(i) = i-1, B_i at b(i) = 2L-i; S_k the
# start of op k, E_k = S_k + dur_k, S_n the makespan. Units i = 1..L-1 (unit L is never off
# the GPU at a check: its copy is away only between the end of F_L and the start of B_L, see
# (4) below). Each unit has one or two *moves* j (``moves_of``, NOTE [ what a unit moves ]):
# the whole unit (b_j = saved_i) and, when 0 < act_i < saved_i, a_i alone (b_j = act_i); i(j)
# is the move's unit, D_j, H_j its transfer times (latency + b_j / bandwidth). In the rows
# below "unit i" ranges over moves j, with i = i(j), saved_i read as b_j.
# ex_k = keepall_k - memory (``keep_all_start_memory``); C = the ops with dur_k > 0 and
# ex_k > 0 (memory is checked there only; leaving checks out only relaxes).
# Binary variables, read off any schedule the simulator accepts:
#   x_j     unit i(j) is offloaded and moves b_j bytes (a move of 0 bytes is read as no
#           offload, NOTE [ what a unit moves ]);
#   d_{i,k} x_i and the GPU copy of unit i is released before op k's allocation (in the
#           simulator's order of events); for k >= b(i+1) it is x_i itself;
#   g_{i,k} x_i and P_i starts at or after E_k.
# Constraints (all ops in the index sets below; S_0 = 0, minimise S_n):
#  (0) the x_j of one unit's moves add up to at most 1.
#  (1) S_{k+1} - S_k >= dur_k.
#  (2) d <= x, g <= x; d_{i,k} non-decreasing and g_{i,k} non-increasing in k.
#  (3) d_{i,k} + g_{i,k-1} >= x_i and d_{i,k+1} + g_{i,k} >= x_i.
#  (4) for k in C, with A_k = {i : i+1 <= k < b(i+1)} and m_i = min(b_i, ex_k):
#        sum_{A_k} m_i (d_{i,k} + g_{i,k-1} - x_i) >= ex_k        (check at S_k)
#        sum_{A_k} m_i (d_{i,k+1} + g_{i,k} - x_i) >= ex_k        (check at t0, below)
#  (5) S_k >= E_{f(h)} + sum_{i >= h} D_i d_{i,k} + sum_{i >= h, b(i+1) <= k} D'_i x_i
#      for h <= k-1, where D'_i = D_i (duplex) or D_i + H_i (one shared channel);
#  (6) S_{b(h+1)} >= E_k + sum_{i >= h} H_i g_{i,k} + sum_{i >= max(h, k+1)} H'_i x_i
#      for b(h+1) > k, H'_i = H_i (duplex) or D_i + H_i;
#  (7) S_{b(h+1)} >= E_{f(h)} + sum_{i >= h} D_i x_i, the same with H_i (duplex), or with
#      D_i + H_i (one channel): the fluid LP's windows (6).
# Claim: the values above satisfy every constraint, with S_k the simulated op starts, so the
# MILP optimum (and any bound a MILP solver proves on it) is <= every feasible makespan; an
# infeasible MILP proves that nothing fits.
#  Fact R: if x_i and unit i is not released before op k's allocation, for an op k >= i+1,
#  then P_i starts at or after S_k. The release happens at max(end of O_i, E_{f(i+1)}) and
#  E_{f(i+1)} = E_i <= S_k. If O_i ended before S_k the release is at or before S_k; at S_k
#  it is then caused by the end of F_{i+1}, which the simulator orders before op k's
#  allocation (class 0, or a zero-length reader's order 2i + 1 < 2k); so O_i ends at or after
#  S_k, and P_i starts after O_i ends.
#  (2) releases and E_k only move forward in k. (3) is Fact R at k (P_i >= S_k >= E_{k-1})
#  and at k + 1 (P_i >= S_{k+1} >= E_k).
#  (4), first row: take the memory just after op k's allocation (dur_k > 0). As in NOTE
#  [ fluid LP lower bound ] (5), it is keepall_k less the units released before it whose
#  prefetch has not allocated before it (plus copies held twice, plus unit L's adjustment,
#  both >= 0; a unit off the GPU lacks exactly b_i bytes), and it is <= memory. Such a unit
#  has d_{i,k} = 1, and its prefetch starts after
#  S_k (prefetch allocations at S_k come before op k's), so g_{i,k-1} = 1; it is in A_k: its
#  release needs E_i <= S_k < E_k, so i <= k-1, and its prefetch ends by S_{b(i+1)}, after
#  S_k. So the bytes of units with d + g - x = 1 in A_k cover ex_k; the other terms are >= 0
#  by (3). Capping each at ex_k keeps the sum >= ex_k (one capped term alone reaches it).
#  Second row: let t0 be the start of the last prefetch that starts in (S_k, E_k), or S_k if
#  none, and take the memory after every event at t0 (after op k's allocation if t0 = S_k).
#  Every op before k has ended, op k has allocated and not freed, no later op has started:
#  the compute part is keepall_k again. A unit off the GPU then was released before t0 < E_k
#  <= S_{k+1}, so d_{i,k+1} = 1, and its prefetch starts after t0, hence at or after E_k, so
#  g_{i,k} = 1. Unit L is off the GPU only inside (E_{L-1}, S_L), which contains no point of
#  [S_k, E_k) of an op with dur_k > 0.
#  (0) a unit makes at most one offload, of one kind.
#  (5) d_{i,k} = 1: O_i ran inside [E_{f(i)}, S_k] (it starts after its trigger, at or after
#  the end of F_i, or the simulator reports a read violation) and [E_{f(i)}, S_k] lies in
#  [E_{f(h)}, S_k] for i >= h; an offloaded unit with b(i+1) <= k has both transfers inside
#  [E_{f(i)}, S_{b(i+1)}]. A channel runs one transfer at a time, each for exactly D_j or H_j
#  of the move j unit i makes (its other move has x = 0 and adds nothing).
#  (6) g_{i,k} = 1: P_i runs inside [E_k, S_{b(i+1)}] (it must end before B_{i+1} starts); for
#  i >= k+1 both transfers start after E_{f(i)} >= E_k. (7) as the fluid LP's (6).
# The constraints use each d_{i,k} and g_{i,k} only at the ops that (4) needs; dropping the
# others (and their rows) only relaxes; rows (5) and (6) are written once per unit h, over the
# moves of all units >= h. The bound is the MILP solver's proven dual bound (its
# LP relaxation is no better than the fluid LP; the integrality is what counts: on random
# chains of 6-10 stages, when both offered whole-unit moves only, the MILP optimum equaled
# CP-SAT's proven optimum on 60 of 72 instances and was within 2.6 % on the others), less a
# relative 1e-7 for the solver's tolerances.

_MILP_MARGIN = 1e-7
# SCIP's probing presolve and its Gomory / MIR / flow-cover separators cost most of the root
# node on this model and add nothing to its bound (measured); the knapsack-cover and clique
# cuts are what lift it.
_SCIP_PARAMS = (
    "propagating/probing/maxprerounds = 0\n"
    "separating/gomory/freq = -1\n"
    "separating/cmir/freq = -1\n"
    "separating/flowcover/freq = -1\n"
)


@dataclasses.dataclass(frozen=True)
class UnitMILP:
    """The answer of the whole-move relaxation (see ``NOTE [ unit MILP lower bound ]``).

    Attributes
    ----------
    bound
        A proven lower bound on the makespan of every feasible schedule (the MILP solver's
        dual bound less a relative 1e-7); ``inf`` when the relaxation is infeasible, which
        proves that nothing fits; ``nan`` when the solver gave no bound in time.
    status
        ``"optimal"`` (the relaxation solved to optimality), ``"time limit"``,
        ``"infeasible"``, ``"trivial"`` (no memory check binds: the bound is the compute
        time), or the solver's word for anything else.
    solve_time
        Seconds spent building and solving.
    variables, constraints
        Size of the model.
    """

    bound: float
    status: str
    solve_time: float
    variables: int
    constraints: int


class _MILPBuilder(_LPBuilder):
    """An :class:`_LPBuilder` with binary columns, solved by SCIP (or CBC) through one proto."""

    def __init__(self) -> None:
        super().__init__()
        self.binary: list[int] = []

    def bool(self) -> int:
        idx = self.var(0.0, 1.0)
        self.binary.append(idx)
        return idx

    def add(self, lb: float, ub: float, terms: dict[int, float]) -> None:
        """A row from {column: coefficient} (repeated columns already summed by the caller)."""
        terms = {i: c for i, c in terms.items() if c != 0.0}
        self.row(lb, ub, list(terms), list(terms.values()))

    def solve_milp(self, time_limit: float, nodes: int | None = None) -> tuple[str, float]:
        from ortools.linear_solver import linear_solver_pb2 as pb

        request = self.request(self.binary)
        request.solver_time_limit_seconds = max(float(time_limit), 1e-3)
        response = pb.MPSolutionResponse()
        # A node limit is a work limit: SCIP (one thread) then stops at the same point on any machine.
        work = "" if nodes is None else f"limits/nodes = {int(nodes)}\n"
        t0 = time.perf_counter()
        for solver_type, params in (
            # SCIP's own Ctrl-C handler stopped the search early and its partial bound was
            # kept, exit 0 (chainoffload/_interrupt.py): SIGINT stays Python's.
            (pb.MPModelRequest.SCIP_MIXED_INTEGER_PROGRAMMING, SCIP_NO_CTRL_C + _SCIP_PARAMS + work),
            (pb.MPModelRequest.SCIP_MIXED_INTEGER_PROGRAMMING, SCIP_NO_CTRL_C + work),
            (pb.MPModelRequest.CBC_MIXED_INTEGER_PROGRAMMING, ""),
        ):
            request.solver_type = solver_type
            request.solver_specific_parameters = params
            _interrupt.solve_proto(request, response)  # NOTE [ MPSolver and the GIL ]
            if response.status not in (pb.MPSOLVER_MODEL_INVALID_SOLVER_PARAMETERS, pb.MPSOLVER_SOLVER_TYPE_UNAVAILABLE):
                break
        if response.status == pb.MPSOLVER_INFEASIBLE:
            return "infeasible", math.inf
        bound = response.best_objective_bound if response.HasField("best_objective_bound") else math.nan
        if response.status == pb.MPSOLVER_OPTIMAL:
            if response.HasField("objective_value"):
                bound = min(bound, response.objective_value) if math.isfinite(bound) else response.objective_value
            return "optimal", bound
        if response.status == pb.MPSOLVER_FEASIBLE or (response.status == pb.MPSOLVER_NOT_SOLVED and math.isfinite(bound)):
            # Stopped early: by the node limit, unless the solver's own clock (not this
            # process's, which a test may fake) says its time limit ran out first.
            spent = response.solve_info.solve_wall_time_seconds if response.HasField("solve_info") else time.perf_counter() - t0
            timed = nodes is None or spent >= 0.98 * float(time_limit)
            return "time limit" if timed else "node limit", bound if bound > 0 else math.nan
        return pb.MPSolverResponseStatus.Name(response.status).removeprefix("MPSOLVER_").lower(), math.nan


def unit_milp(chain: Chain, platform: Platform, *, time_limit: float | None = 10.0, nodes: int | None = None) -> UnitMILP:
    """Solve the whole-move relaxation of ``chain`` on ``platform`` for at most ``time_limit`` seconds.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds the MILP solver may take (building the model comes on top: ~L^3 / 10^6 s).
        ``None`` (only with ``nodes``): no limit from this process's clock; SCIP gets a guard
        of :data:`GUARD_SECONDS` of its own wall time (status ``"time limit"`` if it fires).
    nodes
        Branch-and-bound nodes SCIP may process (1: the root node with its cuts); ``None``:
        no limit. A node limit is a work limit: stopped by it (status ``"node limit"``), the
        answer is the same on every machine (the bound ladder's rule, ``NOTE [ bound ladder ]``).

    Returns
    -------
    UnitMILP
        Its ``bound`` is a proven lower bound on every feasible schedule's makespan
        (``NOTE [ unit MILP lower bound ]`` in this module); a bound found before the time
        limit is proven too, only weaker. Cached per chain object and platform (as
        :func:`fluid_lp` is): a later call gets the cached answer when it is final or was
        given at least as much time.

    Raises
    ------
    ValueError
        If ``time_limit`` is not a number of seconds > 0.
    """
    _check_pair(chain, platform, "unit_milp")
    if time_limit is not None or nodes is None:
        _check_time_limit(time_limit)
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        raise ValueError(f"nodes: expected an integer >= 1 or None, got {nodes!r}")
    key = (id(chain), platform) if nodes is None else (id(chain), platform, int(nodes))
    hit = _MILP_CACHE.get(key)
    asked = math.inf if time_limit is None else float(time_limit)
    if hit is not None and hit[0] is chain and (hit[1].status in _FINAL + ("node limit",) or hit[2] >= asked):
        return hit[1]
    value = _solve_unit_milp(chain, platform, time_limit, nodes)
    if len(_MILP_CACHE) >= 64:
        _MILP_CACHE.pop(next(iter(_MILP_CACHE)))
    _MILP_CACHE[key] = (chain, value, asked)
    return value


_MILP_CACHE: dict[tuple, tuple[Chain, UnitMILP, float]] = {}
_FINAL = ("optimal", "infeasible", "trivial")


def _final_milp(chain: Chain, platform: Platform) -> UnitMILP | None:
    """The cached answer of :func:`unit_milp` for this chain object and platform, if more time would not change it."""
    hit = _MILP_CACHE.get((id(chain), platform))
    return hit[1] if hit is not None and hit[0] is chain and hit[1].status in _FINAL else None


def moves_of(chain: Chain) -> list[tuple[int, str, int]]:
    """What each offloadable unit 1..L-1 can move: ``(stage, moves, bytes)`` (``NOTE [ what a unit moves ]``).

    Unit i moves all of it (``"unit"``, saved[i] bytes) or a_i alone (``"act"``, act[i] bytes)
    when that is neither nothing nor the whole unit.
    """
    out = []
    for i in range(1, chain.length):
        whole, alone = int(chain.saved[i - 1]), int(chain.act[i])
        out.append((i, "unit", whole))
        if 0 < alone < whole:
            out.append((i, "act", alone))
    return out


#: SCIP's own wall-time guard when :func:`unit_milp` is given a node limit and no time limit.
GUARD_SECONDS = 600.0


def _solve_unit_milp(chain: Chain, platform: Platform, time_limit: float | None, nodes: int | None = None) -> UnitMILP:
    t0 = time.perf_counter()
    length = chain.length
    n = 2 * length
    dur = np.concatenate([chain.fwd, chain.bwd[::-1]]).astype(np.float64)
    excess = keep_all_start_memory(chain).astype(np.float64) - float(platform.memory)
    checked = [k for k in range(n) if dur[k] > 0 and excess[k] > 0]
    if not checked:
        return UnitMILP(chain.compute_time, "trivial", time.perf_counter() - t0, 0, 0)
    if not (platform.can_transfer and length >= 2):
        return UnitMILP(math.inf, "infeasible", time.perf_counter() - t0, 0, 0)
    # Scaled as the fluid LP is: bytes by the largest unit, seconds by the mean op.
    total = float(dur.sum())
    time_unit = total / n if total > 0 else 1.0
    byte_unit = float(max(int(chain.saved.max()), 1))
    d = dur / time_unit
    ex = excess / byte_unit
    # Items: one per move a unit can make (NOTE [ what a unit moves ]); at most one per unit.
    items = moves_of(chain)
    stage = [i for i, _, _ in items]
    sv = [b / byte_unit for _, _, b in items]
    out_t = [platform.d2h_time(b) / time_unit for _, _, b in items]
    back_t = [platform.h2d_time(b) / time_unit for _, _, b in items]
    if platform.duplex:
        out_both, back_both = out_t, back_t
    else:
        out_both = back_both = [a + b for a, b in zip(out_t, back_t, strict=True)]
    of_stage: dict[int, list[int]] = {}
    for j, i in enumerate(stage):
        of_stage.setdefault(i, []).append(j)

    def b(j: int) -> int:
        return 2 * length - j

    units = range(1, length)
    every = range(len(items))
    m = _MILPBuilder()
    S = [m.var(0.0, 0.0)] + [m.var() for _ in range(n)]
    m.obj[S[n]] = 1.0
    for k in range(n):
        m.add(float(d[k]), math.inf, {S[k + 1]: 1.0, S[k]: -1.0})
    x = {j: m.bool() for j in every}
    for i in units:
        if len(of_stage[i]) > 1:
            m.add(-math.inf, 1.0, {x[j]: 1.0 for j in of_stage[i]})  # (0)
    need_d: dict[int, set[int]] = {i: set() for i in units}
    need_g: dict[int, set[int]] = {i: set() for i in units}
    for k in checked:
        for i in units:
            if i + 1 <= k < b(i + 1):
                need_d[i].update((k, k + 1))
                need_g[i].update((k - 1, k))
    dv: dict[tuple[int, int], int] = {}
    gv: dict[tuple[int, int], int] = {}
    for j in every:
        i = stage[j]
        prev = None
        for k in sorted(k for k in need_d[i] if k < b(i + 1)):
            dv[j, k] = m.bool()
            m.add(-math.inf, 0.0, {dv[j, k]: 1.0, x[j]: -1.0})
            if prev is not None:
                m.add(0.0, math.inf, {dv[j, k]: 1.0, dv[j, prev]: -1.0})
            prev = k
        prev = None
        for k in sorted(need_g[i]):
            gv[j, k] = m.bool()
            m.add(-math.inf, 0.0, {gv[j, k]: 1.0, x[j]: -1.0})
            if prev is not None:
                m.add(-math.inf, 0.0, {gv[j, k]: 1.0, gv[j, prev]: -1.0})
            prev = k

    def released(j: int, k: int) -> int:
        return dv[j, k] if k < b(stage[j] + 1) else x[j]

    linked: set[tuple[int, int, int]] = set()
    for k in checked:
        for kd, kg in ((k, k - 1), (k + 1, k)):
            terms: dict[int, float] = {}
            for j in every:
                i = stage[j]
                if not i + 1 <= k < b(i + 1):
                    continue
                cap = min(float(sv[j]), float(ex[k]))
                dj, gj = released(j, kd), gv[j, kg]
                for col, c in ((dj, cap), (gj, cap), (x[j], -cap)):
                    terms[col] = terms.get(col, 0.0) + c
                if (j, kd, kg) not in linked and dj != x[j]:
                    linked.add((j, kd, kg))
                    m.add(0.0, math.inf, {dj: 1.0, gj: 1.0, x[j]: -1.0})  # (3)
            if terms:
                m.add(float(ex[k]), math.inf, terms)  # (4)
    # (5) offload windows, one row per (stage h, check k): the items of stages >= h.
    for k in sorted({k for _, k in dv}):
        tail: dict[int, float] = {}
        for i in sorted(units, reverse=True):
            row = False
            for j in of_stage[i]:
                if (j, k) in dv:
                    tail[dv[j, k]] = out_t[j]
                    row = True
                elif b(i + 1) <= k:
                    tail[x[j]] = out_both[j]
            if row:
                m.add(float(d[i - 1]), math.inf, {S[k]: 1.0, S[i - 1]: -1.0, **{c: -v for c, v in tail.items()}})
    # (6) prefetch windows.
    for k in sorted({k for _, k in gv}):
        tail = {}
        for i in sorted(units, reverse=True):
            row = False
            for j in of_stage[i]:
                if (j, k) in gv:
                    tail[gv[j, k]] = back_t[j]
                    row = True
                elif i >= k + 1:
                    tail[x[j]] = back_both[j]
            if row and b(i + 1) > k:
                m.add(float(d[k]), math.inf, {S[b(i + 1)]: 1.0, S[k]: -1.0, **{c: -v for c, v in tail.items()}})
    # (7) whole windows.
    for side in ((out_t, back_t) if platform.duplex else (out_both,)):
        for h in units:
            terms = {S[b(h + 1)]: 1.0, S[h - 1]: -1.0}
            for j in every:
                if stage[j] >= h:
                    terms[x[j]] = -side[j]
            m.add(float(d[h - 1]), math.inf, terms)
    # Without a time limit this process's clock decides nothing (the node limit is the budget).
    limit = GUARD_SECONDS if time_limit is None else max(1e-3, float(time_limit) - (time.perf_counter() - t0))
    status, value = m.solve_milp(limit, nodes)
    elapsed = time.perf_counter() - t0
    if math.isfinite(value):
        value = value * time_unit * (1.0 - _MILP_MARGIN)
    return UnitMILP(value, status, elapsed, len(m.lb), len(m.rows))


@dataclasses.dataclass(frozen=True)
class Bound:
    """A proven lower bound on the makespan and where it comes from.

    Attributes
    ----------
    value
        Seconds; ``inf`` when it proves that no pure-offloading schedule fits.
    kind
        ``"compute time"`` (sum(fwd) + sum(bwd)), ``"volume"`` (:func:`volume_lower_bound`),
        ``"fluid LP"`` (:func:`fluid_lower_bound`),
        ``"unit MILP"`` (:func:`unit_milp`, stopped by its time limit) or ``"unit MILP,
        optimal"`` (the whole-move relaxation solved to optimality).
    seconds
        Time spent computing it.
    """

    value: float
    kind: str
    seconds: float


#: Largest (checked ops x units^2) for which :func:`stronger_bound` builds the unit MILP; past it
#: the model alone takes seconds to build and the fluid LP is within a few percent anyway
#: (benchmarks/results/relaxations.md).
UNIT_MILP_MAX_SIZE = 2_000_000


def _unit_milp_size(chain: Chain, platform: Platform) -> int:
    """(ops whose memory check binds) x M^2, M the moves offered (``moves_of``): how the unit
    MILP's model and solve time grow.

    The cost model below was fitted when only whole units moved (M = L - 1); offering a_i alone
    as well doubles M and, as measured on benchmarks/relaxations.py's chains at L = 20-40, takes
    SCIP 2.5x or more the time to the same status, which M^2 charges as 4x: on the side of
    skipping the MILP rather than overrunning a budget.
    """
    dur = np.concatenate([chain.fwd, chain.bwd[::-1]])
    checked = int(np.count_nonzero((keep_all_start_memory(chain) > platform.memory) & (dur > 0)))
    # len(moves_of(chain)), counted with numpy: the list took seconds at 10^6 stages, and this
    # estimate is what decides, within a time limit, whether the MILP is worth trying.
    act, whole = chain.act[1 : chain.length], chain.saved[: chain.length - 1]
    moves = (chain.length - 1) + int(np.count_nonzero((act > 0) & (act < whole)))
    return checked * moves**2


def unit_milp_seconds(chain: Chain, platform: Platform) -> float:
    """Estimated seconds before :func:`unit_milp` has its bound: building the model and SCIP's root.

    ``0.5 + (ops whose memory check binds) x M^2 / 20,000`` (M: the moves offered, see
    ``_unit_milp_size``), fitted on random chains of
    benchmarks/relaxations.py's family on the shared 2-core machine (load 4-5): the bound SCIP
    proves stops moving after 0.6-0.8 s at L = 12, ~1 s at L = 20, 1-4 s at L = 30 and 2-5 s at
    L = 40-60 with roomy memory; with tight memory at L >= 40 it is still far below the fluid LP
    after 8 s. ``0`` when no check binds (the bound is then the compute time) or when a final
    answer is cached; ``inf`` past :data:`UNIT_MILP_MAX_SIZE`, where :func:`stronger_bound` does
    not build the model.
    """
    if _final_milp(chain, platform) is not None:
        return 0.0
    size = _unit_milp_size(chain, platform)
    if size == 0:
        return 0.0
    return 0.5 + size / 20_000 if size <= UNIT_MILP_MAX_SIZE else math.inf
