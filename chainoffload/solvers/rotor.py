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
memory; the table is a table of integer lower bounds (4 bytes an entry, filled one budget at
a time, 16 to a vector) from which the entries the schedule needs are made exact on demand
(``NOTE [ rotor by bounds ]`` in :mod:`chainoffload._kernels.rotor`): equal bit for bit to
the dense float64 table of the recurrence, at any entry asked.

NOTE [ never lose to the family ]
---------------------------------
Slot rounding makes the table conservative: each size is charged up to one slot too many, and
the budget loses up to one slot. At a memory where a schedule of the family fits with no byte to
spare (checkpoint every block, at its own peak: the budget a user compares against), the table
may not see it and returns a slower plan (measured on a 16-stage T5-like chain with sizes as a
profile gives them: 2 % slower than checkpointing every block, at its peak). Three steps close
that gap, each checked by the simulator in bytes, the fastest kept:

* *An exact slot.* When one slot size divides the budget and every size (:func:`exact_quantum`)
  and the budget is then at most S slots, it is used: nothing is rounded and the table is the
  exact optimum of the family, in fewer slots.
* *The lifted table.* Otherwise the table is filled up to :func:`lift_slots` slots above the
  budget (at most L + 6: what one check of the recurrence can lose to rounding); its plans there
  are tried in bytes, the top one and then a bisection for the largest budget whose plan fits
  (the plans' times fall as the budget grows). The plan at the budget itself always fits.
* *The fixed policies.* Keep-all (before any table), checkpoint-all, sqrt-checkpoint and
  recompute-all are built and simulated whenever their compute time (closed form) is below the
  plan in hand, so rotor is never slower than one of them at a memory where it fits.

``info["source"]`` says which won ("dp", "dp-lifted" with ``info["lifted_by"]`` slots,
"keep-all", or the policy's name).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from .._kernels import lazy
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import simulate
from ._options import OptionError

__all__ = ["rotor", "Slots", "slots_for", "exact_quantum", "lift_slots", "rotor_schedule", "RotorTable", "fill_rotor_table", "default_slots", "DEFAULT_SLOTS"]

_krot = lazy("rotor")  # imports Numba on first use only

#: Memory slots of the dynamic programs when none are given.
DEFAULT_SLOTS = 500

#: Bound on rotor's table when it picks the slots itself, at 8 bytes a (segment, budget) entry
#: (the bounds take 4, their spares and index less than 4 more).
TABLE_BYTES = 4 * 2**30


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


def exact_quantum(chain: Chain, memory: int) -> int:
    """The largest slot that divides the budget ``memory - act[0]`` and every size of ``chain``.

    With it no size and no budget is rounded, so rotor's table is the exact optimum. 0 when the
    budget is not positive.

    Parameters
    ----------
    chain
        The chain.
    memory
        GPU memory limit in bytes.
    """
    budget_bytes = int(memory) - int(chain.act[0])
    if budget_bytes <= 0:
        return 0
    g = budget_bytes
    for a in (chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp):
        g = math.gcd(g, int(np.gcd.reduce(a.astype(np.int64))) if a.shape[0] else 0)
    return g


def slots_for(chain: Chain, memory: int, slots: int, *, exact: bool = False) -> Slots:
    """Round ``chain``'s sizes to slots for a budget of ``memory - act[0]`` bytes in ``slots`` slots.

    Parameters
    ----------
    chain
        The chain.
    memory
        GPU memory limit in bytes (a_0 is taken out: it stays resident throughout).
    slots
        Number of slots S the budget is cut into (>= 1).
    exact
        Use :func:`exact_quantum` as the slot when the budget is then at most ``slots`` slots:
        nothing is rounded, in fewer slots (rotor; the joint DP's queues, which move bytes in
        slots, keep the even cut).
    """
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise OptionError(f"slots: {slots!r} must be an integer >= 1")
    budget_bytes = int(memory) - int(chain.act[0])
    quantum = max(1, -(-max(budget_bytes, 0) // int(slots)))
    if exact:
        g = exact_quantum(chain, memory)
        if g and budget_bytes // g <= int(slots):
            quantum = g
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


def default_slots(length: int) -> int:
    """The slots rotor uses when none are given: :data:`DEFAULT_SLOTS`, fewer on very long chains.

    The table holds at most L (L + 1) / 2 (S + 1) entries; S is lowered so that 8 bytes each
    stay within :data:`TABLE_BYTES` (L = 1000 keeps 500 slots, L = 3000 gets 118).

    Parameters
    ----------
    length
        The chain's length L.
    """
    segments = length * (length + 1) // 2
    fit = TABLE_BYTES // (8 * max(segments, 1)) - 1
    return int(max(1, min(DEFAULT_SLOTS, fit)))


class RotorTable:
    """Rotor's table of one chain on one slot rounding (``NOTE [ rotor by bounds ]``).

    Equal, entry for entry, to the dense table of ``NOTE [ rotor recurrence ]``: :meth:`value`
    is opt[s, t, m] and ``choice[s, t, m]`` the option the schedule takes there (0: "F_all
    on s", j > s: "checkpoint a_{j-1}", -1: the segment cannot run). Both are made exact on
    demand from the table of lower bounds, and kept.
    """

    def __init__(self, chain: Chain, slots: Slots, store: np.ndarray, zs: np.ndarray, rof: np.ndarray, scale: float) -> None:
        self.chain = chain
        self.slots = slots
        self.store = store
        self.zs = zs
        self.rof = rof
        self.scale = float(scale)
        self._keys = np.full(1024, -1, dtype=np.int64)
        self._vals = np.empty(1024)
        self._picks = np.empty(1024, dtype=np.int32)
        self._count = 0

    def _entry(self, s: int, t: int, m: int) -> tuple[float, int]:
        n, sl = self.chain.length, self.slots
        if not (1 <= s <= t <= n) or m > sl.budget:
            raise IndexError(f"rotor table has no entry ({s}, {t}, {m})")
        if m < 0:
            return math.inf, -1
        key = (s * (n + 2) + t) * (sl.budget + 1) + m
        i = int(_krot._memo_slot(self._keys, key))
        if self._keys[i] != key:
            ch = self.chain
            self._keys, self._vals, self._picks, count = _krot.exact_entries(
                ch.fwd, ch.bwd, ch.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget, self.scale,
                self.store, self.zs, self.rof, self._keys, self._vals, self._picks, self._count, s, t, m,
            )
            self._count = int(count)
            i = int(_krot._memo_slot(self._keys, key))
        return float(self._vals[i]), int(self._picks[i])

    def value(self, s: int, t: int, m: int) -> float:
        """Least time of segment s..t with budget ``m`` slots (``inf`` when it cannot run)."""
        return self._entry(s, t, m)[0]

    def least_budget(self, s: int = 1, t: int | None = None) -> int | None:
        """Least budget (slots) at which segment s..t runs, ``None`` if none up to the budget."""
        t = self.chain.length if t is None else t
        lo, hi = 0, self.slots.budget + 1  # feasibility only grows with the budget
        while lo < hi:
            mid = (lo + hi) // 2
            if _krot.bound_at(self.store, self.zs, self.rof, s, t, mid) < _krot.INF_U:
                hi = mid
            else:
                lo = mid + 1
        return lo if lo <= self.slots.budget else None

    @property
    def nbytes(self) -> int:
        """Bytes the table uses: the bounds, their index and the exact entries made so far."""
        return self.store.nbytes + self.zs.nbytes + self.rof.nbytes + self._keys.nbytes + self._vals.nbytes + self._picks.nbytes

    @property
    def exact_count(self) -> int:
        """How many exact entries have been made (the top entry's schedule needs a few thousand)."""
        return self._count

    @property
    def choice(self) -> _Choice:
        """``choice[s, t, m]`` as :func:`emit_segment` reads it."""
        return _Choice(self)


class _Choice:
    """Indexable view of a :class:`RotorTable`'s argmin (what the dense ``choice`` array held)."""

    def __init__(self, table: RotorTable) -> None:
        self._table = table

    def __getitem__(self, key: tuple[int, int, int]) -> int:
        s, t, m = (int(k) for k in key)
        return self._table._entry(s, t, m)[1]


#: Coarsening of the first, small table that sets the units of the real one.
COARSE = 16


def _scale_for(bound: float) -> float:
    """The power of two 1 / delta that keeps overheads up to ``bound`` seconds below CAP / 2 units."""
    if not (bound > 0.0) or not math.isfinite(bound):
        return 1.0 if not (bound > 0.0) else 2.0**-1000
    return 2.0 ** min(1000, max(-1000, math.floor(math.log2((_krot.CAP // 2) / bound))))


def _bound_table(chain: Chain, act, saved, fwd_tmp, bwd_tmp, budget: int, scale: float, block: int):
    return _krot.bound_table(chain.fwd_nosave, act, saved, fwd_tmp, bwd_tmp, int(budget), float(scale), int(block))


def fill_rotor_table(chain: Chain, sl: Slots, *, block: int | None = None, scale: float | None = None) -> RotorTable:
    """Fill rotor's table for every segment and every budget up to ``sl.budget``.

    Parameters
    ----------
    chain
        The chain.
    sl
        Its sizes in slots and the budget, from :func:`slots_for`.
    block
        Rows of the bound table filled together (default :data:`~chainoffload._kernels.rotor.BLOCK`).
    scale
        1 / delta of the bounds, a power of two (default: from a table :data:`COARSE` times
        coarser, ``NOTE [ rotor by bounds ]``). Any value gives the same exact table; a
        coarse one makes its entries slower to get.

    Returns
    -------
    RotorTable
        ``value(1, L, sl.budget)`` is the optimum; ``choice`` rebuilds the schedule with
        :func:`rotor_schedule` or :func:`emit_segment`.
    """
    block = _krot.BLOCK if block is None else int(block)
    if scale is None:
        # A plan can redo each stage's forward at most once per segment above it (they nest),
        # so no overhead passes L * sum(fwd_nosave); the coarse table then says how much the
        # optimum's can be, and the units are set from that.
        crude = _scale_for(chain.length * float(np.sum(chain.fwd_nosave)))
        scale = crude
        if sl.budget >= 4 * COARSE:
            def coarse(a: np.ndarray) -> np.ndarray:
                return np.ascontiguousarray(-(-a // COARSE))

            small = sl.budget // COARSE
            store, zs, rof = _bound_table(chain, coarse(sl.act), coarse(sl.saved), coarse(sl.fwd_tmp), coarse(sl.bwd_tmp),
                                          small, crude, block)
            top = int(_krot.bound_at(store, zs, rof, 1, chain.length, small))
            del store, zs, rof
            if top < _krot.CAP:
                scale = _scale_for((top + chain.length) / crude)
    store, zs, rof = _bound_table(chain, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget, scale, block)
    return RotorTable(chain, sl, store, zs, rof, scale)


def _warm_up(chain: Chain, platform: Platform) -> None:
    """Run rotor's kernels once on a small ``chain`` with the argument types real calls use.

    :func:`chainoffload._compile.prepare` calls it before a solve's clock starts, so that
    compiling (or loading) the kernels is not counted in ``rotor``'s runtime. A table is
    filled whatever the memory (``rotor`` itself returns keep-all without one when it fits).
    """
    sl = slots_for(chain, platform.memory, 8)
    table = fill_rotor_table(chain, sl)
    table.value(1, chain.length, sl.budget)
    table.least_budget()


def emit_segment(ops: list[tuple[str, int]], choice, sl: Slots, s: int, t: int, m: int) -> None:
    """Append to ``ops`` the compute ops of segment (s, t) at budget ``m`` from rotor's ``choice``.

    ``choice`` is anything indexable as ``choice[s, t, m]`` like the dense table of
    :func:`chainoffload._kernels.rotor.rotor_table`, e.g. :attr:`RotorTable.choice`.
    """
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


def rotor_schedule(choice, sl: Slots, length: int) -> Schedule:
    """Rebuild the compute sequence of the top segment (1, L) at budget ``sl.budget`` from ``choice``."""
    ops: list[tuple[str, int]] = []
    emit_segment(ops, choice, sl, 1, length, sl.budget)
    return Schedule(tuple(ops), ())


def lift_slots(length: int, slots: int) -> int:
    """Slots the table gets above the budget, whose plans are tried in bytes (``NOTE [ never lose
    to the family ]``): L + 6 (the most rounded sizes one check of the recurrence adds up), at
    most an eighth of ``slots`` but at least 8.

    Parameters
    ----------
    length
        The chain's length L.
    slots
        The slots S of the budget.
    """
    return int(min(length + 6, max(8, slots // 8)))


def _lifted(chain: Chain, platform: Platform, table: RotorTable, budget: int, top: int,
            deadline: float = math.inf) -> dict[int, tuple[Schedule, object]]:
    """The table's plans at budgets ``budget`` and above (up to ``top`` slots), simulated in bytes:
    ``top`` itself, then a bisection for the largest budget whose plan fits. Budget to
    (schedule, timeline), for the budgets tried that have a plan. Past ``deadline`` only the plan
    at ``budget`` is made (the others are improvements, each a rebuild and a simulation)."""
    n = chain.length
    tried: dict[int, tuple[Schedule, object]] = {}

    def plan(m: int):
        if m != budget and time.perf_counter() >= deadline:
            return None
        if m not in tried:
            if not math.isfinite(table.value(1, n, m)):
                return None
            ops: list[tuple[str, int]] = []
            emit_segment(ops, table.choice, table.slots, 1, n, m)
            schedule = Schedule(tuple(ops), ())
            tried[m] = (schedule, simulate(chain, platform, schedule))
        return tried[m][1]

    plan(budget)
    lo, hi = budget, top
    tl = plan(hi)
    if tl is None or not tl.feasible:
        # The table's plans grow with the budget and fit less often: look for the last that fits.
        while hi - lo > 1:
            mid = (lo + hi) // 2
            tl = plan(mid)
            if tl is not None and not tl.feasible:
                hi = mid
            else:
                lo = mid
        plan(lo)
    return tried


def rotor(chain: Chain, platform: Platform, *, slots: int | None = None, time_limit: float | None = None) -> Result:
    """Optimal persistent checkpointing (rematerialization only, no transfer).

    Parameters
    ----------
    chain, platform
        The instance (the platform's bandwidths are not used).
    slots
        Number of memory slots S of the dynamic program; more slots lose less to rounding
        (each size is rounded up to a slot) and cost time and memory linearly. By default
        :func:`default_slots` (500 unless the chain is so long that the table would not fit).
    time_limit
        Seconds it may take (``None``: no limit). The table is one Numba call that no clock can
        cut, so it is estimated first (``NOTE [ clock ]``): a table that would not fit in what
        is left of the limit, or in the memory free (at any limit), is refused up front with
        status ``timeout``, the estimate in the message and ``info["refused"]``; the message
        names the slots that would fit, when some would.

    Notes
    -----
    The table costs O(S L^3) time and O(S L^2) memory (4 bytes an entry). Measured on random
    chains at S = 500 (``benchmarks/results/scaling-remat.md``): 0.03 s at L = 100, 0.46 s at
    L = 300, 8.7 s and 1006 MiB peak at L = 1000 of CPU on a shared core (the float64 table
    it replaced: 20.9 s and 1669 MiB in the same run); growth exponents about 2.4 (time) and
    1.9 (memory). Keep-all, when it fits, is returned without a table. Through
    :func:`chainoffload.solve`, the kernels' one-time compile (about 9 s of CPU) happens before
    the clock starts.

    Returns
    -------
    Result
        ``feasible`` with the rebuilt schedule (optimal among persistent checkpointing
        schedules up to slot rounding, exact when :func:`exact_quantum` gives a slot, and never
        slower than keep-all, checkpoint-all, sqrt-checkpoint or recompute-all where they fit:
        ``NOTE [ never lose to the family ]``), or ``infeasible`` when no sequence fits.
    """
    from .._cost import rotor_bytes, rotor_seconds, sequence_seconds
    from ._options import check_time_limit, refusal

    t0 = time.perf_counter()
    time_limit = check_time_limit(time_limit)
    deadline = math.inf if time_limit is None else t0 + time_limit
    chosen = slots is not None
    if slots is None:
        slots = default_slots(chain.length)
    sl = slots_for(chain, platform.memory, slots, exact=True)
    lift = 0 if sl.budget * sl.quantum == int(platform.memory) - int(chain.act[0]) and _whole(chain, sl) else lift_slots(chain.length, slots)
    info = {"slots": int(slots), "quantum": sl.quantum, "budget_slots": sl.budget, "lift_slots": lift}
    n = chain.length
    # Both sequences below are persistent checkpointing sequences that slot rounding can hide
    # from the table near its two ends: keep-all (optimal whenever it fits) and the most
    # frugal one (the least memory of all). Keep-all needs no table.
    refused = refusal("rotor", f"checking keep-all on {n:,} stages", sequence_seconds(2 * n), 0.0, time_limit, t0, length=n, info=info)
    if refused is not None:
        return refused
    keep_all = Schedule.keep_all(chain.length)
    timeline = simulate(chain, platform, keep_all)
    if timeline.feasible:
        info.update(source="keep-all", recomputed=0)
        return Result("rotor", Status.FEASIBLE, keep_all, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info)
    # NOTE [ clock ]: the table, and the schedules rebuilt from it (a few L ops each, about
    # log2(lift) + 2 of them, and checkpoint-all's and sqrt-checkpoint's), cannot be cut.
    table_slots = slots + lift
    left = None if time_limit is None else deadline - time.perf_counter()
    tries = 2 + max(1, lift).bit_length()
    need = rotor_seconds(n, table_slots) + sequence_seconds((4 * tries + 6) * n)
    hint = ""
    if left is not None and need > left:
        per_slot = (rotor_seconds(n, 2) - rotor_seconds(n, 1))
        fit = int((left - (need - rotor_seconds(n, table_slots)) - rotor_seconds(n, 0)) / per_slot) if per_slot > 0 else 0
        fit -= lift_slots(n, max(1, fit)) if fit >= 1 else 0
        hint = f"slots={fit} would fit" if 1 <= fit < slots else "no slot count would fit"
        if not chosen and fit >= 1:
            hint += f" (the default here is {slots})"
    # The message names the slots asked for; the estimate counts the lifted ones too.
    refused = refusal("rotor", f"a rotor table of {n:,} stages and {slots} slots", need, rotor_bytes(n, table_slots),
                      left, t0, length=n, hint=hint, info=info)
    if refused is not None:
        return refused
    table = fill_rotor_table(chain, replace(sl, budget=sl.budget + lift))
    value = table.value(1, chain.length, sl.budget)
    info.update(dp_makespan=value)
    # NOTE [ never lose to the family ]: the table's plan at the budget, its plans above it that
    # fit in bytes, and the fixed policies of the family.
    # Under a clock, the lifted plans may use what the estimate kept for them and no more.
    plans = _lifted(chain, platform, table, sl.budget, sl.budget + lift,
                    deadline - sequence_seconds(6 * n) if math.isfinite(deadline) else math.inf)
    info.update(table_bytes=table.nbytes, exact_entries=table.exact_count)
    if math.isfinite(value) and not plans[sl.budget][1].feasible:
        schedule, timeline = plans[sl.budget]
        info.update(source="dp", recomputed=_recomputed(schedule))
        return Result("rotor", Status.ERROR, schedule, makespan=math.inf, runtime=time.perf_counter() - t0, info=info,
                      message=f"rotor: simulator rejects the rebuilt schedule: {timeline.violation.message}")
    best: tuple[float, str, Schedule] | None = None
    for m, (schedule, timeline) in sorted(plans.items()):
        if timeline.feasible and (best is None or timeline.makespan < best[0]):
            best = (timeline.makespan, "dp" if m == sl.budget else "dp-lifted", schedule)
            if m > sl.budget:
                info["lifted_by"] = m - sl.budget
    from .remat_baselines import family_schedules

    skipped = {}
    for name, (ops, build) in family_schedules(n).items():
        if best is not None and _family_seconds(chain, name) > best[0] * (1 + 1e-9):
            continue  # slower whatever memory it needs
        left = None if time_limit is None else deadline - time.perf_counter()
        if name == "recompute-all" and best is None:
            refused = refusal("rotor", f"no sequence fits at {slots} slots; the recompute-all sequence ({ops:,} ops)",
                              sequence_seconds(ops), float(ops) * 400, left, t0, length=n, info=info)
            if refused is not None:
                return refused
        elif left is not None and sequence_seconds(ops) > left:
            skipped[name] = f"its sequence of {ops:,} ops would not fit the time left"
            continue
        schedule = build()
        timeline = simulate(chain, platform, schedule)
        if timeline.feasible and (best is None or timeline.makespan < best[0]):
            best = (timeline.makespan, name, schedule)
    if skipped:
        info["skipped"] = skipped
    if best is None:
        least = table.least_budget()
        if least is not None and least > sl.budget:
            least = None  # only the lifted part of the table holds a plan: not a proven figure
        return Result(
            "rotor",
            Status.INFEASIBLE,
            None,
            runtime=time.perf_counter() - t0,
            min_memory=None if least is None else int(chain.act[0]) + least * sl.quantum,
            info=info,
            message=f"rotor: no checkpointing sequence fits in {platform.memory} B at {slots} slots",
        )
    makespan, source, schedule = best
    if source != "dp-lifted":
        info.pop("lifted_by", None)
    info.update(source=source, recomputed=_recomputed(schedule))
    return Result("rotor", Status.FEASIBLE, schedule, makespan=makespan, runtime=time.perf_counter() - t0, info=info)


def _recomputed(schedule: Schedule) -> int:
    return sum(1 for k, _ in schedule.compute if k in ("Fck", "Fn"))


def _whole(chain: Chain, sl: Slots) -> bool:
    """Whether every size of ``chain`` is a whole number of slots (nothing is rounded)."""
    return all(not np.any(a.astype(np.int64) % sl.quantum) for a in (chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp))


def _family_seconds(chain: Chain, name: str) -> float:
    """The compute time of a fixed policy's sequence (its makespan: it moves nothing), in closed
    form, so that a policy slower than the plan in hand is neither built nor simulated."""
    body = float(np.sum(chain.fwd)) + float(np.sum(chain.bwd))
    nosave = chain.fwd_nosave.astype(float)
    if name == "checkpoint-all":
        return body + float(np.sum(nosave[:-1]))
    if name == "recompute-all":
        # Before B_i: Fn_1..Fn_{i-1}, then F_i.
        return body + float(np.sum(np.cumsum(nosave)[:-1]))
    # sqrt-checkpoint: every stage outside the last segment runs Fck / Fn once more.
    seg = max(1, math.ceil(math.sqrt(chain.length)))
    last = chain.length - (chain.length - 1) // seg * seg
    return body + float(np.sum(nosave[: chain.length - last]))
