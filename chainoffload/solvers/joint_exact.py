"""The exact joint DP: rematerialization and offloading with one transfer in flight per channel.

One of the plans :func:`chainoffload.solvers.joint.joint` compares. Where the paper's DP
(:mod:`chainoffload.solvers.joint`) lets any number of copies queue on each channel and
counts the queues' bytes as fluids (an estimate the simulator then corrects), this one keeps
at most one offload pending and one prefetch in flight, and counts each whole, so its table's
value is an upper bound of the simulated makespan of the plan it rebuilds, equal to it when
no prefetch waits: a plan the simulator always confirms, which the fluid model may miss.

NOTE [ exact joint recurrence ]
-------------------------
*The spine.* Rotor's top segment (1, L) is a chain of *nodes*: node s is either "F_all
on s" (forward part F_s; item: unit s, saved[s] bytes; child (s+1, L); backward part
B_s) or "checkpoint a_{j-1}" (forward part Fck_s, Fn_{s+1}..Fn_{j-1}; item: the lone
a_{j-1}; child (j, L); backward part the segment (s, j-1), solved by rotor's table). The
run is: the forward parts of all nodes, one forward op per stage 1..L, back to back;
then the backward parts in reverse node order. The item of a node is read by the first
op of the next node (n1) and then not before n1's backward part (B_{n1} reads a_{n1-1},
or the left segment (n1, ..) re-runs from it). Only the spine offloads; the segments off
it are rotor's, without transfers.

*An offload.* A node may offload its item X (x bytes) when the offload channel is idle:
the copy is triggered at the end of X's maker (the node's last forward op) and runs
while the spine's forward goes on, for D(x) = latency + x / bandwidth_d2h. The forward
ops of stages i+1, i+2, ... (i = X's stage) follow without any wait, each lasting at
least fwd_min[k] = min(fwd[k], fwd_nosave[k]); so the copy has surely ended, and the GPU
copy is freed (the op of stage i+1, its last reader before the prefetch, has ended too),
by the start of the op of stage u0(X), the least u >= i+2 with fwd_min[i+1..u-1] summing
to >= D(x) (``item_credit_stage``). The DP picks, per offload, a variant of the
item: variant 0 is credited at u = u0(X); variant 1 at u = max(u0, v*) with v* the
least stage >= i+2 with bwd[i+2..v*-1] summing to >= H(x), so that the prefetch below
can hide behind those backward ops (on a fast link u0 = i+2 would leave it no time at
all). Until the credit X counts on the GPU: the budgets of the nodes in between exclude
it, exactly as rotor charges a kept item. The first spine segment (c, L) with c >= u
gets the x bytes back (*credit*; rounded down to slots, as rotor gives back) and no
other offload starts before c, so at most one offload is pending and every offload
starts on an idle channel (state p of the table: the pending item and its variant, 0 for
none).

*Backward credit.* Each offloaded item also has a stage v <= u (v = u for variant 0; for
variant 1, v = v* above; a third variant takes v = min(u0, v*) - 1 with u = u0, one node
more with the credit below, for a wait): the backward part of every node b with v <= b < c runs after
the copy has ended and before X's prefetch starts (below), so it gets the x bytes too
(the left segment (b, j-1) is solved by rotor at budget m + x; B_b of an F_all node
needs usage_B(b) <= m + x). On a slow link this is where the copied bytes serve: the
left segments of the nodes made while the copy ran, re-run during the backward.

*Its prefetch* is triggered at the end of the backward part of the first node r >= v,
the end of segment (r, L), r <= c. By then (r, L) has freed all it used but g_{r-1},
which the enclosing budgets count, and those budgets were cut by x when X was made:
allocating x there is what rotor's accounting of the enclosing nodes already assumes.
Prefetches run deepest item first (an item made deeper is credited to a deeper segment),
and each one is needed, and waited for, by an op that comes before the next prefetch's
trigger: the prefetch channel is idle at every trigger too, and in half duplex every
offload has ended before the first prefetch (the last one is credited within the
forward). X is next needed at the start of node n1's backward part; between the trigger
and that op run at least the B ops of stages n2..r-1 (n2 = the node after n1), so that
op waits at most w = max(0, H(x) - sum(bwd[n2..v-1])), H(x) = latency + x /
bandwidth_h2d, charged at node n1, which knows n2.

*Why the table bounds the simulator from above.* Every memory term is rotor's, exact at
the op (frees at an instant before allocations), with X counted present from its maker
to the credit point, absent from there (and during the backward parts of nodes v..c-1)
until its prefetch starts, present again from then on; the simulator frees X no later
(end of its copy, which has ended, and of its reader F/Fck_{i+1}). Op times are the
chain's; the only waits in the simulated run are those of prefetches, each at most its
charged w. So the simulated makespan is at most the table's value; it is equal when no
wait is charged, or when each charged wait is met exactly (r = v and only B_{n2..v-1}
between the prefetch's trigger and its reader). ``joint_exact`` checks the bound on every
rebuilt schedule and repairs (a smaller memory for the DP) if the simulator ever
disagrees. With the bandwidth at 0 nothing can be offloaded, p = 0 everywhere and the
recurrence is rotor's, evaluated in the same order with strict improvement, so the two
give the same schedule. With unlimited bandwidth and no latency, a node can offload its
unit as soon as its successor has read it: two units on the GPU at a time, no wait.



*Limits.* One offload in flight, credits at bounds computed from the least forward
times, three credit variants per item. What limits the gain on today's links is the copy
time itself: on the GPT-like chain of ``benchmarks/remat.py`` at 25 GB/s a block's unit
(912 MiB) takes 38 ms to copy and the whole forward 46 ms, so about one unit can leave
the GPU before the backward starts, and joint removes about one block's recomputation
(1.3-1.4 points of overhead) wherever rotor recomputes; with a faster link the same DP
removes most of rotor's overhead (the bandwidth table there). Offloads inside the left
segments (which run with both channels idle: every spine prefetch is triggered after
them or waited for before them) would need a spine table per segment end t, L times
the work; they are not modelled. The pure-offloading method, which ``joint`` also runs,
is better on some instances (e.g. ResNet-18 at 0.94 of its keep-all peak: the plan that
offloads unit 2 fits with 4 MB to spare, which slot rounding at S = 500 hides; the DP
finds it at S = 2000). Cost: O(S L^3) for rotor's table plus O(S L^2 P) for
the spine, P the pending states per stage (about 6 D(unit) / fwd, at most 6L + 1); only
the states that can occur get a row (``spine_rows``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .._kernels import lazy
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule, Transfer
from ..simulate import simulate
from .rotor import DEFAULT_SLOTS, Slots, emit_segment, slots_for

_kx = lazy("joint_exact")  # the exact DP's kernels (NOTE [ lazy kernels ] in chainoffload._compile)
_kr = lazy("rotor")

__all__ = ["joint_exact", "exact_table", "exact_schedule", "ExactTable"]

# Relative slack when comparing the table's value with the simulated makespan (float sums
# in another order).
_REL_TOL = 1e-9

# Fractions of the platform's memory the DP is rerun with when the simulator rejects a plan.
_SHRINKS = (1.0, 0.995, 0.98, 0.95, 0.9, 0.8, 0.65, 0.5)


def _times(platform: Platform, sizes: np.ndarray, bandwidth: float) -> np.ndarray:
    """Transfer time of each size (``inf`` when the link carries nothing)."""
    if not bandwidth > 0:
        return np.full(sizes.shape[0], np.inf)
    return platform.latency + sizes.astype(np.float64) / bandwidth


@dataclass(frozen=True)
class ExactTable:
    """The filled tables of the joint DP on one slot rounding.

    ``spine[row_of[s, p], m]`` / ``spine_choice`` / ``row_of`` as returned by
    :func:`chainoffload._kernels.joint.spine_table`; ``rotor`` / ``rotor_choice`` rotor's
    table for the segments off the spine; ``item_x`` / ``item_u`` / ``item_v`` per item
    p = STRIDE i + VARIANTS kind + variant (kind 0: the lone a_i, 1: unit i whole): size
    given back in slots, forward and backward credit stages.
    """

    slots: Slots
    spine: np.ndarray
    spine_choice: np.ndarray
    row_of: np.ndarray
    rotor: np.ndarray
    rotor_choice: np.ndarray
    item_x: np.ndarray
    item_u: np.ndarray
    item_v: np.ndarray

    @property
    def value(self) -> float:
        """The table's makespan of the whole chain at the full budget."""
        return float(self.spine[self.row_of[1, 0], self.slots.budget])


def _item_arrays(chain: Chain, platform: Platform, sl: Slots, keep: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per item p (``chainoffload._kernels.joint``): bytes given back (slots, down), offload and prefetch times
    (``inf`` for the items of a unit in ``keep``: NOTE [ joint: keep ] in :mod:`.joint`)."""
    n = chain.length
    x = np.zeros(_kx.STRIDE * (n + 1), dtype=np.int64)
    size = np.zeros(_kx.STRIDE * (n + 1), dtype=np.int64)
    base = _kx.STRIDE * np.arange(1, n + 1)
    for variant in range(_kx.VARIANTS):
        x[base + variant] = sl.act_down[1:]
        x[base + _kx.VARIANTS + variant] = sl.saved_down
        size[base + variant] = chain.act[1:]
        size[base + _kx.VARIANTS + variant] = chain.saved
    d = _times(platform, size, platform.bandwidth_d2h)
    h = _times(platform, size, platform.bandwidth_h2d)
    d[:_kx.STRIDE] = np.inf
    h[:_kx.STRIDE] = np.inf
    for u in keep:
        if 1 <= u <= n:  # a lone a_u and unit u whole, every credit variant: no credit stage exists
            d[_kx.STRIDE * u : _kx.STRIDE * (u + 1)] = np.inf
            h[_kx.STRIDE * u : _kx.STRIDE * (u + 1)] = np.inf
    return x, d, h


def exact_table(chain: Chain, platform: Platform, sl: Slots, rot: tuple[np.ndarray, np.ndarray] | None = None,
                keep: Iterable[int] = ()) -> ExactTable:
    """Fill rotor's table and the spine table of ``NOTE [ exact joint recurrence ]``.

    Parameters
    ----------
    chain, platform
        The instance (the platform's memory is not read: ``sl`` holds the budget).
    sl
        The chain's sizes in slots and the budget, from :func:`~chainoffload.solvers.rotor.slots_for`.
    rot
        Rotor's ``(opt, choice)`` tables for ``sl``, when the caller has them already.
    keep
        Units whose items are never offloaded (NOTE [ joint: keep ] in :mod:`.joint`).

    Returns
    -------
    ExactTable
        Its :attr:`ExactTable.value` is the table's makespan (``inf``: no plan fits).
    """
    if rot is None:
        rot = _kr.rotor_table(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget)
    rot, rot_choice = rot
    x, d, h = _item_arrays(chain, platform, sl, keep)
    fwd_min = np.ascontiguousarray(np.minimum(chain.fwd, chain.fwd_nosave))
    u, v = _kx.item_credit_stage(fwd_min, chain.bwd, d, h, chain.length)
    spine, choice, row_of = _kx.spine_table(
        chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, x, u, v, h, rot, sl.budget
    )
    return ExactTable(sl, spine, choice, row_of, rot, rot_choice, x, u, v)


def exact_schedule(table: ExactTable, length: int) -> Schedule:
    """Rebuild the schedule of the top segment at the full budget, transfers included.

    The spine is walked forward to collect its nodes (their forward parts come first, back
    to back), then the backward parts are emitted deepest first. An offload is triggered at
    the end of its maker; the prefetch of item p at the end of the backward part of the
    first node r >= v(p), i.e. when segment (r, L) ends (r is at most the node credited).

    Parameters
    ----------
    table
        A table whose :attr:`ExactTable.value` is finite.
    length
        The chain's length L.

    Returns
    -------
    Schedule
        The compute sequence with its triggered transfers.
    """
    sl = table.slots
    ops: list[tuple[str, int]] = []
    transfers: list[Transfer] = []
    # The spine, outermost node first: ("node", s, j, m), and ("prefetch", unit) just before
    # the node r whose segment's end triggers that prefetch.
    spine: list[tuple] = []
    unplaced: list[int] = []  # offloaded items whose prefetch has no node yet
    s, p, m = 1, 0, sl.budget
    while True:
        row = int(table.row_of[s, p])
        code = int(table.spine_choice[row, m]) if row >= 0 else -1
        if code < 0:
            raise AssertionError(f"joint table has no choice for segment ({s}, {length}) pending {p} at budget {m}")
        for q in list(unplaced):
            if s >= int(table.item_v[q]):
                spine.append(("prefetch", q // _kx.STRIDE))
                unplaced.remove(q)
        j, off = divmod(code, _kx.VARIANTS + 1)
        ops.append(("F" if j == 0 else "Fck", s))
        # The node's backward part may use p's bytes once p's prefetch waits for a shallower node.
        back = int(table.item_x[p]) if p != 0 and s >= int(table.item_v[p]) else 0
        spine.append(("node", s, j, min(sl.budget, m + back)))
        if s == length:
            break
        if j == 0:
            n1, y, own = s + 1, int(sl.saved[s - 1]), _kx.STRIDE * s + _kx.VARIANTS + max(off - 1, 0)
        else:
            ops.extend(("Fn", k) for k in range(s + 1, j))
            n1, y, own = j, int(sl.act[j - 1]), _kx.STRIDE * (j - 1) + max(off - 1, 0)
        credit = p != 0 and int(table.item_u[p]) <= n1
        if off and p != 0 and not credit:
            raise AssertionError("joint table offloads while another offload is pending")
        if off:
            transfers.append(Transfer("offload", own // _kx.STRIDE, len(ops) - 1, "end"))
            unplaced.append(own)
        m = min(sl.budget, m - y + (int(table.item_x[p]) if credit else 0))
        p = own if off else (0 if credit else p)
        s = n1
    if unplaced:
        raise AssertionError(f"joint table leaves the prefetch of items {unplaced} without a node")
    for entry in reversed(spine):
        if entry[0] == "prefetch":
            # The segment of the node after this mark has just ended: its last op is B_r.
            transfers.append(Transfer("prefetch", entry[1], len(ops) - 1, "end"))
            continue
        _, s, j, m = entry
        if j == 0:
            ops.append(("B", s))
        else:
            emit_segment(ops, table.rotor_choice, sl, s, j - 1, m)
    return Schedule(tuple(ops), tuple(transfers))


def joint_exact(
    chain: Chain, platform: Platform, *, slots: int = DEFAULT_SLOTS, rot: tuple[np.ndarray, np.ndarray] | None = None,
    keep: Iterable[int] = (),
) -> Result:
    """The exact joint DP alone: its rebuilt schedule, simulated; repaired if rejected.

    The table's value bounds the simulated makespan from above (``NOTE [ exact joint
    recurrence ]``); both are kept in ``info`` (``dp_makespan``, and the result's
    ``makespan`` is the simulator's). Repair: when the simulator rejects the plan, or
    finds it slower than the table claims (neither should happen), the DP is rerun on a
    smaller memory (fractions :data:`_SHRINKS` of the platform's, down to half) until a
    plan passes; ``info["shrink"]`` is the fraction used.

    Parameters
    ----------
    chain, platform
        The instance.
    slots
        Memory slots S of the dynamic programs (as for rotor).
    rot
        Rotor's tables at the platform's memory and ``slots`` (reused for the first attempt).
    keep
        Units (stages 1..L) no plan offloads (:func:`~chainoffload.solvers.check_keep`;
        NOTE [ joint: keep ] in :mod:`.joint`).

    Returns
    -------
    Result
        ``feasible`` with the schedule, or ``infeasible`` when no plan fits.
    """
    from ._options import check_keep

    kept = check_keep(chain, keep)
    t0 = time.perf_counter()
    info: dict = {"slots": int(slots)}
    last_message = ""

    def attempt(shrink: float):
        sl = slots_for(chain, int(platform.memory * shrink), slots)
        table = exact_table(chain, platform, sl, rot if shrink == 1.0 else None, kept)
        value = table.value
        if not math.isfinite(value):
            return None, value, None, sl
        schedule = exact_schedule(table, chain.length)
        return schedule, value, simulate(chain, platform, schedule), sl

    def accept(value: float, timeline) -> bool:
        return timeline.feasible and timeline.makespan <= value * (1 + _REL_TOL) + 1e-15

    found = None
    for shrink in _SHRINKS:
        schedule, value, timeline, sl = attempt(shrink)
        if schedule is None:
            break
        info.update(quantum=sl.quantum, budget_slots=sl.budget, dp_makespan=value, shrink=shrink)
        if accept(value, timeline):
            found = (schedule, timeline)
            break
        last_message = (
            timeline.violation.message
            if not timeline.feasible
            else f"simulated makespan {timeline.makespan!r} above the table's {value!r}"
        )
    return dp_result("joint-exact", found, info, t0, platform, slots, last_message)


def dp_result(method: str, found, info: dict, t0: float, platform: Platform, slots: int, last_message: str) -> Result:
    """The Result of a remat + offload DP: ``found`` = (schedule, timeline, ...) or None."""
    if found is not None:
        schedule, timeline = found[0], found[1]
        info["offloaded_units"] = list(schedule.offloaded_units)
        info["recomputed"] = sum(1 for k, _ in schedule.compute if k in ("Fck", "Fn"))
        return Result(
            method, Status.FEASIBLE, schedule, makespan=timeline.makespan, runtime=time.perf_counter() - t0, info=info
        )
    return Result(
        method,
        Status.INFEASIBLE,
        None,
        runtime=time.perf_counter() - t0,
        info=info,
        message=f"{method}: no plan fits in {platform.memory} B at {slots} slots"
        + (f" ({last_message})" if last_message else ""),
    )

