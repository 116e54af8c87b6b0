"""Proven lower bounds: on the makespan (the fluid LP relaxation) and on the memory of offloading.

Every bound here holds for the problem the simulator accepts in the fixed order: any unit may
move whole or as a_i alone (``moves: "act"``), with any triggers and waits
(``NOTE [ what a unit moves ]``).

* :func:`fluid_lower_bound` solves the fluid LP relaxation (transfers
  divisible and preemptive, units offloaded by a fraction, memory moved in proportion to bytes,
  compute ops that may wait) and returns its optimum, a lower bound on the makespan of every
  schedule the simulator accepts (``NOTE [ fluid LP lower bound ]``).
* :func:`lower_bound` is ``max(chain.compute_time, fluid_lower_bound)``.
* :func:`volume_lower_bound` (closed form) and :func:`unit_milp` (whole moves, a MILP) are the
  cheaper and the stronger rung; :func:`stronger_bound` takes the best of them in a budget.
* :func:`offload_memory_floor` is the least memory any pure-offloading schedule needs.
* :func:`fluid_lp` returns the whole LP solution (the fractions ``x`` that method ``lp``
  rounds, the op start times, solve time).

The modules: ``floor`` (memory), ``volume`` (closed form), ``fluid`` (the fluid LP), ``milp``
(the whole-move relaxation and :func:`stronger_bound`) and ``ladder``: :func:`problem_bound`,
the one bound ``solve``, ``plot``, ``verify`` and ``tradeoff`` report, climbed by a rule that
depends on the instance only (``NOTE [ bound ladder ]``). OR-Tools is imported inside the
functions that solve, so importing this package needs nothing beyond numpy.
"""

from __future__ import annotations

from ._common import LP_SOLVERS
from .floor import keep_all_start_memory, offload_memory_floor
from .fluid import FluidLP, fluid_lower_bound, fluid_lp, lower_bound, lp_cached
from .ladder import ProblemBound, problem_bound, stronger_bound
from .milp import UNIT_MILP_MAX_SIZE, Bound, UnitMILP, moves_of, unit_milp, unit_milp_seconds
from .volume import volume_lower_bound

__all__ = [
    "Bound",
    "FluidLP",
    "ProblemBound",
    "UnitMILP",
    "UNIT_MILP_MAX_SIZE",
    "LP_SOLVERS",
    "fluid_lp",
    "fluid_lower_bound",
    "keep_all_start_memory",
    "lower_bound",
    "lp_cached",
    "moves_of",
    "offload_memory_floor",
    "problem_bound",
    "stronger_bound",
    "unit_milp",
    "unit_milp_seconds",
    "volume_lower_bound",
]

# NOTE [ what a unit moves ]
# ---------------------------
# The problem every bound of this module is proven for: the schedules the simulator accepts in
# the fixed order (pure offloading), each unit i not offloaded, moved whole (``moves: "unit"``,
# b_i = saved_i bytes) or moved as a_i alone (``"act"``, b_i = act_i bytes; the rest,
# saved_i - act_i, stays on the GPU from F_i's start to B_i's end, as with no offload at all:
# docs/model.md, "Which instance a transfer moves"). In the fixed order the two moves differ
# only in b_i: the moved part's GPU copy is released at max(end of O_i, end of F_{i+1}) (rule 4
# of docs/model.md's memory), P_i allocates b_i bytes when it starts, starts after O_i ends and
# ends before B_{i+1} starts (B_{i+1} reads a_i, which moves either way), and each transfer
# lasts latency + b_i / bandwidth. So memory just after op k's allocation is keepall_k less the
# b_i of the units whose moved part is off the GPU then; every proof below is written with b_i.
# A move of b_i = 0 bytes (act_i = 0) frees nothing and only holds a channel: read as "unit i
# is not offloaded", such a schedule still satisfies every row of every relaxation here (its
# rows only lose a term that took time), so the relaxations need not offer that move; and a
# move of a_i alone with act_i = saved_i is the whole-unit move.
#
# Why not narrow the problem to whole units instead: users run what the simulator accepts
# (``joint`` and the torch executor move a_i alone), and moving a_i alone does win where only a
# few bytes must leave: on resnet18 at 1438209368 B (25 GB/s, 10 us) offloading a_2 alone runs
# at the compute time, 14.306 ms, while CP-SAT over whole-unit moves only proved 17.698 ms
# optimal.

