"""Test profiles, for tests/ and property_tests/ alike.

* The **fast** profile is the README's test command, ``pytest -q``: every test not marked
  ``thorough`` (pyproject's ``addopts`` deselects them with ``-m "not thorough"``), with the
  Hypothesis profile ``ci`` (property_tests/conftest.py). It covers every module.
* The **thorough** profile is ``pytest -q -m thorough``: the tests the fast run leaves out
  (large instances, heavy parametrizations, the benchmarks' quick runs). ``pytest -q -m ""``
  runs both (also what to add when naming a thorough test by its id, which ``-m "not thorough"``
  would deselect); ``HYPOTHESIS_PROFILE=thorough`` adds many more Hypothesis examples to either.

Mark a test with ``@pytest.mark.thorough``, or one case of a parametrization with
``pytest.param(..., marks=pytest.mark.thorough)``, when it costs seconds and a cheaper test of
the fast profile already covers its module. A test that once caught a bug stays fast.

``--shard I/N`` keeps the I-th (0-based) of N shards of the selected tests: a bounded,
deterministic sample. ``.ci/run`` runs one shard of the thorough profile, picked from the
commit, so successive commits cover every shard. The shards are balanced by cost: a test that
takes minutes says so with ``pytest.mark.thorough(seconds=...)`` (others count 1 s), and each
test, costliest first, goes to the shard with the least so far (ties: collection order, then
the lower shard), so with no costs given every N-th test from the I-th.

Under CI (the ``CI`` variable set, as ``.ci/run`` is run), a skip for a module that cannot be
imported (``pytest.importorskip``) is a failure: ``.ci/run`` installs every extra the tests use,
so such a skip means a broken environment, not a missing optional feature. Other skips (a GPU
present, say) are left as they are.
"""

from __future__ import annotations

import math
import os

import pytest


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected I/N with integers, e.g. 0/3; got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise pytest.UsageError(f"--shard: {text!r} needs N >= 1 and 0 <= I < N")
    return index, count


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        metavar="I/N",
        default=None,
        help="run every N-th selected test, from the I-th (0-based): a deterministic sample",
    )


def pytest_configure(config):
    if config.getoption("--shard") is not None:
        _shard(config.getoption("--shard"))  # a malformed value is a usage error before collection


def _cost(item) -> float:
    """A test's cost in seconds for ``--shard``: its ``thorough`` mark's ``seconds``, else 1."""
    mark = item.get_closest_marker("thorough")
    seconds = mark.kwargs.get("seconds", 1) if mark is not None else 1
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise pytest.UsageError(f"{item.nodeid}: thorough(seconds=...) must be a positive number; got {seconds!r}")
    return float(seconds)


def _balanced(costs: list[float], count: int) -> list[int]:
    """The shard of each test: costliest first, each to the shard with the least cost so far."""
    loads = [0.0] * count
    owner = [0] * len(costs)
    for position in sorted(range(len(costs)), key=lambda k: -costs[k]):  # stable: ties in order
        shard = min(range(count), key=lambda j: (loads[j], j))
        owner[position] = shard
        loads[shard] += costs[position]
    return owner


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    text = config.getoption("--shard")
    if text is None:
        return
    index, count = _shard(text)
    owner = _balanced([_cost(item) for item in items], count)
    kept = [item for position, item in enumerate(items) if owner[position] == index]
    dropped = [item for position, item in enumerate(items) if owner[position] != index]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def _fail_import_skip(report) -> None:
    if not report.skipped or not _in_ci() or not isinstance(report.longrepr, tuple):
        return
    message = str(report.longrepr[2])
    if message.startswith("Skipped: could not import"):
        report.outcome = "failed"
        report.longrepr = f"CI: {message.removeprefix('Skipped: ')}; .ci/run installs it, so no test may skip for it"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_import_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_import_skip(outcome.get_result())


# NOTE [ tests and best's exact improver ]
# ----------------------------------------
# ``best`` ends with CP-SAT (NOTE [ large neighbourhood search ] in chainoffload/solvers/lns.py),
# 2 deterministic seconds by default: 10-60 s of wall time per solve of a 15-25-stage chain on
# the shared 2-core machine. Hundreds of tests solve such chains with ``best`` for other reasons
# (the CLI, the adapter, tradeoff, the contract), so the suite runs with a budget of
# TEST_CPSAT_WORK through the environment variable ``best`` reads (subprocesses inherit it):
# the improver's code still runs in every one of them, on less work. The tests of the improver
# itself (tests/test_lns.py) and those that pin what the default reaches set their budget
# explicitly (``cpsat_work=``, or ``monkeypatch.delenv``).
TEST_CPSAT_WORK = "0.05"


@pytest.fixture(autouse=True)
def _small_cpsat_work(monkeypatch):
    if "CHAINOFFLOAD_CPSAT_WORK" not in os.environ:
        monkeypatch.setenv("CHAINOFFLOAD_CPSAT_WORK", TEST_CPSAT_WORK)
