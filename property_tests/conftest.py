"""Hypothesis profiles for the property suite, chosen by the HYPOTHESIS_PROFILE variable.

* ``ci`` (the default) — quick: the whole suite in well under two minutes on two slow cores, so
  the README's test command and ``.ci/run`` (which runs exactly that command) use it;
* ``dev`` — a few times more examples, for a local run before a commit;
* ``thorough`` — many more examples, for an evening run after changing a solver or the simulator.

``deadline=None`` everywhere: the first call of a Numba kernel compiles it, and CP-SAT's time
varies from run to run, so a per-example deadline would only report noise. Tests scale their own
example counts from the profile with ``_budget.examples``.
"""

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("ci", max_examples=25, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=100, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)

_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "dev", "thorough"):
    raise ValueError(f"HYPOTHESIS_PROFILE: unknown profile {_PROFILE!r}; known: ci, dev, thorough")
settings.load_profile(_PROFILE)
