"""keep=: every pure-offloading method leaves the units it is told to keep resident."""

import itertools

import pytest

from chainoffload import Platform, Result, Status, keep_all_peak, minimum_memory, register, simulate, solve
from chainoffload.generators import random_chain
from chainoffload.solvers import check_keep, spec
from chainoffload.solvers._registry import _REGISTRY

PURE = [name for name, s in _REGISTRY.items() if not s.remat]


def instance(seed=3, length=6, frac=0.45):
    chain = random_chain(seed, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    bw = float(chain.saved.sum()) / float(chain.fwd.sum()) * 2.0
    return chain, Platform(memory=int(floor + (top - floor) * frac), bandwidth_d2h=bw, bandwidth_h2d=bw)


def options(method):
    return {"time_limit": 10.0} if method == "cpsat" else {}


def test_every_pure_offloading_method_takes_keep():
    # The registry is the list of methods users can name; a new pure-offloading method must take keep too.
    import inspect

    for name in PURE:
        assert "keep" in inspect.signature(spec(name).load()).parameters, name


@pytest.mark.parametrize("method", PURE)
def test_kept_units_are_never_offloaded(method):
    chain, platform = instance()
    free = solve(chain, platform, method, **options(method))
    chosen = list(free.schedule.offloaded_units) if free.schedule is not None else []
    # Keep what the method chose (so it must find another way), then each single unit.
    trials = [chosen] if chosen else []
    trials += [[u] for u in range(1, chain.length + 1)]
    for keep in trials:
        result = solve(chain, platform, method, keep=keep, **options(method))
        assert result.status != Status.ERROR, (keep, result.message)
        if result.schedule is not None:
            assert not set(keep) & set(result.schedule.offloaded_units), (keep, result.schedule.offloaded_units)
            tl = simulate(chain, platform, result.schedule)
            assert tl.feasible == result.feasible and result.makespan == tl.makespan
        if result.feasible and free.feasible and not set(keep) & set(chosen):
            # The unconstrained answer was allowed: a search method does no worse than it.
            if method in ("best", "cpsat", "keep-all"):
                assert result.makespan <= free.makespan * (1 + 1e-9)


@pytest.mark.parametrize("method", ["first-k", "largest-first", "offload-all", "lp", "dp", "best"])
def test_keeping_every_unit_is_keep_all(method):
    chain, platform = instance(frac=1.0)  # keep-all fits
    everything = range(1, chain.length + 1)
    result = solve(chain, platform, method, keep=everything)
    assert result.feasible and not result.schedule.offloaded_units
    chain, platform = instance(frac=0.3)  # keep-all does not fit: nothing else may be tried
    result = solve(chain, platform, method, keep=list(everything))
    assert not result.feasible and result.status == Status.INFEASIBLE


def test_keep_monotone_for_the_exact_method():
    """Keeping more units can only cost time: cpsat's optimum grows along a chain of keep sets."""
    chain, platform = instance(seed=7, length=5, frac=0.3)
    spans = []
    for k in range(0, 4):
        r = solve(chain, platform, "cpsat", keep=range(1, k + 1), time_limit=20.0)
        assert r.status in (Status.OPTIMAL, Status.INFEASIBLE), r.status
        spans.append(r.makespan)  # inf when infeasible
    assert spans == sorted(spans) and spans[0] < spans[1] < spans[2] == float("inf")


@pytest.mark.parametrize(
    "keep, message",
    [
        ([0], r"keep: unit 0 is not a stage in 1\.\.6"),
        ([7], r"keep: unit 7 is not a stage in 1\.\.6"),
        ([2, "3"], r"keep: unit '3' is not an integer stage"),
        ([True], r"keep: unit True is not an integer"),
        (3, r"keep: expected a list of stages"),
        ("12", r"keep: expected a list of stages"),
    ],
)
def test_bad_keep_names_the_unit(keep, message):
    chain, platform = instance()
    for method in PURE:
        with pytest.raises(ValueError, match=message):
            solve(chain, platform, method, keep=keep, **options(method))


def test_check_keep_returns_the_set():
    chain, _ = instance()
    assert check_keep(chain, (3, 1, 3)) == frozenset({1, 3})
    assert check_keep(chain, []) == frozenset()


def test_remat_methods_refuse_keep_by_name():
    chain, platform = instance()
    with pytest.raises(ValueError, match="method 'rotor' does not take keep"):
        solve(chain, platform, "rotor", keep=[1])


def test_solve_turns_a_schedule_that_ignores_keep_into_an_error():
    chain, platform = instance(frac=1.0)

    def careless(chain, platform, *, keep=()):
        from chainoffload.planner import plan_transfers

        schedule = plan_transfers(chain, platform, range(1, chain.length))
        return Result("careless", Status.FEASIBLE, schedule)

    register("careless-keep", careless, "ignores keep", replace=True)
    try:
        assert solve(chain, platform, "careless-keep").status != Status.ERROR  # without keep it is fine
        r = solve(chain, platform, "careless-keep", keep=[1])
        assert r.status == Status.ERROR and "unit(s) [1]" in r.message and "keep" in r.message
    finally:
        _REGISTRY.pop("careless-keep")


def test_minimum_memory_with_keep_is_no_lower():
    chain, platform = instance()
    free = minimum_memory(chain, platform, "largest-first")
    sizes = sorted(range(1, chain.length), key=lambda u: -int(chain.saved[u - 1]))
    kept = minimum_memory(chain, platform, "largest-first", keep=sizes[:1])
    assert free is not None and kept is not None and kept >= free


def test_best_with_keep_never_worse_than_baselines_with_keep():
    chain, platform = instance(seed=11, length=8, frac=0.4)
    for keep in itertools.islice(itertools.combinations(range(1, 8), 2), 6):
        b = solve(chain, platform, "best", keep=keep)
        for base in ("first-k", "largest-first", "offload-all"):
            r = solve(chain, platform, base, keep=keep)
            if r.feasible:
                assert b.feasible and b.makespan <= r.makespan * (1 + 1e-12), (keep, base)

