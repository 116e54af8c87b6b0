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

``--shard I/N`` keeps every N-th of the selected tests, from the I-th (0-based, in collection
order): a bounded, deterministic sample. ``.ci/run`` runs one shard of the thorough profile,
picked from the commit, so successive commits cover every shard.

Under CI (the ``CI`` variable set, as ``.ci/run`` is run), a skip for a module that cannot be
imported (``pytest.importorskip``) is a failure: ``.ci/run`` installs every extra the tests use,
so such a skip means a broken environment, not a missing optional feature. Other skips (a GPU
present, say) are left as they are.
"""

from __future__ import annotations

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


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    text = config.getoption("--shard")
    if text is None:
        return
    index, count = _shard(text)
    kept = [item for position, item in enumerate(items) if position % count == index]
    dropped = [item for position, item in enumerate(items) if position % count != index]
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
