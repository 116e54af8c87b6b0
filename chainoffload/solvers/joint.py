"""Method ``joint``: rematerialization and offloading together, by dynamic programming.

In the spirit of Beaumont, Eyraud-Dubois, Shilova, "Efficient Combination of
Rematerialization and Offloading for Training DNNs" (NeurIPS 2021): the rotor recurrence
(``NOTE [ rotor recurrence ]`` in :mod:`chainoffload.solvers.rotor`) gains states in which a
segment's input is sent to the host while the segment works on later stages, and comes back
before the segment needs it again. The paper's full text is not at hand; this recurrence is
ours, held to rotor and to pure offloading by the tests.

NOTE [ joint recurrence ]
-------------------------
Segment (s, t) as in rotor, plus an input state f: f = 0 the input a_{s-1} stays on the GPU;
f = 1 the input is unit s-1 kept whole (the parent ran F_all on s-1) and f = 2 it is a lone
a_{s-1} (the parent's checkpoint); with f > 0 that input X (x bytes) is offloaded at the
start of the segment's first op, which reads it. The budget m counts X as outside the
segment, so while X is on the host the segment may use m + x.

* "F_all on s" with f > 0: F_s (X present), then the sub-segment (s+1, t) waits for the
  offload to end (wait max(0, D(x) - fwd[s])) and runs with budget m - saved[s] + x; the
  prefetch of X starts with the sub-segment's last op B_{s+1}, which must fit with X back:
  saved[s] + usage_B(s+1) <= m; B_s waits for it (max(0, H(x) - bwd[s+1])).
* "checkpoint a_{j-1}" with f > 0: Fck_s, Fn_{s+1}..Fn_{j-1} (X counted present), then
  (j, t) waits for the offload (max(0, D(x) - time of the Fck/Fn run)) with budget
  m - act[j-1] + x; the prefetch starts with B_j, which must fit with X back:
  act[j-1] + usage_B(j) <= m; then (s, j-1) waits for it (max(0, H(x) - bwd[j])) and runs
  with f = 0.
* A parent chooses its children's states: "F_all on s" passes f in {0, 1} to (s+1, t);
  "checkpoint a_{j-1}" passes f in {0, 2} to (j, t) and f = 0 to (s, j-1).

Every transfer therefore starts on an idle channel (each offload is waited for before the
next child starts, each prefetch before the op after it), so D(x) = latency + x/bandwidth
and the waits are exactly the simulator's. A segment's first segment-child is the only one
that may offload the input, so each unit is offloaded at most once. With f = 0 everywhere the
recurrence is rotor's, evaluated in the same order with strict improvement, so at bandwidth 0
the two give the same schedule.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .._kernels.joint import joint_table
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule, Transfer
from ..simulate import simulate
from .rotor import DEFAULT_SLOTS, Slots, slots_for

__all__ = ["joint", "joint_dp"]


def _times(platform: Platform, sizes: np.ndarray, bandwidth: float) -> np.ndarray:
    if bandwidth <= 0:
        return np.full(sizes.shape[0], np.inf)
    return np.array([platform.latency + int(x) / bandwidth for x in sizes], dtype=np.float64)


def _table(chain: Chain, platform: Platform, sl: Slots) -> tuple[np.ndarray, np.ndarray]:
    d_act = _times(platform, chain.act, platform.bandwidth_d2h)
    h_act = _times(platform, chain.act, platform.bandwidth_h2d)
    d_saved = _times(platform, chain.saved, platform.bandwidth_d2h)
    h_saved = _times(platform, chain.saved, platform.bandwidth_h2d)
    return joint_table(
        chain.fwd,
        chain.bwd,
        chain.fwd_nosave,
        sl.act,
        sl.saved,
        sl.fwd_tmp,
        sl.bwd_tmp,
        sl.act_down,
        sl.saved_down,
        d_act,
        d_saved,
        h_act,
        h_saved,
        sl.budget,
    )


def _rebuild(choice: np.ndarray, sl: Slots, length: int) -> Schedule:
    """Emit the compute sequence and the triggered transfers of the top segment."""
    ops: list[tuple[str, int]] = []
    transfers: list[Transfer] = []
    cap = sl.budget

    def emit(f: int, s: int, t: int, m: int) -> None:
        first = len(ops)
        if s == t:
            ops.append(("F", s))
            ops.append(("B", s))
            return
        code = int(choice[f, s, t, m])
        if code < 0:
            raise AssertionError(f"joint table has no choice for segment ({s}, {t}) state {f} at budget {m}")
        j, fc = divmod(code, 4)
        x_dn = 0 if f == 0 else int(sl.saved_down[s - 2] if f == 1 else sl.act_down[s - 1])
        if j == 0:
            ops.append(("F", s))
            child_first = len(ops)
            emit(fc, s + 1, t, min(cap, m - int(sl.saved[s - 1]) + x_dn))
        else:
            ops.append(("Fck", s))
            ops.extend(("Fn", k) for k in range(s + 1, j))
            child_first = len(ops)
            emit(fc, j, t, min(cap, m - int(sl.act[j - 1]) + x_dn))
        last_b = len(ops) - 1  # B_{s+1} or B_j: the child's last op
        if f > 0:
            transfers.append(Transfer("offload", s - 1, first, "start", before=child_first))
            transfers.append(Transfer("prefetch", s - 1, last_b, "start"))
        if j == 0:
            ops.append(("B", s))
        else:
            emit(0, s, j - 1, m)

    emit(0, 1, length, sl.budget)
    return Schedule(tuple(ops), tuple(transfers))


def joint_dp(chain: Chain, platform: Platform, *, slots: int = DEFAULT_SLOTS) -> Result:
    """The joint dynamic program alone: its rebuilt schedule, simulated; repaired if rejected.

    Repair: when the simulator rejects the plan (it should not: see ``NOTE [ joint
    recurrence ]``), the DP is rerun on a smaller memory, down to half, until one passes.
    """
    t0 = time.perf_counter()
    info: dict = {"slots": int(slots)}
    last_message = ""
    for shrink in (1.0, 0.995, 0.98, 0.95, 0.9, 0.8, 0.65, 0.5):
        memory = int(platform.memory * shrink)
        sl = slots_for(chain, memory, slots)
        opt, choice = _table(chain, platform, sl)
        value = float(opt[0, 1, chain.length, sl.budget])
        if not math.isfinite(value):
            break
        schedule = _rebuild(choice, sl, chain.length)
        timeline = simulate(chain, platform, schedule)
        info.update(quantum=sl.quantum, budget_slots=sl.budget, dp_makespan=value, shrink=shrink)
        if timeline.feasible:
            info["offloaded_units"] = list(schedule.offloaded_units)
            info["recomputed"] = sum(1 for k, _ in schedule.compute if k in ("Fck", "Fn"))
            return Result(
                "joint", Status.FEASIBLE, schedule, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info
            )
        last_message = timeline.violation.message
    return Result(
        "joint",
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        info=info,
        message=f"joint: no plan fits in {platform.memory} B at {slots} slots" + (f" ({last_message})" if last_message else ""),
    )


def _pure_offload_method() -> str:
    from . import _REGISTRY

    spec = _REGISTRY.get("best")
    return "best" if spec is not None and not spec.remat else "largest-first"


def joint(chain: Chain, platform: Platform, *, slots: int = DEFAULT_SLOTS, offload_method: str | None = None) -> Result:
    """Rematerialization plus offloading: the best of the joint DP, rotor and pure offloading.

    Both rotor (no transfer) and pure offloading (no recomputation) are special cases of the
    combined problem, so the method returns whichever of the three simulates fastest; ``info``
    says which (``"source"``) and keeps each one's makespan.

    Parameters
    ----------
    chain, platform
        The instance.
    slots
        Memory slots of the dynamic programs.
    offload_method
        The pure-offloading method to compare with; default ``best`` when it is registered
        as a pure-offloading method, else ``largest-first``.
    """
    from . import solve
    from .rotor import rotor

    t0 = time.perf_counter()
    candidates = {"joint-dp": joint_dp(chain, platform, slots=slots), "rotor": rotor(chain, platform, slots=slots)}
    name = offload_method or _pure_offload_method()
    candidates[name] = solve(chain, platform, method=name)
    best_name, best = None, None
    for key, res in candidates.items():
        if res.status.has_schedule and (best is None or res.makespan < best.makespan):
            best_name, best = key, res
    info = {f"{key}_makespan": res.makespan for key, res in candidates.items()}
    info.update(candidates["joint-dp"].info)
    runtime = time.perf_counter() - t0
    if best is None:
        least = [r.min_memory for r in candidates.values() if r.min_memory is not None]
        return Result(
            "joint",
            Status.INFEASIBLE,
            None,
            runtime=runtime,
            min_memory=min(least) if least else None,
            info=info,
            message=f"joint: neither the joint DP, rotor nor {name} fits in {platform.memory} B",
        )
    info["source"] = best_name
    return Result("joint", Status.FEASIBLE, best.schedule, makespan=best.makespan, runtime=runtime, info=info)
