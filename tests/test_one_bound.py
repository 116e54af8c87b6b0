"""One bound, one meaning (issue 21): ``solve``, ``plot``, ``verify`` and ``tradeoff`` report
the same lower bound for the same instance, and that figure does not depend on the clock
(``NOTE [ bound ladder ]`` in ``chainoffload/bounds/ladder.py``)."""

import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chainoffload import Chain, Platform, keep_all_peak, solve
from chainoffload.bounds import ladder, lower_bound, offload_memory_floor, problem_bound
from chainoffload.generators import random_chain

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}


def _tight(seed, length, level, rate):
    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = rate * float(chain.saved.sum()) / chain.compute_time
    return chain, Platform(memory=int(lo + level * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


def _copy(chain):
    # A new chain object: the LP and MILP caches are per object, so this one is solved afresh.
    return Chain.from_dict(chain.to_dict())


@pytest.fixture
def slow_clock(monkeypatch):
    """A process whose clock runs 10,000 s per reading: every wall-clock budget is spent at once."""
    ticks = itertools.count()
    real = time.perf_counter

    def fake():
        return real() + 1e4 * next(ticks)

    def install():
        monkeypatch.setattr(time, "perf_counter", fake)
        monkeypatch.setattr(time, "monotonic", fake)
        monkeypatch.setattr(time, "time", fake)

    return install


def test_the_bound_does_not_depend_on_the_clock(slow_clock):
    # A 6-stage chain where the unit MILP rung lifts the bound far above the fluid LP: the rung
    # the old budget-based ladder reached only when the clock allowed.
    chain, platform = _tight(0, 6, 0.25, 0.5)
    normal = problem_bound(chain, platform)
    assert normal.rung == "unit-milp" and normal.value > 1.4 * lower_bound(chain, platform)
    by_solve = solve(chain, platform, "dp")
    slow_clock()
    slowed = problem_bound(_copy(chain), platform)
    assert (slowed.value, slowed.rung, slowed.tried) == (normal.value, normal.rung, normal.tried)
    again = solve(_copy(chain), platform, "dp")
    assert (again.lower_bound, again.info["bound"], again.makespan) == (by_solve.lower_bound, by_solve.info["bound"], by_solve.makespan)


def test_the_rungs_follow_a_size_rule(monkeypatch):
    chain, platform = _tight(3, 12, 0.3, 0.5)
    assert "fluid-lp" in problem_bound(chain, platform).tried
    monkeypatch.setattr(ladder, "FLUID_LP_MAX_STAGES", 11)  # the rule, not the time, says no
    assert "fluid-lp" not in problem_bound(_copy(chain), platform).tried
    monkeypatch.setattr(ladder, "UNIT_MILP_WORK_SIZE", 0)
    assert problem_bound(_copy(chain), platform).tried == ("trivial", "volume")


def test_a_time_limit_the_user_sets_may_cut_the_ladder():
    chain, platform = _tight(0, 6, 0.25, 0.5)
    full = problem_bound(chain, platform)
    cut = problem_bound(_copy(chain), platform, time_limit=1e-9)
    assert cut.tried == ("trivial",) and cut.value <= full.value


def _cli(cwd, *argv):
    proc = subprocess.run([sys.executable, "-m", "chainoffload", *map(str, argv)], cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _ms(text, pattern):
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return found.group(1)


def test_the_four_commands_print_the_same_bound(tmp_path):
    chain, platform = _tight(0, 6, 0.25, 0.5)
    (tmp_path / "chain.json").write_text(json.dumps(chain.to_dict()))
    (tmp_path / "platform.json").write_text(json.dumps(platform.to_dict()))
    code, out, err = _cli(tmp_path, "solve", "chain.json", "--platform", "platform.json", "--method", "dp", "--out", "s.json")
    assert code == 0, err
    solved = _ms(out, r"lower bound\s+(\S+ \S+)\s+\(gap [^;]+; unit-milp bound\)")
    code, out, err = _cli(tmp_path, "plot", "chain.json", "s.json", "-o", "s.svg")
    assert code == 0, err
    assert _ms(out, r"lower bound (\S+ \S+);") == solved
    # plot takes that figure from the file (issue 22); without it, it climbs to the same one
    record = json.loads((tmp_path / "s.json").read_text())
    del record["solver"]["lower_bound"]
    (tmp_path / "bare.json").write_text(json.dumps(record))
    code, out, err = _cli(tmp_path, "plot", "chain.json", "bare.json", "-o", "s.svg")
    assert code == 0, err
    assert _ms(out, r"lower bound (\S+ \S+);") == solved
    code, out, err = _cli(tmp_path, "verify", "chain.json", "s.json", "--time-limit", "1", "--workers", "1")
    assert code == 0, err
    assert _ms(out, r"lower bound\s+(\S+ \S+)\s+\(unit-milp bound\)") == solved
    code, out, err = _cli(tmp_path, "tradeoff", "chain.json", "--platform", "platform.json", "--memories",
                          str(platform.memory), "--methods", "keep-all", "--json")
    assert code == 0, err
    code, js, err = _cli(tmp_path, "solve", "chain.json", "--platform", "platform.json", "--method", "dp", "--json")
    assert json.loads(out)["lower_bound"][0] == json.loads(js)["lower_bound"]
