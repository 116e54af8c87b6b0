"""The model's constraints: the simulator's timing rules, memory, and what only helps the search.

:class:`Constraints` relates the records of :mod:`.variables`. The rules that make every
solution a schedule whose replay is the solution (NOTE [ cpsat: expressible timings ]) come
first; the rest (NOTE [ cpsat: canonical triggers ], NOTE [ cpsat: symmetry ], NOTE [ cpsat:
redundant memory cuts ]) remove duplicate solutions or strengthen the LP relaxation and cut
no timeline.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ...bounds.floor import keep_all_start_memory
from ...order import b_pos, f_pos, reader_pos
from .variables import TransferVar, Variables

__all__ = ["Constraints"]

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
#   when a literal says a_u moves alone (``moves: "act"``, docs/model.md), that holds for
#   a_u's act[u] bytes, the transfers take a_u's time, and the rest, saved[u] - act[u],
#   stays from F_u's start to B_u's end;
# * (duplicates only) a transfer is not triggered at the start of op k+1 when that start is
#   the instant op k ends: the end of op k is the same instant, and since transfers at one
#   event may take any queue order, every queue the start could give, the end gives too.
#
# With every start equal to the max of exactly the terms the simulator takes, the model's
# timeline is the simulator's deterministic replay of the converted schedule (with the
# integer durations; `integer_replay` is that replay, and the tests check that it reproduces
# every CP-SAT time exactly). The search space is therefore: every fixed-order schedule in
# the format whose explicit waits are on offloads, each unit moved whole or as a_u alone (a
# choice only where act[u] != saved[u]; else both are one schedule). The brute-force oracle
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

# NOTE [ cpsat: symmetry ]
# Variables that no rule reads in some solutions would let CP-SAT find one timeline many
# times: the times, trigger and order literals of a unit that is not offloaded, and whether
# an op that starts when its predecessor ends "waited". They are fixed: an absent transfer
# has start 0, end its duration, trigger time 0 and its first allowed event; the order
# literal of a pair with an absent member says "listed first runs first"; the cause
# "previous" of an op is "it did not wait" (Variables). None of this removes a timeline.

# NOTE [ cpsat: redundant memory cuts ]
# Memory while op k runs is keep-all's memory at op k (``bounds.keep_all_start_memory``) less
# the bytes of the units that are off the GPU, so at least the excess keepall_k - memory
# must be off. Two instants are checked: the start S_k, and t0 = the last prefetch start in
# (S_k, E_k), or S_k if none. A unit i off the GPU at S_k was released by S_k and its
# prefetch starts after S_k; one off at t0 was released before E_k and its prefetch starts at
# E_k or later (no prefetch starts in (t0, E_k)). Literals a[i, k] and z[i, k] *imply* these
# (only that direction is needed), and for each literal family the units' bytes cover the
# excess. The second instant is what a check at op starts alone misses: a prefetch that
# starts while op k runs brings its whole unit back then, not at the next op.
# Each unit's bytes are capped at the excess in those sums (keeps every 0/1 point, tightens
# the LP). There is one such literal per move a unit can make (whole, a_i alone), each
# implying that move and counting its bytes and transfer time: the move decides both.
# Channels: the offloads of the units a[., k] marks, i >= h, ran after F_h ended and
# before S_k; their prefetches (and those z[., k] marks) run after S_k (after E_k) and end
# before B_{h+1} starts (each P_i ends before B_{i+1}, which is at or before B_{h+1} for
# i >= h). Any solution satisfies all of this with a, z set to "is off the GPU then", so no
# solution is cut; they only make the bound provable sooner. The same structure, with
# whole moves and preemptive channels, is the lower bound of chainoffload.bounds
# (NOTE [ unit MILP lower bound ] there).


class Constraints:
    """Adds the model's constraints over ``variables`` (call :meth:`add_all` once)."""

    def __init__(self, variables: Variables):
        self.v = variables
        self.model = variables.model

    def add_all(self) -> None:
        """Every constraint group, in the order the NOTEs give them."""
        self.compute_sequence()
        self.triggers()
        self.channels()
        self.transfer_starts()
        self.waits()
        self.op_starts()
        self.symmetry()
        self.memory()
        self.redundant_memory()

    # -- timing --------------------------------------------------------------------------------

    def compute_sequence(self) -> None:
        """Ops run one after the other; ``gap`` says whether op k waited."""
        md, ops = self.model, self.v.ops
        for op in ops:
            md.add(op.end == op.start + op.duration)
        md.add(ops[0].start == 0)
        for prev, op in itertools.pairwise(ops):
            md.add(op.start >= prev.end + 1).only_enforce_if(op.gap)
            md.add(op.start == prev.end).only_enforce_if(~op.gap)

    def triggers(self) -> None:
        """Each transfer picks one allowed event; it starts at or after it; P_u not before O_u."""
        md, v = self.model, self.v
        for unit in v.units.values():
            for tr in (unit.offload, unit.prefetch):
                self._trigger(tr)
            o, p = unit.offload, unit.prefetch
            md.add(p.event >= o.event)
            md.add(p.start >= o.end).only_enforce_if(unit.offloaded)

    def _trigger(self, tr: TransferVar) -> None:
        md, v = self.model, self.v
        hi = tr.events[-1]
        md.add(sum(tr.triggers.values()) == tr.present)
        md.add(tr.event == sum(e * y for e, y in tr.triggers.items()) + tr.events[0] * (1 - tr.present))
        for e, y in tr.triggers.items():
            md.add(tr.trigger_time == v.event_time(e)).only_enforce_if(y)
            if e % 2 == 0 and e >= 2:
                # The start of op k+1 at the instant op k ends is the same trigger as the end
                # of op k (ties at one event take any order): use that one.
                md.add_implication(y, v.ops[e // 2].gap)
            if v.canonical and e < hi:
                # NOTE [ cpsat: canonical triggers ]: the next allowed event is after the start.
                if e % 2 == 0:
                    md.add(tr.start <= v.ops[e // 2].end - 1).only_enforce_if(y)
                else:
                    nxt = v.ops[e // 2 + 1]
                    md.add(tr.start <= nxt.start - 1).only_enforce_if([y, nxt.gap])
                    md.add(tr.start <= nxt.end - 1).only_enforce_if([y, ~nxt.gap])
        md.add(tr.start >= tr.trigger_time).only_enforce_if(tr.present)

    def channels(self) -> None:
        """One transfer at a time per channel, in trigger order."""
        md, v = self.model, self.v
        for chan in v.channels:
            md.add_no_overlap([v.transfer(k).interval for k in chan])
        for (a, b), p in v.order.items():
            ta, tb = v.transfer(a), v.transfer(b)
            both = [ta.present, tb.present]
            md.add(ta.end <= tb.start).only_enforce_if([p] + both)
            md.add(ta.event <= tb.event).only_enforce_if([p] + both)
            md.add(tb.end <= ta.start).only_enforce_if([~p] + both)
            md.add(tb.event <= ta.event).only_enforce_if([~p] + both)

    def transfer_starts(self) -> None:
        """A transfer's start equals the latest of its trigger, its channel predecessor's end and (P) its offload's end."""
        md, v = self.model, self.v
        for key, causes in v.transfer_cause.items():
            tr = v.transfer(key)
            for what, c in causes.items():
                md.add_implication(c, tr.present)
                if what == "trigger":
                    md.add(tr.start == tr.trigger_time).only_enforce_if(c)
                elif what == "offload":
                    md.add(tr.start == v.units[key[1]].offload.end).only_enforce_if(c)
                else:
                    other = v.transfer(what)
                    md.add(tr.start == other.end).only_enforce_if(c)
                    md.add_implication(c, other.present)
                    first = v.before(what, key)
                    if not isinstance(first, int):
                        md.add_implication(c, first)
            md.add_bool_or(list(causes.values())).only_enforce_if(tr.present)

    def waits(self) -> None:
        """Explicit waits on offloads: binding, at an op after the trigger op, at most one per unit."""
        md, v = self.model, self.v
        for unit in v.units.values():
            o = unit.offload
            for k, w in unit.waits.items():
                md.add_implication(w, unit.offloaded)
                md.add(o.event <= 2 * k - 1).only_enforce_if(w)
                md.add(v.ops[k].start == o.end).only_enforce_if(w)
            if unit.waits:
                md.add(sum(unit.waits.values()) <= 1)

    def op_starts(self) -> None:
        """An op's start equals the latest of its predecessor's end, its implicit prefetch waits and its explicit waits."""
        md, v = self.model, self.v
        waits_at: dict[int, list[Any]] = {}
        for unit in v.units.values():
            for k, w in unit.waits.items():
                waits_at.setdefault(k, []).append(w)
        for op in v.ops[1:]:
            if op.kind == "B":
                for u in (op.stage, op.stage - 1):
                    if u in v.units:
                        md.add(op.start >= v.units[u].prefetch.end).only_enforce_if(v.units[u].offloaded)
            causes = v.op_cause[op.index]
            for what, c in causes.items():
                if what != "previous":
                    unit = v.units[what[1]]
                    md.add(op.start == unit.prefetch.end).only_enforce_if(c)
                    md.add_implication(c, unit.offloaded)
            md.add_bool_or(list(causes.values()) + waits_at.get(op.index, []))

    def symmetry(self) -> None:
        """NOTE [ cpsat: symmetry ]: fix what no rule reads."""
        md, v = self.model, self.v
        for unit in v.units.values():
            off = ~unit.offloaded
            for tr in (unit.offload, unit.prefetch):
                md.add(tr.start == 0).only_enforce_if(off)
                md.add(tr.end == tr.duration).only_enforce_if(off)
                md.add(tr.trigger_time == 0).only_enforce_if(off)
        for (a, b), p in v.order.items():
            md.add_implication(~v.transfer(a).present, p)
            md.add_implication(~v.transfer(b).present, p)

    # -- memory --------------------------------------------------------------------------------

    def _interval(self, start, end, name, present=None):
        md = self.model
        size = md.new_int_var(0, self.v.horizon, f"{name}_len")
        if present is None:
            md.add(size == end - start)
            return md.new_interval_var(start, size, end, name)
        md.add(size == end - start).only_enforce_if(present)
        return md.new_optional_interval_var(start, size, end, present, name)

    # NOTE [ cpsat: zero-length ops ]
    # An op that takes no time lasts one unit on the grid (so that its transient counts), and
    # its frees come at the end of that unit, after its allocation and before the next op's,
    # as docs/model.md's order within one instant has them. One rule of that order the grid
    # did not follow: a prefetch allocates at the *start* of the instant (order -1), before a
    # zero-length op's allocation and frees at that instant. On the grid a prefetch that starts
    # when a zero-length op ends (the op's unit over) came after the op's frees; the simulator
    # counts it before them, and rejected the solution (issue 33: on a 4-stage chain with
    # zero-length ops every schedule CP-SAT found was rejected, and it said timeout).
    # So the prefetched copy's memory starts at the beginning of the run of zero-length ops
    # that share the prefetch's instant: `run_start[k]` is the start of the first op of the
    # run of back-to-back zero-length ops ending with op k (ops that follow each other without
    # a wait happen at one instant), and a prefetch that starts within that instant on the
    # grid (after run_start[k], at or before the end of zero-length op k) allocates at
    # run_start[k] at the latest. An allocation counted earlier only takes
    # memory, so the solver never places it earlier than it must: the bound is exact, no
    # equality needed. The rest of the order is what the grid had: an op that took time frees
    # before anything allocates at its end; a zero-length op's frees come after its own
    # allocation and before the next op's; the original a zero-length F_{i+1} reads is
    # released at its end ("zero-length reader").

    def _zero_length_runs(self) -> dict[int, Any]:
        """``run_start[k]`` for each zero-length op k (NOTE [ cpsat: zero-length ops ])."""
        v, md = self.v, self.model
        chain, ops = v.chain, v.ops
        run_start: dict[int, Any] = {}
        for k, op in enumerate(ops):
            seconds = float(chain.fwd[op.stage - 1] if op.kind == "F" else chain.bwd[op.stage - 1])
            if seconds != 0.0:
                continue
            if k - 1 not in run_start:
                run_start[k] = op.start
                continue
            # Op k-1 is zero-length too: the same instant unless op k waited.
            start = md.new_int_var(0, v.horizon, f"run{k}")
            joined = md.new_bool_var(f"joined{k}")
            md.add(op.start == ops[k - 1].end).only_enforce_if(joined)
            md.add(op.start > ops[k - 1].end).only_enforce_if(~joined)
            md.add(start == run_start[k - 1]).only_enforce_if(joined)
            md.add(start == op.start).only_enforce_if(~joined)
            run_start[k] = start
        return run_start

    def _prefetch_allocation(self, prefetch: TransferVar, run_start: dict[int, Any], name: str):
        """When the prefetch's copy starts taking memory: its start, or earlier when it starts
        at the end of a zero-length op (NOTE [ cpsat: zero-length ops ])."""
        if not run_start:
            return prefetch.start
        v, md = self.v, self.model
        alloc = md.new_int_var(0, v.horizon, name)
        md.add(alloc <= prefetch.start)
        for k, first in run_start.items():
            # The prefetch starts inside the run's instant, (run_start[k], end of op k]: two
            # half-reified inequalities (a `!=` propagated too weakly to find a first solution).
            after = md.new_bool_var(f"{name}_after{k}")
            by = md.new_bool_var(f"{name}_by{k}")
            md.add(prefetch.start >= first + 1).only_enforce_if(after)
            md.add(prefetch.start <= first).only_enforce_if(~after)
            md.add(prefetch.start <= v.ops[k].end).only_enforce_if(by)
            md.add(prefetch.start >= v.ops[k].end + 1).only_enforce_if(~by)
            md.add(alloc <= first).only_enforce_if([after, by])
            # The same rule at the op's end alone, as an equality: redundant, but CP-SAT proves
            # infeasibility with it where the inequalities alone left it at UNKNOWN (measured on
            # 3-stage chains), while they alone find first solutions fast.
            at = md.new_bool_var(f"{name}_at{k}")
            md.add(prefetch.start == v.ops[k].end).only_enforce_if(at)
            md.add(prefetch.start != v.ops[k].end).only_enforce_if(~at)
            md.add(alloc <= first).only_enforce_if(at)
        return alloc

    def memory(self) -> None:
        """One Cumulative at the memory limit over every allocation's [start, free) interval."""
        v, md = self.v, self.model
        chain, length, ops = v.chain, v.length, v.ops
        act, saved = [int(a) for a in chain.act], [int(s) for s in chain.saved]
        fwd_tmp, bwd_tmp = [int(t) for t in chain.fwd_tmp], [int(t) for t in chain.bwd_tmp]
        intervals, demands = [], []

        def add(iv, d):
            if d > 0:
                intervals.append(iv)
                demands.append(d)

        last = ops[-1]
        run_start = self._zero_length_runs()
        add(self._interval(ops[0].start, last.end, "a0"), act[0])
        self.resident_end: dict[int, Any] = {}
        for i in range(1, length + 1):
            f, b = ops[f_pos(i)], ops[b_pos(length, i)]
            add(md.new_interval_var(f.start, f.duration, f.end, f"ftmp{i}"), fwd_tmp[i - 1])
            add(md.new_interval_var(b.start, b.duration, b.end, f"btmp{i}"), bwd_tmp[i - 1])
            # g_{i-1}, allocated by B_i, freed by B_{i-1} (g_0 is never freed; B_1 ends it all).
            g_end = ops[b_pos(length, i - 1)].end if i > 1 else b.end
            add(self._interval(b.start, g_end, f"g{i - 1}"), act[i - 1])
            if i == length:
                add(md.new_interval_var(b.start, b.duration, b.end, f"g{length}"), act[length])
            unit = v.units.get(i)
            if unit is None:
                add(self._interval(f.start, b.end, f"unit{i}"), saved[i - 1])
                continue
            x, o = unit.offloaded, unit.offload
            r = md.new_int_var(0, v.horizon, f"r{i}")
            md.add(r == b.end).only_enforce_if(~x)
            if i < length:
                free = md.new_int_var(0, v.horizon, f"free{i}")
                md.add_max_equality(free, [o.end, ops[f_pos(i + 1)].end])
                md.add(r == free).only_enforce_if(x)
            else:
                md.add(r == o.end).only_enforce_if(x)
            self.resident_end[i] = r
            # What moves (a_i alone, or the whole unit) leaves at r and is back from P_i's
            # start; the rest of a unit of which a_i alone moves stays from F_i to B_i.
            moved = act[i] if unit.alone is not None else saved[i - 1]
            back = self._prefetch_allocation(unit.prefetch, run_start, f"alloc{i}")
            add(self._interval(f.start, r, f"unit{i}a"), moved)
            add(self._interval(back, b.end, f"unit{i}b", x), moved)
            if unit.alone is not None:
                rest_end = md.new_int_var(0, v.horizon, f"rest{i}")
                md.add(rest_end == r).only_enforce_if(unit.whole)
                md.add(rest_end == b.end).only_enforce_if(~unit.whole)
                add(self._interval(f.start, rest_end, f"rest{i}a"), saved[i - 1] - act[i])
                add(self._interval(back, b.end, f"rest{i}b", unit.whole), saved[i - 1] - act[i])
        md.add_cumulative(intervals, demands, v.platform.memory)

    def redundant_memory(self) -> None:
        """Implied constraints that give the LP relaxation the structure of the problem.

        See NOTE [ cpsat: redundant memory cuts ].
        """
        v, md = self.v, self.model
        if not v.units:
            return
        chain, length, ops, grid = v.chain, v.length, v.ops, v.grid
        saved = [int(s) for s in chain.saved]
        excess = keep_all_start_memory(chain).astype(np.int64) - int(v.platform.memory)
        units = sorted(v.units)
        # One literal per move a unit can make (whole, a_i alone): bytes and transfer times differ.
        moves = {i: [("unit", v.units[i].whole, saved[i - 1])]
                 + ([("act", v.units[i].alone, int(chain.act[i]))] if v.units[i].alone is not None else [])
                 for i in units}
        for k, op in enumerate(ops):
            at_start, at_end = [], []
            for i in units:
                unit = v.units[i]
                if not i + 1 <= k < reader_pos(length, i):
                    continue
                for how, lit, size in moves[i]:
                    a = md.new_bool_var(f"absent{i}{how}_{k}")
                    md.add_implication(a, lit)
                    md.add(self.resident_end[i] <= op.start).only_enforce_if(a)
                    md.add(unit.prefetch.start >= op.start + 1).only_enforce_if(a)
                    at_start.append((i, how, size, a))
                    z = md.new_bool_var(f"absent_end{i}{how}_{k}")
                    md.add_implication(z, lit)
                    md.add(self.resident_end[i] <= op.end - 1).only_enforce_if(z)
                    md.add(unit.prefetch.start >= op.end).only_enforce_if(z)
                    at_end.append((i, how, size, z))
            if not at_start:
                continue
            need = int(excess[k])
            if need > 0:
                for group in (at_start, at_end):
                    # Capping each unit at the excess keeps every 0/1 point and tightens the LP.
                    md.add(sum(min(size, need) * lit for _, _, size, lit in group) >= need)
            # Channels: the absent units i >= h went out on D2H after F_h ended and before the
            # check, and come back on H2D after it and before B_{h+1} starts (each P_i ends
            # before B_{i+1}, at or before B_{h+1} for i >= h). One pair of cuts per h.
            for h in sorted({i for i, *_ in at_start}):
                f_end = ops[f_pos(h)].end
                reader = ops[b_pos(length, h + 1)].start
                out_a = sum(grid.transfer("offload", i, how) * a for i, how, _, a in at_start if i >= h)
                back_a = sum(grid.transfer("prefetch", i, how) * a for i, how, _, a in at_start if i >= h)
                back_z = sum(grid.transfer("prefetch", i, how) * z for i, how, _, z in at_end if i >= h)
                md.add(op.start >= f_end + out_a)
                md.add(reader >= op.start + back_a)
                md.add(reader >= op.end + back_z)
