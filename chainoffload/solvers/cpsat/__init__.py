"""Exact method ``cpsat``: a CP-SAT model of docs/model.md's rules, for small chains.

The model decides which units to offload and what each moves (the whole unit, or a_i alone:
``moves: "act"``), the trigger event of every transfer, the order of
each channel's queue and the explicit waits of compute ops, minimises the makespan, and proves
a lower bound. Its solution is converted to the one schedule format and replayed by the
simulator. The package is laid out like the model:

* :mod:`.grid` — integer durations (NOTE [ cpsat: time scale ]);
* :mod:`.variables` — typed records of the decision variables;
* :mod:`.constraints` — the simulator's rules (NOTE [ cpsat: expressible timings ]) and what
  only helps the search;
* :mod:`.objective` — the makespan and a proven bound on it;
* :mod:`.hint` — warm starts: a schedule mapped onto the variables;
* :mod:`.model` — one model: build, solve, read a schedule back;
* :mod:`.solve` — :func:`cpsat`, the method.

OR-Tools is imported inside the functions that build or solve (STYLE.md, habit 6).
"""

from .grid import TimeGrid
from .hint import in_model_space, integer_replay
from .model import CPModel
from .solve import cpsat, default_workers

__all__ = ["cpsat", "CPModel", "TimeGrid", "integer_replay", "in_model_space", "default_workers"]
