"""Exact method ``cpsat``: a CP-SAT model of docs/model.md's rules, for small chains.

The model decides which units to offload, the trigger event of every transfer, the order of
each channel's queue and the explicit waits of compute ops, minimises the makespan, and proves a
lower bound. Its solution is converted to the one schedule format and replayed by the
simulator; see NOTE [ cpsat: expressible timings ] for why the replay is identical and NOTE
[ cpsat: time scale ] for how integer times compare with the simulator's float times.

OR-Tools is imported here only (STYLE.md, habit 6).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Iterable, Sequence

from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..order import b_pos, f_pos, reader_pos, transfer_events, trigger, wait_ops
from ..schedule import Schedule, ScheduleError, Transfer, fixed_order
from ..simulate import simulate
from . import OptionError

__all__ = ["cpsat", "TimeGrid", "integer_replay", "in_model_space"]

# NOTE [ cpsat: expressible timings ]
# The simulator (chainoffload.simulate) does not take times from a schedule: it derives them.
# Compute op k starts at max(end of op k-1, ends of the transfers whose `before` is k, and for
# B_j the ends of the prefetches of units j and j-1); a transfer starts at max(its trigger
# time, end of the transfer ahead of it on its FIFO channel, and for a prefetch its offload's
# end); channels serve transfers in trigger-event order. A plain scheduling model (free
# intervals, NoOverlap, Cumulative) would find timings no schedule can express: a transfer
# starting between two compute events, a compute op idling for no named transfer, or a
# channel order that is not the trigger order. So the model is tightened to exactly the
# simulator's semantics:
#
# * every transfer chooses (booleans y[t, e]) one trigger event e among the compute-op start
#   and end events in its valid range, and its start *equals* the max of that event's time,
#   the end of a transfer ahead of it on its channel and (prefetch) its offload's end: it is
#   >= each of them and a Boolean "which one is the max" makes it equal to one of them;
# * the channel order is the trigger order: for every pair on a channel an order Boolean
#   p[a, b] implies both end_a <= start_b and event_a <= event_b (ties at one event are free
#   and become list order in the converted schedule);
# * every compute op's start *equals* max(previous end, the ends of the prefetches B_j
#   implicitly waits for, the ends of the offloads that wait for it): >= each, = one of them;
# * the only explicit waits are on offloads (`before` on O_u at an op after its trigger op
#   and before B_{u+1}); a wait on a prefetch never frees memory, and a wait on O_u at
#   B_{u+1} or later is implied by the implicit wait on P_u, which ends after O_u. A wait is
#   required to be binding (the op starts exactly at O_u's end); a non-binding wait changes
#   no time, so this only removes duplicate solutions;
# * memory is one Cumulative at the platform's limit over half-open intervals [alloc, free):
#   at one instant a free ([.., t)) is not counted and an allocation ([t, ..)) is, which is
#   the simulator's "frees before allocations". Unit u is resident from F_u's start to
#   max(end O_u, end F_{u+1}) (F_{u+1} reads a_u) and again from P_u's *start* to B_u's end;
# * (duplicates only) a transfer is not triggered at the start of op k+1 when that start is
#   the instant op k ends: the end of op k is the same instant, and since transfers at one
#   event may take any queue order, every queue the start could give, the end gives too.
#
# With every start equal to the max of exactly the terms the simulator takes, the model's
# timeline is the simulator's deterministic replay of the converted schedule (with the
# integer durations; `integer_replay` is that replay, and the tests check that it reproduces
# every CP-SAT time exactly). The search space is therefore: every fixed-order schedule in
# the format whose explicit waits are on offloads. The brute-force oracle
# (chainoffload.exact) enumerates the same space through the float simulator.

# NOTE [ cpsat: canonical triggers ]
# Many trigger events give one timeline: a transfer queued behind a busy channel starts when
# the channel frees, whichever earlier event queued it. The model keeps one of them: the
# latest allowed event whose time is not after the transfer's start (the next allowed event
# comes after the start). This loses no timeline: moving every trigger to that event keeps
# each start (the new trigger time is still <= the start, which is still the max of the other
# terms, or equals the old binding trigger) and keeps the FIFO order (starts are in channel
# order and the chosen event grows with the start), stays in the unit's trigger range (the
# old event had a time <= the start; a prefetch starts before B_{u+1} because it ends by
# then), keeps a prefetch's event >= its offload's, and keeps an offload's trigger op before
# the op that waits for it (that op starts at the offload's end, after its start). The last
# two need transfers of at least one time unit, so the rule is off when one is shorter.
# The brute-force oracle does not use this rule; the tests compare the two.

# NOTE [ cpsat: time scale ]
# CP-SAT needs integers. Every duration d (seconds) becomes round(d * scale) units (compute
# ops at least 1 unit, so that a zero-length op's transient still counts for an instant, as
# the simulator counts it). For the same decisions, every event time is a max-plus
# expression of durations, so the model's time / scale and the simulator's time differ by
# at most R / scale, where R = sum over all compute ops and all possible transfers of
# |round(d * scale) - d * scale| (`TimeGrid.slack`). Hence:
#   |simulated makespan - objective / scale| <= R / scale      (checked by the tests), and
#   lower_bound = (CP-SAT's proven bound - R) / scale.
# A gap below R units cannot be resolved by the integer model, so the search stops there
# (absolute_gap_limit = R) and reports optimal: then the simulated makespan is within
# 3 R / scale of the lower bound (`info["tolerance"]` is R / scale).
# The default scale puts the compute time at 10^6 units, so R / scale is ~1e-6 of it per
# stage. One caveat: two events from unrelated max-plus chains that coincide in integers
# (a free and an allocation at the same unit) may fall in the other order in floats. The
# solver then replays its schedule in the simulator before reporting it, and when the
# simulator rejects it re-solves on a perturbed scale (at most `_RETRIES` times) from the
# previous solution; it never reports a schedule the simulator rejects. The same caveat
# applies to the bound: it is proven for the integer model, and holds for the float instance
# unless the float optimum relies on such a coincidence (its rounded replay breaking memory).

_RETRIES = 3
_TARGET_UNITS = 1_000_000


@dataclasses.dataclass(frozen=True)
class TimeGrid:
    """Integer durations of one instance at one time scale.

    Attributes
    ----------
    scale
        Integer units per second.
    op
        Duration of each compute op of the fixed order (index into ``fixed_order``), units.
    offload, prefetch
        Duration of O_u / P_u at index u - 1, units (``None`` when that link has bandwidth 0).
    slack
        R: the sum of all rounding errors, in units (NOTE [ cpsat: time scale ]).
    """

    scale: float
    op: tuple[int, ...]
    offload: tuple[int, ...] | None
    prefetch: tuple[int, ...] | None
    slack: float

    @classmethod
    def build(cls, chain: Chain, platform: Platform, scale: float | None = None) -> "TimeGrid":
        """Round ``chain``'s and ``platform``'s durations at ``scale`` (default: compute time = 10^6 units)."""
        if scale is None:
            base = chain.compute_time
            scale = _TARGET_UNITS / base if base > 0 else 1.0
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise OptionError(f"time_scale: {scale!r} must be a finite number of units per second > 0")
        scale = float(scale)
        err = 0.0
        ops = []
        for kind, stage in fixed_order(chain.length):
            d = float(chain.fwd[stage - 1] if kind == "F" else chain.bwd[stage - 1]) * scale
            di = max(1, int(round(d)))
            err += abs(di - d)
            ops.append(di)
        transfers: list[tuple[int, ...] | None] = []
        for timer in (platform.d2h_time, platform.h2d_time):
            times = [timer(int(s)) for s in chain.saved]
            if not all(math.isfinite(t) for t in times):
                transfers.append(None)
                continue
            row = []
            for t in times:
                di = int(round(t * scale))
                err += abs(di - t * scale)
                row.append(di)
            transfers.append(tuple(row))
        if transfers[0] is None or transfers[1] is None:
            transfers = [None, None]
        # Float sums in another order, for safety: one unit per 2^40 of the horizon.
        err += sum(ops) * 2.0**-40
        return cls(scale, tuple(ops), transfers[0], transfers[1], err)

    @property
    def can_transfer(self) -> bool:
        """Whether both directions have finite transfer times."""
        return self.offload is not None


def in_model_space(chain: Chain, schedule: Schedule) -> Schedule | None:
    """The schedule with redundant waits dropped, if it lies in the CP-SAT model's space; else None.

    The space (NOTE [ cpsat: expressible timings ]): the fixed compute order, every transfer
    triggered in its valid range, prefetch not before offload, and explicit waits only on
    offloads at ops before B_{u+1}. Waits at B_{u+1} or later are implied and dropped here;
    waits that do not bind are kept (the model re-derives which bind).
    """
    try:
        schedule.validate(chain)
    except ScheduleError:
        return None
    if schedule.has_remat:
        return None
    length = chain.length
    out = []
    for t in schedule.transfers:
        lo, hi = transfer_events(length, t.unit)
        if not lo <= t.event <= hi:
            return None
        before = t.before
        if before is not None:
            if t.kind == "prefetch":
                if before >= reader_pos(length, t.unit):
                    before = None  # implied by B_{u+1}'s implicit wait on this prefetch
                else:
                    return None
            elif before not in wait_ops(length, t.unit):
                before = None  # at or after B_{u+1}: implied by the wait on P_u
        out.append(dataclasses.replace(t, before=before))
    return Schedule(schedule.compute, tuple(out))


def integer_replay(grid: TimeGrid, length: int, schedule: Schedule, duplex: bool) -> dict[str, list[int]]:
    """The simulator's timing rules replayed on the integer durations of ``grid``.

    Mirrors chainoffload.simulate's timing decisions (trigger order with list-order ties,
    FIFO non-preemptive channels, a prefetch waits for its offload, explicit and implicit
    waits) with integer arithmetic; memory is not checked. Used to complete solution hints
    and, in the tests, to show that CP-SAT's times are exactly this replay.

    Returns
    -------
    dict
        ``op_start``, ``op_end`` (per compute op) and ``start``, ``end`` (per transfer).
    """
    n = 2 * length
    transfers = schedule.transfers
    m = len(transfers)
    order = sorted(range(m), key=lambda t: (transfers[t].event, t))
    offload_of = {t.unit: idx for idx, t in enumerate(transfers) if t.kind == "offload"}
    prefetch_of = {t.unit: idx for idx, t in enumerate(transfers) if t.kind == "prefetch"}
    waits: dict[int, list[int]] = {}
    for idx, t in enumerate(transfers):
        if t.before is not None:
            waits.setdefault(t.before, []).append(idx)
    op_start, op_end = [0] * n, [0] * n
    start: list[int | None] = [None] * m
    end: list[int | None] = [None] * m
    chan_free = [0, 0]
    ptr = 0
    for k, (kind, stage) in enumerate(fixed_order(length)):
        s = op_end[k - 1] if k else 0
        for t in waits.get(k, ()):
            if end[t] is not None:
                s = max(s, end[t])
        if kind == "B":
            for u in (stage, stage - 1):
                p = prefetch_of.get(u)
                if p is not None and end[p] is not None:
                    s = max(s, end[p])
        op_start[k], op_end[k] = s, s + grid.op[k]
        for event, when in ((2 * k, s), (2 * k + 1, s + grid.op[k])):
            while ptr < m and transfers[order[ptr]].event == event:
                t = order[ptr]
                ptr += 1
                tr = transfers[t]
                if tr.kind == "offload":
                    c, dur = 0, grid.offload[tr.unit - 1]
                    st = max(chan_free[c], when)
                else:
                    c, dur = (1 if duplex else 0), grid.prefetch[tr.unit - 1]
                    st = max(chan_free[c], when)
                    o = offload_of.get(tr.unit)
                    if o is not None and end[o] is not None:
                        st = max(st, end[o])
                start[t], end[t] = st, st + dur
                chan_free[c] = st + dur
    return {"op_start": op_start, "op_end": op_end, "start": start, "end": end}


def _import_cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - ortools is a core dependency
        raise ImportError("method 'cpsat' needs OR-Tools: pip install ortools") from exc
    return cp_model


class _Model:
    """The CP-SAT model of one instance at one time grid (see the NOTEs above)."""

    def __init__(self, chain: Chain, platform: Platform, grid: TimeGrid, keep: frozenset[int] = frozenset()):
        cp_model = _import_cp_model()
        self.cp_model = cp_model
        self.chain, self.platform, self.grid = chain, platform, grid
        L = self.length = chain.length
        n = self.n = 2 * L
        md = self.model = cp_model.CpModel()
        horizon = sum(grid.op)
        if grid.can_transfer:
            # Every start equals some earlier end or event: no schedule is longer than all
            # durations end to end.
            horizon += sum(grid.offload) + sum(grid.prefetch)
        self.horizon = horizon
        self.ops = fixed_order(L)
        self.S = [md.new_int_var(0, horizon, f"S{k}") for k in range(n)]
        self.E = [md.new_int_var(0, horizon, f"E{k}") for k in range(n)]
        for k in range(n):
            md.add(self.E[k] == self.S[k] + grid.op[k])
        md.add(self.S[0] == 0)
        # gap[k]: op k starts after op k-1 ends (it waited); else at that very instant.
        self.gap = [None] + [md.new_bool_var(f"gap{k}") for k in range(1, n)]
        for k in range(1, n):
            md.add(self.S[k] >= self.E[k - 1] + 1).only_enforce_if(self.gap[k])
            md.add(self.S[k] == self.E[k - 1]).only_enforce_if(~self.gap[k])
        units = list(range(1, L + 1)) if grid.can_transfer else []
        self.units = units
        # Canonical triggers need every transfer to last at least one unit (see the NOTE).
        self.canonical = bool(units) and min(grid.offload) >= 1 and min(grid.prefetch) >= 1
        self.x = {u: md.new_bool_var(f"x{u}") for u in units}
        for u in keep:
            if u in self.x:
                md.add(self.x[u] == 0)  # a unit the caller keeps resident
        # -- transfers -------------------------------------------------------------------
        # Transfer keys: ("O", u) and ("P", u).
        self.tr: dict[tuple[str, int], dict[str, Any]] = {}
        for u in units:
            lo, hi = transfer_events(L, u)
            for kind, dur in (("O", grid.offload[u - 1]), ("P", grid.prefetch[u - 1])):
                key = (kind, u)
                st = md.new_int_var(0, horizon, f"{kind}{u}_s")
                en = md.new_int_var(0, horizon, f"{kind}{u}_e")
                iv = md.new_optional_interval_var(st, dur, en, self.x[u], f"{kind}{u}_iv")
                ev = md.new_int_var(0, hi, f"{kind}{u}_ev")
                trig = md.new_int_var(0, horizon, f"{kind}{u}_trig")
                ys = {e: md.new_bool_var(f"y_{kind}{u}_{e}") for e in range(lo, hi + 1)}
                md.add(sum(ys.values()) == self.x[u])
                md.add(ev == sum(e * y for e, y in ys.items()))
                for e, y in ys.items():
                    md.add(trig == self._event_time(e)).only_enforce_if(y)
                    if e % 2 == 0 and e >= 2:
                        # Start of op k+1 at the instant op k ends is the same trigger as the
                        # end of op k (ties at one event take any order): use that one.
                        md.add_implication(y, self.gap[e // 2])
                    if self.canonical and e < hi:
                        # NOTE [ cpsat: canonical triggers ]: the latest allowed event not
                        # after the start, so the next allowed event is after the start.
                        if e % 2 == 0:
                            md.add(st <= self.E[e // 2] - 1).only_enforce_if(y)
                        else:
                            k1 = e // 2 + 1
                            md.add(st <= self.S[k1] - 1).only_enforce_if([y, self.gap[k1]])
                            md.add(st <= self.E[k1] - 1).only_enforce_if([y, ~self.gap[k1]])
                md.add(st >= trig).only_enforce_if(self.x[u])
                self.tr[key] = {"unit": u, "kind": kind, "start": st, "end": en, "iv": iv, "ev": ev,
                                "trig": trig, "y": ys, "dur": dur}
            md.add(self.tr[("P", u)]["ev"] >= self.tr[("O", u)]["ev"])
            md.add(self.tr[("P", u)]["start"] >= self.tr[("O", u)]["end"]).only_enforce_if(self.x[u])
        # -- channels: order = trigger order -----------------------------------------------
        channels: list[list[tuple[str, int]]] = [[("O", u) for u in units], [("P", u) for u in units]]
        if not platform.duplex:
            channels = [channels[0] + channels[1]]
        self.channels = channels
        self.prec: dict[tuple[tuple[str, int], tuple[str, int]], Any] = {}
        self.prec_var: dict[tuple[tuple[str, int], tuple[str, int]], Any] = {}  # the (a, b) that own a variable
        for chan in channels:
            md.add_no_overlap([self.tr[k]["iv"] for k in chan])
            for i, a in enumerate(chan):
                for b in chan[i + 1 :]:
                    ta, tb = self.tr[a], self.tr[b]
                    both = [self.x[ta["unit"]], self.x[tb["unit"]]]
                    if a[1] == b[1]:
                        # O_u and P_u on one channel: the offload goes first.
                        self.prec[(a, b)] = 1
                        self.prec[(b, a)] = 0
                        continue
                    p = md.new_bool_var(f"p_{a[0]}{a[1]}_{b[0]}{b[1]}")
                    md.add(ta["end"] <= tb["start"]).only_enforce_if([p] + both)
                    md.add(ta["ev"] <= tb["ev"]).only_enforce_if([p] + both)
                    md.add(tb["end"] <= ta["start"]).only_enforce_if([~p] + both)
                    md.add(tb["ev"] <= ta["ev"]).only_enforce_if([~p] + both)
                    self.prec[(a, b)] = p
                    self.prec[(b, a)] = ~p
                    self.prec_var[(a, b)] = p
        # -- transfer start = max(trigger, channel predecessor's end, own offload's end) -----
        self.tr_choice: dict[tuple[str, int], dict[Any, Any]] = {}
        for chan in channels:
            for key in chan:
                t = self.tr[key]
                xu = self.x[t["unit"]]
                choices: dict[Any, Any] = {}
                c = md.new_bool_var(f"c_{key[0]}{key[1]}_trig")
                md.add(t["start"] == t["trig"]).only_enforce_if(c)
                choices["trig"] = c
                if key[0] == "P" and platform.duplex:
                    c = md.new_bool_var(f"c_{key[0]}{key[1]}_off")
                    md.add(t["start"] == self.tr[("O", key[1])]["end"]).only_enforce_if(c)
                    choices["off"] = c
                for other in chan:
                    if other == key:
                        continue
                    p = self.prec[(other, key)]
                    if isinstance(p, int) and p == 0:
                        continue
                    c = md.new_bool_var(f"c_{key[0]}{key[1]}_{other[0]}{other[1]}")
                    md.add(t["start"] == self.tr[other]["end"]).only_enforce_if(c)
                    md.add_implication(c, self.x[other[1]])
                    if not isinstance(p, int):
                        md.add_implication(c, p)
                    choices[other] = c
                for c in choices.values():
                    md.add_implication(c, xu)
                md.add_bool_or(list(choices.values())).only_enforce_if(xu)
                self.tr_choice[key] = choices
        # -- explicit waits on offloads ----------------------------------------------------
        self.w: dict[tuple[int, int], Any] = {}
        for u in units:
            ws = []
            for k in wait_ops(L, u):
                w = md.new_bool_var(f"w{u}_{k}")
                o = self.tr[("O", u)]
                md.add_implication(w, self.x[u])
                md.add(o["ev"] <= 2 * k - 1).only_enforce_if(w)
                # A wait binds (see the NOTE): the op starts exactly at O_u's end.
                md.add(self.S[k] == o["end"]).only_enforce_if(w)
                self.w[(u, k)] = w
                ws.append(w)
            if ws:
                md.add(sum(ws) <= 1)
        # -- compute start = max(previous end, implicit prefetch waits, explicit waits) -----
        self.op_choice: list[dict[Any, Any]] = [{} for _ in range(n)]
        for k in range(1, n):
            kind, stage = self.ops[k]
            md.add(self.S[k] >= self.E[k - 1])
            choices = {}
            c = md.new_bool_var(f"c_op{k}_prev")
            md.add(self.S[k] == self.E[k - 1]).only_enforce_if(c)
            choices["prev"] = c
            if kind == "B" and units:
                for u in (stage, stage - 1):
                    if u < 1:
                        continue
                    p = self.tr[("P", u)]
                    md.add(self.S[k] >= p["end"]).only_enforce_if(self.x[u])
                    if u == stage and stage < L:
                        continue  # P_stage ended before B_{stage+1}: never the max here
                    c = md.new_bool_var(f"c_op{k}_P{u}")
                    md.add(self.S[k] == p["end"]).only_enforce_if(c)
                    md.add_implication(c, self.x[u])
                    choices[("P", u)] = c
            for (u, kk), w in self.w.items():
                if kk == k:
                    choices[("O", u)] = w
            md.add_bool_or(list(choices.values()))
            self.op_choice[k] = choices
        # -- memory ----------------------------------------------------------------------
        self._memory()
        md.minimize(self.E[n - 1])

    def _event_time(self, e: int):
        return self.S[e // 2] if e % 2 == 0 else self.E[e // 2]

    def _interval(self, start, end, name, present=None):
        md = self.model
        size = md.new_int_var(0, self.horizon, f"{name}_len")
        md.add(size == end - start) if present is None else md.add(size == end - start).only_enforce_if(present)
        if present is None:
            return md.new_interval_var(start, size, end, name)
        return md.new_optional_interval_var(start, size, end, present, name)

    def _memory(self) -> None:
        chain, md, L = self.chain, self.model, self.length
        act, saved = [int(v) for v in chain.act], [int(v) for v in chain.saved]
        fwd_tmp, bwd_tmp = [int(v) for v in chain.fwd_tmp], [int(v) for v in chain.bwd_tmp]
        S, E = self.S, self.E
        ivs, dem = [], []

        def add(iv, d):
            if d > 0:
                ivs.append(iv)
                dem.append(d)

        last = self.n - 1
        add(self._interval(S[0], E[last], "a0"), act[0])
        self.resident_end = {}
        for i in range(1, L + 1):
            fk, bk = f_pos(i), b_pos(L, i)
            add(md.new_interval_var(S[fk], self.grid.op[fk], E[fk], f"ftmp{i}"), fwd_tmp[i - 1])
            add(md.new_interval_var(S[bk], self.grid.op[bk], E[bk], f"btmp{i}"), bwd_tmp[i - 1])
            # g_{i-1}, allocated by B_i, freed by B_{i-1} (g_0 is never freed; B_1 ends it all).
            g_end = E[b_pos(L, i - 1)] if i > 1 else E[bk]
            add(self._interval(S[bk], g_end, f"g{i - 1}"), act[i - 1])
            if i == L:
                add(md.new_interval_var(S[bk], self.grid.op[bk], E[bk], f"g{L}"), act[L])
            if i in self.x:
                xi = self.x[i]
                o = self.tr[("O", i)]
                r = md.new_int_var(0, self.horizon, f"r{i}")
                md.add(r == E[bk]).only_enforce_if(~xi)
                if i < L:
                    free = md.new_int_var(0, self.horizon, f"free{i}")
                    md.add_max_equality(free, [o["end"], E[f_pos(i + 1)]])
                    md.add(r == free).only_enforce_if(xi)
                else:
                    md.add(r == o["end"]).only_enforce_if(xi)
                self.resident_end[i] = r
                add(self._interval(S[fk], r, f"unit{i}a"), saved[i - 1])
                add(self._interval(self.tr[("P", i)]["start"], E[bk], f"unit{i}b", xi), saved[i - 1])
            else:
                add(self._interval(S[fk], E[bk], f"unit{i}"), saved[i - 1])
        md.add_cumulative(ivs, dem, self.platform.memory)
        self._redundant_memory()

    def _redundant_memory(self) -> None:
        """Implied constraints that give the LP relaxation the structure of the problem.

        NOTE [ cpsat: redundant memory cuts ]: for each compute op k and each unit i that can
        be off the GPU when op k starts (k after F_{i+1}, before B_{i+1}), a Boolean a[i, k]
        *implies* that it is: its GPU copy freed by S_k and its prefetch started after S_k.
        Then the memory at S_k, keep-all's memory there less the bytes of absent units, is at
        most the limit; and the absent units' offloads fit on the D2H channel before S_k,
        their prefetches on the H2D channel after it. Any real solution satisfies these with
        a[i, k] = "unit i is absent at S_k" (only this direction is needed), so they cut no
        solution; they only make the bound provable sooner.
        """
        if not self.units:
            return
        chain, md, L, grid = self.chain, self.model, self.length, self.grid
        act, saved = [int(v) for v in chain.act], [int(v) for v in chain.saved]
        S, E = self.S, self.E
        self.absent: dict[tuple[int, int], Any] = {}
        prefix = 0
        cum_saved = []
        for v in saved:
            prefix += v
            cum_saved.append(prefix)
        for k, (kind, j) in enumerate(self.ops):
            if kind == "F":
                keep = int(act[0]) + cum_saved[j - 1] + int(chain.fwd_tmp[j - 1])
            else:
                keep = int(act[0]) + cum_saved[j - 1] + act[j] + act[j - 1] + int(chain.bwd_tmp[j - 1])
            terms = []
            for i in self.units:
                if not (i + 1 <= k <= 2 * L - i - 2):
                    continue
                a = md.new_bool_var(f"absent{i}_{k}")
                md.add_implication(a, self.x[i])
                md.add(self.resident_end[i] <= S[k]).only_enforce_if(a)
                md.add(self.tr[("P", i)]["start"] >= S[k] + 1).only_enforce_if(a)
                self.absent[(i, k)] = a
                terms.append((i, a))
            if not terms:
                continue
            excess = keep - self.platform.memory
            if excess > 0:
                md.add(sum(saved[i - 1] * a for i, a in terms) >= excess)
            # Channels: the absent units i >= h went out on D2H after F_h ended and before S_k,
            # and come back on H2D after S_k and before B_{h+1} starts (each P_i ends before
            # B_{i+1}, which is at or before B_{h+1} for i >= h). One pair of cuts per h.
            for h in sorted({i for i, _ in terms}):
                group = [(i, a) for i, a in terms if i >= h]
                md.add(S[k] >= E[f_pos(h)] + sum(grid.offload[i - 1] * a for i, a in group))
                md.add(S[b_pos(L, h + 1)] >= S[k] + sum(grid.prefetch[i - 1] * a for i, a in group))

    # -- hints and solutions --------------------------------------------------------------

    def hint(self, schedule: Schedule) -> None:
        """Set a complete solution hint from ``schedule`` (in the model space), by integer replay."""
        md, L = self.model, self.length
        schedule = self._canonical(schedule)
        rep = integer_replay(self.grid, L, schedule, self.platform.duplex)
        md.clear_hints()
        values: dict[Any, int] = {}
        for k in range(self.n):
            values[self.S[k]] = rep["op_start"][k]
            values[self.E[k]] = rep["op_end"][k]
        off = {t.unit for t in schedule.transfers if t.kind == "offload"}
        tr_vals: dict[tuple[str, int], tuple[int, int, int]] = {}
        list_pos: dict[tuple[str, int], int] = {}
        for idx, t in enumerate(schedule.transfers):
            key = ("O" if t.kind == "offload" else "P", t.unit)
            tr_vals[key] = (rep["start"][idx], rep["end"][idx], t.event)
            list_pos[key] = idx
        for u in self.units:
            values[self.x[u]] = int(u in off)
        for key, t in self.tr.items():
            if key in tr_vals:
                st, en, ev = tr_vals[key]
                trig = self._value_of_event(ev, values)
            else:
                st, en, ev, trig = 0, t["dur"], 0, 0
            values[t["start"]], values[t["end"]], values[t["ev"]], values[t["trig"]] = st, en, ev, trig
            for e, y in t["y"].items():
                values[y] = int(key in tr_vals and e == ev)
        for (a, b), p in self.prec.items():
            if isinstance(p, int) or p is not self.prec_var.get((a, b)):
                continue
            if a in tr_vals and b in tr_vals:
                # FIFO: trigger order, ties by list order.
                values[p] = int((tr_vals[a][2], list_pos[a]) < (tr_vals[b][2], list_pos[b]))
            else:
                values[p] = 0
        for key, choices in self.tr_choice.items():
            present = key in tr_vals
            for what, c in choices.items():
                ok = False
                if present:
                    st = tr_vals[key][0]
                    if what == "trig":
                        ok = st == values[self.tr[key]["trig"]]
                    elif what == "off":
                        ok = st == tr_vals[("O", key[1])][1]
                    elif what in tr_vals:
                        ok = st == tr_vals[what][1] and self._prec_value(what, key, values) == 1
                values[c] = int(ok)
        waits = {(t.unit, t.before) for t in schedule.transfers if t.kind == "offload" and t.before is not None}
        for (u, k), w in self.w.items():
            binds = (u, k) in waits and values[self.S[k]] == tr_vals[("O", u)][1]
            values[w] = int(binds)
        for k in range(1, self.n):
            for what, c in self.op_choice[k].items():
                if what == "prev":
                    values[c] = int(values[self.S[k]] == values[self.E[k - 1]])
                elif what[0] == "P":
                    values[c] = int(what in tr_vals and values[self.S[k]] == tr_vals[what][1])
        for v, val in values.items():
            md.add_hint(v, val)

    def complete_hint(self, time_limit: float) -> bool:
        """Turn the hint into a complete assignment of every variable (CP-SAT keeps such a hint).

        The hint of :meth:`hint` leaves auxiliary variables (interval sizes, free times,
        absence literals) open; CP-SAT may fail to complete it within its own small effort and
        drop it. A solve with every hinted variable fixed completes it; returns whether it did.
        """
        cp_model = self.cp_model
        solver = cp_model.CpSolver()
        solver.parameters.fix_variables_to_their_hinted_value = True
        solver.parameters.max_time_in_seconds = float(time_limit)
        solver.parameters.num_search_workers = 1
        status = solver.status_name(solver.solve(self.model))
        if status not in ("OPTIMAL", "FEASIBLE"):
            return False
        md = self.model
        values = [int(solver.value(md.get_int_var_from_proto_index(i))) for i in range(len(md.proto.variables))]
        md.clear_hints()
        for i, val in enumerate(values):
            md.add_hint(md.get_int_var_from_proto_index(i), val)
        return True

    def _canonical(self, schedule: Schedule) -> Schedule:
        """Move triggers at the start of op k+1 that coincides with the end of op k to that end.

        The FIFO order is kept: transfers are listed in their original trigger order, and the
        moved ones only join the adjacent event, so the replay is unchanged.
        """
        rep = integer_replay(self.grid, self.length, schedule, self.platform.duplex)
        order = sorted(range(len(schedule.transfers)), key=lambda t: (schedule.transfers[t].event, t))
        out = []
        for t in order:
            tr = schedule.transfers[t]
            k = tr.op
            if tr.at == "start" and k >= 1 and rep["op_start"][k] == rep["op_end"][k - 1]:
                tr = dataclasses.replace(tr, op=k - 1, at="end")
            out.append(tr)
        merged = Schedule(schedule.compute, tuple(out))
        if not self.canonical:
            return merged
        # NOTE [ cpsat: canonical triggers ]: move every trigger to the latest allowed event
        # not after the transfer's start, and list in start order (the FIFO order).
        rep = integer_replay(self.grid, self.length, merged, self.platform.duplex)
        times = []
        for k in range(self.n):
            times += [(2 * k, rep["op_start"][k]), (2 * k + 1, rep["op_end"][k])]
        allowed = [
            (e, tm) for e, tm in times if not (e % 2 == 0 and e >= 2 and rep["op_start"][e // 2] == rep["op_end"][e // 2 - 1])
        ]
        rows = []
        for idx, tr in enumerate(merged.transfers):
            lo, hi = transfer_events(self.length, tr.unit)
            start = rep["start"][idx]
            ev = max(e for e, tm in allowed if lo <= e <= hi and (tm <= start or e == lo))
            rows.append(((ev, start, rep["end"][idx], tr.kind == "prefetch"), dataclasses.replace(tr, op=ev // 2, at="end" if ev % 2 else "start")))
        rows.sort(key=lambda r: r[0])
        canon = Schedule(schedule.compute, tuple(tr for _, tr in rows))
        again = integer_replay(self.grid, self.length, canon, self.platform.duplex)
        same = again["op_start"] == rep["op_start"] and sorted(zip(again["start"], again["end"])) == sorted(zip(rep["start"], rep["end"]))
        return canon if same else merged

    def _prec_value(self, a, b, values: dict[Any, int]) -> int:
        """Hinted value of "a before b on their channel"."""
        p = self.prec[(a, b)]
        if isinstance(p, int):
            return p
        if (a, b) in self.prec_var:
            return values.get(p, 0)
        return 1 - values.get(self.prec_var[(b, a)], 0)

    def _value_of_event(self, e: int, values: dict[Any, int]) -> int:
        return values[self.S[e // 2]] if e % 2 == 0 else values[self.E[e // 2]]

    def schedule_from(self, solver) -> Schedule:
        """Convert the solver's current solution to the schedule format."""
        rows = []
        for key, t in self.tr.items():
            if not solver.boolean_value(self.x[t["unit"]]):
                continue
            ev = int(solver.value(t["ev"]))
            before = None
            if key[0] == "O":
                for k in wait_ops(self.length, t["unit"]):
                    if solver.boolean_value(self.w[(t["unit"], k)]):
                        before = k
            tr = Transfer("offload" if key[0] == "O" else "prefetch", t["unit"], *trigger(ev), before)
            # List order: trigger event, then the channel's order (start, end), offload first.
            rows.append(((ev, int(solver.value(t["start"])), int(solver.value(t["end"])), key[0] == "P"), tr))
        rows.sort(key=lambda r: r[0])
        return Schedule(self.ops, tuple(tr for _, tr in rows))

    def solution_times(self, solver) -> dict[str, Any]:
        """CP-SAT's own times: op starts/ends and transfer (start, end) by ("O"|"P", unit)."""
        return {
            "op_start": [int(solver.value(v)) for v in self.S],
            "op_end": [int(solver.value(v)) for v in self.E],
            "transfers": {
                key: (int(solver.value(t["start"])), int(solver.value(t["end"])))
                for key, t in self.tr.items()
                if solver.boolean_value(self.x[t["unit"]])
            },
        }


def _heuristic_schedules(chain: Chain, platform: Platform, keep: frozenset[int]) -> list[tuple[str, Result]]:
    """Feasible schedules of the baselines (and of ``best`` when it imports), for the hint."""
    from . import baselines

    out = []
    for name, func in (("largest-first", baselines.largest_first), ("first-k", baselines.first_k), ("keep-all", baselines.keep_all)):
        res = func(chain, platform, keep=keep)
        if res.feasible:
            out.append((name, res))
    try:
        from .best import best  # type: ignore[import-not-found]
    except ImportError:
        best = None
    if best is not None:
        try:
            res = best(chain, platform, keep=keep)
        except Exception:  # noqa: BLE001 - a hint source failing must not fail the exact method
            res = None
        if res is not None and res.feasible and res.schedule is not None:
            tl = simulate(chain, platform, res.schedule)
            if tl.feasible:
                out.append(("best", res.replace(makespan=tl.makespan)))
    return out


class _Progress:
    """Prints objective and bound over time on stderr (progress=True)."""

    def __init__(self, cp_model, scale: float, t0: float):
        class _Callback(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(cb) -> None:  # noqa: N805
                print(
                    f"cpsat: t={time.perf_counter() - t0:8.2f}s  objective={cb.objective_value / scale:.9g}s  "
                    f"bound={cb.best_objective_bound / scale:.9g}s",
                    file=sys.stderr,
                    flush=True,
                )

        self.callback = _Callback()


def cpsat(
    chain: Chain,
    platform: Platform,
    *,
    time_limit: float = 60.0,
    workers: int = 2,
    hint: bool | Schedule | Sequence[Schedule] = True,
    progress: bool = False,
    time_scale: float | None = None,
    keep: Iterable[int] = (),
) -> Result:
    """Solve the offloading problem exactly with a CP-SAT model of docs/model.md's rules.

    Parameters
    ----------
    chain, platform
        The instance (small chains: tens of stages).
    time_limit
        Seconds the whole call may take to search, warm start and retries included (the
        warm start itself, the baselines and ``best``, runs first and is not cut short).
    workers
        CP-SAT search workers (threads).
    hint
        ``True``: warm-start from the best feasible schedule of the baselines largest-first,
        first-k and keep-all (and of ``best`` when that method exists). A :class:`Schedule` or
        a list of them: use these too (chainoffload.verify passes the schedule it checks).
        ``False``: no hint.
    progress
        Print objective and bound (seconds) on stderr at each solution found.
    time_scale
        Integer time units per second; default puts the compute time at 10^6 units.
    keep
        Units (stages 1..L) that must stay resident: the model fixes their offload choice to
        "no", so ``optimal`` means optimal among the schedules that keep them (and a given
        hint that offloads one is ignored).

    Returns
    -------
    Result
        ``optimal`` (proven for the integer model up to its rounding slack; the simulated
        makespan is within ``3 * info["tolerance"]`` seconds of the optimum over the model's
        space, NOTE [ cpsat: time scale ]), ``feasible``
        (time limit reached with a schedule), ``infeasible`` (no schedule of the space fits) or
        ``timeout`` (no schedule found in time). ``lower_bound`` is CP-SAT's proven bound,
        rescaled and less the rounding slack. ``info`` holds ``time_scale``, ``tolerance``,
        ``objective_units``, ``bound_units``, ``cpsat_status``, ``wall_time``, ``hint`` (the
        heuristic used), ``retries``.

    Raises
    ------
    ValueError
        Bad ``time_limit``, ``workers`` or ``time_scale`` (the message names it), or memory
        below the chain's stage floor, or ``keep`` names a unit that is not a stage.

    Notes
    -----
    See NOTE [ cpsat: expressible timings ] and NOTE [ cpsat: time scale ] in this module.
    """
    from . import check_memory_floor

    t0 = time.perf_counter()
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0 or math.isnan(time_limit):
        raise OptionError(f"time_limit: {time_limit!r} must be a number of seconds > 0")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers: {workers!r} must be an integer >= 1")
    if not isinstance(progress, bool):
        raise OptionError(f"progress: {progress!r} must be true or false")
    check_memory_floor(chain, platform)
    from . import check_keep

    kept = check_keep(chain, keep)
    cp_model = _import_cp_model()
    grid = TimeGrid.build(chain, platform, time_scale)

    # Warm start: the best feasible schedule we know, if it lies in the model's space.
    candidates: list[tuple[str, Schedule, float]] = []
    if hint is not False and hint is not None:
        extra: list[Schedule] = []
        if isinstance(hint, Schedule):
            extra = [hint]
        elif hint is not True:
            try:
                extra = list(hint)
            except TypeError:
                raise OptionError(f"hint: {hint!r} must be true, false, a Schedule or a list of schedules") from None
            if not all(isinstance(s, Schedule) for s in extra):
                raise OptionError("hint: every item must be a Schedule")
        for idx, sched in enumerate(extra):
            tl = simulate(chain, platform, sched)
            if tl.feasible and not kept & set(sched.offloaded_units):
                candidates.append((f"given[{idx}]", sched, tl.makespan))
        for name, res in _heuristic_schedules(chain, platform, kept):
            candidates.append((name, res.schedule, res.makespan))
    in_space = []
    for name, sched, mk in candidates:
        s2 = in_model_space(chain, sched)
        if s2 is not None and (grid.can_transfer or not s2.transfers):
            in_space.append((mk, name, s2))
    in_space.sort(key=lambda r: r[0])
    warm = in_space[0] if in_space else None

    info: dict[str, Any] = {"hint": warm[1] if warm else None, "retries": 0}
    if warm is not None and warm[0] <= chain.compute_time * (1 + 1e-12):
        # The warm start already reaches sum(fwd) + sum(bwd), a bound of every schedule: it is
        # optimal and there is nothing for CP-SAT to prove.
        info.update(
            time_scale=grid.scale,
            tolerance=grid.slack / grid.scale,
            cpsat_status="SKIPPED",
            kept_hint=True,
            wall_time=time.perf_counter() - t0,
        )
        return Result(
            "cpsat",
            Status.OPTIMAL,
            warm[2],
            makespan=warm[0],
            lower_bound=min(chain.compute_time, warm[0]),
            runtime=time.perf_counter() - t0,
            info=info,
            message="cpsat: the warm start reaches the compute time, a proven lower bound",
        )
    scale_used = grid.scale
    best_schedule: Schedule | None = None
    best_makespan = math.inf
    last_hint = warm[2] if warm else None
    status_name = "UNKNOWN"
    bound_units = math.nan
    objective_units = math.nan
    lb = math.nan
    tolerance = grid.slack / grid.scale
    deadline = t0 + float(time_limit)
    cpsat_accepted = False
    for attempt in range(_RETRIES + 1):
        model = _Model(chain, platform, grid, kept)
        if last_hint is not None:
            model.hint(last_hint)
            info["hint_complete"] = model.complete_hint(min(5.0, max(0.5, time_limit / 4)))
        solver = cp_model.CpSolver()
        # time_limit is the budget of the whole call, retries included.
        solver.parameters.max_time_in_seconds = max(0.1, deadline - time.perf_counter())
        solver.parameters.num_search_workers = int(workers)
        # A gap below the rounding slack R is below what the integer model can resolve
        # (NOTE [ cpsat: time scale ]): stop there and call it optimal.
        solver.parameters.absolute_gap_limit = max(1.0, float(grid.slack))
        callback = _Progress(cp_model, grid.scale, t0).callback if progress else None
        code = solver.solve(model.model, callback)
        status_name = solver.status_name(code)
        if status_name == "MODEL_INVALID":  # pragma: no cover - a bug in this module
            raise RuntimeError(f"cpsat: CP-SAT rejects the model: {model.model.validate()}")
        info["retries"] = attempt
        scale_used, tolerance = grid.scale, grid.slack / grid.scale
        if status_name == "INFEASIBLE":
            break
        bound_units = float(solver.best_objective_bound) if status_name in ("OPTIMAL", "FEASIBLE", "UNKNOWN") else math.nan
        lb = (bound_units - grid.slack) / grid.scale if math.isfinite(bound_units) else math.nan
        if status_name not in ("OPTIMAL", "FEASIBLE"):
            break
        objective_units = float(solver.objective_value)
        schedule = model.schedule_from(solver)
        tl = simulate(chain, platform, schedule)
        if tl.feasible:
            best_schedule, best_makespan = schedule, tl.makespan
            cpsat_accepted = True
            break
        if time.perf_counter() >= deadline:
            break
        # NOTE [ cpsat: time scale ]: a coincidence in integers fell the other way in floats.
        last_hint = schedule
        grid = TimeGrid.build(chain, platform, grid.scale * 1.6180339887)
    if progress:
        print(f"cpsat: done, status {status_name}, {time.perf_counter() - t0:.2f}s", file=sys.stderr, flush=True)

    info.update(
        time_scale=scale_used,
        tolerance=tolerance,
        objective_units=objective_units,
        bound_units=bound_units,
        cpsat_status=status_name,
        wall_time=time.perf_counter() - t0,
    )
    runtime = time.perf_counter() - t0
    if status_name == "INFEASIBLE":
        return Result(
            "cpsat",
            Status.INFEASIBLE,
            None,
            runtime=runtime,
            info=info,
            message=f"cpsat: no schedule of the model's space fits in {platform.memory} B (proven)",
        )
    # A heuristic's schedule may beat CP-SAT's by rounding (at most 2 * tolerance): keep the better.
    if warm is not None and warm[0] < best_makespan:
        best_schedule, best_makespan = warm[2], warm[0]
        info["kept_hint"] = True
    if best_schedule is None:
        return Result(
            "cpsat",
            Status.TIMEOUT,
            None,
            lower_bound=lb,
            runtime=runtime,
            info=info,
            message=f"cpsat: no schedule found within {time_limit:g}s (CP-SAT status {status_name})",
        )
    # OPTIMAL only when CP-SAT's own (simulator-accepted) schedule is proven optimal.
    status = Status.OPTIMAL if status_name == "OPTIMAL" and cpsat_accepted else Status.FEASIBLE
    message = "" if cpsat_accepted else "cpsat: the simulator rejected CP-SAT's schedules (NOTE [ cpsat: time scale ]); kept the warm start"
    if math.isfinite(lb):
        lb = min(lb, best_makespan)
    return Result(
        "cpsat",
        status,
        best_schedule,
        makespan=best_makespan,
        lower_bound=lb,
        runtime=runtime,
        info=info,
        message=message,
    )
