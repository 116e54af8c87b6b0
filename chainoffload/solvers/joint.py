"""Method ``joint``: rematerialization and offloading together, by dynamic programming.

The dynamic program of Beaumont, Eyraud-Dubois, Shilova, "Efficient Combination of
Rematerialization and Offloading for Training DNNs" (NeurIPS 2021), as its public
reimplementation (Colossal-AI's ``PofoSolver``) and the paper's abstract describe it, in this
project's byte rules: a walk along the chain whose state is the stage, the memory kept, the
bytes the D2H queue still has to copy and the bytes the H2D pipeline still has to bring back,
plus whether the stage's input is kept as a lone activation or as a whole unit; one step covers
a stage's forward ops and its mirrored backward part. The recurrence below is ours.

NOTE [ joint recurrence ]
-------------------------
*The spine.* A persistent schedule's top segment (1, L) is a chain of *nodes*: node s is
"F_all on s" (forward part F_s; it keeps unit s whole, which is the next node's input; the next
node is s + 1; backward part B_s) or "checkpoint to j" (forward part Fck_s, Fn_{s+1}..Fn_{j-1};
it keeps the lone a_{j-1}, the next node is j; backward part rotor's segment (s, j - 1), which
re-runs from node s's input). The run is the forward parts of all nodes, back to back, then the
backward parts in reverse node order. The deepest node is F_all on L.

*The choice at a node* (as in the paper): its kind (F_all, or checkpoint to any j), and whether
to offload its *input*, the item the previous node kept: a lone a_{s-1} ("offload as a") or the
whole unit s-1 ("as ā"), which the previous node's kind decides; out of a whole unit it may
also move a_{s-1} alone, the rest staying on the GPU (``act_alone``; the schedule's transfers
then say ``moves="act"``). The offload is triggered at the
end of the input's maker, on the D2H channel, behind whatever that channel still copies (FIFO);
the input is read by node s's first forward op, then not before node s's backward part, so it
can stay on the host in between; its prefetch must end before node s's backward part starts.
Any number of copies may be in flight on each channel.

*State* (s, flag, D2H queue, H2D pipeline, m); ``m`` is the budget of segment (s, L) as in
rotor (``NOTE [ rotor recurrence ]``): the memory left once a_0, every kept item and node s's
input are counted. Offloaded items are counted where the two queues say they are on the GPU:

* the **D2H queue** holds the bytes not yet copied. It is kept as the instant its last copy ends,
  on the forward clock (the sum of the least forward times of the stages before, so that a copy
  the clock sees ended has ended), rounded *up* to a grid; the bytes it still holds when the op of
  stage t starts are (end - clock(t)) x bandwidth (fluid: the paper's df). Forward ops count them.
* the **H2D pipeline** holds the bytes that the backward parts of node s and deeper nodes must
  still bring back for shallower nodes. Prefetches run as late as the channel allows (the paper's
  db): node s's backward part, lasting tau, absorbs tau x bandwidth of it, the rest moves to the
  deeper nodes, and an offloaded input joins it for the nodes after s. It is kept as its end on
  the backward clock (the sum of bwd of the stages before: each backward part lasts at least the
  bwd of its stages), rounded up to a grid. Backward parts count all of it as on the GPU.

Both grids are absolute points of their clock, so rounding never creeps; a queue longer than
the grid's rows is not allowed. A step: check the forward ops (each need + queue bytes <= m; the
input, outside m, is counted whole during the first op), the backward part (B_s needs usage_B(s)
+ pipeline <= m; a checkpoint's segment runs in rotor's table at budget m - pipeline), and move
to the next node with budget m - (its input) + (node s's input if offloaded). The deepest node
adds, before B_L, the D2H queue's tail past the forward's end and the pipeline's leftover (the
bytes no backward part absorbs). With no bandwidth the queues stay empty and the recurrence is
rotor's top segment, evaluated in the same order with the same ties: the same schedule.

*Grids and cost.* The D2H grid spans the time to copy the budget, at most the forward, at
most twice the longest copy of one input; the pipeline's the time to bring the budget back, at
most twice the longest prefetch; each gets as many rows as keep the table near ``_WORK`` cells
(2 to 16; ``rows``). A checkpointed node spans at most ``max_span`` stages when the link can
move data (all, as rotor, when it cannot). The table has 2 (rows + 1)^2 rows per stage, filled
only where a walk from node 1 can arrive (``reachable_rows``); the fill is O(L max_span S
rows^2) on top of rotor's O(S L^3) table for the backward parts.

*From the table to a schedule* (:func:`joint_schedule`): offloads at the end of each input's
maker, in spine order; prefetches in the deepest-first order the pipeline serves them, each
triggered at the end of the backward part in which it must start to end, behind the ones
before it, just before its reader's backward part (as late as possible, on the model's
durations), or one backward part earlier.

*Why the value is not reported, and how the schedule is repaired.* The paper's queues are
fluids: an item is freed byte by byte as its copy goes, and a prefetch holds only what has
arrived. The simulator frees an offloaded item when its whole copy has ended and charges a
prefetch's whole size from its start, so the table's value is an estimate of its schedule's
makespan, neither bound. :func:`joint_dp` therefore reports the simulator's makespan, keeping the
table's value in ``info["dp_makespan"]``, and repairs what the fluid hid: where memory goes over
the limit, the op waits for the offload in flight that ends first, or the prefetch that holds
memory too early is triggered later (:func:`_with_waits`: the paper's "memory that does not fit
becomes idle time", on whole items). And since the table holds the model's best plan for every
budget up to the platform's, the plans for budgets a few percent smaller, which leave the whole
items room, cost one walk each: ``joint_dp`` rebuilds, repairs and simulates the plans at
``_ROOTS`` fractions of the budget and keeps the fastest feasible one. Measured on the V100
twins of ResNet-50/101, Inception-v3 and DenseNet-121 at 12 GB/s, the D2H queue's bytes never
bound a forward op (dropping that term changed no plan), but its timing did: how much the
forward can move, and when the last copies end (dropping the queue altogether let the DP plan
copies that end after the backward has started, 10-50 points of overhead worse once simulated).
The pipeline's bytes bind the backward parts.

NOTE [ joint: lifted plans ]
----------------------------
Sizes are rounded *up* to slots and the budget *down* (as in rotor), so the table charges each
item up to a slot too many and a plan that fits in bytes with a few slots to spare is hidden
from it. Measured on the V100 twins at 12 GB/s (``benchmarks/results/joint_gap.md``): at 500
slots ``joint`` was up to 1.5 % slower than the same DP alone at 2000 slots (on 18 of 40
network points: GPT-2-12 and -48, ResNet-18, -50, -101, -152, Inception-v3, DenseNet-121, at
10-70 % of the way from the floor to the keep-all peak), while 4x the slots cost about 4x the
table; at 8000 slots the work budget leaves the
queues 6 grid rows instead of 15-16 and the plans were slower still (ResNet-50 and -101 at
10-50 %). The improver is rotor's lifted table (``NOTE [ never lose to the family ]``): the
table is filled ``lift`` slots above the budget (:func:`joint_lift`: L + 6, at most an eighth
of the slots, at least 8), with the queue grids of the budget itself, so every entry at or below
the budget is the unlifted table's (the walks there give the same plans; the kernel caps a
child's budget at the table's top, which a walk from a root at or below the budget never
reaches) and only the entries above are new. Their plans (at most ``LIFT_WORK // L`` budgets,
evenly spread: a work bound, not a clock) are rebuilt, repaired and simulated in bytes like the
others; one is kept only when the simulator finds it feasible and strictly faster than every
plan at or below the budget. Result: ``joint`` strictly faster on 31 of 56 points (ten networks
and four random chains x four memories), by up to 1.54 %, slower on none, and at or below the
2000-slot DP on 55 of them (the other: ResNet-101 at 10 %, equal to the microsecond), for about
10 % more of joint's time (the lifted walks; on random chains of 100 and 1000 stages,
``joint_gap_long.md``, up to about 30 % of ``joint_dp``'s, with a 0.4 % and 1 % faster plan).
Lifting by 125 or 250 slots found nothing more on the six network points that gained most.
What neither the lift nor a finer table reaches (a plan with one recomputation fewer, whose
transfers the fluid queues mis-time) is left to CP-SAT (``NOTE [ joint: CP-SAT re-timing ]`` in
:mod:`.joint_cpsat`), below.

*The method.* :func:`joint` returns the fastest of this plan, the exact DP's
(:mod:`chainoffload.solvers.joint_exact`: one transfer in flight per channel, whole items, a
bound the simulator confirms), rotor's and the pure-offloading result, so it is never worse
than any of them; at bandwidth 0 it is rotor's schedule. The fastest, when it recomputes, is then
improved by CP-SAT on ``cpsat_work`` deterministic seconds (``NOTE [ joint: CP-SAT re-timing ]``):
only a schedule the simulator finds strictly faster replaces it, so this keeps every guarantee.

NOTE [ joint: keep ]
--------------------
``keep=`` means what it means for the pure-offloading methods (``check_keep``, docs/model.md):
no schedule offloads a unit in it, whole or as its lone a_i (``Schedule.offloaded_units``).
It does not forbid recomputing: a kept stage may still be run Fck / Fn and re-run (the PyTorch
adapter keeps a stage the executor cannot call again from being recomputed through the chain it
solves, ``recompute_chain``, not through ``keep``). Every candidate honours it where it chooses: the paper's DP and the exact DP never
offer an offload of a kept unit's item (its copy time is infinite, as a_0's), so their tables
are the unkept ones with those choices removed (``keep=()`` fills the very same tables); rotor
moves nothing; pure offloading is ``best`` with the same ``keep``; the CP-SAT improver has no
instance of a kept unit to choose. With ``keep`` the result is the fastest of those, as without.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from .._kernels import lazy
from ..chain import Chain
from ..platform import Platform
from ..result import Result, Status
from ..schedule import Schedule, Transfer
from ..simulate import Timeline, simulate
from .joint_cpsat import JOINT_CPSAT_WORK
from .joint_cpsat import improve as improve_joint
from .joint_exact import dp_result, joint_exact
from .rotor import DEFAULT_SLOTS, Slots, emit_segment, lift_slots, slots_for

_kj = lazy("joint")  # the joint DP's kernels (NOTE [ lazy kernels ] in chainoffload._compile)
_kr = lazy("rotor")

__all__ = ["joint", "joint_dp", "joint_lift", "joint_table", "joint_schedule", "walk", "window_tables", "JointTable", "Node"]

# Fractions of the budget whose plans joint_dp rebuilds and simulates (one table serves all).
_ROOTS = (1.0, 0.99, 0.98, 0.97, 0.96, 0.95, 0.93, 0.91, 0.89, 0.87, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)

# Cells the spine table may visit (about 2 L * max_span * rows * (S + 1)): the queue grids get
# as many rows as fit, 2 to 16 each (NOTE [ joint recurrence ]). About 2 s on one core.
_WORK = 3e8
_MAX_ROWS = 16
#: Default longest checkpointed node on the spine when the link can move data.
DEFAULT_SPAN = 16
#: Share of ``joint``'s time limit that its pure-offloading candidate (``best``) may take.
OFFLOAD_SHARE = 0.3
#: Longest chain the exact DP runs on inside :func:`joint` (its spine is O(S L^2 P) over
#: rotor's full O(S L^2) table).
EXACT_MAX_LENGTH = 200
# A queue's grid spans this many times the longest transfer of one input.
_SPAN_ITEMS = 2.0
#: Work of the lifted walks (``NOTE [ joint: lifted plans ]``), in stages walked: at most
#: ``LIFT_WORK // L`` lifted budgets (at least 8) are rebuilt and simulated: every one of the
#: (at most 62, at 500 slots) on chains up to 128 stages, 8 at L = 1000.
LIFT_WORK = 8_000


@dataclass(frozen=True)
class JointTable:
    """The filled joint DP on one slot rounding.

    ``opt`` / ``choice`` from :func:`chainoffload._kernels.joint.spine_table`; ``win`` /
    ``win_choice`` rotor's tables for the backward parts (:func:`window_tables`); the grids and
    per-node input arrays it was filled with.
    """

    slots: Slots
    opt: np.ndarray
    choice: np.ndarray
    win: np.ndarray
    win_choice: np.ndarray
    in_slots: np.ndarray
    d_in: np.ndarray
    h_in: np.ndarray
    fclk: np.ndarray
    bclk: np.ndarray
    rate_f: float
    rate_b: float
    delta_f: float
    n_f: int
    delta_b: float
    n_b: int
    lift: int = 0

    @staticmethod
    def flag_of(flag: int, off: int) -> int:
        """Which input arrays (``[s, k]``) an offload choice reads: the input's own kind when it
        moves whole (off = 1), the lone-activation ones when only a_{s-1} moves (off = 2)."""
        return flag if off == 1 else 0

    @property
    def budget(self) -> int:
        """The rounded budget (slots) of the platform's memory; ``slots.budget`` is the table's
        top, ``lift`` slots above it (``NOTE [ joint: lifted plans ]``)."""
        return self.slots.budget - self.lift

    @property
    def value(self) -> float:
        """The table's makespan of the whole chain at the full budget (``inf``: nothing fits)."""
        return float(self.opt[1, 0, self.budget]) if self.budget >= 0 else math.inf


@dataclass(frozen=True)
class Node:
    """One spine node of a rebuilt plan: stage ``s``, next node ``j`` (``s + 1`` for F_all),
    whether it is F_all, whether its input is offloaded, the input's kind ``flag`` (1: unit s-1
    whole, 0: a lone a_{s-1}), the budget ``window`` its backward part runs with (slots), that
    part's duration ``tau`` in the model, and ``act_alone``: only a_{s-1} of a whole unit s-1
    moves (the rest stays on the GPU)."""

    s: int
    j: int
    f_all: bool
    offload: bool
    flag: int
    window: int
    tau: float
    act_alone: bool = False


def _grid_rows(length: int, span: int, budget: int, rows: int | None) -> int:
    if rows is not None:
        return int(rows)
    per_row = max(1.0, 2.0 * length * span * (budget + 1))
    n = int(math.isqrt(int(_WORK / per_row / 2))) - 1
    return max(2, min(_MAX_ROWS, n))


def _check_int(name: str, value, least: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least):
        raise ValueError(f"{name}: {value!r} must be an integer >= {least}")


def window_tables(
    chain: Chain, sl: Slots, span: int, rot: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rotor's tables for the segments of at most ``span`` stages: ``win[s, d, m]`` is the time
    of segment (s, s + d) at budget m, ``choice[s, d, m]`` rotor's choice there.

    Sliced from rotor's full tables when given; else, for a long chain, computed by rotor's own
    kernel on overlapping pieces of 2 ``span`` stages (a segment of at most ``span`` stages lies
    whole in one piece, and it sees the gradient a_t of its end exactly when t < L, as in the
    whole chain), so memory stays O(L span S) instead of O(L^2 S).

    Parameters
    ----------
    chain
        The chain.
    sl
        Its sizes in slots and the budget.
    span
        Longest segment needed (1..L).
    rot
        Rotor's full ``(opt, choice)`` for ``sl``, if at hand.

    Returns
    -------
    tuple of numpy.ndarray
        ``(win, choice)``, shapes (L + 2, span, budget + 1); stages in ``choice`` are the chain's.
    """
    n = chain.length
    span = max(1, min(int(span), n))
    win = np.full((n + 2, span, sl.budget + 1), np.inf)
    choice = np.full((n + 2, span, sl.budget + 1), -1, dtype=np.int32)
    if rot is None and 2 * span >= n:
        rot = _kr.rotor_table(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget)
    if rot is not None:
        opt, full_choice = rot
        for d in range(span):
            idx = np.arange(1, n - d + 1)
            win[idx, d] = opt[idx, idx + d]
            choice[idx, d] = full_choice[idx, idx + d]
        return win, choice
    start = 1
    while start <= n:
        end = min(n, start + 2 * span - 1)
        piece = slice(start - 1, end)
        opt, sub = _kr.rotor_table(
            chain.fwd[piece], chain.bwd[piece], chain.fwd_nosave[piece], sl.act[start - 1 : end + 1],
            sl.saved[piece], sl.fwd_tmp[piece], sl.bwd_tmp[piece], sl.budget,
        )
        # Segments starting in [start, start + span) and ending before the piece's end (or at L).
        for s_loc in range(1, min(span, end - start + 1) + 1):
            s = start + s_loc - 1
            for d in range(span):
                t = s + d
                if t > n or (t == end and end < n):
                    break
                win[s, d] = opt[s_loc, s_loc + d]
                c = sub[s_loc, s_loc + d]
                choice[s, d] = np.where(c > 0, c + start - 1, c)
        start += span
    return win, choice


class _Band:
    """Rotor's ``choice[s, t, m]`` read from a band table ``choice[s, t - s, m]`` (for
    :func:`~chainoffload.solvers.rotor.emit_segment`)."""

    def __init__(self, band: np.ndarray) -> None:
        self.band = band

    def __getitem__(self, key: tuple[int, int, int]):
        s, t, m = key
        return self.band[s, t - s, m]


def joint_table(
    chain: Chain,
    platform: Platform,
    sl: Slots,
    *,
    rows: int | None = None,
    max_span: int | None = None,
    rot: tuple[np.ndarray, np.ndarray] | None = None,
    act_alone: bool = False,
    windows: tuple[np.ndarray, np.ndarray] | None = None,
    lift: int = 0,
    keep: Iterable[int] = (),
) -> JointTable:
    """Fill rotor's table and the spine table of ``NOTE [ joint recurrence ]``.

    Parameters
    ----------
    chain, platform
        The instance (the platform's memory is not read: ``sl`` holds the budget).
    sl
        The chain's sizes in slots and the budget, from :func:`~chainoffload.solvers.rotor.slots_for`.
    rows
        Grid rows of each queue (default: as many as the work budget allows, 2 to 16).
    max_span
        Most stages a checkpointed spine node spans when the link can move data (default
        :data:`DEFAULT_SPAN`; with no link every span is allowed, as in rotor).
    rot
        Rotor's full ``(opt, choice)`` tables for ``sl``, when the caller has them already
        (:func:`window_tables` then slices them instead of computing its own).
    act_alone
        Also let a node offload only a_{s-1} out of a whole input unit s-1 (the paper's
        "offload as a" of a kept stage), the rest of the unit staying on the GPU.
    windows
        :func:`window_tables`' ``(win, choice)`` for ``sl`` (lifted) and this table's span, when
        the caller has them already (two tables of one instance share them).
    lift
        Fill the table ``lift`` slots above ``sl.budget`` (``NOTE [ joint: lifted plans ]``);
        the queue grids are the ones of ``sl.budget``, so every entry up to it is the unlifted
        table's. ``rot`` and ``windows`` must then be for the lifted budget.
    keep
        Units (stages 1..L) no node may offload, whole or as a lone a_i (``NOTE [ joint: keep ]``);
        they may still be recomputed.

    Returns
    -------
    JointTable
        Its :attr:`JointTable.value` is the model's makespan (``inf``: no plan fits).
    """
    _check_int("rows", rows, 1)
    _check_int("max_span", max_span, 1)
    _check_int("lift", lift, 0)
    top = replace(sl, budget=sl.budget + int(lift))
    n = chain.length
    moving = platform.can_transfer and n >= 3
    span = n if not moving else min(n, DEFAULT_SPAN if max_span is None else int(max_span))
    win, win_choice = window_tables(chain, top, span, rot) if windows is None else windows
    # Node s's input: the lone a_{s-1} (flag 0) or unit s-1 whole (flag 1); a_0 never moves.
    in_slots = np.zeros((n + 2, 2), dtype=np.int64)
    in_bytes = np.zeros((n + 2, 2), dtype=np.float64)
    in_slots[2 : n + 1, 0] = sl.act[1:n]
    in_slots[2 : n + 1, 1] = sl.saved[: n - 1]
    in_bytes[2 : n + 1, 0] = chain.act[1:n]
    in_bytes[2 : n + 1, 1] = chain.saved[: n - 1]
    fwd_min = np.minimum(chain.fwd, chain.fwd_nosave)
    fclk = np.zeros(n + 2)
    fclk[1:] = np.concatenate(([0.0], np.cumsum(fwd_min)))
    bclk = np.zeros(n + 2)
    bclk[1:] = np.concatenate(([0.0], np.cumsum(chain.bwd)))
    budget_bytes = max(1, sl.budget * sl.quantum)
    if moving:
        d_in = platform.latency + in_bytes / platform.bandwidth_d2h
        h_in = platform.latency + in_bytes / platform.bandwidth_h2d
        d_in[:2] = np.inf
        h_in[:2] = np.inf
        n_q = _grid_rows(n, span, sl.budget, rows)
        # The queues never usefully hold more than the budget; the D2H one not past the forward.
        span_f = min(budget_bytes / platform.bandwidth_d2h, float(fclk[n + 1]))
        span_b = budget_bytes / platform.bandwidth_h2d
        finite = np.isfinite(d_in[2:n])
        big_d = float(d_in[2:n][finite].max()) if finite.any() else 0.0
        finite = np.isfinite(h_in[2:n])
        big_h = float(h_in[2:n][finite].max()) if finite.any() else 0.0
        span_f = max(min(span_f, _SPAN_ITEMS * big_d), big_d)
        span_b = max(min(span_b, _SPAN_ITEMS * big_h), big_h)
        if span_f > 0 and span_b > 0 and math.isfinite(span_f) and math.isfinite(span_b):
            n_f = n_b = n_q
            delta_f, delta_b = span_f / n_f, span_b / n_b
        else:
            # Unlimited bandwidth and no latency: copies take no time and the queues stay empty;
            # a fine grid keeps an end rounded up to it within the op that triggered it.
            n_f = n_b = 1
            delta_f = delta_b = max(float(fclk[n + 1]), float(bclk[n + 1]), 1e-300) * 1e-9
    else:
        d_in = np.full((n + 2, 2), np.inf)
        h_in = np.full((n + 2, 2), np.inf)
        n_f = n_b = 0
        delta_f = delta_b = 1.0
    # NOTE [ joint: keep ]: node u + 1's input is unit u (whole or its lone a_u); a kept unit's
    # input cannot move, which the kernels read as an infinite copy time (as for a_0). Set after
    # the grids, so that the table is the unkept one's with those choices removed.
    for u in keep:
        if 1 <= u < n:
            d_in[u + 1, :] = np.inf
            h_in[u + 1, :] = np.inf
    rate_f = platform.bandwidth_d2h / sl.quantum
    rate_b = platform.bandwidth_h2d / sl.quantum
    opt, choice = _kj.spine_table(
        chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, win, top.budget,
        in_slots, d_in, h_in, fclk, bclk, rate_f, rate_b, delta_f, n_f, delta_b, n_b, 3 if act_alone else 2,
    )
    return JointTable(top, opt, choice, win, win_choice, in_slots, d_in, h_in, fclk, bclk, rate_f, rate_b,
                      delta_f, n_f, delta_b, n_b, int(lift))


def walk(table: JointTable, chain: Chain, budget: int | None = None) -> list[Node]:
    """The spine nodes of the table's plan, outermost first.

    Parameters
    ----------
    table
        A filled table.
    chain
        The chain it was filled for.
    budget
        The root budget in slots (default: the table's rounded budget :attr:`JointTable.budget`;
        up to its top ``table.slots.budget``); must be one where ``table.opt[1, 0, budget]`` is
        finite.

    Returns
    -------
    list of Node
        Each node with its backward part's budget and duration in the model.
    """
    t = table
    sl = t.slots
    length = chain.length
    nf1, nb1 = t.n_f + 1, t.n_b + 1
    nodes: list[Node] = []
    s, flag, i_f, i_b, m = 1, 0, 0, 0, t.budget if budget is None else int(budget)
    while True:
        row = (flag * nf1 + i_f) * nb1 + i_b
        code = int(t.choice[s, row, m])
        if code == _kj.NO_CHOICE:
            raise AssertionError(f"joint table has no choice for node {s} (row {row}) at budget {m}")
        j, off = divmod(code, _kj.OFFLOADS)
        part = t.flag_of(flag, off)
        charge = _kj.pipe_slots(s, i_b, t.bclk, t.delta_b, t.rate_b) if t.n_b > 0 else 0
        window = m - charge
        f_all = j == 0
        nxt = s + 1 if f_all else j
        # The backward part's duration in the model (it moves the pipeline).
        tau = float(chain.bwd[s - 1]) if f_all else float(t.win[s, j - 1 - s, window])
        nodes.append(Node(s, nxt, f_all, bool(off), flag, window, tau, off == 2))
        if s == length:
            return nodes
        if t.n_f > 0 or t.n_b > 0:
            i_f, i_b, ok = _kj.child_rows(s, nxt, off, i_f, i_b, tau, t.d_in[s, part], t.h_in[s, part], t.fclk, t.bclk,
                                      t.delta_f, t.n_f, t.delta_b, t.n_b)
            if not ok:
                raise AssertionError(f"joint table leaves the queue grid after node {s}")
        back = int(t.in_slots[s, part]) if off else 0
        item = int(sl.saved[s - 1]) if f_all else int(sl.act[nxt - 1])
        m = min(sl.budget, m - item + back)
        flag = 1 if f_all else 0
        s = nxt


def joint_schedule(
    table: JointTable, chain: Chain, platform: Platform, *, early: int = 0, budget: int | None = None
) -> Schedule:
    """Rebuild the schedule of the table's plan, transfers included.

    Offloads are triggered at the end of each offloaded input's maker (the last forward op of
    the node before). Prefetches run deepest first; each is triggered at the end of the
    backward part in which it must start so that, behind the prefetches before it, it ends
    just before its reader's backward part (as late as possible, from the model's durations),
    or ``early`` backward parts before that.

    Parameters
    ----------
    table
        A table whose :attr:`JointTable.value` is finite.
    chain, platform
        The instance it was filled for.
    early
        How many backward parts earlier than the latest possible to trigger each prefetch.
    budget
        Walk the table from this budget (slots) instead of the full one: the plan the model
        finds for a smaller memory.

    Returns
    -------
    Schedule
        The compute sequence with its triggered transfers.
    """
    nodes = walk(table, chain, budget)
    sl = table.slots
    ops: list[tuple[str, int]] = []
    offloads: list[Transfer] = []
    last_forward = -1
    for node in nodes:
        if node.offload:
            offloads.append(Transfer("offload", node.s - 1, last_forward, "end", moves=_moves(node)))
        if node.f_all:
            ops.append(("F", node.s))
        else:
            ops.append(("Fck", node.s))
            ops.extend(("Fn", k) for k in range(node.s + 1, node.j))
        last_forward = len(ops) - 1
    # Backward parts, deepest first; end_op[k] is the op that ends the k-th backward part.
    end_op: list[int] = []
    for node in reversed(nodes):
        if node.f_all:
            ops.append(("B", node.s))
        else:
            emit_segment(ops, _Band(table.win_choice), sl, node.s, node.j - 1, node.window)
        end_op.append(len(ops) - 1)
    # Start of each backward part on the backward's own clock (0: the forward's end).
    order = list(reversed(nodes))
    start = np.concatenate(([0.0], np.cumsum([n.tau for n in order])))
    index_of = {n.s: k for k, n in enumerate(order)}
    prefetches: list[tuple[int, int, Transfer]] = []
    later = math.inf  # the latest start of the prefetch after this one (shallower)
    for node in nodes:  # shallow first: the one needed last is placed first
        if not node.offload:
            continue
        k = index_of[node.s]
        finish = min(start[k], later)
        begin = finish - platform.h2d_time(_item_bytes(chain, node))
        later = begin
        # The backward part in which the prefetch must start: the last one starting at or before it.
        part = int(np.searchsorted(start[: k + 1], begin, side="right")) - 1 - early
        trigger = last_forward if part < 0 else end_op[part - 1] if part >= 1 else last_forward
        prefetches.append((trigger, -node.s, Transfer("prefetch", node.s - 1, trigger, "end", moves=_moves(node))))
    prefetches.sort(key=lambda p: (p[0], p[1]))
    return Schedule(tuple(ops), tuple(offloads) + tuple(p[2] for p in prefetches))


def _moves(node: Node) -> str:
    """What node's offload moves: a_{s-1} alone out of a whole unit s-1, or all of its input."""
    return "act" if node.act_alone else "unit"


def _with_waits(chain: Chain, platform: Platform, schedule: Schedule, deadline: float = math.inf) -> tuple[Schedule, Timeline]:
    """Simulate ``schedule``; where memory goes over the limit, turn the excess into waits.

    The model frees an offloaded item byte by byte, the simulator when its whole copy has
    ended (``NOTE [ joint recurrence ]``), so a forward op may start while the item it counted
    as gone is still on the GPU: that op then waits for the offload in flight that ends first
    (a ``before`` wait, the paper's idle time), and the schedule is simulated again. A
    prefetch whose allocation goes over is triggered one op later (still before its reader).
    Stops when feasible, when no such fix applies, after a bounded number of fixes, or when
    one more simulation (timed as the first) would end past ``deadline``.
    """
    t = time.perf_counter()
    timeline = simulate(chain, platform, schedule)
    once = time.perf_counter() - t
    for _ in range(2 * len(schedule.transfers) + 4):
        v = timeline.violation
        if v is None or v.rule != "memory" or time.perf_counter() + once > deadline:
            break
        fixed = _fix_memory(schedule, timeline, v)
        if fixed is None:
            break
        schedule = fixed
        timeline = simulate(chain, platform, schedule)
    return schedule, timeline


def _fix_memory(schedule: Schedule, timeline: Timeline, v) -> Schedule | None:
    transfers = list(schedule.transfers)
    at = v.time
    if v.op.startswith("P_"):
        unit = int(v.op[2:])
        idx = next(k for k, t in enumerate(transfers) if t.kind == "prefetch" and t.unit == unit)
        t = transfers[idx]
        reader = _first_reader(schedule, t)
        if t.op + 1 >= reader:
            return None
        transfers[idx] = replace(t, op=t.op + 1, at="end", before=None)
        return Schedule(schedule.compute, tuple(transfers))
    # A compute op: the one of that name starting at the violation's instant.
    ks = [k for k in range(len(schedule.compute)) if schedule.op_name(k) == v.op]
    k = min(ks, key=lambda q: abs(timeline.op_start[q] - at))
    # Wait for the offload in flight that ends first, if its GPU copy is then free.
    flying = [
        (timeline.transfer_end[q], q)
        for q, t in enumerate(transfers)
        if t.kind == "offload" and t.op < k and timeline.transfer_start[q] <= at < timeline.transfer_end[q]
        and (t.before is None or t.before > k)
    ]
    if flying:
        q = min(flying)[1]
        t = transfers[q]
        transfers[q] = replace(t, before=k)
        return Schedule(schedule.compute, tuple(transfers))
    # Else a prefetch that holds its bytes already but is read only after this op: start it
    # after this op instead (the last one started, which the backward needs last).
    held = [
        (timeline.transfer_start[q], q)
        for q, t in enumerate(transfers)
        if t.kind == "prefetch" and timeline.transfer_start[q] <= at and t.op < k and _first_reader(schedule, t) > k
    ]
    if held:
        q = max(held)[1]
        t = transfers[q]
        transfers[q] = replace(t, op=k, at="end", before=None)
        return Schedule(schedule.compute, tuple(transfers))
    return None


def _first_reader(schedule: Schedule, prefetch: Transfer) -> int:
    """Index of the first op after the prefetch's trigger that reads its unit (B or forward of the next stage)."""
    unit = prefetch.unit
    for k in range(prefetch.op + 1, len(schedule.compute)):
        kind, stage = schedule.compute[k]
        if (kind == "B" and stage in (unit, unit + 1)) or (kind != "B" and stage == unit + 1):
            return k
    return len(schedule.compute)


def _item_bytes(chain: Chain, node: Node) -> int:
    """Bytes of node's input: the lone a_{s-1} or unit s-1 whole."""
    return int(chain.saved[node.s - 2]) if node.flag and not node.act_alone else int(chain.act[node.s - 1])


def joint_dp(
    chain: Chain,
    platform: Platform,
    *,
    slots: int = DEFAULT_SLOTS,
    rows: int | None = None,
    max_span: int | None = None,
    rot: tuple[np.ndarray, np.ndarray] | None = None,
    act_alone: bool | None = True,
    time_limit: float | None = None,
    lift: int | None = None,
    keep: Iterable[int] = (),
) -> Result:
    """The joint dynamic program alone: its rebuilt schedule, simulated and repaired.

    The reported makespan is the simulator's (``NOTE [ joint recurrence ]``); the table's
    value is kept in ``info["dp_makespan"]``. The table holds the model's best plan for every
    budget up to the platform's, so the plans for slightly smaller budgets cost a walk each:
    the plans at :data:`_ROOTS` fractions of the budget are rebuilt (prefetches as late as
    possible, and one backward part earlier), their memory excess turned into waits
    (:func:`_with_waits`), simulated, and the fastest feasible one is kept
    (``info["root"]``: the fraction it came from; ``info["act_alone"]``: whether it moves some
    a_i alone). By default the table also has the choice to offload a_{s-1} alone out of a
    whole unit (``act_alone``): its model value can only be lower, and on the shipped networks
    (V100 and A100 times, 12-64 GB/s, 30 % and 50 % of the peak) its simulated plan was never
    slower than the plain table's, for about 1.2x the time.

    Then the slot rounding's gap (``NOTE [ joint: lifted plans ]``): the table is filled
    ``lift`` slots above the rounded budget, and its plans there, which the rounding up of
    every size hides, are rebuilt, repaired and simulated in bytes too; one is kept only when
    it is strictly faster (``info["lifted_by"]``: its slots above the budget). The plans at
    and below the budget are the unlifted table's, so the result is never slower than with
    ``lift=0``.

    Parameters
    ----------
    chain, platform
        The instance.
    slots
        Memory slots S of the dynamic programs (as for rotor).
    rows, max_span, rot
        As for :func:`joint_table` (``rot`` for the platform's memory and ``slots``, filled
        ``lift`` slots above the budget).
    act_alone
        ``True`` (default) / ``False``: the table with / without lone-activation offloads of
        whole units; ``None``: both tables, the fastest simulated plan of either (twice the time).
    time_limit
        Seconds it may take (``None``: no limit). A table is one Numba call no clock can cut: one
        whose estimate (``NOTE [ clock ]``) does not fit what is left, or the memory free (at
        any limit), is not filled; with no table filled the result is ``timeout``, refused up
        front with the estimate in the message. The walks are cut at the limit: the fastest
        plan simulated by then is kept (``info["stopped"] = "time"``).
    lift
        Slots the table gets above the budget (default :func:`joint_lift`; 0: no lifted plans,
        the DP as it was before them). At most ``LIFT_WORK // L`` (at least 8) of the lifted
        budgets, evenly spread, are walked: a work bound, not a clock, so the result is the same
        on any machine.
    keep
        Units (stages 1..L) no plan offloads (:func:`~chainoffload.solvers.check_keep`;
        ``NOTE [ joint: keep ]``).

    Returns
    -------
    Result
        ``feasible`` with the schedule, or ``infeasible`` when no plan fits.
    """
    from .._cost import joint_dp_bytes, joint_dp_seconds
    from ._options import check_keep, check_time_limit, refusal

    t0 = time.perf_counter()
    time_limit = check_time_limit(time_limit)
    kept = check_keep(chain, keep)
    deadline = math.inf if time_limit is None else t0 + time_limit
    info: dict = {"slots": int(slots)}
    if act_alone is not None and not isinstance(act_alone, bool):
        raise ValueError(f"act_alone: expected True, False or None, got {act_alone!r}")
    sl = slots_for(chain, platform.memory, slots)
    _check_int("lift", lift, 0)
    lift = joint_lift(chain, platform, slots) if lift is None else int(lift)
    info["lift_slots"] = lift
    kinds = (False, True) if act_alone is None else (act_alone,)
    windows = None
    found: tuple[Schedule, Timeline, float] | None = None
    last_message = ""
    tried: set[tuple] = set()
    for k, alone in enumerate(kinds):
        left = None if time_limit is None else deadline - time.perf_counter()
        refused = refusal("joint", f"the joint DP's table of {chain.length:,} stages and {slots} slots",
                          joint_dp_seconds(chain.length, slots + lift), joint_dp_bytes(chain.length, slots + lift), left,
                          t0, length=chain.length, info=info)
        if refused is not None:
            if k == 0:
                return refused
            info["stopped"] = "time"
            break
        table = joint_table(chain, platform, sl, rows=rows, max_span=max_span, rot=rot, act_alone=alone,
                            windows=windows, lift=lift, keep=kept)
        windows = (table.win, table.win_choice)
        # The last table's choices include the others': its value is the model's optimum.
        info.update(quantum=sl.quantum, budget_slots=sl.budget, dp_makespan=table.value, rows=table.n_b)
        found, last_message = _best_walks(table, chain, platform, sl, tried, found, last_message, deadline, info)
        # NOTE [ joint: lifted plans ]: after the table's own budgets; a lifted plan replaces
        # only a strictly slower one.
        found, last_message = _lifted_walks(table, chain, platform, tried, found, last_message, deadline, info)
    if found is not None:
        info["root"] = found[2]
        if found[2] <= 1.0:
            info.pop("lifted_by", None)
        info["act_alone"] = any(t.moves == "act" for t in found[0].transfers)
    return dp_result("joint", found, info, t0, platform, slots, last_message)


def _best_walks(table, chain, platform, sl, tried, found, last_message, deadline=math.inf, info=None):
    """Rebuild, repair and simulate the table's plans at the :data:`_ROOTS` budgets; keep the
    fastest feasible one in ``found`` (skipping plans ``tried`` already). A walk that would not
    end by ``deadline`` (timed as the longest one so far; the first from the sequence model of
    ``NOTE [ clock ]``) is not started, and ``info["stopped"]`` says so."""
    from .._cost import sequence_seconds

    longest = 4 * sequence_seconds(3 * chain.length)
    if math.isfinite(table.value):
        for fraction in _ROOTS:
            budget = int(sl.budget * fraction)
            if not math.isfinite(float(table.opt[1, 0, budget])):
                break
            plan = tuple(walk(table, chain, budget))
            if plan in tried:
                continue
            tried.add(plan)
            found, last_message, longest, stopped = _simulate_walk(
                table, chain, platform, budget, fraction, found, last_message, longest, deadline
            )
            if stopped:
                if info is not None:
                    info["stopped"] = "time"
                return found, last_message
    return found, last_message


def _simulate_walk(table, chain, platform, budget, root, found, last_message, longest, deadline):
    """Rebuild the plan the table walks at ``budget`` (late transfers, then early ones unless
    the first moves nothing), repair and simulate it, and keep it in ``found`` (tagged ``root``)
    when feasible and strictly faster. Returns ``(found, last_message, longest, stopped)``:
    ``stopped`` when a rebuild (timed as the ``longest`` so far) would not end by ``deadline``."""
    for early in (0, 1):
        if time.perf_counter() + longest > deadline:
            return found, last_message, longest, True
        began = time.perf_counter()
        schedule, timeline = _with_waits(
            chain, platform, joint_schedule(table, chain, platform, early=early, budget=budget), deadline
        )
        longest = max(longest, time.perf_counter() - began)
        if timeline.feasible and (found is None or timeline.makespan < found[1].makespan):
            found = (schedule, timeline, root)
        elif not timeline.feasible:
            last_message = timeline.violation.message
        if not schedule.transfers:
            break
    return found, last_message, longest, False


def joint_lift(chain: Chain, platform: Platform, slots: int) -> int:
    """Slots the joint DP's table gets above the budget by default (``NOTE [ joint: lifted
    plans ]``): rotor's :func:`~chainoffload.solvers.rotor.lift_slots` when the link can move
    data, 0 when it cannot (the DP is then rotor's, and ``rotor`` lifts its own table)."""
    return lift_slots(chain.length, slots) if platform.can_transfer and chain.length >= 3 else 0


def _lifted_walks(table, chain, platform, tried, found, last_message, deadline=math.inf, info=None):
    """Rebuild, repair and simulate the table's plans at budgets above its rounded one (``NOTE
    [ joint: lifted plans ]``), at most ``LIFT_WORK // L`` of them (at least 8), evenly spread
    from the top down; keep one in ``found`` only when strictly faster (``info["lifted_by"]``)."""
    from .._cost import sequence_seconds

    if table.lift <= 0:
        return found, last_message
    budgets = np.arange(table.slots.budget, table.budget, -1)
    most = max(8, LIFT_WORK // max(1, chain.length))
    if budgets.size > most:
        budgets = budgets[np.unique(np.linspace(0, budgets.size - 1, most).round().astype(np.int64))]
    longest = 4 * sequence_seconds(3 * chain.length)
    for budget in budgets.tolist():
        if not math.isfinite(float(table.opt[1, 0, budget])):
            continue
        plan = tuple(walk(table, chain, budget))
        if plan in tried:
            continue
        tried.add(plan)
        before = found
        # A lifted plan's violation is not the message of the budget's own plans: left out.
        found, _, longest, stopped = _simulate_walk(
            table, chain, platform, budget, budget / max(1, table.budget), found, last_message, longest, deadline
        )
        if found is not before and info is not None:
            info["lifted_by"] = budget - table.budget
        if stopped:
            if info is not None:
                info["stopped"] = "time"
            return found, last_message
    return found, last_message


def joint(
    chain: Chain,
    platform: Platform,
    *,
    slots: int = DEFAULT_SLOTS,
    rows: int | None = None,
    max_span: int | None = None,
    offload: Result | None = None,
    time_limit: float | None = None,
    lift: int | None = None,
    cpsat_work: float | None = None,
    keep: Iterable[int] = (),
) -> Result:
    """Rematerialization plus offloading: the best of the joint DPs, rotor and pure offloading.

    The candidates are the paper's DP (:func:`joint_dp`, any number of transfers in flight,
    fluid queues), the exact DP (:func:`~chainoffload.solvers.joint_exact.joint_exact`, one
    transfer in flight per channel, chains up to :data:`EXACT_MAX_LENGTH` stages), rotor (no
    transfer) and pure offloading (no recomputation); the last two are special cases of the
    combined problem. The method returns whichever simulates fastest; ``info`` says which
    (``"source"``) and keeps each one's makespan. The paper's DP also simulates the plans of
    its table a few slots above the rounded budget, which slot rounding hides (``lift``), and
    keeps one only when it fits and is strictly faster, so ``joint`` is never slower than with
    ``lift=0`` (measured: strictly faster on 31 of 56 network and random-chain points, up to
    1.54 %, about 10 % more time).

    Parameters
    ----------
    chain, platform
        The instance.
    slots
        Memory slots of the dynamic programs.
    rows, max_span
        As for :func:`joint_table`.
    offload
        The pure-offloading result to compare with (e.g. a ``best`` result the caller already
        has); by default :func:`chainoffload.solvers.best.best` is run here.
    time_limit
        Seconds it may take (``None``: no limit). The candidates then run in the order that
        keeps a schedule in hand soonest: pure offloading first (``best`` with
        :data:`OFFLOAD_SHARE` of the limit; it can always be cut), then the paper's DP, rotor
        and the exact DP, each only when its estimated table (``NOTE [ clock ]``) fits what is
        left; the ones left out are in ``info["skipped"]`` with the reason (also, at any limit,
        a table that would not fit in the memory free), those the limit cut short in
        ``info["cut_short"]``, and ``info["stopped"]`` is then ``"time"``. Status ``timeout``
        when no candidate has a schedule and the limit left one out.
    lift
        Slots the paper's DP's table gets above the budget, whose plans slot rounding hides
        (``NOTE [ joint: lifted plans ]``; default :func:`joint_lift`, 0: none, the method as
        it was before them). ``info["lifted_by"]`` says when the returned DP plan is one.
    cpsat_work
        CP-SAT's deterministic seconds for improving the chosen plan when it rematerializes
        (``NOTE [ joint: CP-SAT re-timing ]`` in :mod:`.joint_cpsat`; default
        :data:`~chainoffload.solvers.joint_cpsat.JOINT_CPSAT_WORK`, 0: off). ``info["cpsat"]``
        says what it did (with ``"from"``, the chosen candidate's makespan, when it found a faster
        schedule; ``info["source"]`` still names that candidate).
    keep
        Units (stages 1..L) that must stay resident, as for the pure-offloading methods: no
        candidate offloads one, whole or as a lone a_i; they may still be recomputed (``NOTE
        [ joint: keep ]``). An ``offload`` result that moves one is not a candidate
        (``info["offload_dropped"]`` says which units it moved).
    """
    from .._cost import joint_exact_seconds
    from ._options import check_keep, check_time_limit, refusal
    from ._registry import spec
    from .rotor import rotor

    if offload is not None and not isinstance(offload, Result):
        raise TypeError(f"offload: expected a Result, got {type(offload).__name__}")
    if cpsat_work is None:
        cpsat_work = JOINT_CPSAT_WORK
    if not (isinstance(cpsat_work, (int, float)) and not isinstance(cpsat_work, bool) and 0 <= cpsat_work < math.inf):
        raise ValueError(f"cpsat_work: {cpsat_work!r} must be a number of deterministic seconds >= 0")
    kept = check_keep(chain, keep)
    t0 = time.perf_counter()
    time_limit = check_time_limit(time_limit)
    timed = time_limit is not None
    deadline = t0 + time_limit if timed else math.inf

    def left() -> float | None:
        # Never 0 or below: a candidate given what is left must see a limit it can refuse
        # (best may overrun its share by its last step; seen at L = 10^6).
        return max(deadline - time.perf_counter(), 1e-6) if timed else None

    exact = platform.can_transfer and chain.length <= EXACT_MAX_LENGTH
    _check_int("lift", lift, 0)
    lift = joint_lift(chain, platform, slots) if lift is None else int(lift)
    skipped: dict[str, str] = {}
    found: dict[str, Result] = {}
    if offload is None and timed:
        # Under a clock the one candidate that can be cut runs first: a schedule in hand early.
        offload = spec("best").load()(chain, platform, time_limit=max(OFFLOAD_SHARE * time_limit, 1e-3), keep=kept)
    rot = None
    if exact:
        # Both DPs read rotor's dense table: fill it once, when the exact DP fits the clock,
        # up to the paper's DP's lifted top (entries below it do not depend on the top).
        sl = slots_for(chain, platform.memory, slots)
        refused = refusal("joint-exact", f"the exact DP of {chain.length} stages",
                          joint_exact_seconds(chain.length, slots + lift), 0.0, left(), t0, length=chain.length)
        if refused is None:
            rot = _kr.rotor_table(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp,
                                  sl.budget + lift)
        else:
            exact = False
            skipped["joint-exact"] = refused.message
    found["joint-dp"] = joint_dp(chain, platform, slots=slots, rows=rows, max_span=max_span, rot=rot, time_limit=left(),
                                 lift=lift, keep=kept)
    found["rotor"] = rotor(chain, platform, slots=slots, time_limit=left())
    if exact:
        if lift:
            # The exact DP's table stops at the budget.
            rot = tuple(np.ascontiguousarray(a[:, :, : sl.budget + 1]) for a in rot)
        found["joint-exact"] = joint_exact(chain, platform, slots=slots, rot=rot, keep=kept)
    if offload is None:
        # best itself may run joint (remat=True): reach it by name, as the registry does, so
        # that the two modules do not import each other.
        offload = spec("best").load()(chain, platform, keep=kept)
    name = offload.method or "offload"
    dropped = sorted(kept & set(offload.schedule.offloaded_units)) if offload.schedule is not None else []
    if not dropped:
        found[name] = offload
    candidates: dict[str, Result] = {}
    cut = []
    for key, res in found.items():
        if res.info.get("refused"):
            skipped[key] = res.message
        else:
            candidates[key] = res
            if timed and res.info.get("stopped") == "time":
                cut.append(key)
    best_name, chosen = None, None
    for key, res in candidates.items():
        if res.status.has_schedule and (chosen is None or res.makespan < chosen.makespan):
            best_name, chosen = key, res
    info = {f"{key}_makespan": res.makespan for key, res in candidates.items()}
    info.update(candidates["joint-dp"].info if "joint-dp" in candidates else {})
    info.pop("refused", None)
    if skipped:
        info["skipped"] = skipped
    if dropped:
        info["offload_dropped"] = dropped
    if cut:
        info["cut_short"] = cut
    if timed and (skipped or cut):
        info["stopped"] = "time"
    else:
        info.pop("stopped", None)
    runtime = time.perf_counter() - t0
    if chosen is None:
        if timed and (skipped or cut):
            return Result(
                "joint", Status.TIMEOUT, None, runtime=runtime, info=info,
                message=f"joint: no candidate had a schedule within the time limit ({time_limit:g} s): "
                + "; ".join(skipped.values()),
            )
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
    schedule, makespan = chosen.schedule, chosen.makespan
    if cpsat_work > 0 and platform.can_transfer and not (timed and deadline - time.perf_counter() <= 0):
        imp = improve_joint(chain, platform, schedule, makespan, work=float(cpsat_work), deadline=deadline, keep=kept)
        info["cpsat"] = imp.info
        if imp.makespan < makespan:
            # ``source`` stays the candidate improved; the improvement is said here.
            info["cpsat"] = {**imp.info, "from": makespan}
            schedule, makespan = imp.schedule, imp.makespan
    runtime = time.perf_counter() - t0
    return Result("joint", Status.FEASIBLE, schedule, makespan=makespan, runtime=runtime, info=info)
