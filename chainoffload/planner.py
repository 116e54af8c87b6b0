"""The transfer planner: given which units to offload, place every trigger.

Every heuristic and the baselines that benefit go through :func:`plan_transfers`, so that a
comparison between methods compares their choice of units, not their timing code.

NOTE [ transfer planner ]
-------------------------
Given the set U of units to offload, the planner fixes every trigger in one forward and one
backward sweep (:func:`chainoffload._kernels.planner.plan_kernel`), replaying the simulator's
timing rules as it goes:

* **Offloads** are triggered at the end of F_i, the earliest instant the data exists, so the
  D2H channel serves U in stage order. Before F_k starts, the planner frees every GPU copy
  whose offload has already ended (and whose F_{i+1} is over). If F_k's allocation still does
  not fit, F_k waits (``before``) for the fewest further offloads, in channel order, that make
  it fit; unit k - 1 cannot help, since F_k reads a_{k-1}. Waiting is the only lever the
  forward has: compute never idles unless a named transfer makes it.
* **Prefetches** are issued in decreasing stage order (the order the backward needs them),
  each at the earliest boundary (end of F_L, then the end of each B_{j+1}) from which the
  unit fits in every backward phase up to B_u, with memory counted from the trigger (an
  upper bound of when the copy really allocates). A unit that fits nowhere earlier is issued
  at the last boundary before B_{u+1}, which reads it. GPU copies whose offload may still be
  in flight when the backward begins are counted present in each B_j that could start before
  they are freed (start times are bounded below by running the backward with no waits), never
  in B_{V+1}, ..., B_1 for V the largest unit offloaded: B_{V+1} waits for P_V, queued behind
  every offload (``NOTE [ the original is gone when B_{v+1} starts ]`` in the kernel, which also
  states the one exception); the
  first B_j that cannot run beside such a copy waits (``before``) for its offload, and the
  copies counted before it leave B_j and the phases after it (``NOTE [ a wait frees the copies
  before it ]`` in the kernel).
* **Zero-length ops.** A copy that starts at the instant a zero-length op starts allocates
  before that op does (docs/model.md, "One instant"), so it is counted at that op's allocation
  too, and where only that instant is short a later unit's prefetch is queued ahead of it
  (``NOTE [ prefetch at a zero-length instant ]`` in the kernel); prefetches are listed in the
  order the H2D queue serves them.
* Memory checks use the same accounting as the simulator, so the plan is feasible whenever
  every check passes; the caller still simulates it (the simulator is the only judge).

The sweeps take O(L + |U| sqrt(L)) (``NOTE [ slack in blocks ]`` in the kernel) and are
deterministic: the same inputs give the same schedule.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ._kernels import lazy
from .chain import Chain
from .platform import Platform
from .schedule import OP_CODE, Schedule, Transfer, fixed_order, resolve
from .simulate import Timeline, replay, simulate

_kplan = lazy("planner")  # imports Numba on first use only

__all__ = ["plan_transfers", "plan_and_simulate", "eager_plan", "plan_arrays", "schedule_from_arrays"]

# Also for ``chainoffload.solvers._search`` (private): ``fixed_arrays``, ``Candidate``,
# ``saved_table``, ``score``, ``plan_units``: a unit set planned and scored on arrays.


def eager_plan(chain: Chain, units: Iterable[int]) -> Schedule:
    """The vDNN-style timing: O_i at the end of F_i, P_i at the start of B_{i+2}.

    Each unit is copied out as soon as it is made and copied back one stage ahead of the
    backward that first reads it (B_{i+1} reads a_i); units L - 1 and L, which B_L reads, are
    prefetched at the end of F_L. Nothing waits explicitly.
    """
    length = chain.length
    chosen = sorted({int(u) for u in units})
    for u in chosen:
        if not 1 <= u <= length:
            raise ValueError(f"units: {u} is not a stage in 1..{length}")
    compute = fixed_order(length)
    pos = {op: k for k, op in enumerate(compute)}
    offloads, prefetches = [], []
    for u in chosen:
        offloads.append(Transfer("offload", u, pos[("F", u)], "end"))
        if u + 2 <= length:
            prefetches.append(Transfer("prefetch", u, pos[("B", u + 2)], "start"))
        else:
            prefetches.append(Transfer("prefetch", u, pos[("F", length)], "end"))
    return Schedule(compute, tuple(offloads + prefetches))


def plan_transfers(chain: Chain, platform: Platform, units: Iterable[int]) -> Schedule:
    """Place the offload and prefetch triggers for ``units`` (stages, 1-based).

    Parameters
    ----------
    chain, platform
        The instance; the platform's memory limit guides where compute must wait.
    units
        The units to offload.

    Returns
    -------
    Schedule
        A fixed-order schedule with one offload and one prefetch per unit, placed as NOTE
        [ transfer planner ] describes. It is not guaranteed feasible (the units may not be
        enough to fit the limit): callers simulate it.

    Raises
    ------
    ValueError
        A unit outside 1..L, or units to move over a link of bandwidth 0.
    """
    return plan_and_simulate(chain, platform, units)[0]


def plan_and_simulate(chain: Chain, platform: Platform, units: Iterable[int]) -> tuple[Schedule, Timeline]:
    """:func:`plan_transfers` together with the simulator's timeline of the plan it returns.

    The candidate plans are scored on arrays (:func:`plan_units`, as
    ``chainoffload.solvers._search`` does); only the one chosen becomes a :class:`Schedule` and
    goes through :func:`simulate`.
    """
    chosen = check_units(chain, platform, units)
    candidate = plan_units(chain, platform, chosen, fixed_arrays(chain.length), saved_table(chain))
    schedule = candidate.schedule()
    return schedule, simulate(chain, platform, schedule)


def check_units(chain: Chain, platform: Platform, units: Iterable[int]) -> np.ndarray:
    """``units`` as a sorted int64 array of distinct stages; raises ``ValueError`` like :func:`plan_transfers`."""
    chosen = np.unique(np.fromiter((int(u) for u in units), dtype=np.int64))
    if chosen.shape[0] and (chosen[0] < 1 or chosen[-1] > chain.length):
        bad = int(chosen[0]) if chosen[0] < 1 else int(chosen[-1])
        raise ValueError(f"units: {bad} is not a stage in 1..{chain.length}")
    if chosen.shape[0] and not platform.can_transfer:
        raise ValueError(
            f"units: cannot offload {chosen.tolist()} over a link of bandwidth "
            f"{platform.bandwidth_d2h} B/s (D2H) / {platform.bandwidth_h2d} B/s (H2D)"
        )
    return chosen


def plan_arrays(chain: Chain, platform: Platform, chosen: np.ndarray, alone: np.ndarray | None = None) -> list[tuple[np.ndarray, ...]]:
    """The planner's candidate plans for the sorted units ``chosen`` as transfer arrays.

    Units in ``alone`` (a subset of ``chosen``) move a_i alone (``moves: "act"``): the plan
    frees and brings back act[i] bytes for them, at act[i]'s transfer time.

    Returns the safe sweep, the optimistic sweep and the eager timing, in that order (ties go
    to the first), each ``(kind, unit, op, at, before)`` int64 arrays as
    :meth:`Schedule.arrays` encodes transfers. Nothing is validated or simulated here.
    """
    length = chain.length
    offload = np.zeros(length + 1, dtype=np.int64)
    offload[chosen] = 1
    moved = chain.saved.copy()
    if alone is not None and alone.shape[0]:
        moved[alone - 1] = chain.act[alone]
    # Platform.d2h_time / h2d_time, element-wise (the same float operations).
    d_time = platform.latency + moved / platform.bandwidth_d2h
    h_time = platform.latency + moved / platform.bandwidth_h2d
    plans = [_kernel_arrays(chain, platform, chosen, offload, d_time, h_time, opt, moved) for opt in (False, True)]
    plans.append(eager_arrays(length, chosen))
    return plans


def eager_arrays(length: int, chosen: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`eager_plan`'s transfers as arrays (``chosen``: sorted stages)."""
    m = chosen.shape[0]
    kind = np.concatenate([np.zeros(m, dtype=np.int64), np.ones(m, dtype=np.int64)])
    unit = np.concatenate([chosen, chosen])
    # P_u at the start of B_{u+2} (op 2L - u - 2); units L-1 and L at the end of F_L (op L-1).
    pre_op = np.where(chosen + 2 <= length, 2 * length - chosen - 2, length - 1)
    op = np.concatenate([chosen - 1, pre_op])
    at = np.concatenate([np.ones(m, dtype=np.int64), np.where(chosen + 2 <= length, 0, 1)])
    before = np.full(2 * m, -1, dtype=np.int64)
    return kind, unit, op.astype(np.int64), at.astype(np.int64), before


def _kernel_arrays(
    chain: Chain,
    platform: Platform,
    chosen: np.ndarray,
    offload: np.ndarray,
    d_time: np.ndarray,
    h_time: np.ndarray,
    optimistic: bool,
    moved: np.ndarray,
) -> tuple[np.ndarray, ...]:
    off_before, pre_op, pre_seq, _fits, _makespan = _kplan.plan_kernel(
        chain.fwd,
        chain.bwd,
        chain.act,
        chain.saved,
        chain.fwd_tmp,
        chain.bwd_tmp,
        platform.memory,
        d_time,
        h_time,
        platform.duplex,
        offload,
        optimistic,
        moved,
    )
    m = chosen.shape[0]
    # The order the sweep sent them in, which the H2D queue serves: by trigger, decreasing stage
    # within one, but for a lead sent ahead of a copy that would start at a zero-length
    # instant (NOTE [ prefetch at a zero-length instant ] in the kernel).
    pre_units = chosen[np.argsort(pre_seq[chosen], kind="stable")]
    kind = np.concatenate([np.zeros(m, dtype=np.int64), np.ones(m, dtype=np.int64)])
    unit = np.concatenate([chosen, pre_units])
    op = np.concatenate([chosen - 1, pre_op[pre_units]])
    at = np.ones(2 * m, dtype=np.int64)
    before = np.concatenate([off_before[chosen], np.full(m, -1, dtype=np.int64)])
    return kind, unit, op, at, before


def schedule_from_arrays(length: int, transfers: tuple[np.ndarray, ...], alone: Iterable[int] = ()) -> Schedule:
    """A fixed-order :class:`Schedule` from ``(kind, unit, op, at, before)`` transfer arrays; the
    units in ``alone`` move a_i alone."""
    kind, unit, op, at, before = (a.tolist() for a in transfers)
    act = set(alone)
    out = tuple(
        Transfer(_KIND[k], u, o, _AT[a], None if b < 0 else b, "act" if u in act else "unit")
        for k, u, o, a, b in zip(kind, unit, op, at, before, strict=True)
    )
    return Schedule(fixed_order(length), out)


_KIND = ("offload", "prefetch")
_AT = ("start", "end")


_FIXED: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def fixed_arrays(length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(op_kind, op_stage)`` of the fixed order (read-only, cached per length)."""
    hit = _FIXED.get(length)
    if hit is None:
        op_kind = np.concatenate([np.full(length, OP_CODE["F"]), np.full(length, OP_CODE["B"])]).astype(np.int64)
        op_stage = np.concatenate([np.arange(1, length + 1), np.arange(length, 0, -1)]).astype(np.int64)
        for arr in (op_kind, op_stage):
            arr.setflags(write=False)
        if len(_FIXED) > 8:
            _FIXED.clear()
        hit = _FIXED[length] = (op_kind, op_stage)
    return hit


class Candidate:
    """A scored transfer list on the fixed order (``NOTE [ search without objects ]`` in ``chainoffload/solvers/_search.py``).

    Attributes
    ----------
    units
        The offloaded stages, sorted.
    alone
        Those of them that move a_i alone (``moves: "act"``), sorted.
    transfers
        ``(kind, unit, op, at, before)`` int64 arrays.
    feasible, makespan, peak, rule
        The simulator kernel's verdict (rule 0 feasible, 1 memory, 2 read).
    offloaded
        Bytes the offloads move.
    """

    __slots__ = ("length", "units", "transfers", "feasible", "makespan", "peak", "rule", "offloaded", "source", "alone")

    def __init__(self, length, units, transfers, makespan, peak, rule, offloaded, source="", alone=()):
        self.length = length
        self.units = units
        self.alone = tuple(alone)
        self.transfers = transfers
        self.rule = int(rule)
        self.feasible = self.rule == 0
        self.makespan = float(makespan)
        self.peak = int(peak)
        self.offloaded = int(offloaded)
        self.source = source

    def schedule(self):
        """The candidate as a :class:`~chainoffload.Schedule` (built once, for the winner)."""
        return schedule_from_arrays(self.length, self.transfers, self.alone)

    @property
    def rank(self) -> tuple[float, int]:
        """Order among feasible candidates: least makespan, then fewest bytes moved."""
        return (self.makespan, self.offloaded)


def saved_table(chain: Chain) -> np.ndarray:
    """``saved`` with a 0 in front, indexed by stage: the bytes an offload of unit u moves."""
    return np.concatenate([[0], chain.saved.astype(np.int64)])


def score(
    chain: Chain,
    platform: Platform,
    units: tuple[int, ...],
    transfers: tuple[np.ndarray, ...],
    ops: tuple[np.ndarray, np.ndarray],
    saved: np.ndarray,
    alone: tuple[int, ...] = (),
) -> Candidate:
    """Resolve and replay one well-formed transfer list on the fixed order (``ops``: :func:`fixed_arrays`);
    the units in ``alone`` move a_i alone."""
    op_kind, op_stage = ops
    kind, unit, op, at, before = transfers
    for arr in transfers:
        # Read-only like Schedule.arrays(): the kernels then reuse simulate()'s compiled code.
        arr.setflags(write=False)
    tr_act = None
    if alone:
        tr_act = np.isin(unit, np.asarray(alone, dtype=np.int64)).astype(np.int64)
        tr_act.setflags(write=False)
    structure = resolve(chain.length, op_kind, op_stage, kind, unit, op, at, before, tr_act)
    out = replay(chain, platform, structure)
    op_end, peak, rule = out[1], out[7], out[9]
    moved = int(saved[np.asarray(units, dtype=np.int64)].sum()) if units else 0
    if alone:
        idx = np.asarray(alone, dtype=np.int64)
        moved -= int(saved[idx].sum()) - int(chain.act[idx].sum())
    return Candidate(chain.length, units, transfers, op_end[-1] if op_end.shape[0] else 0.0, peak, rule, moved, alone=alone)


def plan_units(
    chain: Chain,
    platform: Platform,
    chosen: np.ndarray,
    ops: tuple[np.ndarray, np.ndarray],
    saved: np.ndarray,
    alone: tuple[int, ...] = (),
) -> Candidate:
    """The best of the planner's plans (:func:`plan_arrays`) for the sorted units ``chosen``, scored
    (those in ``alone`` move a_i alone).

    Feasible first, then the shorter makespan, then the lower peak (a hint for repairs); ties
    go to the earlier plan.
    """
    key = tuple(chosen.tolist())
    if not key:
        empty = np.zeros(0, dtype=np.int64)
        return score(chain, platform, key, (empty, empty, empty, empty, empty), ops, saved)
    best = None
    best_key = None
    for transfers in plan_arrays(chain, platform, chosen, np.asarray(alone, dtype=np.int64)):
        cand = score(chain, platform, key, transfers, ops, saved, alone)
        rank = (0, cand.makespan, cand.peak) if cand.feasible else (1, 0.0, cand.peak)
        if best_key is None or rank < best_key:
            best, best_key = cand, rank
    return best
