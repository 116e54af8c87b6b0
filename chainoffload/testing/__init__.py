"""Test helpers for people who write or change a solver: Hypothesis strategies and assertions.

Strategies (:mod:`chainoffload.testing.strategies`, needs ``hypothesis``; every bound is
keyword-only):

* :func:`chains` — valid chains (sizes whole bytes, times finite floats >= 0);
* :func:`platforms` — platforms, sized for a chain when given one: memory between the chain's
  floor and a bit above its keep-all peak, bandwidths around the chain's own scale, with 0 and
  ``inf`` on request, latency, duplex;
* :func:`instances` — ``(chain, platform)`` pairs;
* :func:`schedules` — valid fixed-order schedules of a chain (``valid=False``: broken ones);
* :func:`broken_schedules` — schedules that break one rule, each with the verdict the simulator
  must give (:data:`BROKEN_KINDS`).

Assertions (:mod:`chainoffload.testing.asserts`, no Hypothesis needed):

* :func:`assert_feasible` — re-simulate a result, timeline or schedule: feasible, peak within
  memory, reported makespan, peak and bytes are the simulator's, bounds in order;
* :func:`assert_no_better_than_optimal` — a makespan does not beat an optimum or a lower bound.

Example: test your own solver against the simulator and the exact optimum::

    from hypothesis import given, settings
    import chainoffload as co
    from chainoffload.testing import assert_feasible, assert_no_better_than_optimal, instances, chains

    co.register("mine", my_solver, "my heuristic")

    @settings(max_examples=50, deadline=None)
    @given(instances(chains=chains(max_length=4)))
    def test_mine(instance):
        chain, platform = instance
        result = co.solve(chain, platform, "mine")
        if result.feasible:
            assert_feasible(result, chain, platform)
            exact = co.solve(chain, platform, "cpsat", time_limit=5)
            # exact's optimum (or its lower bound if not proven), up to its time-grid tolerance
            assert_no_better_than_optimal(result, exact, abs_tol=exact.info.get("tolerance", 0.0))

The strategies shrink to short chains, small numbers, few transfers and the plainest triggers,
so a failure comes back as a small instance that can be read by hand.
"""

from __future__ import annotations

from typing import Any

from .asserts import REL_TOL, assert_feasible, assert_no_better_than_optimal

# The strategies need Hypothesis and are imported on first use (see __getattr__).
_STRATEGY_NAMES = (
    "chains",
    "platforms",
    "instances",
    "schedules",
    "broken_schedules",
    "well_formed_schedules",
    "Instance",
    "BrokenSchedule",
    "BROKEN_KINDS",
)

__all__ = ["assert_feasible", "assert_no_better_than_optimal", "REL_TOL", *_STRATEGY_NAMES]


def __getattr__(name: str) -> Any:
    # The strategies need Hypothesis, a test-time dependency; the assertions do not, so it is
    # imported only when a strategy is asked for.
    if name in _STRATEGY_NAMES:
        try:
            from . import strategies
        except ImportError as exc:  # pragma: no cover - hypothesis is in the dev extra
            if getattr(exc, "name", None) == "hypothesis" or "hypothesis" in str(exc):
                raise ImportError(
                    f"chainoffload.testing.{name} needs Hypothesis: pip install 'chainoffload[dev]' (or hypothesis)"
                ) from exc
            raise
        return getattr(strategies, name)
    raise AttributeError(f"module 'chainoffload.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
