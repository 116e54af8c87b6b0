"""One CP-SAT model of one instance: variables, constraints, objective; solving; reading a solution."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._interrupt import run_stoppable
from ...chain import Chain
from ...order import fixed_order, trigger
from ...platform import Platform
from ...schedule import Schedule, Transfer
from .constraints import Constraints
from .grid import TimeGrid
from .hint import hint_values
from .objective import Objective
from .variables import Variables

__all__ = ["CPModel", "import_cp_model", "model_estimate"]


def model_estimate(length: int) -> dict[str, float]:
    """Estimated size of the CP-SAT model of a chain of ``length`` stages (NOTE [ cpsat: model size ]):
    ``variables``, ``constraints``, ``bytes`` and ``seconds`` to build here."""
    cons = 43.7 * length**2
    return {
        "variables": 12.1 * length**2,
        "constraints": cons,
        "bytes": 0.3e9 + 1000.0 * cons,
        "seconds": 10.1 * (length / 100.0) ** 2.5,
    }


def import_cp_model():
    """OR-Tools' CP-SAT module (imported here only, STYLE.md habit 6)."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - ortools is a core dependency
        raise ImportError("method 'cpsat' needs OR-Tools: pip install ortools") from exc
    return cp_model


class CPModel:
    """The CP-SAT model of ``chain`` on ``platform`` at time grid ``grid``.

    Parameters
    ----------
    chain, platform, grid
        The instance and its integer durations.
    keep
        Units that must stay resident.
    lower_bound
        A proven float lower bound on the makespan to state in the model (:class:`Objective`).
    """

    def __init__(
        self,
        chain: Chain,
        platform: Platform,
        grid: TimeGrid,
        keep: frozenset[int] = frozenset(),
        lower_bound: float | None = None,
    ):
        self.cp_model = import_cp_model()
        self.model = self.cp_model.CpModel()
        self.chain, self.platform, self.grid = chain, platform, grid
        self.variables = Variables(self.model, chain, platform, grid, keep)
        self.constraints = Constraints(self.variables)
        self.constraints.add_all()
        self.objective = Objective(self.variables, lower_bound)
        self.objective.add()

    # -- warm start ------------------------------------------------------------------------------

    def hint(self, schedule: Schedule) -> None:
        """Start the search from ``schedule`` (in the model's space: :func:`.hint.in_model_space`)."""
        self.model.clear_hints()
        for var, value in hint_values(self.variables, schedule).items():
            self.model.add_hint(var, value)

    def complete_hint(self, time_limit: float) -> bool:
        """Turn the hint into a complete assignment of every variable (CP-SAT keeps such a hint).

        The hint leaves auxiliary variables (interval sizes, free times, absence literals)
        open; CP-SAT may fail to complete it within its own small effort and drop it. A solve
        with every hinted variable fixed completes it; returns whether it did.
        """
        solver = self.cp_model.CpSolver()
        solver.parameters.fix_variables_to_their_hinted_value = True
        solver.parameters.max_time_in_seconds = float(time_limit)
        solver.parameters.num_workers = 1
        solver.parameters.catch_sigint_signal = False  # SIGINT stays Python's (chainoffload/_interrupt.py)
        status = solver.status_name(run_stoppable(lambda: solver.solve(self.model), solver.stop_search))
        if status not in ("OPTIMAL", "FEASIBLE"):
            return False
        md = self.model
        values = [int(solver.value(md.get_int_var_from_proto_index(i))) for i in range(len(md.proto.variables))]
        md.clear_hints()
        for i, val in enumerate(values):
            md.add_hint(md.get_int_var_from_proto_index(i), val)
        return True

    # -- solving ---------------------------------------------------------------------------------

    def solve(self, *, time_limit: float, workers: int, gap_units: float, on_solution: Callable[[Any], None] | None = None):
        """Run CP-SAT; returns ``(solver, status name)``.

        ``gap_units`` is the absolute gap at which to stop (the rounding slack, NOTE [ cpsat:
        time scale ]); ``on_solution(solver_callback)`` is called at each improving solution.
        """
        cp_model = self.cp_model
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
        solver.parameters.num_workers = int(workers)
        solver.parameters.absolute_gap_limit = max(1.0, float(gap_units))
        # CP-SAT's own SIGINT handler aborted the process (std::bad_function_call) on a Ctrl-C
        # at the wrong moment: SIGINT stays Python's, and the search ends by stop_search.
        solver.parameters.catch_sigint_signal = False
        callback = None
        if on_solution is not None:

            class _Callback(cp_model.CpSolverSolutionCallback):
                def on_solution_callback(cb) -> None:  # noqa: N805
                    on_solution(cb)

            callback = _Callback()
        code = run_stoppable(lambda: solver.solve(self.model, callback), solver.stop_search)
        return solver, solver.status_name(code)

    # -- reading a solution ----------------------------------------------------------------------

    def schedule_from(self, solver) -> Schedule:
        """Convert the solver's current solution to the schedule format."""
        v = self.variables
        rows = []
        for u, unit in v.units.items():
            if not solver.boolean_value(unit.offloaded):
                continue
            moves = "act" if unit.alone is not None and solver.boolean_value(unit.alone) else "unit"
            for tr in (unit.offload, unit.prefetch):
                ev = int(solver.value(tr.event))
                before = None
                if tr.kind == "offload":
                    for k, w in unit.waits.items():
                        if solver.boolean_value(w):
                            before = k
                op, at = trigger(ev)
                # List order: trigger event, then the channel's order (start, end), offload first.
                key = (ev, int(solver.value(tr.start)), int(solver.value(tr.end)), tr.kind == "prefetch")
                rows.append((key, Transfer(tr.kind, u, op, at, before, moves)))
        rows.sort(key=lambda r: r[0])
        return Schedule(fixed_order(self.chain.length), tuple(tr for _, tr in rows))

    def checked(self, solver) -> tuple[Schedule, float] | None:
        """The solver's current solution as a schedule the simulator accepts.

        Every CP-SAT solution ``best`` takes (its exact improver, its search for a first fit, the
        bound ladder's ``cpsat`` rung) goes through here: a solver never reports a makespan the
        simulator disagrees with.

        Returns
        -------
        tuple or None
            ``(schedule, simulated makespan)``, or ``None`` when the simulator rejects the
            schedule (a coincidence in integers that fell the other way in floats, NOTE [ cpsat:
            time scale ]).
        """
        from ...simulate import simulate

        schedule = self.schedule_from(solver)
        tl = simulate(self.chain, self.platform, schedule)
        return (schedule, tl.makespan) if tl.feasible else None

    def solution_times(self, solver) -> dict[str, Any]:
        """CP-SAT's own times: op starts/ends and transfer (start, end) by ("O"|"P", unit)."""
        v = self.variables
        times: dict[tuple[str, int], tuple[int, int]] = {}
        for unit in v.units.values():
            if solver.boolean_value(unit.offloaded):
                for tr in (unit.offload, unit.prefetch):
                    times[tr.key] = (int(solver.value(tr.start)), int(solver.value(tr.end)))
        return {
            "op_start": [int(solver.value(op.start)) for op in v.ops],
            "op_end": [int(solver.value(op.end)) for op in v.ops],
            "transfers": times,
        }


