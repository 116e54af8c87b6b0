"""chainoffload_torch: profile a PyTorch chain of modules and train it under an offloading schedule.

One line::

    model = chainoffload_torch.offload(model, sample, memory="6GiB")

profiles ``model`` (an ``nn.Sequential`` or a list of blocks) into a :class:`chainoffload.Chain`
and :class:`chainoffload.Platform`, solves with :func:`chainoffload.solve`, and returns an
:class:`Offloader` whose forward/backward carries the schedule out (``.table()`` shows it).
Below it: :func:`profile`, :func:`measure_sizes`, :func:`measure_link`; :class:`Offloader` for
a chain and schedule of your own, and :class:`OffloadActivations`, the same as a context manager.
"""

from .executor import OffloadActivations, Offloader, StepStats, choose_schedule, offload
from .profiler import Profile, Sizes, measure_link, measure_sizes, profile, profile_full
from ._stages import as_stages

__all__ = [
    "offload",
    "Offloader",
    "OffloadActivations",
    "StepStats",
    "choose_schedule",
    "profile",
    "profile_full",
    "Profile",
    "measure_sizes",
    "measure_link",
    "Sizes",
    "as_stages",
]
