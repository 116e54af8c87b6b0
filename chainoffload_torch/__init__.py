"""chainoffload_torch: offload a PyTorch model's activations under a memory budget, in place.

One line, on any model with a list of repeated blocks (a Hugging Face transformer, a ResNet,
an ``nn.Sequential``)::

    handle = chainoffload_torch.offload(model, batch, memory="6GiB")   # or memory=0.5
    loss = model(**batch).loss; loss.backward()                         # train as usual

finds the blocks, profiles a training step into a :class:`chainoffload.Chain` and a
:class:`chainoffload.Platform`, solves with :func:`chainoffload.solve` and hooks the model so
that each step carries the schedule out (``handle.table()`` shows it, ``handle.remove()``
undoes it). :func:`budget_curve` shows what each budget costs before choosing one.
Below it: :func:`profile` and :func:`profile_full`, :func:`measure_sizes`, :func:`measure_link`;
:class:`Offloader` with a chain and schedule of your own, and :class:`OffloadActivations`, the
executor as a context manager around a list of stages.
"""

from ._discovery import Blocks, find_blocks
from ._stages import EntryState, as_stages
from ._state import ProfilingSideEffect
from .api import Offloader, budget_curve, offload
from .executor import OffloadActivations, StepStats
from .plans import Budget, Plan
from .profiler import Profile, Sizes, measure_link, measure_sizes, profile, profile_full

__all__ = [
    "offload",
    "budget_curve",
    "Offloader",
    "Plan",
    "Budget",
    "OffloadActivations",
    "StepStats",
    "EntryState",
    "profile",
    "profile_full",
    "Profile",
    "measure_sizes",
    "measure_link",
    "Sizes",
    "Blocks",
    "find_blocks",
    "as_stages",
    "ProfilingSideEffect",
]
