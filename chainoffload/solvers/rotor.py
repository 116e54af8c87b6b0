"""Method ``rotor``: optimal persistent checkpointing of a heterogeneous chain (no offloading).

The dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal
checkpointing for heterogeneous chains: how to train deep neural networks with limited
memory" (2019), in this project's byte rules (docs/model.md) with memory counted in slots.

NOTE [ rotor recurrence ]
-------------------------
A segment (s, t) starts with a_{s-1} resident (held by whoever made it, outside the segment)
and, when t < L, the gradient g_t; it must run B_t, ..., B_s and end with g_{s-1}. Its budget
m is the memory it may use on top of what lies outside it, g_t included (g(t) = act[t] for
t < L, 0 for t = L since B_L makes g_L itself). usage_B(i) = saved[i] + act[i] + act[i-1] +
bwd_tmp[i] is what B_i holds of its own (unit i, g_i, g_{i-1}, its transient).

* s = t: F_s then B_s; needs m >= max(g(t) + saved[s] + fwd_tmp[s], usage_B(s)).
* "F_all on s": F_s, then (s+1, t) with budget m - saved[s] (unit s stays), then B_s; needs
  g(t) + saved[s] + fwd_tmp[s] <= m and usage_B(s) <= m.
* "checkpoint a_{j-1}" (s < j <= t): Fck_s, Fn_{s+1}, ..., Fn_{j-1} (each Fn frees its
  input), leaving a_{s-1} and a lone a_{j-1}; then (j, t) with budget m - act[j-1]; B_j frees
  the lone a_{j-1}, so then (s, j-1) runs with budget m. Needs g(t) + act[s] + fwd_tmp[s] <= m
  and g(t) + act[k-1] + act[k] + fwd_tmp[k] <= m for every Fn_k.

Each term is exactly the peak the simulator sees at that op (frees at an instant come before
allocations), so the table's value is the simulated makespan. Sizes are rounded *up* to
slots and the budget *down*, so every schedule rebuilt from the table fits in bytes. Ties go
to "F_all", so a budget that holds everything recomputes nothing. O(S L^3) time, O(S L^2)
memory.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .._kernels.rotor import rotor_table
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import simulate
from . import OptionError
from .remat_baselines import recompute_all_schedule

__all__ = ["rotor", "Slots", "slots_for", "rotor_schedule", "DEFAULT_SLOTS"]

#: Memory slots of the dynamic programs when none are given.
DEFAULT_SLOTS = 500


@dataclass(frozen=True)
class Slots:
    """A chain's sizes in slots of ``quantum`` bytes, and the budget the DP may use.

    ``up`` rounds a size up (what the DP charges), ``down`` rounds it down (what the DP may
    give back), so that a plan within ``budget`` slots fits within the byte budget.
    """

    quantum: int
    budget: int
    act: np.ndarray
    saved: np.ndarray
    fwd_tmp: np.ndarray
    bwd_tmp: np.ndarray
    act_down: np.ndarray
    saved_down: np.ndarray


def slots_for(chain: Chain, memory: int, slots: int) -> Slots:
    """Round ``chain``'s sizes to slots for a budget of ``memory - act[0]`` bytes in ``slots`` slots.

    Parameters
    ----------
    chain
        The chain.
    memory
        GPU memory limit in bytes (a_0 is taken out: it stays resident throughout).
    slots
        Number of slots S the budget is cut into (>= 1).
    """
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise OptionError(f"slots: {slots!r} must be an integer >= 1")
    budget_bytes = int(memory) - int(chain.act[0])
    quantum = max(1, -(-max(budget_bytes, 0) // int(slots)))
    budget = max(budget_bytes, 0) // quantum

    def up(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(-(-a.astype(np.int64) // quantum))

    def down(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.astype(np.int64) // quantum)

    return Slots(
        quantum=quantum,
        budget=int(budget),
        act=up(chain.act),
        saved=up(chain.saved),
        fwd_tmp=up(chain.fwd_tmp),
        bwd_tmp=up(chain.bwd_tmp),
        act_down=down(chain.act),
        saved_down=down(chain.saved),
    )


def _table(chain: Chain, sl: Slots) -> tuple[np.ndarray, np.ndarray]:
    return rotor_table(
        chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget
    )


def emit_segment(ops: list[tuple[str, int]], choice: np.ndarray, sl: Slots, s: int, t: int, m: int) -> None:
    """Append to ``ops`` the compute ops of segment (s, t) at budget ``m`` from rotor's ``choice``."""
    # Explicit stack: ("seg", s, t, m) expands a segment, ("op", kind, stage) emits an op.
    stack: list[tuple] = [("seg", s, t, m)]
    while stack:
        item = stack.pop()
        if item[0] == "op":
            ops.append((item[1], item[2]))
            continue
        _, s, t, m = item
        if s == t:
            ops.append(("F", s))
            ops.append(("B", s))
            continue
        j = int(choice[s, t, m])
        if j < 0:
            raise AssertionError(f"rotor table has no choice for segment ({s}, {t}) at budget {m}")
        if j == 0:
            ops.append(("F", s))
            stack.append(("op", "B", s))
            stack.append(("seg", s + 1, t, m - int(sl.saved[s - 1])))
        else:
            ops.append(("Fck", s))
            ops.extend(("Fn", k) for k in range(s + 1, j))
            stack.append(("seg", s, j - 1, m))
            stack.append(("seg", j, t, m - int(sl.act[j - 1])))


def rotor_schedule(choice: np.ndarray, sl: Slots, length: int) -> Schedule:
    """Rebuild the compute sequence of the top segment (1, L) at budget ``sl.budget`` from ``choice``."""
    ops: list[tuple[str, int]] = []
    emit_segment(ops, choice, sl, 1, length, sl.budget)
    return Schedule(tuple(ops), ())


def rotor(chain: Chain, platform: Platform, *, slots: int = DEFAULT_SLOTS) -> Result:
    """Optimal persistent checkpointing (rematerialization only, no transfer).

    Parameters
    ----------
    chain, platform
        The instance (the platform's bandwidths are not used).
    slots
        Number of memory slots S of the dynamic program; more slots lose less to rounding
        (each size is rounded up to a slot) and cost time linearly.

    Returns
    -------
    Result
        ``feasible`` with the rebuilt schedule (optimal among persistent checkpointing
        schedules up to slot rounding), or ``infeasible`` with ``min_memory`` when even
        the most frugal sequence does not fit in the slot-rounded budget.
    """
    t0 = time.perf_counter()
    sl = slots_for(chain, platform.memory, slots)
    opt, choice = _table(chain, sl)
    value = float(opt[1, chain.length, sl.budget]) if sl.budget >= 0 else math.inf
    info = {"slots": int(slots), "quantum": sl.quantum, "budget_slots": sl.budget, "dp_makespan": value}
    # Both sequences below are persistent checkpointing sequences that slot rounding can hide
    # from the table near its two ends: keep-all (optimal whenever it fits) and the most
    # frugal one (the least memory of all).
    for name, fallback in (("keep-all", Schedule.keep_all(chain.length)), ("recompute-all", recompute_all_schedule(chain.length))):
        if name == "recompute-all" and math.isfinite(value):
            break
        timeline = simulate(chain, platform, fallback)
        if timeline.feasible:
            info.update(source=name, recomputed=sum(1 for k, _ in fallback.compute if k in ("Fck", "Fn")))
            return Result("rotor", Status.FEASIBLE, fallback, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info)
    if not math.isfinite(value):
        least = _least_budget(opt, chain.length)
        return Result(
            "rotor",
            Status.INFEASIBLE,
            None,
            runtime=time.perf_counter() - t0,
            min_memory=None if least is None else int(chain.act[0]) + least * sl.quantum,
            info=info,
            message=f"rotor: no checkpointing sequence fits in {platform.memory} B at {slots} slots",
        )
    schedule = rotor_schedule(choice, sl, chain.length)
    timeline = simulate(chain, platform, schedule)
    info.update(source="dp", recomputed=sum(1 for k, _ in schedule.compute if k in ("Fck", "Fn")))
    return Result(
        "rotor",
        Status.FEASIBLE if timeline.feasible else Status.ERROR,
        schedule,
        makespan=timeline.makespan if timeline.feasible else math.inf,
        runtime=time.perf_counter() - t0,
        info=info,
        message="" if timeline.feasible else f"rotor: simulator rejects the rebuilt schedule: {timeline.violation.message}",
    )


def _least_budget(opt: np.ndarray, length: int) -> int | None:
    finite = np.flatnonzero(np.isfinite(opt[1, length, :]))
    return int(finite[0]) if finite.size else None
