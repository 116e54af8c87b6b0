"""The fluid LP relaxation (``NOTE [ fluid LP lower bound ]``): its solution and its bound.

OR-Tools is imported inside the functions that solve.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from .. import _interrupt
from ..chain import Chain
from ..order import b_pos
from ..platform import Platform
from ._common import LP_SOLVERS, _check_pair, _check_solver
from .floor import keep_all_start_memory

__all__ = ["FluidLP", "LP_SOLVERS", "fluid_lp", "fluid_lower_bound", "lower_bound", "lp_cached"]

#: LP back ends :func:`fluid_lp` accepts: GLOP (simplex, exact vertex; the default) and PDLP
#: (first-order, approximate; for models too large for a simplex basis in memory: on this
#: model it is much slower than GLOP at the sizes measured, 1.9 s against 0.05 s at L = 100).

# Relative safety margin taken off the solver's objective before it is reported as a bound:
# GLOP's answer is a simplex vertex accurate to its feasibility tolerance (~1e-9 on the scaled
# model); PDLP stops at a relative gap of ~1e-9 but its primal point is only approximately
# feasible, hence the wider margin. The margin keeps a bound that should equal a
# makespan exactly from landing an ulp above it; it costs nothing measurable.
_MARGIN = {"glop": 1e-8, "pdlp": 1e-6}



# NOTE [ fluid LP lower bound ]
# ------------------------------
# Ops k = 0..n-1 (n = 2L) in the fixed order; F_i is op f(i) = i-1, B_i is op b(i) = 2L-i;
# dur_k its time. nz(k) = the least k' >= k with dur_k' > 0 (n if none): only ops k..nz(k)-1,
# all of duration zero, can end at or before the instant op k starts without coming before it.
# Units 1..L-1 are the offloadable ones (a_0 never; unit L, see (5) below). Bytes and times
# are scaled in ``fluid_lp``; the constraints below are in bytes and seconds.
#
# LP variables: s_0 = 0, s_1, ..., s_n (start of op k; s_n the makespan, minimised);
# x_i in [0, 1] (fraction of unit i moved; 0 if a bandwidth is 0); X_m = sum_{i<=m} x_i
# saved_i (X_0 = 0; "X_{>=i}" is X_{L-1} - X_{i-1}); O_k, P_k >= 0 for k = 0..n (bytes
# offloaded / prefetched by time s_k); f_k >= 0 for each op k with dur_k > 0 (bytes of first
# GPU copies freed by the start of op k). Constraints:
#  (1) s_{k+1} - s_k >= dur_k.
#  (2) channel: duplex: O_{k+1} - O_k <= bw_d2h (s_{k+1} - s_k), same for P with bw_h2d;
#      half duplex: (O_{k+1} - O_k)/bw_d2h + (P_{k+1} - P_k)/bw_h2d <= s_{k+1} - s_k
#      (an infinite bandwidth drops its term); O and P non-decreasing.
#  (3) availability: O_k <= X_{min(nz(k), L-1)} (only units whose F has ended by s_k).
#  (4) P_k <= O_k; P_{b(i+1)} >= X_{>=i} for i = 1..L-1; O_n = P_n = X_{L-1}.
#  (5) for dur_k > 0: f_k <= O_k, f_k <= X_{min(k-1, L-1)} (units i with F_{i+1} before op k),
#      and keepall_k - f_k + P_k <= memory (keepall_k: ``keep_all_start_memory``).
#  (6) latency windows: for i = 1..L-1, with D_j = latency + saved_j / bw_d2h and H_j the same
#      with bw_h2d: s_{b(i+1)} - s_{f(i)} - dur_{f(i)} >= sum_{j>=i} x_j D_j and >= sum_{j>=i}
#      x_j H_j (duplex), or >= sum_{j>=i} x_j (D_j + H_j) (half duplex).
#
# Claim: every schedule the simulator accepts at this memory maps to a feasible LP point whose
# objective is its makespan; so the LP optimum is <= the optimum (and an infeasible LP proves
# that no schedule fits). Take the simulated timeline: op k runs [S_k, E_k], E_k = S_k + dur_k;
# transfer t of unit i runs [a_t, c_t], c_t - a_t = latency + b_i/bw, b_i the bytes it moves
# (saved_i whole, act_i for a_i alone: NOTE [ what a unit moves ]). Its bytes moved by time u
# are B_t(u) = b_i * clip((u - a_t)/(c_t - a_t), 0, 1) (for c_t = a_t: b_i if u >= a_t else 0).
# Set s_k = S_k (s_n = E_{n-1}, the makespan), x_i = b_i / saved_i for offloaded units i <= L-1
# (1 for a whole unit, act_i / saved_i for a_i alone; 0 if saved_i = 0) else 0, so that X_m is
# the bytes units 1..m move; O_k = sum over offloads of units <= L-1 of B_t(S_k), P_k likewise
# over prefetches, f_k = sum of b_i over offloaded i <= L-1 whose moved part's free comes
# before op k's allocation in the simulator's order of events.
#  (1) S_{k+1} >= E_k: compute is one op at a time.
#  (2) A transfer moves bytes only within [a_t, c_t], at rate b_i/(latency + b_i/bw) <= bw;
#      a channel serves one transfer at a time (FIFO, non-preemptive), so in [S_k, S_{k+1}] it
#      moves at most bw (S_{k+1} - S_k) bytes, and on a shared channel the offload and prefetch
#      bytes need at least O/bw_d2h + P/bw_h2d seconds of it. B_t is non-decreasing.
#  (3) O_i starts at or after its trigger, which is at or after E_{f(i)} (else the simulator
#      reports a read violation). B_t(S_k) > 0 needs a_t <= S_k, so E_{f(i)} <= S_k: either
#      f(i) < k, or f(i) >= k and ops k..f(i) all have duration 0 (E_f(i) >= S_k with equality
#      only then), i.e. f(i) < nz(k), i.e. i <= nz(k).
#  (4) P_i starts after O_i ends, so B_P(u) > 0 implies B_O(u) = b_i: P_k <= O_k. P_j ends
#      before B_{j+1} starts (B waits for it; one triggered later is a read violation), and
#      S_{b(j+1)} <= S_{b(i+1)} for j >= i, so every unit j >= i is fully back by S_{b(i+1)}.
#      All transfers end before B_1 ends.
#  (5) Let dur_k > 0. Every event of ops before k comes before op k's allocation (they happen
#      at times <= S_k, and at S_k only frees or zero-length ops of lower index, which the
#      simulator orders first); no event of a later op does (they happen at times >= E_k >
#      S_k). So the compute-made part of memory just after op k's allocation is keepall_k
#      exactly, and the memory there is keepall_k - (moved parts freed) + (prefetch
#      allocations made) + (unit L's adjustment): the part of a unit that does not move (a
#      unit of which a_i alone moves) is on the GPU from F_i's start to B_i's end, as keepall_k
#      counts it. The free of unit i's moved part happens at max(c_{O_i},
#      E_{f(i+1)}) (frees before allocations at one instant), so a freed unit has c_{O_i} <=
#      S_k — its bytes count in O_k, f_k <= O_k — and E_{f(i+1)} <= S_k, which with dur_k > 0
#      means f(i+1) < k, i.e. i <= k-1. A prefetch allocates its b_i bytes when it starts, at
#      or before any of its bytes move: P_k <= the prefetch allocations made by S_k. Unit L:
#      O_L, P_L both lie in [E_{f(L)}, S_{b(L)}]; its GPU copy is missing only between the end
#      of O_L and the start of P_L, an interval in which no op with dur > 0 starts (op L-1 = F_L
#      starts before it, or at its start if dur_{L-1} = 0; op L = B_L at or after P_L's start,
#      whose allocation the simulator puts first at one instant), so its adjustment is >= 0.
#      Hence keepall_k - f_k + P_k <= simulated memory <= memory.
#  (6) O_j for j >= i starts at or after E_{f(j)} >= E_{f(i)} and ends before P_j, which ends
#      by S_{b(j+1)} <= S_{b(i+1)}; so does P_j. On one channel, these transfers are disjoint,
#      each lasting latency + b_j / bw >= x_j D_j (x_j <= 1: a move of a_i alone is charged a
#      fraction of the latency, which only relaxes), or the same with H_j.
# With a bandwidth 0 no schedule transfers anything (the simulator refuses it): x = 0 is exact.
# The LP drops a_0 and unit L and pools transfers, so it is a relaxation, not a model; waits
# are free in it, so its optimum is at least sum(dur) (s_n >= sum of (1)).
#
# The model ``fluid_lp`` builds is this LP rewritten, with the same optimum or a looser one
# (either keeps the bound valid: dropping a row only relaxes): tau_k = s_{k+1} - s_k are the
# variables, so (1) is a bound; f_k is eliminated ((5) becomes P_k - O_k <= memory - keepall_k
# and P_k - X_j <= memory - keepall_k), and each of those rows is left out where P_k <= O_k or
# P_k <= P_n = X_{L-1} or P_k <= O_k <= X_avail (rows that are kept) already implies it; x_i
# is (X_i - X_{i-1}) / saved_i; (3) is left out where its right side is X_{L-1}, and on a
# duplex link O is not required non-decreasing (both only relax; on 640 random instances the
# optimum equals that of the unreduced LP to 2e-15); in (6) the window lengths are a chain of
# sums of tau, the bytes are X_{L-1} - X_{i-1}, and the latency count is a prefix sum N of x,
# where a unit of size 0 (whose x is not determined by X) counts as 0.


@dataclasses.dataclass(frozen=True)
class FluidLP:
    """The solution of the fluid LP relaxation (see ``NOTE [ fluid LP lower bound ]``).

    Attributes
    ----------
    bound
        The LP optimum less a relative 1e-8 (GLOP) or 1e-6 (PDLP) margin for solver tolerance:
        a lower bound on the makespan of every feasible schedule. ``inf`` when the LP is
        infeasible, which proves that no pure-offloading schedule fits in the memory.
    objective
        The solver's objective value (the LP makespan), ``inf`` when infeasible.
    x
        Fraction of each unit 1..L offloaded (index i-1 is stage i; unit L is always 0).
    starts
        LP start time of each compute op, length 2L + 1 (the last is the LP makespan); empty
        when infeasible.
    status
        ``"optimal"``, ``"infeasible"`` or the solver's own word for anything else.
    solver
        ``"glop"`` or ``"pdlp"``.
    solve_time
        Seconds spent building and solving the model.
    variables, constraints
        Size of the model.
    """

    bound: float
    objective: float
    x: np.ndarray
    starts: np.ndarray
    status: str
    solver: str
    solve_time: float
    variables: int
    constraints: int

    @property
    def feasible(self) -> bool:
        """Whether the LP has a solution (otherwise no schedule fits)."""
        return math.isfinite(self.bound)


class _LPBuilder:
    """Rows and columns of a sparse LP, gathered in lists and shipped as one MPModelProto."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.obj: list[float] = []
        self.rows: list[tuple[float, float, list[int], list[float]]] = []

    def var(self, lb: float = 0.0, ub: float = math.inf, obj: float = 0.0) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.obj.append(obj)
        return len(self.lb) - 1

    def vars(self, count: int, lb: float = 0.0, ub: float = math.inf) -> list[int]:
        return [self.var(lb, ub) for _ in range(count)]

    def row(self, lb: float, ub: float, idx: list[int], coef: list[float]) -> None:
        self.rows.append((lb, ub, idx, coef))

    def request(self, integer: list[int] = ()):
        """The model as one OR-Tools ``MPModelRequest`` (columns in ``integer`` made integral)."""
        from ortools.linear_solver import linear_solver_pb2 as pb

        request = pb.MPModelRequest()
        model = request.model
        for lb, ub, c in zip(self.lb, self.ub, self.obj, strict=True):
            v = model.variable.add()
            v.lower_bound = lb
            v.upper_bound = ub
            if c:
                v.objective_coefficient = c
        for idx in integer:
            model.variable[idx].is_integer = True
        for lb, ub, idx, coef in self.rows:
            ct = model.constraint.add()
            ct.lower_bound = lb
            ct.upper_bound = ub
            ct.var_index.extend(idx)
            ct.coefficient.extend(coef)
        return request

    def solve(self, solver: str, time_limit: float | None = None) -> tuple[str, float, float, np.ndarray]:
        from ortools.linear_solver import linear_solver_pb2 as pb

        request = self.request()
        if time_limit is not None:
            request.solver_time_limit_seconds = max(float(time_limit), 1e-3)
        if solver == "glop":
            request.solver_type = pb.MPModelRequest.GLOP_LINEAR_PROGRAMMING
        else:
            request.solver_type = pb.MPModelRequest.PDLP_LINEAR_PROGRAMMING
            # Tight tolerances: the answer is used as a bound, not only as a plan.
            request.solver_specific_parameters = (
                "termination_criteria { simple_optimality_criteria "
                "{ eps_optimal_absolute: 1e-9 eps_optimal_relative: 1e-9 } }"
            )
        response = pb.MPSolutionResponse()
        _interrupt.solve_proto(request, response)  # NOTE [ MPSolver and the GIL ]
        status = pb.MPSolverResponseStatus.Name(response.status)
        values = np.array(response.variable_value, dtype=np.float64)
        if response.status == pb.MPSOLVER_OPTIMAL:
            lower = response.objective_value
            if response.HasField("best_objective_bound") and math.isfinite(response.best_objective_bound):
                # The dual side of the answer, where the solver reports one.
                lower = min(lower, response.best_objective_bound)
            return "optimal", response.objective_value, lower, values
        if response.status == pb.MPSOLVER_INFEASIBLE:
            return "infeasible", math.inf, math.inf, values
        return status.removeprefix("MPSOLVER_").lower(), math.nan, math.nan, values


def fluid_lp(chain: Chain, platform: Platform, *, solver: str = "glop", time_limit: float | None = None) -> FluidLP:
    """Solve the fluid LP relaxation of ``chain`` on ``platform``.

    Parameters
    ----------
    chain, platform
        The instance.
    solver
        ``"glop"`` (default; simplex, exact) or ``"pdlp"`` (first-order, approximate; see
        :data:`LP_SOLVERS`). Case-insensitive.
    time_limit
        Seconds the LP solver may take (``None``: no limit).

    Returns
    -------
    FluidLP
        Its ``bound`` is a proven lower bound on the makespan of every schedule the simulator
        accepts (``NOTE [ fluid LP lower bound ]`` in this module), ``inf`` when none can fit.

    Raises
    ------
    ValueError
        If ``solver`` is not one of :data:`LP_SOLVERS`.
    RuntimeError
        If the LP solver ends in an unexpected state (neither optimal nor infeasible).
    TimeoutError
        If ``time_limit`` ran out first (nothing is cached then).
    """
    _check_pair(chain, platform, "fluid_lp")
    solver = _check_solver(solver)
    # Sweeps, bisections and `best` (which runs `lp`) ask for one instance's LP many times;
    # chains and platforms are immutable, so the answer for the same objects is reused.
    key = (id(chain), platform, solver)
    hit = _LP_CACHE.get(key)
    if hit is not None and hit[0] is chain:
        return hit[1]
    value = _solve_fluid_lp(chain, platform, solver, time_limit)
    if len(_LP_CACHE) >= 64:
        _LP_CACHE.pop(next(iter(_LP_CACHE)))
    _LP_CACHE[key] = (chain, value)
    return value


_LP_CACHE: dict[tuple[int, Platform, str], tuple[Chain, FluidLP]] = {}


def lp_cached(chain: Chain, platform: Platform, solver: str = "glop") -> bool:
    """Whether :func:`fluid_lp` has this chain object's LP on this platform at hand (free to ask)."""
    hit = _LP_CACHE.get((id(chain), platform, solver))
    return hit is not None and hit[0] is chain


# NOTE [ fluid LP at extreme links ]
# GLOP refuses a model whose coefficients span too many orders of magnitude ("model_invalid" at
# 1e-300 or 1e300 B/s, "abnormal" already at 1e-40 or 1e40 on the scaled model). Each scaled
# rate is therefore kept in [1e-6, 1e6]: a rate above is taken as infinite and one below is
# raised to 1e-6, and the scaled latency is capped at 1e6. Every such change makes the link
# faster or its latency smaller, which only adds schedules to the relaxation (the transfer rows
# and the windows (6) loosen), so the optimum can only drop and stays a lower bound. It matters
# only for links far from any machine: a scaled rate of 1e-6 is a transfer of the largest unit
# taking a million times the mean op, one of 1e6 a millionth of it.
_RATE_RANGE = (1e-6, 1e6)


def _relaxed_rate(rate: float) -> float:
    if rate > _RATE_RANGE[1]:
        return math.inf
    if 0 < rate < _RATE_RANGE[0]:
        return _RATE_RANGE[0]
    return rate


def _solve_fluid_lp(chain: Chain, platform: Platform, solver: str, time_limit: float | None = None) -> FluidLP:
    t0 = time.perf_counter()
    length = chain.length
    n = 2 * length
    dur = np.concatenate([chain.fwd, chain.bwd[::-1]]).astype(np.float64)
    keep = keep_all_start_memory(chain)
    saved = chain.saved.astype(np.float64)

    # Scale bytes and seconds to order one, so that GLOP's absolute tolerances mean the same on
    # a 1 KiB toy and a 100 GiB network.
    byte_unit = float(max(int(chain.saved.max()), 1))
    total = float(dur.sum())
    time_unit = total / n if total > 0 else 1.0
    d_dur = dur / time_unit
    mem_rhs = (float(platform.memory) - keep.astype(np.float64)) / byte_unit
    can = platform.can_transfer and length >= 2
    bw_d = _relaxed_rate(platform.bandwidth_d2h * time_unit / byte_unit)  # scaled bytes per scaled second
    bw_h = _relaxed_rate(platform.bandwidth_h2d * time_unit / byte_unit)
    sv = saved / byte_unit

    # nz[k]: least k' >= k with dur_k' > 0 (n if none).
    nz = np.empty(n + 1, dtype=np.int64)
    nz[n] = n
    for k in range(n - 1, -1, -1):
        nz[k] = k if dur[k] > 0 else nz[k + 1]

    checked = dur > 0
    if not can and np.any(mem_rhs[checked] < 0):
        # Nothing can move: keep-all is the only schedule, and its memory check (5) fails.
        return FluidLP(math.inf, math.inf, np.zeros(length), np.zeros(0), "infeasible", solver,
                       time.perf_counter() - t0, 0, 0)

    m = _LPBuilder()
    # tau_k = s_{k+1} - s_k (period k: op k and the wait after it); (1) becomes its lower bound.
    tau = [m.var(float(d_dur[k]), math.inf, 1.0) for k in range(n)]
    # X[i] = sum_{j <= i} x_j saved_j (scaled), i = 0..L-1; x_i = (X_i - X_{i-1}) / saved_i.
    X = [m.var(0.0, 0.0)]
    for i in range(1, length):
        X.append(m.var(0.0, math.inf))
        m.row(0.0, float(sv[i - 1]) if can else 0.0, [X[i], X[i - 1]], [1.0, -1.0])
    last = length - 1  # X[last]: all offloadable units

    if can:
        Off = m.vars(n + 1)  # the NOTE's O_k: bytes offloaded by op k (scaled)
        P = m.vars(n + 1)
        for k in range(n):
            # P never decreases (a prefetch is not undone). O needs no such row on duplex
            # links: replacing O by its running maximum keeps every other row satisfied.
            m.row(0.0, math.inf, [P[k + 1], P[k]], [1.0, -1.0])
            if platform.duplex:
                if math.isfinite(bw_d):
                    m.row(-math.inf, 0.0, [Off[k + 1], Off[k], tau[k]], [1.0, -1.0, -bw_d])
                if math.isfinite(bw_h):
                    m.row(-math.inf, 0.0, [P[k + 1], P[k], tau[k]], [1.0, -1.0, -bw_h])
            else:
                m.row(0.0, math.inf, [Off[k + 1], Off[k]], [1.0, -1.0])
                idx, coef = [tau[k]], [-1.0]
                if math.isfinite(bw_d):
                    idx += [Off[k + 1], Off[k]]
                    coef += [1.0 / bw_d, -1.0 / bw_d]
                if math.isfinite(bw_h):
                    idx += [P[k + 1], P[k]]
                    coef += [1.0 / bw_h, -1.0 / bw_h]
                if len(idx) > 1:
                    m.row(-math.inf, 0.0, idx, coef)
        for k in range(n + 1):
            avail = min(int(nz[k]), last)
            if avail < last:  # (3); for avail = last it follows from O_n = X_last
                m.row(-math.inf, 0.0, [Off[k], X[avail]], [1.0, -1.0])
            m.row(-math.inf, 0.0, [P[k], Off[k]], [1.0, -1.0])  # (4)
        for i in range(1, length):
            b = b_pos(length, i + 1)
            m.row(0.0, math.inf, [P[b], X[last], X[i - 1]], [1.0, -1.0, 1.0])
        m.row(0.0, 0.0, [Off[n], X[last]], [1.0, -1.0])
        m.row(0.0, 0.0, [P[n], X[last]], [1.0, -1.0])
        cum_sv = np.concatenate([[0.0], np.cumsum(sv[:last])])  # cum_sv[i] = sum_{j <= i} sv_j
        for k in range(n):
            if dur[k] <= 0:
                continue  # see (5): no memory check at the start of a zero-length op
            # (5) with f_k = min(O_k, X_j) eliminated: P_k - O_k <= rhs and P_k - X_j <= rhs.
            # The first follows from P_k <= O_k unless rhs < 0. The second follows from
            # P_k <= O_k <= X_avail (forward, (3)) or P_k <= P_n = X_last unless rhs is below
            # the bytes of units j+1..avail.
            rhs = float(mem_rhs[k])
            j = min(k - 1, last) if k >= 1 else 0
            avail = min(int(nz[k]), last)
            if rhs < 0:
                m.row(-math.inf, rhs, [P[k], Off[k]], [1.0, -1.0])
            if rhs < cum_sv[max(avail, j)] - cum_sv[j]:
                m.row(-math.inf, rhs, [P[k], X[j]], [1.0, -1.0])

        # (6) windows: W[i] = tau over ops f(i) .. b(i+1) - 1 = i-1 .. 2L-i-2, nested in i.
        # sum_{j >= i} x_j saved_j is X_last - X_{i-1}; the count sum_{j >= i} x_j (for the
        # latency) is N_last - N_{i-1}, N a prefix sum of the increments of X over saved.
        lat = min(platform.latency / time_unit, _RATE_RANGE[1])  # a smaller latency relaxes (6)
        inv_d = 1.0 / bw_d if math.isfinite(bw_d) else 0.0
        inv_h = 1.0 / bw_h if math.isfinite(bw_h) else 0.0
        per_byte = [inv_d, inv_h] if platform.duplex else [inv_d + inv_h]
        per_unit = [lat, lat] if platform.duplex else [2.0 * lat]
        sides = [(b, u) for b, u in zip(per_byte, per_unit, strict=True) if b > 0 or u > 0]
        if sides and last >= 1:
            W = [None] * (length + 1)
            for i in range(last, 0, -1):
                W[i] = m.var(0.0, math.inf)
                if i == last:
                    m.row(0.0, 0.0, [W[i], tau[i - 1], tau[i]], [1.0, -1.0, -1.0])
                else:
                    m.row(0.0, 0.0, [W[i], W[i + 1], tau[i - 1], tau[b_pos(length, i + 1) - 1]], [1.0, -1.0, -1.0, -1.0])
            N = None
            if lat > 0:
                N = [m.var(0.0, 0.0)]
                for i in range(1, length):
                    N.append(m.var(0.0, math.inf))
                    # a unit of size 0 adds no bytes; leaving its count out only loosens (6)
                    c_x = 1.0 / float(sv[i - 1]) if sv[i - 1] > 0 else 0.0
                    m.row(0.0, 0.0, [N[i], N[i - 1], X[i], X[i - 1]], [1.0, -1.0, -c_x, c_x])
            for b_coef, u_coef in sides:
                for i in range(1, length):
                    idx = [W[i], X[last], X[i - 1]]
                    coef = [1.0, -b_coef, b_coef]
                    if N is not None and u_coef > 0:
                        idx += [N[last], N[i - 1]]
                        coef += [-u_coef, u_coef]
                    m.row(float(d_dur[i - 1]), math.inf, idx, coef)

    if time_limit is not None and time.perf_counter() - t0 >= time_limit:
        raise TimeoutError(f"fluid_lp: the time limit ({time_limit:.3g} s) ran out while building the LP")
    status, objective, lower, values = m.solve(solver, None if time_limit is None else time_limit - (time.perf_counter() - t0))
    if time_limit is not None and status not in ("optimal", "infeasible"):
        raise TimeoutError(f"fluid_lp: the {solver} LP solver stopped ({status}) within the time limit ({time_limit:.3g} s)")
    elapsed = time.perf_counter() - t0
    if status == "infeasible":
        return FluidLP(math.inf, math.inf, np.zeros(length), np.zeros(0), status, solver, elapsed, len(m.lb), len(m.rows))
    if status != "optimal":
        raise RuntimeError(f"fluid_lp: the {solver} LP solver ended with status {status!r} on chain {chain.name!r}")
    objective *= time_unit
    bound = lower * time_unit * (1.0 - _MARGIN[solver])
    xs = np.zeros(length)
    if can:
        cum = values[X]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(sv[:last] > 0, np.diff(cum) / np.where(sv[:last] > 0, sv[:last], 1.0), 0.0)
        xs[:last] = np.clip(frac, 0.0, 1.0)
    starts = np.concatenate([[0.0], np.cumsum(values[tau])]) * time_unit
    return FluidLP(bound, objective, xs, starts, status, solver, elapsed, len(m.lb), len(m.rows))


def fluid_lower_bound(chain: Chain, platform: Platform, *, solver: str = "glop", time_limit: float | None = None) -> float:
    """The fluid LP optimum: a proven lower bound on the makespan of every feasible schedule.

    Parameters
    ----------
    chain, platform
        The instance.
    solver
        ``"glop"`` or ``"pdlp"`` (see :func:`fluid_lp`).

    Returns
    -------
    float
        Seconds; ``inf`` when the LP is infeasible, which proves that no pure-offloading
        schedule fits in ``platform.memory``. The argument is ``NOTE [ fluid LP lower bound ]``
        in this module.
    """
    return fluid_lp(chain, platform, solver=solver, time_limit=time_limit).bound


def lower_bound(chain: Chain, platform: Platform, *, solver: str = "glop", time_limit: float | None = None) -> float:
    """``max(chain.compute_time, fluid_lower_bound(chain, platform))``.

    The maximum only matters by float rounding (the LP already charges every op its time); it
    makes the bound of an instance that needs no wait exactly the wait-free makespan.

    Returns
    -------
    float
        Seconds; ``inf`` when no pure-offloading schedule fits.
    """
    return max(chain.compute_time, fluid_lower_bound(chain, platform, solver=solver, time_limit=time_limit))


