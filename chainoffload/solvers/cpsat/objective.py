"""The objective: the makespan, the end of B_1, bounded below by what is already proven."""

from __future__ import annotations

from .variables import Variables

__all__ = ["Objective"]


class Objective:
    """Minimise the makespan; optionally state a proven lower bound on it.

    Parameters
    ----------
    variables
        The model's variables.
    lower_bound
        A float lower bound (seconds) on the makespan of every schedule, or ``None``. It enters
        the integer model as ``makespan >= grid.units_below(lower_bound)`` (NOTE [ cpsat: time
        scale ]), which cuts no solution that is a feasible schedule, and lets CP-SAT stop as
        soon as a solution reaches it.
    """

    def __init__(self, variables: Variables, lower_bound: float | None = None):
        self.v = variables
        self.lower_bound = lower_bound

    @property
    def makespan(self):
        """The objective variable: the end of the last op."""
        return self.v.ops[-1].end

    def add(self) -> None:
        """Add the objective (and the bound) to the model."""
        md = self.v.model
        if self.lower_bound is not None:
            floor = self.v.grid.units_below(self.lower_bound)
            if floor > 0:
                md.add(self.makespan >= floor)
        md.minimize(self.makespan)
