"""Example counts scaled from the loaded Hypothesis profile (see conftest.py).

A test that costs more per example (a solver run, CP-SAT) asks for a fraction of the profile's
``max_examples``; a cheap one for a multiple. At least ``least`` examples always run.
"""

from hypothesis import settings


def examples(fraction: float = 1.0, *, least: int = 5) -> int:
    """``fraction`` of the current profile's ``max_examples``, and at least ``least``."""
    return max(least, int(settings.default.max_examples * fraction))
