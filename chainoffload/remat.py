"""Rematerialization schedules: their structure, their memory semantics, their simulation.

A schedule *has remat* when its compute sequence holds ``"Fck"`` / ``"Fn"`` ops or repeats a
forward (see :attr:`Schedule.has_remat`). :func:`validate_remat` checks such a sequence (it is
called by :meth:`Schedule.validate`); :func:`simulate_remat` replays it (called by
:func:`chainoffload.simulate`, which stays the one entry point). Builders used by the solvers
(:func:`persistent_schedule`) live here too, so that every remat solver emits the same shapes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ._kernels.simulate_remat import simulate_remat_kernel
from .schedule import OP_CODE, Schedule, ScheduleError

if TYPE_CHECKING:
    from .chain import Chain
    from .platform import Platform
    from .simulate import Timeline

__all__ = ["validate_remat", "simulate_remat", "RematStructure"]

# Instance kinds: what of unit i is on the GPU.
_ACT = 0  # only a_i (made by Fck_i / Fn_i): act[i] bytes
_FULL = 1  # the whole unit (made by F_i): saved[i] bytes


@dataclasses.dataclass(frozen=True, eq=False)
class RematStructure:
    """A remat schedule resolved into instances (depends on the chain's length only).

    An *instance* is one residency of unit i's data: made by one forward op, read by later
    ops, freed by one op. ``inst_kind`` is 0 when only a_i is held (act[i] bytes), 1 when the
    whole unit is (saved[i] bytes). The arrays are those the kernel takes.
    """

    op_inst: np.ndarray
    use_ptr: np.ndarray
    use_inst: np.ndarray
    free_ptr: np.ndarray
    free_inst: np.ndarray
    inst_unit: np.ndarray
    inst_kind: np.ndarray
    inst_prod: np.ndarray
    inst_off: np.ndarray
    inst_pre: np.ndarray
    tr_inst: np.ndarray

    def inst_size(self, chain: "Chain") -> np.ndarray:
        """Bytes of each instance on ``chain``."""
        units = self.inst_unit
        return np.where(self.inst_kind == _FULL, chain.saved[units - 1], chain.act[units]).astype(np.int64)


def validate_remat(schedule: Schedule, length: int) -> RematStructure:
    """Check a rematerialization sequence and its transfers; raise :class:`ScheduleError`.

    Rules (the state of unit i is *none*, *a* (only a_i, made by Fck_i / Fn_i) or *full*
    (saved[i], made by F_i)):

    * every B_i occurs exactly once, in the order B_L, ..., B_1; B_i needs unit i *full* and
      a_{i-1} present (unit i-1 *a* or *full*, or i = 1);
    * every forward op of stage i (F, Fck, Fn) needs a_{i-1} present, and none runs after B_i;
      Fck_i / Fn_i also not after B_{i+1} (their output a_i would have no reader);
    * F_i needs unit i *none* or *a* (an F_all re-run over a resident a_i replaces it);
      Fck_i / Fn_i need unit i *none*;
    * Fn_i frees its input: it needs unit i-1 in state *a* (a_0 is never freed, so Fn_1 is
      allowed and frees nothing; a whole unit i-1 cannot lose only its a_{i-1});
    * an offload of unit i is triggered when unit i is present and its maker has ended
      (at or after the maker's end event); it moves that instance; the instance is neither
      freed nor remade before its prefetch is triggered (every op that frees it comes after
      the prefetch trigger and waits for the prefetch).

    Returns the resolved :class:`RematStructure` (cached on the schedule per length).
    """
    cache = schedule.__dict__.setdefault("_remat_structure", {})
    if length in cache:
        return cache[length]
    struct = _analyze(schedule, length)
    cache[length] = struct
    return struct


def _analyze(schedule: Schedule, length: int) -> RematStructure:
    compute = schedule.compute
    n = len(compute)
    state = [0] * (length + 1)  # 0 none, 1 a, 2 full; index 0 unused (a_0 always present)
    current = [-1] * (length + 1)  # instance id of unit i, -1 when none
    done_b = [False] * (length + 2)
    inst_unit: list[int] = []
    inst_kind: list[int] = []
    inst_prod: list[int] = []
    inst_free: list[int] = []
    op_inst = [-1] * n
    uses: list[list[int]] = [[] for _ in range(n)]
    frees: list[list[int]] = [[] for _ in range(n)]
    next_b = length
    # events at which each instance is alive: maker end event .. free op start event
    inst_alive_from: list[int] = []

    def where(k: int) -> str:
        kind, stage = compute[k]
        return f"schedule.compute[{k}] ({kind}_{stage})"

    def new_instance(unit: int, kind: int, k: int) -> int:
        inst_unit.append(unit)
        inst_kind.append(kind)
        inst_prod.append(k)
        inst_free.append(-1)
        inst_alive_from.append(2 * k + 1)
        return len(inst_unit) - 1

    def free(unit: int, k: int) -> None:
        u = current[unit]
        inst_free[u] = k
        frees[k].append(u)
        current[unit] = -1
        state[unit] = 0

    for k, (kind, i) in enumerate(compute):
        if kind == "B":
            if i != next_b:
                raise ScheduleError(
                    f"{where(k)}: backward ops must run once each in the order B_{length}..B_1; expected B_{next_b}"
                    if next_b >= 1
                    else f"{where(k)}: B_{i} runs a second time"
                )
            if state[i] != 2:
                raise ScheduleError(
                    f"{where(k)}: B_{i} needs unit {i} whole on the GPU, but no F_{i} (F_all) ran since it was last freed"
                )
            if i > 1 and state[i - 1] == 0:
                raise ScheduleError(f"{where(k)}: B_{i} reads a_{i - 1}, which is not resident")
            uses[k].append(current[i])
            if i > 1:
                uses[k].append(current[i - 1])
            free(i, k)
            if i > 1 and state[i - 1] == 1:
                # A lone a_{i-1} has no reader once stage i is done.
                free(i - 1, k)
            done_b[i] = True
            next_b -= 1
            continue
        if done_b[i]:
            raise ScheduleError(f"{where(k)}: stage {i} runs a forward after its backward B_{i}")
        if kind != "F" and i < length and done_b[i + 1]:
            raise ScheduleError(f"{where(k)}: {kind}_{i} after B_{i + 1}: its output a_{i} would have no reader")
        if i > 1 and state[i - 1] == 0:
            raise ScheduleError(f"{where(k)}: {kind}_{i} reads a_{i - 1}, which is not resident")
        if i > 1:
            uses[k].append(current[i - 1])
        if kind == "F":
            if state[i] == 2:
                raise ScheduleError(f"{where(k)}: F_{i} while unit {i} is already resident whole")
            if state[i] == 1:
                # The re-run's output replaces the lone a_i, freed at the end of F_i.
                uses[k].append(current[i])
                free(i, k)
            op_inst[k] = current[i] = new_instance(i, _FULL, k)
            state[i] = 2
        else:
            if state[i] != 0:
                raise ScheduleError(f"{where(k)}: {kind}_{i} while a_{i} is already resident")
            if kind == "Fn" and i > 1:
                if state[i - 1] != 1:
                    raise ScheduleError(
                        f"{where(k)}: Fn_{i} frees its input a_{i - 1}, but unit {i - 1} is kept whole by F_{i - 1}; use Fck_{i}"
                    )
                free(i - 1, k)
            op_inst[k] = current[i] = new_instance(i, _ACT, k)
            state[i] = 1
    if next_b >= 1:
        raise ScheduleError(f"schedule.compute: B_{next_b} never runs (backward ops must run B_{length}..B_1)")

    # Transfers: attach each to the instance present at its trigger.
    n_inst = len(inst_unit)
    by_unit: dict[int, list[int]] = {}
    for u in range(n_inst):
        by_unit.setdefault(inst_unit[u], []).append(u)
    inst_off = [-1] * n_inst
    inst_pre = [-1] * n_inst
    tr_inst = [-1] * len(schedule.transfers)
    offload_of: dict[int, int] = {}
    for idx, t in enumerate(schedule.transfers):
        if t.kind == "offload":
            offload_of[t.unit] = idx
    for idx, t in enumerate(schedule.transfers):
        if t.kind != "offload":
            continue
        event = t.event
        hit = -1
        for u in by_unit.get(t.unit, ()):
            end = 2 * inst_free[u] + 1 if inst_free[u] >= 0 else 2 * n
            if inst_alive_from[u] <= event < end:
                hit = u
        if hit < 0:
            raise ScheduleError(
                f"schedule.transfers[{idx}]: offload of unit {t.unit} is triggered when unit {t.unit} is not on the GPU "
                "(before its maker ends, or after it is freed)"
            )
        inst_off[hit] = idx
        tr_inst[idx] = hit
    for idx, t in enumerate(schedule.transfers):
        if t.kind != "prefetch":
            continue
        u = tr_inst[offload_of[t.unit]]
        if inst_free[u] >= 0 and t.event >= 2 * inst_free[u]:
            raise ScheduleError(
                f"schedule.transfers[{idx}]: prefetch of unit {t.unit} is triggered at or after "
                f"{where(inst_free[u])}, which frees that data"
            )
        inst_pre[u] = idx
        tr_inst[idx] = u

    def csr(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        ptr = np.zeros(len(lists) + 1, dtype=np.int64)
        for k, items in enumerate(lists):
            ptr[k + 1] = ptr[k] + len(items)
        flat = np.array([u for items in lists for u in items], dtype=np.int64)
        return ptr, flat

    use_ptr, use_inst = csr(uses)
    free_ptr, free_inst = csr(frees)
    arrays = dict(
        op_inst=np.array(op_inst, dtype=np.int64),
        use_ptr=use_ptr,
        use_inst=use_inst,
        free_ptr=free_ptr,
        free_inst=free_inst,
        inst_unit=np.array(inst_unit, dtype=np.int64),
        inst_kind=np.array(inst_kind, dtype=np.int64),
        inst_prod=np.array(inst_prod, dtype=np.int64),
        inst_off=np.array(inst_off, dtype=np.int64),
        inst_pre=np.array(inst_pre, dtype=np.int64),
        tr_inst=np.array(tr_inst, dtype=np.int64),
    )
    for arr in arrays.values():
        arr.setflags(write=False)
    return RematStructure(**arrays)


def op_durations(chain: "Chain", schedule: Schedule) -> np.ndarray:
    """Duration of every compute op: fwd for F, fwd_nosave for Fck / Fn, bwd for B."""
    kind, stage, *_ = schedule.arrays()
    idx = stage - 1
    return np.where(
        kind == OP_CODE["B"], chain.bwd[idx], np.where(kind == OP_CODE["F"], chain.fwd[idx], chain.fwd_nosave[idx])
    ).astype(np.float64)


def simulate_remat(chain: "Chain", platform: "Platform", schedule: Schedule) -> "Timeline":
    """Replay a rematerialization schedule; the same rules as the fixed order, op by op.

    Called by :func:`chainoffload.simulate` for schedules with :attr:`Schedule.has_remat`;
    call that instead. Timing decisions (trigger order, FIFO channels, waits, instants, the
    first rule broken) are those of :func:`chainoffload.simulate`.

    Memory semantics (rotor's model, Beaumont et al. 2019, in DESIGN.md's byte rules)
    -------------------------------------------------------------------------------------
    * **F_i** ("F", F_all; time ``fwd[i]``) allocates saved[i] + fwd_tmp[i] at its start and
      frees fwd_tmp[i] at its end: unit i is then *whole*. Run while a lone a_i is resident
      (a re-run from an earlier checkpoint), it replaces that a_i: the lone copy is freed at
      the end of F_i, so both are counted while F_i runs.
    * **Fck_i** (time ``fwd_nosave[i]``) allocates act[i] + fwd_tmp[i] at its start, frees
      fwd_tmp[i] at its end, and keeps its input: unit i holds *only a_i*.
    * **Fn_i** is Fck_i that also frees its input a_{i-1} at its end (a lone a_{i-1}; a_0
      stays, being the chain's input).
    * **B_i** allocates g_{i-1} + bwd_tmp[i] at its start (B_L also g_L), and at its end frees
      saved[i], g_i, bwd_tmp[i] and, when unit i-1 holds only a_{i-1}, that a_{i-1} too (a
      checkpoint has no reader once stage i is done). a_0 is freed at the end of B_1.
    * **Reads**: a forward of stage i and B_i read a_{i-1}; B_i reads unit i.
    * **Transfers** move the instance present at the trigger: saved[i] bytes for a whole
      unit, act[i] bytes for a lone a_i (e.g. the checkpoint an Fck made). The GPU copy is
      freed at max(end of the offload, end of every op that reads it and comes before the
      prefetch's trigger) -- the fixed order's "F_{i+1} still reads a_i", generalised. The
      prefetch allocates the same bytes at its start. Every op that reads or frees the
      instance after the prefetch's trigger waits for the prefetch's end; an op whose own
      start triggers that prefetch cannot wait, which is a ``read`` violation.

    Returns
    -------
    Timeline
        As :func:`chainoffload.simulate`; ``offloaded_bytes`` counts each transfer's instance.
    """
    from .simulate import _timeline_from_kernel

    struct = validate_remat(schedule, chain.length)
    op_kind, op_stage, tr_kind, _tr_unit, tr_op, tr_at, tr_before = schedule.arrays()
    inst_size = struct.inst_size(chain)
    out = simulate_remat_kernel(
        chain.act,
        chain.fwd_tmp,
        chain.bwd_tmp,
        platform.memory,
        platform.bandwidth_d2h,
        platform.bandwidth_h2d,
        platform.latency,
        platform.duplex,
        op_kind,
        op_stage,
        op_durations(chain, schedule),
        struct.op_inst,
        struct.use_ptr,
        struct.use_inst,
        struct.free_ptr,
        struct.free_inst,
        inst_size,
        struct.inst_prod,
        struct.inst_off,
        struct.inst_pre,
        tr_kind,
        struct.tr_inst,
        tr_op,
        tr_at,
        tr_before,
    )
    timeline = _timeline_from_kernel(chain, platform, schedule, out)
    moved = int(sum(int(inst_size[struct.tr_inst[t]]) for t in range(len(schedule.transfers)) if schedule.transfers[t].kind == "offload"))
    return dataclasses.replace(timeline, offloaded_bytes=moved)
