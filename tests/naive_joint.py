"""An independent oracle for the joint DP: every spine plan, evaluated step by step, in plain Python.

Written from ``NOTE [ joint recurrence ]`` (chainoffload/solvers/joint.py), not from the
kernel: a *plan* is a sequence of spine nodes, each "F_all on s" or "checkpoint s..j-1", each
with or without its input offloaded; :func:`plan_cost` walks one plan through the model's state
(budget, D2H queue end, H2D pipeline end, both on their absolute grids) and returns its time in
the model, or ``inf`` where a rule forbids it; :func:`best_plan` enumerates them all. The grid
parameters and rotor's window table are the model's inputs, taken from the table under test.
"""

from __future__ import annotations

import math

import numpy as np


def _ceil_index(x: float, delta: float) -> int:
    return int(math.ceil(x / delta))


def _after(clock: float, delta: float) -> int:
    return int(math.floor(clock / delta)) + 1


def _slots(seconds: float, rate: float) -> int:
    if seconds <= 0.0:
        return 0
    v = seconds * rate
    return 1 << 40 if v >= 1e15 else math.ceil(v - 1e-9)


def plan_cost(chain, table, plan, budget: int) -> float:
    """Time of ``plan`` in the model from the root budget, ``inf`` if a step breaks a rule.

    ``plan`` is a list of ``(s, j, f_all, off)``: the node at stage s, the next node's stage
    j (s + 1 for F_all), and what of its input is offloaded: 0 nothing, 1 all of it, 2 only
    a_{s-1} out of a whole unit s-1.
    """
    t = table
    sl = t.slots
    n = chain.length
    act, saved, fwd_tmp, bwd_tmp = sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp
    m = budget
    flag = 0
    end_f = None  # grid index of the D2H queue's end, None: idle
    end_b = None  # grid index of the pipeline's end, None: empty
    total = 0.0
    for k, (s, j, f_all, off) in enumerate(plan):
        last = s == n
        if last != (k == len(plan) - 1) or (last and not f_all) or (f_all and j != s + 1):
            return math.inf
        part = flag if off == 1 else 0  # a_{s-1} alone reads the lone-activation sizes
        if off and not (2 <= s < n and t.n_b > 0 and math.isfinite(t.d_in[s, part])):
            return math.inf
        if off == 2 and flag == 0:
            return math.inf
        y = 0 if s == 1 else int(t.in_slots[s, part])
        e_point = None if end_f is None else end_f * t.delta_f
        r_point = None if end_b is None else end_b * t.delta_b
        # The D2H queue after this node's offload (its input joins at the node's start).
        new_f = end_f
        if off:
            start = t.fclk[s] if e_point is None else e_point
            new_f = _ceil_index(start + t.d_in[s, part], t.delta_f)

        def debt(op_stage: int, end_index) -> int:
            if end_index is None or t.n_f == 0:
                return 0
            return _slots(end_index * t.delta_f - t.fclk[op_stage], t.rate_f)

        # Forward ops: (stage, need, time).
        if f_all:
            ops = [(s, saved[s - 1] + fwd_tmp[s - 1], chain.fwd[s - 1])]
        else:
            ops = [(s, act[s] + fwd_tmp[s - 1], chain.fwd_nosave[s - 1])]
            ops += [(u, act[u - 1] + act[u] + fwd_tmp[u - 1], chain.fwd_nosave[u - 1]) for u in range(s + 1, j)]
        for q, (u, need, _) in enumerate(ops):
            if q == 0:
                if need + (debt(s, end_f) if e_point is not None and e_point > t.fclk[s] else 0) > m:
                    return math.inf
            elif need + debt(u, new_f) > m + (y if off else 0):
                return math.inf
        charge = 0 if r_point is None or r_point <= t.bclk[s] else _slots(r_point - t.bclk[s], t.rate_b)
        if f_all:
            usage_b = saved[s - 1] + act[s] + act[s - 1] + bwd_tmp[s - 1]
            if usage_b + charge > m:
                return math.inf
            tau = chain.bwd[s - 1]
        else:
            w = m - charge
            if w < 0 or not math.isfinite(t.win[s, j - 1 - s, w]):
                return math.inf
            tau = float(t.win[s, j - 1 - s, w])
        if last:
            idle = 0.0
            if t.n_f > 0 and e_point is not None and e_point > t.fclk[n + 1]:
                idle += e_point - t.fclk[n + 1]
            if r_point is not None and r_point > t.bclk[n + 1]:
                idle += r_point - t.bclk[n + 1]
            return total + chain.fwd[n - 1] + idle + chain.bwd[n - 1]
        total += sum(op[2] for op in ops) + tau
        # The next node's state.
        y_next = saved[s - 1] if f_all else act[j - 1]
        m = min(sl.budget, m - y_next + (y if off else 0))
        if m < 0:
            return math.inf
        if new_f is not None and new_f * t.delta_f <= t.fclk[j]:
            new_f = None
        if new_f is not None and new_f - _after(t.fclk[j], t.delta_f) + 1 > t.n_f:
            return math.inf
        r = t.bclk[j]
        if r_point is not None and r_point > t.bclk[s]:
            r = max(t.bclk[j], r_point - (tau - (t.bclk[j] - t.bclk[s])))
        if off:
            r += t.h_in[s, part]
        end_b = None
        if r > t.bclk[j]:
            end_b = _ceil_index(r, t.delta_b)
            if end_b - _after(t.bclk[j], t.delta_b) + 1 > t.n_b:
                return math.inf
        end_f = new_f
        flag = 1 if f_all else 0
    return math.inf


def plans(length: int, max_span: int, transfers: bool, act_alone: bool = False):
    """Every spine plan of a chain of ``length`` stages (nodes span at most ``max_span`` stages);
    with ``act_alone``, a node whose input is a whole unit may also offload a_{s-1} alone."""

    def rec(s: int, whole_input: bool):
        if s == length:
            yield [(s, s + 1, True, 0)]
            return
        offs = (0, 1) if transfers and s >= 2 else (0,)
        if transfers and act_alone and whole_input and s >= 2:
            offs = (0, 1, 2)
        for off in offs:
            for rest in rec(s + 1, True):
                yield [(s, s + 1, True, off)] + rest
            for j in range(s + 1, min(length, s + max_span) + 1):
                for rest in rec(j, False):
                    yield [(s, j, False, off)] + rest

    yield from rec(1, False)


def best_plan(chain, table, max_span: int, budget: int | None = None, act_alone: bool = False) -> tuple[float, list]:
    """The least time over every plan in the model, and one plan that has it."""
    budget = table.slots.budget if budget is None else budget
    best, arg = math.inf, None
    for plan in plans(chain.length, max_span, table.n_b > 0, act_alone):
        cost = plan_cost(chain, table, plan, budget)
        if cost < best:
            best, arg = cost, plan
    return best, arg


def plan_of_nodes(nodes) -> list:
    """A plan in :func:`plan_cost`'s form from :class:`chainoffload.solvers.joint.Node` records."""
    return [(n.s, n.j, n.f_all, 2 if n.act_alone else int(n.offload)) for n in nodes]


__all__ = ["plan_cost", "plans", "best_plan", "plan_of_nodes", "np"]
