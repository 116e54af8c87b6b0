import math

import pytest

from chainoffload import Platform, Result, Schedule, Status, Transfer, keep_all_peak, methods, register, simulate, solve
from chainoffload.examples import resnet18
from chainoffload.platform import PlatformError
from chainoffload.solvers import judge

BASELINES = ("keep-all", "offload-all", "first-k", "largest-first")


def plat(memory, bw=25.0):
    return Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw)


def test_registry_lists_baselines():
    listing = methods()
    for name in BASELINES:
        assert name in listing and listing[name]


def test_unknown_method_lists_known_ones(chain3):
    with pytest.raises(ValueError, match=r"unknown method 'nope'; known: keep-all, offload-all"):
        solve(chain3, plat(1000), "nope")


def test_memory_below_floor_is_misuse(chain3):
    with pytest.raises(PlatformError, match=r"platform.memory: 161 B is below 162 B"):
        solve(chain3, plat(161), "keep-all")


@pytest.mark.parametrize("method", BASELINES)
def test_baselines_feasible_at_the_memory_they_claim(method):
    chain = resnet18()
    peak = keep_all_peak(chain)
    floor = chain.stage_memory_floor()
    for memory in (floor, (floor + peak) // 2, peak):
        platform = Platform(memory=memory, bandwidth_d2h=12e9, bandwidth_h2d=12e9)
        result = solve(chain, platform, method)
        assert result.method == method
        if result.feasible:
            tl = simulate(chain, platform, result.schedule)
            assert tl.feasible and tl.peak_memory <= memory
            assert result.makespan == tl.makespan and result.peak_memory == tl.peak_memory
            assert result.lower_bound >= chain.compute_time
            assert result.makespan >= result.lower_bound
        else:
            assert result.status == Status.INFEASIBLE and result.schedule is None
            assert result.min_memory is None or result.min_memory > memory


def test_keep_all_is_optimal_when_it_fits(chain3):
    r = solve(chain3, plat(192), "keep-all")
    assert r.status == Status.OPTIMAL and r.makespan == 12.0 and r.gap == 0.0
    r = solve(chain3, plat(191), "keep-all")
    assert r.status == Status.INFEASIBLE and r.min_memory == 192 and math.isinf(r.makespan)


def test_judge_never_reports_a_rejected_schedule_as_feasible(chain3):
    bad = Result("liar", Status.FEASIBLE, Schedule.keep_all(3), makespan=12.0)
    judged = judge(chain3, plat(191), bad)
    assert judged.status == Status.ERROR and "rejects" in judged.message
    wrong = Result("liar", Status.FEASIBLE, Schedule.keep_all(3), makespan=11.0)
    judged = judge(chain3, plat(192), wrong)
    assert judged.status == Status.ERROR and "claimed makespan 11.0" in judged.message
    no_schedule = Result("liar", Status.FEASIBLE, None)
    assert judge(chain3, plat(192), no_schedule).status == Status.ERROR


def test_register_a_user_solver(chain3):
    def mine(chain, platform, *, unit=1):
        s = Schedule.from_units(
            chain.length,
            [Transfer("offload", unit, 0, "end"), Transfer("prefetch", unit, 3, "end", before=4)],
        )
        return Result("mine", Status.FEASIBLE, s)

    register("test-mine", mine, "offload one unit", replace=True)
    r = solve(chain3, plat(167), "test-mine")
    assert r.status == Status.FEASIBLE and r.makespan == 13.0 and r.peak_memory == 167
    assert r.runtime > 0
    with pytest.raises(ValueError, match="already exists"):
        register("test-mine", mine, "again")
    with pytest.raises(TypeError, match="not callable"):
        register("test-other", 3, "x")


def test_to_dict_is_json_safe(chain3):
    import json

    r = solve(chain3, plat(191), "keep-all")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["status"] == "infeasible" and d["makespan"] is None and d["min_memory"] == 192
    for key in ("method", "status", "makespan", "lower_bound", "peak_memory", "offloaded_bytes", "runtime", "schedule"):
        assert key in d


def test_first_k_takes_the_smallest_k(chain3):
    r = solve(chain3, plat(10**6), "first-k")
    assert r.feasible and r.schedule.offloaded_units == ()


def test_no_bandwidth_means_no_offload(chain3):
    r = solve(chain3, Platform(memory=191, bandwidth_d2h=0.0, bandwidth_h2d=0.0), "largest-first")
    assert r.status == Status.INFEASIBLE


def test_unknown_option_names_the_accepted_ones(chain3):
    with pytest.raises(ValueError, match=r"method 'keep-all' does not take slots; it takes: keep, time_limit"):
        solve(chain3, plat(1000), "keep-all", slots=3)


def test_every_method_takes_a_time_limit_and_a_bad_one_is_named(chain3):
    from chainoffload.solvers import spec

    # The package's own methods (other tests register throwaway ones that fail on purpose).
    for name in [m for m in methods() if isinstance(spec(m).target, str)]:
        if name != "cpsat":
            assert solve(chain3, plat(1000), name, time_limit=5).status in (Status.OPTIMAL, Status.FEASIBLE)
    for bad in (0, -1.0, float("inf"), "3", True):
        with pytest.raises(ValueError, match="time_limit"):
            solve(chain3, plat(1000), "keep-all", time_limit=bad)
