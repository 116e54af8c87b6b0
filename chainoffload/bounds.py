"""Proven lower bounds: on the makespan (the fluid LP relaxation) and on the memory of offloading.

Every bound here holds for the problem the simulator accepts in the fixed order: any unit may
move whole or as a_i alone (``moves: "act"``), with any triggers and waits
(``NOTE [ what a unit moves ]``).

* :func:`fluid_lower_bound` solves the fluid LP relaxation (transfers
  divisible and preemptive, units offloaded by a fraction, memory moved in proportion to bytes,
  compute ops that may wait) and returns its optimum, a lower bound on the makespan of every
  schedule the simulator accepts (``NOTE [ fluid LP lower bound ]``).
* :func:`lower_bound` is ``max(chain.compute_time, fluid_lower_bound)``.
* :func:`volume_lower_bound` (closed form) and :func:`unit_milp` (whole moves, a MILP) are the
  cheaper and the stronger rung; :func:`stronger_bound` takes the best of them in a budget.
* :func:`offload_memory_floor` is the least memory any pure-offloading schedule needs.
* :func:`fluid_lp` returns the whole LP solution (the fractions ``x`` that method ``lp``
  rounds, the op start times, solve time).

OR-Tools is imported inside the functions that solve, so importing this module needs nothing
beyond numpy.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from .chain import Chain
from .order import b_pos
from .platform import Platform

__all__ = [
    "Bound",
    "FluidLP",
    "UnitMILP",
    "UNIT_MILP_MAX_SIZE",
    "LP_SOLVERS",
    "fluid_lp",
    "fluid_lower_bound",
    "keep_all_start_memory",
    "lower_bound",
    "offload_memory_floor",
    "stronger_bound",
    "unit_milp",
    "unit_milp_seconds",
    "volume_lower_bound",
]

#: LP back ends :func:`fluid_lp` accepts: GLOP (simplex, exact vertex; the default) and PDLP
#: (first-order, approximate; for models too large for a simplex basis in memory: on this
#: model it is much slower than GLOP at the sizes measured, 1.9 s against 0.05 s at L = 100).
LP_SOLVERS = ("glop", "pdlp")

# Relative safety margin taken off the solver's objective before it is reported as a bound:
# GLOP's answer is a simplex vertex accurate to its feasibility tolerance (~1e-9 on the scaled
# model); PDLP stops at a relative gap of ~1e-9 but its primal point is only approximately
# feasible, hence the wider margin. The margin keeps a bound that should equal a
# makespan exactly from landing an ulp above it; it costs nothing measurable.
_MARGIN = {"glop": 1e-8, "pdlp": 1e-6}


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


# -- keep-all memory and the memory floor -------------------------------------------------------


def keep_all_start_memory(chain: Chain) -> np.ndarray:
    """Memory in use at the start of each compute op of the schedule that offloads nothing.

    Op k of the fixed order F_1..F_L, B_L..B_1, just after its own allocation, by ``docs/model.md``'s
    rules (every earlier op's frees have happened; no later op has started):

    * F_i: ``a_0 + saved_1 + ... + saved_i + fwd_tmp_i``;
    * B_i: ``a_0 + saved_1 + ... + saved_i + g_i + g_{i-1} + bwd_tmp_i`` where g_i (act[i]) was
      allocated by B_{i+1} (by B_i itself for i = L) and g_{i-1} is B_i's own allocation.

    The simulator's memory curve of :meth:`Schedule.keep_all` takes exactly these values at the
    op starts (tests check it) when every op has a positive duration; its peak is their maximum.

    Returns
    -------
    numpy.ndarray
        int64, length 2L, indexed like the compute sequence.
    """
    length = chain.length
    act = chain.act.astype(np.int64)
    cum = np.cumsum(chain.saved.astype(np.int64))  # cum[i-1] = saved_1 + ... + saved_i
    fwd_part = int(act[0]) + cum + chain.fwd_tmp.astype(np.int64)
    stages = np.arange(length, 0, -1)  # B_L .. B_1
    bwd_part = int(act[0]) + cum[stages - 1] + act[stages] + act[stages - 1] + chain.bwd_tmp.astype(np.int64)[stages - 1]
    return np.concatenate([fwd_part, bwd_part]).astype(np.int64)


def offload_memory_floor(chain: Chain) -> int:
    """A proven lower bound on the peak memory of every pure-offloading schedule of ``chain``.

    Whatever is offloaded and whenever, at the start of each op (just after its allocation)
    these bytes are on the GPU:

    * F_i (when fwd[i] > 0): a_0, the whole unit i-1 (F_i reads a_{i-1}, so the GPU copy of
      unit i-1 is freed only at the end of F_i or later), saved[i] and fwd_tmp[i];
    * B_i (when bwd[i] > 0): a_0, saved[i] (back on the GPU: P_i ends before B_{i+1} starts),
      the whole unit i-1 (P_{i-1} must end before B_i starts), g_i (allocated by B_{i+1}, or by
      B_L itself), g_{i-1} and bwd_tmp[i].

    "Unit 0" is a_0, counted once. An op of duration zero ends at the instant it starts, and the
    simulator frees memory allocated earlier before allocations at one instant, so for such an
    op only what it allocates itself is certain: F_i keeps a_0 + saved[i] + fwd_tmp[i]; B_i is
    left to :meth:`Chain.stage_memory_floor`. The floor is the largest of these and of
    :meth:`Chain.stage_memory_floor` (below which :func:`chainoffload.solve` refuses the
    instance anyway).

    When every op takes some time, infinite bandwidth and no latency reach this floor:
    offloading every unit as soon as it is made and prefetching it just before its backward
    runs at it with no wait, and the fluid LP is feasible at exactly this memory (tests check
    both).

    Returns
    -------
    int
        Bytes.
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"offload_memory_floor: chain must be a Chain, got {type(chain).__name__}")
    # Vectorised (the Python loop took ~4 s at 10^6 stages, before a time limit could act);
    # each sum adds chain sizes, below 2T < 2^61 (NOTE [ memory sums fit int64 ]): int64 is exact.
    act, saved = chain.act, chain.saved
    a0 = int(act[0])
    prev_unit = np.concatenate([[0], saved[:-1]])  # unit 0 is a_0, already counted
    f_need = a0 + saved + chain.fwd_tmp + np.where(chain.fwd > 0, prev_unit, 0)
    b_need = a0 + saved + prev_unit + act[1:] + act[:-1] + chain.bwd_tmp
    best = max(chain.stage_memory_floor(), int(f_need.max()))
    if bool(np.any(chain.bwd > 0)):
        best = max(best, int(b_need[chain.bwd > 0].max()))
    return int(best)


# NOTE [ what a unit moves ]
# ---------------------------
# The problem every bound of this module is proven for: the schedules the simulator accepts in
# the fixed order (pure offloading), each unit i not offloaded, moved whole (``moves: "unit"``,
# b_i = saved_i bytes) or moved as a_i alone (``"act"``, b_i = act_i bytes; the rest,
# saved_i - act_i, stays on the GPU from F_i's start to B_i's end, as with no offload at all:
# docs/model.md, "Which instance a transfer moves"). In the fixed order the two moves differ
# only in b_i: the moved part's GPU copy is released at max(end of O_i, end of F_{i+1}) (rule 4
# of docs/model.md's memory), P_i allocates b_i bytes when it starts, starts after O_i ends and
# ends before B_{i+1} starts (B_{i+1} reads a_i, which moves either way), and each transfer
# lasts latency + b_i / bandwidth. So memory just after op k's allocation is keepall_k less the
# b_i of the units whose moved part is off the GPU then; every proof below is written with b_i.
# A move of b_i = 0 bytes (act_i = 0) frees nothing and only holds a channel: read as "unit i
# is not offloaded", such a schedule still satisfies every row of every relaxation here (its
# rows only lose a term that took time), so the relaxations need not offer that move; and a
# move of a_i alone with act_i = saved_i is the whole-unit move.
#
# Why not narrow the problem to whole units instead: users run what the simulator accepts
# (``joint`` and the torch executor move a_i alone), and moving a_i alone does win where only a
# few bytes must leave: on resnet18 at 1438209368 B (25 GB/s, 10 us) offloading a_2 alone runs
# at the compute time, 14.306 ms, while CP-SAT over whole-unit moves only proved 17.698 ms
# optimal.

# NOTE [ volume lower bound ]
# ----------------------------
# A closed-form bound in O(L), the cheap rung of the bound ladder (``chainoffload.solvers``,
# ``NOTE [ bound ladder ]``). Ops k = 0..n-1 of the fixed order, dur_k, keepall_k and S_k as in
# ``NOTE [ fluid LP lower bound ]``; e_k = keepall_k - memory. Take a schedule the simulator
# accepts and an op k with dur_k > 0 and e_k > 0. By (5) of that note, memory at op k's
# allocation is keepall_k - f_k + P_k + (unit L's adjustment, >= 0), so f_k - P_k >= e_k: the
# units (<= L-1) whose moved part (b_i bytes, NOTE [ what a unit moves ]) was freed before op
# k's allocation and whose prefetch had not allocated by then hold at least e_k bytes.
#  (a) Each of those frees came after its offload ended, and every offload starts after F_1
#      ends (O_i after F_i): at least e_k bytes crossed the D2H channel, one transfer at a time,
#      in [fwd_1, S_k]. So S_k >= fwd_1 + latency + e_k / bw_d2h, and S_k >= sum_{j<k} dur_j.
#  (b) Each of those prefetches starts at or after S_k and ends before B_{j+1} of its unit j
#      starts, so by the start of B_2 at the latest (j >= 1): for op k before B_2, at least e_k
#      bytes cross the H2D channel in [S_k, S_{B_2}], and S_{B_2} >= S_k + latency + e_k /
#      bw_h2d as well as S_k + the ops k..B_3 in between.
# So the makespan is at least S_k + sum_{j>=k} dur_j, and (for k before B_2) S_k + max(latency +
# e_k / bw_h2d, sum of dur_j from k to B_3) + bwd_2 + bwd_1. When some e_k > 0 and nothing can
# move (a bandwidth of 0, or L = 1), no schedule fits: the bound is inf. (a) and (b) use
# disjoint intervals, so they hold on a half-duplex link too. The LP imposes (a) and (b) among
# its rows, but the LP is solved only when the ladder can afford it.


def volume_lower_bound(chain: Chain, platform: Platform) -> float:
    """A closed-form lower bound on the makespan, in O(L) (``NOTE [ volume lower bound ]``).

    What must be offloaded before each op that would not fit with everything kept, and
    prefetched again before the backward needs it, at the link's bandwidth.

    Returns
    -------
    float
        Seconds, at least ``chain.compute_time``; ``inf`` when some op cannot fit and nothing
        can move.
    """
    _check_pair(chain, platform, "volume_lower_bound")
    length = chain.length
    n = 2 * length
    dur = np.concatenate([chain.fwd, chain.bwd[::-1]]).astype(np.float64)
    compute = chain.compute_time
    excess = (keep_all_start_memory(chain) - int(platform.memory)).astype(np.float64)
    check = (dur > 0) & (excess > 0)
    if not np.any(check):
        return compute
    if length < 2 or not platform.can_transfer:
        return math.inf
    prefix = np.concatenate([[0.0], np.cumsum(dur)[:-1]])  # sum_{j<k} dur_j
    suffix = compute - prefix  # sum_{j>=k} dur_j
    lat = platform.latency
    d2h = excess / platform.bandwidth_d2h if math.isfinite(platform.bandwidth_d2h) else np.zeros(n)
    h2d = excess / platform.bandwidth_h2d if math.isfinite(platform.bandwidth_h2d) else np.zeros(n)
    start = np.maximum(prefix, float(chain.fwd[0]) + lat + d2h)
    best = np.where(check, start + suffix, 0.0)
    b2 = n - 2  # op index of B_2
    tail = float(chain.bwd[1] + chain.bwd[0])
    between = np.maximum(suffix - suffix[b2], 0.0)  # ops k..B_3, for k < b2
    back = start + np.maximum(lat + h2d, between) + tail
    early = check & (np.arange(n) < b2)
    best = np.maximum(best, np.where(early, back, 0.0))
    return max(compute, float(best.max()))


# -- the fluid LP ------------------------------------------------------------------------------

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
        for lb, ub, c in zip(self.lb, self.ub, self.obj):
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
        from ortools.linear_solver import pywraplp

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
        pywraplp.Solver.SolveWithProto(request, response)
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
        O = m.vars(n + 1)
        P = m.vars(n + 1)
        for k in range(n):
            # P never decreases (a prefetch is not undone). O needs no such row on duplex
            # links: replacing O by its running maximum keeps every other row satisfied.
            m.row(0.0, math.inf, [P[k + 1], P[k]], [1.0, -1.0])
            if platform.duplex:
                if math.isfinite(bw_d):
                    m.row(-math.inf, 0.0, [O[k + 1], O[k], tau[k]], [1.0, -1.0, -bw_d])
                if math.isfinite(bw_h):
                    m.row(-math.inf, 0.0, [P[k + 1], P[k], tau[k]], [1.0, -1.0, -bw_h])
            else:
                m.row(0.0, math.inf, [O[k + 1], O[k]], [1.0, -1.0])
                idx, coef = [tau[k]], [-1.0]
                if math.isfinite(bw_d):
                    idx += [O[k + 1], O[k]]
                    coef += [1.0 / bw_d, -1.0 / bw_d]
                if math.isfinite(bw_h):
                    idx += [P[k + 1], P[k]]
                    coef += [1.0 / bw_h, -1.0 / bw_h]
                if len(idx) > 1:
                    m.row(-math.inf, 0.0, idx, coef)
        for k in range(n + 1):
            avail = min(int(nz[k]), last)
            if avail < last:  # (3); for avail = last it follows from O_n = X_last
                m.row(-math.inf, 0.0, [O[k], X[avail]], [1.0, -1.0])
            m.row(-math.inf, 0.0, [P[k], O[k]], [1.0, -1.0])  # (4)
        for i in range(1, length):
            b = b_pos(length, i + 1)
            m.row(0.0, math.inf, [P[b], X[last], X[i - 1]], [1.0, -1.0, 1.0])
        m.row(0.0, 0.0, [O[n], X[last]], [1.0, -1.0])
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
                m.row(-math.inf, rhs, [P[k], O[k]], [1.0, -1.0])
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
        sides = [(b, u) for b, u in zip(per_byte, per_unit) if b > 0 or u > 0]
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


# -- the whole-move relaxation -------------------------------------------------------------------

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

    def solve_milp(self, time_limit: float) -> tuple[str, float]:
        from ortools.linear_solver import linear_solver_pb2 as pb
        from ortools.linear_solver import pywraplp

        request = self.request(self.binary)
        request.solver_time_limit_seconds = max(float(time_limit), 1e-3)
        response = pb.MPSolutionResponse()
        for solver_type, params in (
            (pb.MPModelRequest.SCIP_MIXED_INTEGER_PROGRAMMING, _SCIP_PARAMS),
            (pb.MPModelRequest.SCIP_MIXED_INTEGER_PROGRAMMING, ""),
            (pb.MPModelRequest.CBC_MIXED_INTEGER_PROGRAMMING, ""),
        ):
            request.solver_type = solver_type
            request.solver_specific_parameters = params
            pywraplp.Solver.SolveWithProto(request, response)
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
            return "time limit", bound if bound > 0 else math.nan
        return pb.MPSolverResponseStatus.Name(response.status).removeprefix("MPSOLVER_").lower(), math.nan


def unit_milp(chain: Chain, platform: Platform, *, time_limit: float = 10.0) -> UnitMILP:
    """Solve the whole-move relaxation of ``chain`` on ``platform`` for at most ``time_limit`` seconds.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds the MILP solver may take (building the model comes on top: ~L^3 / 10^6 s).

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
    _check_time_limit(time_limit)
    key = (id(chain), platform)
    hit = _MILP_CACHE.get(key)
    if hit is not None and hit[0] is chain and (hit[1].status in _FINAL or hit[2] >= time_limit):
        return hit[1]
    value = _solve_unit_milp(chain, platform, float(time_limit))
    if len(_MILP_CACHE) >= 64:
        _MILP_CACHE.pop(next(iter(_MILP_CACHE)))
    _MILP_CACHE[key] = (chain, value, float(time_limit))
    return value


_MILP_CACHE: dict[tuple[int, Platform], tuple[Chain, UnitMILP, float]] = {}
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


def _solve_unit_milp(chain: Chain, platform: Platform, time_limit: float) -> UnitMILP:
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
        out_both = back_both = [a + b for a, b in zip(out_t, back_t)]
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
    status, value = m.solve_milp(max(1e-3, float(time_limit) - (time.perf_counter() - t0)))
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


def stronger_bound(chain: Chain, platform: Platform, *, time_limit: float = 10.0) -> Bound:
    """The best proven lower bound within ``time_limit`` seconds: compute time, volume, fluid LP, unit MILP.

    The whole-move relaxation (:func:`unit_milp`, ``NOTE [ unit MILP lower bound ]``) keeps
    what the fluid LP loses: what a unit moves (all of it, or a_i alone) is freed only when its
    whole offload has ended and comes back whole when its prefetch starts. It gets the time left after the fluid LP and is
    skipped on chains where building it alone would cost seconds (see
    :data:`UNIT_MILP_MAX_SIZE`); then the answer is the best of the others. The fluid LP gets
    the whole ``time_limit`` (it is free when cached); when even it runs out, so would the
    MILP, and the answer is the closed-form bounds'.

    Parameters
    ----------
    chain, platform
        The instance.
    time_limit
        Seconds for the whole call (> 0). Cost: the fluid LP is ~0.05 s at L = 100; the unit
        MILP's model has ~L^2 binary columns and ~L^2 rows of ~L terms, and its solver stops at
        the limit with the bound proven so far (:func:`unit_milp_seconds` estimates when it
        has one).

    Returns
    -------
    Bound
        The largest of the four, and which it is.

    Raises
    ------
    ValueError
        If ``time_limit`` is not a number of seconds > 0.
    """
    _check_pair(chain, platform, "stronger_bound")
    _check_time_limit(time_limit)
    t0 = time.perf_counter()
    best = Bound(chain.compute_time, "compute time", 0.0)
    volume = volume_lower_bound(chain, platform)
    if volume > best.value:
        best = Bound(volume, "volume", 0.0)
    try:
        fluid = fluid_lower_bound(chain, platform, time_limit=float(time_limit)) if math.isfinite(best.value) else -math.inf
    except TimeoutError:
        return dataclasses.replace(best, seconds=time.perf_counter() - t0)
    if fluid > best.value:
        best = Bound(fluid, "fluid LP", 0.0)
    left = float(time_limit) - (time.perf_counter() - t0)
    size = _unit_milp_size(chain, platform)
    if math.isfinite(best.value) and size and (left > 0.01 or _final_milp(chain, platform)) and size <= UNIT_MILP_MAX_SIZE:
        unit = unit_milp(chain, platform, time_limit=max(left, 1e-3))
        if unit.bound > best.value:
            best = Bound(unit.bound, "unit MILP, optimal" if unit.status == "optimal" else "unit MILP", 0.0)
    return dataclasses.replace(best, seconds=time.perf_counter() - t0)
