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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .._kernels import lazy
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule
from ..simulate import simulate
from ._options import OptionError
from .remat_baselines import recompute_all_schedule

__all__ = ["rotor", "Slots", "slots_for", "rotor_schedule", "RotorTable", "fill_rotor_table", "default_slots", "DEFAULT_SLOTS"]

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
    def choice(self) -> "_Choice":
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
        schedules up to slot rounding), or ``infeasible`` with ``min_memory`` when even
        the most frugal sequence does not fit in the slot-rounded budget.
    """
    from .._clock import rotor_bytes, rotor_seconds, sequence_seconds
    from ._options import check_time_limit, refusal

    t0 = time.perf_counter()
    time_limit = check_time_limit(time_limit)
    deadline = math.inf if time_limit is None else t0 + time_limit
    chosen = slots is not None
    if slots is None:
        slots = default_slots(chain.length)
    sl = slots_for(chain, platform.memory, slots)
    info = {"slots": int(slots), "quantum": sl.quantum, "budget_slots": sl.budget}
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
    # NOTE [ clock ]: the table, and the schedule rebuilt from it (a few L ops), cannot be cut.
    left = None if time_limit is None else deadline - time.perf_counter()
    need = rotor_seconds(n, slots) + sequence_seconds(4 * n)
    hint = ""
    if left is not None and need > left:
        per_slot = (rotor_seconds(n, 2) - rotor_seconds(n, 1))
        fit = int((left - (need - rotor_seconds(n, slots)) - rotor_seconds(n, 0)) / per_slot) if per_slot > 0 else 0
        hint = f"slots={fit} would fit" if 1 <= fit < slots else "no slot count would fit"
        if not chosen and fit >= 1:
            hint += f" (the default here is {slots})"
    refused = refusal("rotor", f"a rotor table of {n:,} stages and {slots} slots", need, rotor_bytes(n, slots),
                      left, t0, length=n, hint=hint, info=info)
    if refused is not None:
        return refused
    table = fill_rotor_table(chain, sl)
    value = table.value(1, chain.length, sl.budget)
    info.update(dp_makespan=value, table_bytes=table.nbytes)
    if not math.isfinite(value):
        from .remat_baselines import sequence_length

        ops = sequence_length("recompute-all", n)
        left = None if time_limit is None else deadline - time.perf_counter()
        refused = refusal("rotor", f"no sequence fits at {slots} slots; the recompute-all sequence ({ops:,} ops)",
                          sequence_seconds(ops), float(ops) * 400, left, t0, length=n, info=info)
        if refused is not None:
            return refused
        fallback = recompute_all_schedule(chain.length)
        timeline = simulate(chain, platform, fallback)
        if timeline.feasible:
            info.update(source="recompute-all", recomputed=sum(1 for k, _ in fallback.compute if k in ("Fck", "Fn")))
            return Result("rotor", Status.FEASIBLE, fallback, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info)
        least = table.least_budget()
        return Result(
            "rotor",
            Status.INFEASIBLE,
            None,
            runtime=time.perf_counter() - t0,
            min_memory=None if least is None else int(chain.act[0]) + least * sl.quantum,
            info=info,
            message=f"rotor: no checkpointing sequence fits in {platform.memory} B at {slots} slots",
        )
    schedule = rotor_schedule(table.choice, sl, chain.length)
    info.update(table_bytes=table.nbytes, exact_entries=table.exact_count)
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
