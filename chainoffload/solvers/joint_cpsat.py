"""``joint``'s exact improver: CP-SAT re-chooses and re-times the transfers of a rematerializing plan.

NOTE [ joint: CP-SAT re-timing ]
--------------------------------
The paper's DP (``NOTE [ joint recurrence ]`` in :mod:`.joint`) rounds sizes up to memory slots
and the budget down, and times its queues on a grid of rows: a plan that fits in bytes with a
slot to spare, or a copy that could start one op earlier, is hidden from it (the lift of
``NOTE [ joint: lifted plans ]`` closes part of that gap). This module keeps the plan's compute
sequence (its F, Fck, Fn and B ops and their order, so its rematerialization) fixed and lets
CP-SAT choose, under the platform's true memory in bytes, what the plan's transfers are: which
*instances* (docs/model.md, "Instances") are offloaded (at most one per unit, as the format
allows), whether a whole unit moves a_i alone (``moves: "act"``), the trigger event of every
offload and prefetch, the channel order, and the explicit waits (``before``) on offloads. It is
the exact model of :mod:`chainoffload.solvers.cpsat` (``NOTE [ cpsat: expressible timings ]``:
every start *equals* the max of the terms the simulator takes, with a literal saying which)
carried from the fixed order to any sequence:

* **Instances and their readers come from the simulator's own resolver**
  (:func:`chainoffload.schedule.resolve`), not from a second copy of the rules: for every
  instance a probe schedule offloads it at the end of its maker and gives the ops that read its
  original GPU copy (``hold_op``), the ops that wait for its prefetch, and the op that frees
  it; the plan with no transfer gives every other allocation and free.
* **An offload's trigger is kept where that answer does not change**: from the end of its maker
  up to the start of the first backward op after the maker (the readers of the original are
  the forward readers before that op, docs/model.md), and before the next forward op of the
  same stage (which would make the offload move that op's instance). The prefetch is triggered
  at or after its offload and before the first op that waits for it starts (else a ``read``
  violation), and ends before every such op starts. An explicit wait may name an op after the
  trigger op, up to that first backward op. Joint's DP triggers every offload at the end of its
  input's maker, so its plans lie in this space; a plan that does not (an incumbent from
  elsewhere) is left as it is (``info["why"]``).
* **Memory** is one Cumulative over [allocation, free) intervals: each allocation of the
  transfer-free plan from its op's start to its freeing op's end (a_0 from 0 to the end); an
  offloaded instance's original from its maker's start to max(its offload's end, the end of its
  last original reader), and the prefetched copy from the prefetch's start to the freeing op's
  end; with a_i alone moving, the rest stays from the maker's start to that end.

What this model does not state exactly (the order of events within one instant for zero-length
ops, ``NOTE [ cpsat: zero-length ops ]``; the integer rounding of ``NOTE [ cpsat: time scale ]``)
only matters through the simulator, which replays every candidate: **a candidate replaces the
incumbent only when the simulator accepts it and its makespan is strictly smaller**, so this
never returns a schedule the simulator rejects or one slower than the incumbent.

The search is ``best``'s (``NOTE [ large neighbourhood search ]`` in :mod:`.lns`, whose runner
it uses). One worker, a fixed seed and ``max_deterministic_time`` as the normal stop make the
result the same on any machine and at any load; Ctrl-C stops the search through CP-SAT's
``stop_search`` (the runner's ``run_stoppable``). Every model states that the makespan is below
the incumbent's (its integer replay plus the rounding slack, which cuts no faster schedule): a
neighbourhood with nothing better is proven so in a few hundredths of a deterministic second
instead of spending its share on worse schedules (measured on Inception-v3's V100 twin at 10 %:
6 of its 7 structural moves proven INFEASIBLE in 0.003-0.074 s each and the improving one OPTIMAL
in 0.063, where without the cut those 6 ran out their 0.5 s each and the improving one took 0.43).

1. **Re-timing the plan's own sequence**, only when the plan stalls at all (its makespan above
   the compute time of its sequence, which no choice of transfers beats; joint's plans mostly do
   not: the DP recomputes rather than wait). The incumbent becomes a complete solution hint (a
   solve with the hinted decisions fixed completes it); windows of :data:`WINDOW_STAGES` stages
   are re-solved with every instance outside them fixed, then the whole model, within
   :data:`RETIME_SHARE` of the work.

NOTE [ joint: CP-SAT structure moves ]
--------------------------------------
2. **Structural moves.** Where joint's plan does not stall (every recomputing plan of ResNet-18,
   ResNet-50, Inception-v3 and GPT-2-12 in ``benchmarks/results/joint_cpsat.md``: the makespan is
   the sequence's compute time within 1e-9), only fewer recomputations make it faster: a stage s whose first forward op is a checkpoint (Fck_s
   or Fn_s) and which is re-run by F_s after a backward op. A move makes that first op F_s (the
   unit kept whole) and deletes the re-run, saving the re-run's time and the checkpoint's; for a
   run of consecutive re-runs, all at once too. The new sequence must pass the resolver (else
   the move is dropped) and be faster in compute alone than the incumbent; its transfers are
   then solved from scratch by CP-SAT (the incumbent's, carried over where their instance
   survives, as a partial hint) within :data:`EDIT_WORK`. The moves are tried the largest saving
   first; after one improves, they are drawn again from the new incumbent; at most
   :data:`MAX_EDITS` models are built per call (their building is wall time the work does not
   count).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from ..chain import Chain
from ..platform import Platform
from ..schedule import OP_CODE, Schedule, ScheduleError, Transfer, resolve
from ..simulate import simulate

__all__ = ["JOINT_CPSAT_WORK", "MAX_STAGES", "WINDOW_STAGES", "WINDOW_WORK", "Improvement", "improve"]

#: CP-SAT's deterministic seconds ``joint`` spends by default (its ``cpsat_work``). At 0.25 it finds
#: the same faster plans as at 0.5 on the 16 points of benchmarks/results/joint_cpsat_work.md
#: (Inception-v3's twin at 10/30/70 %, random-L12 at 10/70 %) for 45.4 s of joint's time in all
#: against 65.6 s (3.7 s without it; load 6-7 on 2 cores); a structural move with nothing better is
#: mostly proven so in 0.003-0.14 of them (benchmarks/results/joint_cpsat.md).
JOINT_CPSAT_WORK = 0.25
#: The most deterministic seconds one window may take.
WINDOW_WORK = 0.25
#: The share of the work the re-timing of the incumbent's own sequence may take (the rest: structural moves).
RETIME_SHARE = 0.5
#: The most deterministic seconds one structural move's solve may take (the improving move above
#: took 0.063; the proofs that a move has nothing better, up to 0.14 on ResNet-50's twin).
EDIT_WORK = 0.2
#: The most structural moves one call builds a model for (each costs a model's building).
MAX_EDITS = 16
#: Stages per window.
WINDOW_STAGES = 6
#: Longest chain whose model is built (as lns.WINDOW_MAX_STAGES: the model grows with the square of the
#: instances, and its building is wall time no work limit cuts).
MAX_STAGES = 24
#: The seed of the window offsets (CP-SAT's own is lns.SEED).
SEED = 0

_EPS = 1e-12
_OP_B = OP_CODE["B"]


@dataclasses.dataclass(frozen=True)
class Improvement:
    """What :func:`improve` found: the best schedule (the incumbent when nothing better), its
    simulated makespan, and ``info``: ``mode`` (``skipped`` with ``why``, or ``run``), ``work``
    (deterministic seconds spent); for the re-timing ``retime`` (``run``, or why not), ``windows``
    (solved), ``improved``, ``whole`` (CP-SAT's status of the whole solve), ``hint_makespan`` (the
    incumbent as the model replays it, seconds); for the structural moves ``edits`` (models
    solved), ``edits_improved``, ``edit_status`` (CP-SAT's status of each); ``guard`` when a
    clock stopped a call."""

    schedule: Schedule
    makespan: float
    info: dict


@dataclasses.dataclass(frozen=True)
class _Item:
    """One instance that may be offloaded (docs/model.md, "Instances")."""

    stage: int
    maker: int
    freer: int
    whole: bool  # made by F (saved[i] bytes) rather than Fck / Fn (a lone a_i)
    holds: tuple[int, ...]  # forward ops that read the original GPU copy
    waiters: tuple[int, ...]  # ops that wait for the prefetch
    off_events: tuple[int, int]  # allowed offload trigger events, inclusive
    pre_last: int  # last allowed prefetch trigger event
    wait_ops: tuple[int, ...]  # ops an explicit wait on the offload may name


def _arrays(compute, transfers=()):
    kind = np.array([OP_CODE[k] for k, _ in compute], dtype=np.int64)
    stage = np.array([s for _, s in compute], dtype=np.int64)
    tk = np.array([0 if t[0] == "offload" else 1 for t in transfers], dtype=np.int64)
    tu = np.array([t[1] for t in transfers], dtype=np.int64)
    to = np.array([t[2] for t in transfers], dtype=np.int64)
    ta = np.array([t[3] for t in transfers], dtype=np.int64)
    tb = np.full(len(transfers), -1, dtype=np.int64)
    out = (kind, stage, tk, tu, to, ta, tb)
    for arr in out:
        arr.setflags(write=False)  # as Schedule.arrays(): one compiled signature
    return out


def _items(length: int, compute, keep: frozenset[int] = frozenset()) -> list[_Item]:
    """Every offloadable instance of ``compute``, read off the simulator's resolver (probes);
    none of a unit in ``keep`` (NOTE [ joint: keep ] in :mod:`.joint`)."""
    n = len(compute)
    items = []
    for m, (kind, i) in enumerate(compute):
        if kind == "B" or i in keep:
            continue
        first_b = next(k for k in range(m + 1, n) if compute[k][0] == "B")
        nxt = next((k for k in range(m + 1, n) if compute[k][0] != "B" and compute[k][1] == i), n)
        # Probe: the offload at the end of its maker, the prefetch at the same event.
        st = resolve(length, *_arrays(compute, [("offload", i, m, 1), ("prefetch", i, m, 1)]))
        holds = tuple(int(k) for k in st.hold_op[st.hold_ptr[0]:st.hold_ptr[1]])
        waiters = tuple(k for k in range(n) if 1 in st.wait_tr[st.wait_ptr[k]:st.wait_ptr[k + 1]])
        freer = next((k for k in range(n) if -2 in st.free_src[st.free_ptr[k]:st.free_ptr[k + 1]]), None)
        if not waiters or freer is None:
            continue
        first_wait = waiters[0]
        hi = min(2 * first_b, 2 * nxt - 1, 2 * first_wait - 1)
        lo = 2 * m + 1
        if hi < lo:
            continue
        wait_ops = tuple(range(m + 1, min(first_b, first_wait) + 1))
        items.append(_Item(i, m, freer, kind == "F", holds, waiters, (lo, hi), 2 * first_wait - 1, wait_ops))
    return items


class _Model:
    """The CP-SAT model of one compute sequence's transfers (NOTE [ joint: CP-SAT re-timing ])."""

    def __init__(self, chain: Chain, platform: Platform, compute, items: list[_Item], grid,
                 upper: float | None = None) -> None:
        from ortools.sat.python import cp_model

        self.chain, self.platform, self.compute, self.items, self.grid = chain, platform, compute, items, grid
        self.md = md = cp_model.CpModel()
        length, n = chain.length, len(compute)
        scale = grid.scale
        act, saved = [int(a) for a in chain.act], [int(s) for s in chain.saved]
        dur, err = [], 0.0
        for kind, s in compute:
            sec = float(chain.fwd[s - 1] if kind == "F" else chain.bwd[s - 1] if kind == "B" else chain.fwd_nosave[s - 1])
            d = max(1, int(round(sec * scale)))
            err += abs(d - sec * scale)
            dur.append(d)
        self.slack = grid.slack + err
        tdur = {}
        for c, it in enumerate(items):
            for kind in ("offload", "prefetch"):
                tdur[c, kind, "unit"] = grid.transfer(kind, it.stage, "unit" if it.whole else "act")
                tdur[c, kind, "act"] = grid.transfer(kind, it.stage, "act")
        h = sum(dur) + sum(tdur[c, k, "unit"] for c in range(len(items)) for k in ("offload", "prefetch"))
        self.horizon = h
        S = [md.new_int_var(0, h, f"S{k}") for k in range(n)]
        E = [md.new_int_var(0, h, f"E{k}") for k in range(n)]
        gap = [None] + [md.new_bool_var(f"gap{k}") for k in range(1, n)]
        self.S, self.E = S, E
        for k in range(n):
            md.add(E[k] == S[k] + dur[k])
        md.add(S[0] == 0)
        for k in range(1, n):
            md.add(S[k] >= E[k - 1] + 1).only_enforce_if(gap[k])
            md.add(S[k] == E[k - 1]).only_enforce_if(~gap[k])

        def ev_time(e):
            return S[e // 2] if e % 2 == 0 else E[e // 2]

        # -- items: choice, what moves, transfers ---------------------------------------------------
        self.x, self.alone, self.mv, self.tr, self.waits = [], [], [], {}, []
        per_stage: dict[int, list] = {}
        for c, it in enumerate(items):
            x = md.new_bool_var(f"x{c}")
            alone = None
            whole_mv = x
            if it.whole and act[it.stage] != saved[it.stage - 1]:
                alone = md.new_bool_var(f"act{c}")
                whole_mv = md.new_bool_var(f"whole{c}")
                md.add(alone + whole_mv == x)
            self.x.append(x)
            self.alone.append(alone)
            self.mv.append(whole_mv)
            per_stage.setdefault(it.stage, []).append(x)
            for kind in ("offload", "prefetch"):
                d = tdur[c, kind, "unit"]
                size = d if alone is None else d - (d - tdur[c, kind, "act"]) * alone
                start = md.new_int_var(0, h, f"{kind[0]}{c}_s")
                end = md.new_int_var(0, h, f"{kind[0]}{c}_e")
                iv = md.new_optional_interval_var(start, size, end, x, f"{kind[0]}{c}_iv")
                lo = it.off_events[0]
                hi = it.off_events[1] if kind == "offload" else it.pre_last
                lits = {e: md.new_bool_var(f"y{kind[0]}{c}_{e}") for e in range(lo, hi + 1)}
                ev = md.new_int_var(lo, hi, f"{kind[0]}{c}_ev")
                trig = md.new_int_var(0, h, f"{kind[0]}{c}_t")
                md.add(sum(lits.values()) == x)
                md.add(ev == sum(e * y for e, y in lits.items()) + lo * (1 - x))
                for e, y in lits.items():
                    md.add(trig == ev_time(e)).only_enforce_if(y)
                    if e % 2 == 0 and e >= 2:
                        # The start of op k+1 at the instant op k ends is the end of op k
                        # (NOTE [ cpsat: expressible timings ], duplicates only).
                        md.add_implication(y, gap[e // 2])
                md.add(start >= trig).only_enforce_if(x)
                # NOTE [ cpsat: symmetry ]: what no rule reads is fixed.
                md.add(start == 0).only_enforce_if(~x)
                md.add(end == d).only_enforce_if(~x)
                md.add(trig == 0).only_enforce_if(~x)
                self.tr[c, kind] = dict(start=start, end=end, iv=iv, ev=ev, lits=lits, trig=trig)
            o, p = self.tr[c, "offload"], self.tr[c, "prefetch"]
            md.add(p["ev"] >= o["ev"])
            md.add(p["start"] >= o["end"]).only_enforce_if(x)
            w = {k: md.new_bool_var(f"w{c}_{k}") for k in it.wait_ops}
            for k, lit in w.items():
                md.add_implication(lit, x)
                md.add(o["ev"] <= 2 * k - 1).only_enforce_if(lit)
                md.add(S[k] == o["end"]).only_enforce_if(lit)
            if w:
                md.add(sum(w.values()) <= 1)
            self.waits.append(w)
        for xs in per_stage.values():
            if len(xs) > 1:
                md.add(sum(xs) <= 1)  # at most one offload per unit (docs/model.md)

        # -- channels: FIFO in trigger order, start = max(trigger, predecessor, own offload) ---------
        keys = [(c, "offload") for c in range(len(items))], [(c, "prefetch") for c in range(len(items))]
        chans = list(keys) if platform.duplex else [keys[0] + keys[1]]
        self.chans = chans
        self.order = {}
        for chan in chans:
            md.add_no_overlap([self.tr[k]["iv"] for k in chan])
            for a_i, a in enumerate(chan):
                for b in chan[a_i + 1:]:
                    if a[0] == b[0]:
                        continue
                    p = md.new_bool_var(f"p{a}{b}")
                    self.order[a, b] = p
                    ta, tb = self.tr[a], self.tr[b]
                    both = [self.x[a[0]], self.x[b[0]]]
                    md.add(ta["end"] <= tb["start"]).only_enforce_if([p] + both)
                    md.add(ta["ev"] <= tb["ev"]).only_enforce_if([p] + both)
                    md.add(tb["end"] <= ta["start"]).only_enforce_if([~p] + both)
                    md.add(tb["ev"] <= ta["ev"]).only_enforce_if([~p] + both)
                    md.add_implication(~self.x[a[0]], p)
                    md.add_implication(~self.x[b[0]], p)

        def before(a, b):
            if a[0] == b[0]:
                return int(a[1] == "offload")
            lit = self.order.get((a, b))
            return lit if lit is not None else ~self.order[b, a]

        for chan in chans:
            for key in chan:
                tr, x = self.tr[key], self.x[key[0]]
                causes = [md.new_bool_var(f"c{key}trig")]
                md.add(tr["start"] == tr["trig"]).only_enforce_if(causes[0])
                if key[1] == "prefetch" and platform.duplex:
                    c = md.new_bool_var(f"c{key}off")
                    md.add(tr["start"] == self.tr[key[0], "offload"]["end"]).only_enforce_if(c)
                    causes.append(c)
                for other in chan:
                    if other == key or (other[0] == key[0] and other[1] == "prefetch"):
                        continue
                    c = md.new_bool_var(f"c{key}{other}")
                    md.add(tr["start"] == self.tr[other]["end"]).only_enforce_if(c)
                    md.add_implication(c, self.x[other[0]])
                    first = before(other, key)
                    if not isinstance(first, int):
                        md.add_implication(c, first)
                    causes.append(c)
                for c in causes:
                    md.add_implication(c, x)
                md.add_bool_or(causes).only_enforce_if(x)

        # -- compute ops: start = max(previous end, prefetches waited for, explicit waits) -----------
        for k in range(1, n):
            causes = [~gap[k]]
            for c, it in enumerate(items):
                if k in it.waiters:
                    p_end = self.tr[c, "prefetch"]["end"]
                    md.add(S[k] >= p_end).only_enforce_if(self.x[c])
                    lit = md.new_bool_var(f"cop{k}_{c}")
                    md.add(S[k] == p_end).only_enforce_if(lit)
                    md.add_implication(lit, self.x[c])
                    causes.append(lit)
                if k in self.waits[c]:
                    causes.append(self.waits[c][k])
            md.add_bool_or(causes)

        # -- memory -----------------------------------------------------------------------------
        sizes = _sizes_table(chain)
        st = resolve(length, *_arrays(compute))
        pending: dict[tuple[int, int], int] = {}
        for k in range(n):
            for sid in st.alloc_size[st.alloc_ptr[k]:st.alloc_ptr[k + 1]]:
                pending[k, int(sid)] = pending.get((k, int(sid)), 0) + 1
        mine = {(it.freer, it.maker, length + it.stage if it.whole else it.stage) for it in items}
        ivs, dem = [], []

        def add(iv, d):
            if d > 0:
                ivs.append(iv)
                dem.append(int(d))

        def span(a, b, name, present=None):
            ln = md.new_int_var(0, h, f"{name}_len")
            if present is None:
                md.add(ln == b - a)
                return md.new_interval_var(a, ln, b, name)
            md.add(ln == b - a).only_enforce_if(present)
            return md.new_optional_interval_var(a, ln, b, present, name)

        for f in range(n):
            for q in range(st.free_ptr[f], st.free_ptr[f + 1]):
                sid, src = int(st.free_size[q]), int(st.free_src[q])
                pending[src, sid] -= 1
                if (f, src, sid) in mine:
                    continue  # an item: below
                add(span(S[src], E[f], f"m{f}_{q}"), sizes[sid])
        for (k, sid), cnt in pending.items():
            for j in range(cnt):
                add(span(S[k], E[n - 1], f"rest{k}_{sid}_{j}"), sizes[sid])
        # a_0 is freed by B_1 in the table above (paired with the g_0 it allocates): resident from 0.
        add(span(S[0], E[n - 1], "a0"), act[0])
        for c, it in enumerate(items):
            x, o, p = self.x[c], self.tr[c, "offload"], self.tr[c, "prefetch"]
            full = saved[it.stage - 1] if it.whole else act[it.stage]
            moved = act[it.stage] if self.alone[c] is not None else full
            rel = md.new_int_var(0, h, f"rel{c}")
            md.add(rel == E[it.freer]).only_enforce_if(~x)
            free = md.new_int_var(0, h, f"free{c}")
            md.add_max_equality(free, [o["end"]] + [E[k] for k in it.holds])
            md.add(rel == free).only_enforce_if(x)
            add(span(S[it.maker], rel, f"i{c}a"), moved)
            add(span(p["start"], E[it.freer], f"i{c}b", x), moved)
            if self.alone[c] is not None:
                rest_end = md.new_int_var(0, h, f"re{c}")
                md.add(rest_end == rel).only_enforce_if(self.mv[c])
                md.add(rest_end == E[it.freer]).only_enforce_if(~self.mv[c])
                add(span(S[it.maker], rest_end, f"r{c}a"), full - moved)
                add(span(p["start"], E[it.freer], f"r{c}b", self.mv[c]), full - moved)
        md.add_cumulative(ivs, dem, int(platform.memory))
        if upper is not None:
            # Only a schedule faster than the incumbent is of use: its integer replay is at most
            # upper * scale + R units (NOTE [ cpsat: time scale ]), so this cuts none of them.
            md.add(E[n - 1] <= int(math.floor(upper * scale + self.slack)))
        md.minimize(E[n - 1])

    # -- hints and solutions --------------------------------------------------------------------

    def decisions(self, c: int) -> list[int]:
        """Proto indices of item ``c``'s decisions (what, which, when), for fixing outside a window."""
        out = [self.x[c].index]
        if self.alone[c] is not None:
            out += [self.alone[c].index, self.mv[c].index]
        for kind in ("offload", "prefetch"):
            out.append(self.tr[c, kind]["ev"].index)
        out += [w.index for w in self.waits[c].values()]
        return out

    def hint(self, schedule: Schedule, op_map: dict[int, int] | None = None) -> bool:
        """Hint the incumbent's decisions; False when it lies outside the model's space.

        With ``op_map`` (op of ``schedule`` -> op of this model's sequence, for a structural move)
        the incumbent's transfers are carried over where their instance survives, their events
        clamped into the new ranges: a partial hint CP-SAT may repair or drop.
        """
        md, length = self.md, self.chain.length
        st = schedule._structure(length)
        by_maker = {it.maker: c for c, it in enumerate(self.items)}
        chosen: dict[int, tuple] = {}
        pos = {int(t): q for q, t in enumerate(st.tr_order)}
        prefetch_of = {tr.unit: q for q, tr in enumerate(schedule.transfers) if tr.kind == "prefetch"}

        def moved(e: int) -> int | None:
            if op_map is None:
                return e
            k = op_map.get(e // 2)
            return None if k is None else 2 * k + e % 2

        for t, tr in enumerate(schedule.transfers):
            if tr.kind != "offload":
                continue
            maker = moved(2 * int(st.tr_src[t]))
            c = None if maker is None else by_maker.get(maker // 2)
            pt = prefetch_of[tr.unit]
            oe = moved(2 * tr.op + (tr.at == "end"))
            pe = moved(2 * schedule.transfers[pt].op + (schedule.transfers[pt].at == "end"))
            before = None if tr.before is None else moved(2 * tr.before)
            if op_map is None:
                if c is None or not (self.items[c].off_events[0] <= oe <= self.items[c].off_events[1]
                                     and oe <= pe <= self.items[c].pre_last):
                    return False
                if before is not None and before // 2 not in self.waits[c]:
                    return False
            else:
                if c is None or oe is None or pe is None:
                    continue
                lo, hi = self.items[c].off_events
                oe = min(max(oe, lo), hi)
                pe = min(max(pe, oe), self.items[c].pre_last)
                if before is not None and before // 2 not in self.waits[c]:
                    before = None
            chosen[c] = (oe, pe, None if before is None else before // 2, tr.moves == "act", pos[t], pos[pt])
        md.clear_hints()
        for c in range(len(self.items)):
            got = chosen.get(c)
            md.add_hint(self.x[c], got is not None)
            if self.alone[c] is not None:
                md.add_hint(self.alone[c], got is not None and got[3])
                md.add_hint(self.mv[c], got is not None and not got[3])
            for j, kind in enumerate(("offload", "prefetch")):
                tr = self.tr[c, kind]
                e = got[j] if got else None
                md.add_hint(tr["ev"], e if e is not None else self.items[c].off_events[0])
                for ee, y in tr["lits"].items():
                    md.add_hint(y, ee == e)
            for k, w in self.waits[c].items():
                md.add_hint(w, got is not None and got[2] == k)
        for (a, b), p in self.order.items():
            ga, gb = chosen.get(a[0]), chosen.get(b[0])
            if ga is None or gb is None:
                md.add_hint(p, True)
            else:
                pa = ga[4] if a[1] == "offload" else ga[5]
                pb = gb[4] if b[1] == "offload" else gb[5]
                md.add_hint(p, pa < pb)
        return True

    def schedule_from(self, solver) -> Schedule:
        rows = []
        for c, it in enumerate(self.items):
            if not solver.boolean_value(self.x[c]):
                continue
            moves = "act" if self.alone[c] is not None and solver.boolean_value(self.alone[c]) else "unit"
            before = next((k for k, w in self.waits[c].items() if solver.boolean_value(w)), None)
            for kind in ("offload", "prefetch"):
                tr = self.tr[c, kind]
                ev = int(solver.value(tr["ev"]))
                key = (ev, int(solver.value(tr["start"])), int(solver.value(tr["end"])), kind == "prefetch")
                rows.append((key, Transfer(kind, it.stage, ev // 2, "end" if ev % 2 else "start",
                                           before if kind == "offload" else None, moves)))
        rows.sort(key=lambda r: r[0])
        return Schedule(tuple(self.compute), tuple(t for _, t in rows))

    def checked(self, solver) -> tuple[Schedule, float] | None:
        sched = self.schedule_from(solver)
        tl = simulate(self.chain, self.platform, sched)
        return (sched, tl.makespan) if tl.feasible else None


def _sizes_table(chain: Chain) -> np.ndarray:
    from ..simulate import _sizes

    return _sizes(chain)


def _op_seconds(chain: Chain, kind: str, stage: int) -> float:
    if kind == "F":
        return float(chain.fwd[stage - 1])
    return float(chain.bwd[stage - 1] if kind == "B" else chain.fwd_nosave[stage - 1])


def _sequence_seconds(chain: Chain, compute) -> float:
    """The compute time of a sequence: no schedule of it is shorter."""
    return sum(_op_seconds(chain, k, s) for k, s in compute)


def _edits(chain: Chain, compute) -> list[tuple[float, tuple, dict[int, int]]]:
    """Structural moves (NOTE [ joint: CP-SAT structure moves ]): ``(seconds saved, sequence, op map)``.

    A re-run forward op F_s (after a backward op) is deleted and the instance of stage s it
    re-makes is made whole by its first forward op instead (Fck_s / Fn_s becomes F_s); for a run
    of consecutive re-runs, all of them at once too. Sequences the resolver rejects are dropped.
    """
    length, n = chain.length, len(compute)
    first_b = next(k for k in range(n) if compute[k][0] == "B")
    singles = []
    for r in range(first_b + 1, n):
        kind, s = compute[r]
        if kind != "F":
            continue
        prev = max((k for k in range(r) if compute[k][0] != "B" and compute[k][1] == s), default=None)
        if prev is not None and compute[prev][0] in ("Fck", "Fn"):
            singles.append((r, prev))
    groups = [[pair] for pair in singles]
    run: list = []
    for pair in singles:
        if run and pair[0] == run[-1][0] + 1:
            run.append(pair)
        else:
            run = [pair]
        if len(run) > 1:
            groups.append(list(run))
    out, seen = [], set()
    for group in groups:
        new = list(compute)
        for _r, prev in group:
            new[prev] = ("F", compute[prev][1])
        gone = {r for r, _ in group}
        new = tuple(op for k, op in enumerate(new) if k not in gone)
        if new in seen:
            continue
        seen.add(new)
        try:
            resolve(length, *_arrays(new))
        except ScheduleError:
            continue
        op_map, j = {}, 0
        for k in range(n):
            if k not in gone:
                op_map[k] = j
                j += 1
        out.append((_sequence_seconds(chain, compute) - _sequence_seconds(chain, new), new, op_map))
    out.sort(key=lambda e: -e[0])  # stable: ties keep the sequence's order
    return out


def improve(
    chain: Chain,
    platform: Platform,
    schedule: Schedule,
    makespan: float,
    *,
    work: float = JOINT_CPSAT_WORK,
    deadline: float = math.inf,
    keep: frozenset[int] = frozenset(),
) -> Improvement:
    """Improve a feasible ``schedule`` (any compute sequence) with CP-SAT (NOTE [ joint: CP-SAT re-timing ]).

    First the transfers of the incumbent's own sequence are re-chosen and re-timed (when it
    stalls at all), then structural moves (NOTE [ joint: CP-SAT structure moves ]) are tried,
    the largest saving first. ``work`` is CP-SAT's deterministic seconds in all (> 0);
    ``deadline`` a ``time.perf_counter()`` value past which no call runs. ``keep``: units no
    instance of which is offloaded (NOTE [ joint: keep ] in :mod:`.joint`; the incumbent must
    offload none of them). Returns the incumbent or a strictly faster schedule the simulator
    accepts.
    """
    from .cpsat.grid import TimeGrid
    from .lns import _Runner, _set_hint, _values

    if not (isinstance(work, (int, float)) and not isinstance(work, bool) and work > 0 and math.isfinite(work)):
        raise ValueError(f"work: {work!r} must be a number of deterministic seconds > 0")
    info: dict[str, Any] = {"mode": "skipped", "work": 0.0, "windows": 0, "improved": 0, "edits": 0,
                            "edits_improved": 0, "edit_status": []}

    def skip(why: str) -> Improvement:
        return Improvement(schedule, makespan, {**info, "why": why})

    length = chain.length
    compute = tuple(schedule.compute)
    if length > MAX_STAGES:
        return skip(f"longer than {MAX_STAGES} stages")
    if not platform.can_transfer:
        return skip("no transfer is possible")
    if all(kind in ("F", "B") for kind, _ in compute) and len(compute) == 2 * length:
        return skip("a fixed-order schedule, which best's exact improver already re-solves")
    try:
        grid = TimeGrid.build(chain, platform)
    except ValueError as exc:
        return skip(" ".join(str(exc).split()))
    if not grid.can_transfer:
        return skip("no transfer is possible")
    runner = _Runner(work, deadline)
    best_sched, best_span = schedule, makespan
    info["mode"] = "run"

    def accept(model: _Model, solver) -> bool:
        nonlocal best_sched, best_span
        got = model.checked(solver)
        if got is not None and got[1] < best_span * (1 - _EPS):
            best_sched, best_span = got
            return True
        return False

    # 1. Re-timing the incumbent's own sequence: only where it stalls (its makespan above the
    #    sequence's compute time, which no choice of transfers beats).
    if makespan <= _sequence_seconds(chain, compute) * (1 + 1e-9):
        info["retime"] = "no stall"
    else:
        items = _items(length, compute, keep)
        model = _Model(chain, platform, compute, items, grid, upper=makespan) if items else None
        if model is None or not model.hint(schedule):
            info["retime"] = "outside the model's space" if model is not None else "nothing can be offloaded"
        else:
            md = model.md
            solver, status = runner.solve(md, min(WINDOW_WORK, runner.left), fix_hint=True)
            if status not in ("OPTIMAL", "FEASIBLE"):
                info["retime"] = f"the hint was not completed ({status})"
            else:
                info["retime"] = "run"
                # The incumbent replayed by the model, in seconds: its simulated makespan up to
                # the rounding slack when the model states the simulator's rules (the tests check it).
                info["hint_makespan"] = float(solver.objective_value) / grid.scale
                hint = _values(solver, md)
                _set_hint(md, hint)
                rng = np.random.default_rng(SEED)
                width = min(WINDOW_STAGES, length)
                stride = max(1, width // 2)
                share = runner.left * RETIME_SHARE
                while length > width and runner.spent < share and runner.stopped is None:
                    offset = int(rng.integers(0, stride))
                    improved = False
                    for lo in range(1 - offset, length, stride):
                        if runner.spent >= share or runner.stopped is not None:
                            break
                        hi = lo + width - 1
                        sub = md.clone()
                        for c, it in enumerate(items):
                            if lo <= it.stage <= hi:
                                continue
                            for idx in model.decisions(c):
                                domain = sub.proto.variables[idx].domain
                                domain.clear()
                                domain.extend([hint[idx], hint[idx]])
                        solver, status = runner.solve(sub, min(WINDOW_WORK, share - runner.spent), gap_units=model.slack)
                        info["windows"] += 1
                        if status in ("OPTIMAL", "FEASIBLE") and accept(model, solver):
                            hint = _values(solver, md)
                            _set_hint(md, hint)
                            info["improved"] += 1
                            improved = True
                    if not improved:
                        break
                if runner.spent < share and runner.stopped is None:
                    solver, status = runner.solve(md, share - runner.spent, gap_units=model.slack)
                    info["whole"] = status
                    if status in ("OPTIMAL", "FEASIBLE") and accept(model, solver):
                        info["improved"] += 1
    # 2. Structural moves, from the incumbent, the largest saving first; after an improvement
    #    the moves are drawn again from the new incumbent.
    tried: set = set()
    while runner.left > 0 and runner.stopped is None and info["edits"] < MAX_EDITS:
        base = best_sched
        moves = [e for e in _edits(chain, tuple(base.compute)) if e[1] not in tried
                 and _sequence_seconds(chain, e[1]) < best_span * (1 - _EPS)]
        if not moves:
            break
        for _, new, op_map in moves:
            if runner.left <= 0 or runner.stopped is not None or info["edits"] >= MAX_EDITS:
                break
            if time.perf_counter() >= deadline:  # a model's building is wall time: none past the caller's clock
                runner.stopped = "deadline"
                break
            tried.add(new)
            items = _items(length, new, keep)
            if not items:
                continue
            model = _Model(chain, platform, new, items, grid, upper=best_span)
            model.hint(base, op_map)
            solver, status = runner.solve(model.md, min(EDIT_WORK, runner.left), gap_units=model.slack)
            info["edits"] += 1
            info["edit_status"].append(status)
            if status in ("OPTIMAL", "FEASIBLE") and accept(model, solver):
                info["edits_improved"] += 1
                break
        else:
            break
    info["work"] = runner.spent
    if runner.stopped is not None:
        info["guard"] = runner.stopped
    return Improvement(best_sched, best_span, info)
