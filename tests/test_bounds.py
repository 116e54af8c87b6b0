"""Lower bounds: the keep-all memory profile, the offloading memory floor, the fluid LP bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from chainoffload import Chain, Platform, Schedule, Transfer, fixed_order, simulate
from chainoffload.bounds import (
    fluid_lower_bound,
    fluid_lp,
    keep_all_start_memory,
    lower_bound,
    offload_memory_floor,
    stronger_bound,
    unit_milp,
)
from chainoffload.exact import brute_force
from chainoffload.generators import random_chain
from chainoffload.planner import plan_transfers
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers import methods, solve, spec

BIG = 2**60
INF = math.inf


def _platforms(memory: int, bw: float):
    """Duplex and half duplex, with and without latency."""
    return [
        Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw),
        Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw / 2, latency=1e-4),
        Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, duplex=False),
        Platform(memory=memory, bandwidth_d2h=bw / 3, bandwidth_h2d=bw, latency=5e-5, duplex=False),
    ]


def _small_chains():
    return [random_chain(seed, length) for seed, length in [(1, 3), (2, 4), (3, 5), (4, 6), (5, 7)]]


# -- keep-all profile and memory floor ------------------------------------------------------


@pytest.mark.parametrize("seed,length", [(0, 1), (1, 2), (2, 5), (3, 12), (4, 40)])
def test_keep_all_profile_matches_simulator(seed, length):
    chain = random_chain(seed, length)
    platform = Platform(memory=BIG, bandwidth_d2h=INF, bandwidth_h2d=INF)
    tl = simulate(chain, platform, Schedule.keep_all(length))
    profile = keep_all_start_memory(chain)
    assert profile.shape == (2 * length,)
    for k in range(2 * length):
        # The last value the curve takes at op k's start: every op has a positive duration, so
        # only op k - 1's frees and op k's allocation happen at that instant, frees first.
        at = np.flatnonzero(tl.memory_time == tl.op_start[k])
        assert at.size, k
        assert tl.memory_bytes[at[-1]] == profile[k], (k, tl.memory_bytes[at], profile[k])
    assert profile.max() == tl.peak_memory == keep_all_peak(chain)


def test_keep_all_profile_tiny(chain3):
    # F1, F2, F3, B3, B2, B1 by hand from docs/model.md's rules.
    assert keep_all_start_memory(chain3).tolist() == [40, 75, 120, 192, 127, 72]


def test_offload_memory_floor_tiny(chain3):
    # F3: a0 + unit 2 + saved3 + fwd_tmp3 = 10 + 35 + 45 + 5 = 95;
    # B3: a0 + saved3 + unit 2 + g3 + g2 + bwd_tmp3 = 10 + 45 + 35 + 40 + 30 + 7 = 167.
    assert offload_memory_floor(chain3) == 167
    assert offload_memory_floor(chain3) >= chain3.stage_memory_floor()


def _random_schedule(chain: Chain, rng: np.random.Generator) -> Schedule:
    """A random well-formed fixed-order schedule: random units, triggers, explicit waits, and
    units of which a_i alone moves (``moves="act"``), which the bounds must cover too."""
    length = chain.length
    n = 2 * length
    compute = fixed_order(length)
    transfers = []
    for u in range(1, length + 1):
        if rng.random() < 0.5:
            continue
        f_op = u - 1
        deadline = 2 * length - u - 1 if u < length else length  # B_{u+1}, or B_L for unit L
        o_op = int(rng.integers(f_op, deadline))  # triggered at the end of F_u or later
        o_at = "end"
        p_op = int(rng.integers(o_op, deadline))
        p_at = "end" if p_op == o_op else str(rng.choice(["start", "end"]))
        if p_at == "start" and p_op == o_op:
            p_at = "end"
        o_before = None
        if rng.random() < 0.3 and o_op + 1 < n:
            o_before = int(rng.integers(o_op + 1, min(n, o_op + 4)))
        p_before = None
        if rng.random() < 0.3 and p_op + 1 < n:
            p_before = int(rng.integers(p_op + 1, min(n, p_op + 4)))
        moves = "act" if rng.random() < 0.4 else "unit"
        transfers.append(Transfer("offload", u, o_op, o_at, o_before, moves))
        transfers.append(Transfer("prefetch", u, p_op, p_at, p_before, moves))
    return Schedule(compute, tuple(transfers))


def _zero_chain() -> Chain:
    """A chain with zero-duration ops and zero-size tensors (the corner cases of the NOTE)."""
    return Chain(
        fwd=[1.0, 0.0, 0.5, 0.0, 2.0],
        bwd=[0.0, 1.0, 0.0, 1.5, 1.0],
        act=[5, 10, 0, 20, 8, 12],
        saved=[30, 10, 40, 8, 25],
        fwd_tmp=[3, 0, 6, 1, 2],
        bwd_tmp=[4, 2, 0, 5, 1],
        name="zeros",
    )


def test_memory_floor_below_every_peak():
    rng = np.random.default_rng(7)
    chains = _small_chains() + [_zero_chain()]
    for chain in chains:
        floor = offload_memory_floor(chain)
        assert floor >= chain.stage_memory_floor()
        for bw in (1e6, 1e9, INF):
            platform = Platform(memory=BIG, bandwidth_d2h=bw, bandwidth_h2d=bw)
            for _ in range(40):
                tl = simulate(chain, platform, _random_schedule(chain, rng))
                if tl.violation is None:
                    assert tl.peak_memory >= floor, (chain.name, tl.peak_memory, floor)


def test_floor_is_reached_with_free_transfers():
    # Infinite bandwidth, no latency: the LP fits exactly at the floor with no wait, and is
    # infeasible clearly below it (1 B below is within the LP's tolerance on a scale of MB).
    for chain in _small_chains() + [random_chain(11, 30)]:
        floor = offload_memory_floor(chain)
        platform = Platform(memory=floor, bandwidth_d2h=INF, bandwidth_h2d=INF)
        assert lower_bound(chain, platform) == chain.compute_time
        assert fluid_lower_bound(chain, platform) == pytest.approx(chain.compute_time, rel=1e-7)
        below = platform.with_memory(floor - max(1, floor // 1000))
        assert fluid_lower_bound(chain, below) == INF


# -- the LP bound is a bound ------------------------------------------------------------------


@pytest.mark.parametrize("chain_index", range(6))
def test_bounds_below_random_feasible_schedules(chain_index):
    # The claims of NOTE [ fluid LP lower bound ] and NOTE [ unit MILP lower bound ]: any
    # schedule the simulator accepts maps to a point of each relaxation. Set the memory to each
    # random schedule's own peak (the tightest memory at which it is feasible), on duplex and
    # half-duplex links with and without latency, also on a chain with zero-length ops and
    # zero-size tensors, and check both bounds against its makespan.
    chain = (_small_chains() + [_zero_chain()])[chain_index]
    rng = np.random.default_rng(100 + chain_index)
    scale = float(chain.saved.mean()) / max(chain.compute_time / chain.length, 1e-12)
    checked = 0
    for trial in range(30):
        schedule = _random_schedule(chain, rng)
        bw = scale * float(rng.choice([0.2, 0.5, 1.0, 3.0]))
        base = _platforms(BIG, bw)[trial % 4]
        tl = simulate(chain, base, schedule)
        if tl.violation is not None:
            continue
        platform = base.with_memory(tl.peak_memory)
        tight = simulate(chain, platform, schedule)
        assert tight.feasible
        fluid = fluid_lower_bound(chain, platform)
        assert fluid <= tight.makespan * (1 + 1e-9), (trial, fluid, tight.makespan, schedule.to_dict())
        unit = unit_milp(chain, platform, time_limit=20.0)
        assert unit.bound <= tight.makespan * (1 + 1e-9), (trial, unit, tight.makespan, schedule.to_dict())
        if trial % 4 == 0:
            assert stronger_bound(chain, platform, time_limit=20.0).value <= tight.makespan * (1 + 1e-9)
        checked += 1
    assert checked >= 10


def _fixed_order_methods():
    names = []
    for name in methods():
        entry = spec(name)
        if entry.remat:
            continue
        try:
            entry.load()
        except (ImportError, AttributeError, SyntaxError):
            continue  # a method whose module is not written yet
        names.append(name)
    return names


# Chains of 3-5 stages in the fast profile; 6 and 7 (64 and 128 offload sets) in the thorough one.
@pytest.mark.parametrize("chain_index", [0, 1, 2, pytest.param(3, marks=pytest.mark.thorough), pytest.param(4, marks=pytest.mark.thorough)])
def test_bound_below_every_method_and_exhaustive(chain_index):
    chain = _small_chains()[chain_index]
    peak = keep_all_peak(chain)
    floor = offload_memory_floor(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / chain.length)
    names = _fixed_order_methods()
    assert {"keep-all", "offload-all", "first-k", "largest-first", "lp"} <= set(names)
    units = list(range(1, chain.length + 1))
    for frac in (0.05, 0.4, 0.9):
        memory = int(floor + frac * (peak - floor))
        for platform in _platforms(memory, scale * 0.5)[:3]:
            bound = lower_bound(chain, platform)
            best = INF
            for name in names:
                options = {"cpsat": {"time_limit": 2.0}, "best": {"time_limit": 1.0}}.get(name, {})
                result = solve(chain, platform, method=name, **options)
                if result.feasible:
                    assert bound <= result.makespan * (1 + 1e-9), (name, bound, result.makespan)
                    best = min(best, result.makespan)
            # Exhaustive over offload sets (unit L included), each planned and simulated.
            for r in range(len(units) + 1):
                for subset in itertools.combinations(units, r):
                    schedule = plan_transfers(chain, platform, subset) if subset else Schedule.keep_all(chain.length)
                    tl = simulate(chain, platform, schedule)
                    if tl.feasible:
                        best = min(best, tl.makespan)
            if math.isfinite(best):
                assert bound <= best * (1 + 1e-9)
            else:
                assert bound >= chain.compute_time


def test_free_transfers_bound_is_compute_time():
    for chain in _small_chains():
        floor = offload_memory_floor(chain)
        for memory in (floor, keep_all_peak(chain), BIG):
            platform = Platform(memory=memory, bandwidth_d2h=INF, bandwidth_h2d=INF, duplex=False)
            assert lower_bound(chain, platform) == chain.compute_time


def test_no_bandwidth():
    chain = random_chain(3, 6)
    peak = keep_all_peak(chain)
    fits = Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    assert lower_bound(chain, fits) == chain.compute_time
    assert fluid_lower_bound(chain, fits.with_memory(peak - 1)) == INF
    one_way = Platform(memory=peak - 1, bandwidth_d2h=1e9, bandwidth_h2d=0.0)
    assert fluid_lower_bound(chain, one_way) == INF


def test_bound_grows_as_bandwidth_shrinks_and_memory_tightens():
    chain = random_chain(21, 20)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / chain.length)
    memory = int(floor + 0.2 * (peak - floor))
    bounds = [fluid_lower_bound(chain, Platform(memory=memory, bandwidth_d2h=scale * f, bandwidth_h2d=scale * f)) for f in (4.0, 1.0, 0.25)]
    assert bounds[0] <= bounds[1] <= bounds[2]
    assert bounds[2] > chain.compute_time * 1.01  # a slow link must cost time at this memory
    mems = [fluid_lower_bound(chain, Platform(memory=int(floor + f * (peak - floor)), bandwidth_d2h=scale, bandwidth_h2d=scale)) for f in (1.0, 0.5, 0.0)]
    assert mems[0] <= mems[1] <= mems[2]
    assert mems[0] == pytest.approx(chain.compute_time, rel=1e-7)


def test_lp_solution_fields():
    chain = random_chain(5, 10)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / chain.length)
    platform = Platform(memory=(floor + peak) // 2, bandwidth_d2h=scale, bandwidth_h2d=scale)
    sol = fluid_lp(chain, platform)
    assert sol.status == "optimal" and sol.feasible
    assert sol.x.shape == (10,) and sol.x[-1] == 0.0
    assert np.all((sol.x >= 0) & (sol.x <= 1))
    assert sol.starts.shape == (21,)
    assert np.all(np.diff(sol.starts) >= np.concatenate([chain.fwd, chain.bwd[::-1]]) * (1 - 1e-9) - 1e-12)
    assert sol.bound <= sol.objective
    assert sol.objective == pytest.approx(sol.starts[-1], rel=1e-9)
    again = fluid_lp(chain, platform)
    assert again.bound == sol.bound and np.array_equal(again.x, sol.x)  # deterministic


def test_pdlp_agrees_with_glop():
    chain = random_chain(8, 8)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / chain.length)
    platform = Platform(memory=(floor + peak) // 2, bandwidth_d2h=scale, bandwidth_h2d=scale)
    glop = fluid_lp(chain, platform, solver="glop")
    pdlp = fluid_lp(chain, platform, solver="PDLP")
    assert pdlp.solver == "pdlp"
    assert pdlp.bound <= glop.objective * (1 + 1e-6)
    assert pdlp.bound == pytest.approx(glop.bound, rel=1e-4)


def test_bad_input():
    chain = random_chain(1, 4)
    platform = Platform(memory=BIG, bandwidth_d2h=1e9, bandwidth_h2d=1e9)
    with pytest.raises(ValueError, match="'simplex'"):
        fluid_lower_bound(chain, platform, solver="simplex")
    with pytest.raises(TypeError, match="chain"):
        fluid_lower_bound("chain", platform)
    with pytest.raises(TypeError, match="platform"):
        lower_bound(chain, {"memory": 1})
    with pytest.raises(TypeError, match="chain"):
        offload_memory_floor([1, 2])


# -- the whole-unit relaxation (NOTE [ unit MILP lower bound ]) ---------------------------------


@pytest.mark.parametrize("chain_index", range(5))
def test_unit_bound_below_every_method(chain_index):
    chain = _small_chains()[chain_index]
    peak, floor = keep_all_peak(chain), offload_memory_floor(chain)
    scale = float(chain.saved.mean()) / (chain.compute_time / chain.length)
    for frac in (0.05, 0.4, 0.9):
        for platform in _platforms(int(floor + frac * (peak - floor)), scale * 0.5):
            bound = stronger_bound(chain, platform, time_limit=20.0)
            assert bound.value >= lower_bound(chain, platform) * (1 - 1e-9)
            for name in ("offload-all", "first-k", "largest-first", "lp", "dp", "best"):
                result = solve(chain, platform, method=name)
                if result.feasible:
                    assert bound.value <= result.makespan * (1 + 1e-9), (name, bound, result.makespan)


def _tight(seed, length, level, rate):
    """The benchmark family: memory `level` of the way from the offload floor to keep-all."""
    chain = random_chain(seed, length)
    floor, peak = offload_memory_floor(chain), keep_all_peak(chain)
    balance = float(chain.saved.sum()) / chain.compute_time
    bw = rate * balance
    return chain, Platform(memory=int(floor + level * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)


@pytest.mark.parametrize("seed,length,level,rate", [(0, 6, 0.25, 0.5), (1, 6, 0.5, 2.0), (2, 6, 0.75, 0.5), (3, 5, 0.5, 0.5)])
def test_unit_bound_against_cpsat_optimum(seed, length, level, rate):
    # Sound against the proven optimum, and (the point of it) much tighter than the fluid LP
    # where memory moves by whole moves: on the first instance the fluid LP is at the compute
    # time, while the optimum is 1.43x it (moving a_4 alone, 44 of its 153 MB, is the cheapest
    # way to fit), and the whole-move bound reaches the optimum.
    chain, platform = _tight(seed, length, level, rate)
    exact = solve(chain, platform, "cpsat", time_limit=60.0, bound=False)  # not floored by the bound under test
    assert exact.status.value == "optimal"
    unit = unit_milp(chain, platform, time_limit=30.0)
    assert unit.status == "optimal"
    assert unit.bound <= exact.makespan * (1 + 1e-9)
    assert unit.bound >= fluid_lower_bound(chain, platform) * (1 - 1e-9)
    if seed == 0:
        assert fluid_lower_bound(chain, platform) < 0.71 * exact.makespan
        assert any(t.moves == "act" for t in exact.schedule.transfers)
        assert unit.bound == pytest.approx(exact.makespan, rel=1e-5)


def test_unit_bound_below_brute_force():
    for seed, frac, ratio, duplex in [(1, 0.2, 0.1, True), (1, 0.5, 0.05, False), (8, 0.1, 0.2, True), (5, 0.3, 0.05, True)]:
        chain = random_chain(seed, 3)
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        bw = float(chain.saved.sum()) / float(chain.fwd.sum()) * ratio
        platform = Platform(memory=int(floor + (top - floor) * frac), bandwidth_d2h=bw, bandwidth_h2d=bw, duplex=duplex)
        oracle = brute_force(chain, platform)
        assert oracle.feasible
        unit = unit_milp(chain, platform, time_limit=10.0)
        assert unit.bound <= oracle.makespan * (1 + 1e-9)


def test_unit_bound_trivial_and_infeasible_cases(chain3):
    roomy = Platform(memory=192, bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    trivial = unit_milp(chain3, roomy)
    assert trivial.status == "trivial" and trivial.bound == chain3.compute_time
    got = stronger_bound(chain3, roomy)
    assert (got.kind, got.value) == ("compute time", 12.0)
    stuck = Platform(memory=180, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    assert unit_milp(chain3, stuck).bound == INF
    assert stronger_bound(chain3, stuck).value == INF


def test_stronger_bound_says_which_bound(chain3):
    chain, platform = _tight(0, 6, 0.25, 0.5)
    got = stronger_bound(chain, platform, time_limit=20.0)
    assert got.kind == "unit MILP, optimal" and got.value > 1.4 * fluid_lower_bound(chain, platform)
    assert got.seconds > 0
    # No time: only what is cached for this chain object (here the MILP solved to optimality),
    # else the closed-form bounds'.
    quick = stronger_bound(chain, platform, time_limit=1e-6)
    assert (quick.kind, quick.value) == (got.kind, got.value)
    fresh = random_chain(0, 6)  # an equal chain whose LP is not cached: no time even for the LP
    cold = stronger_bound(fresh, platform, time_limit=1e-6)
    assert cold.kind in ("volume", "compute time") and cold.value <= got.value
    with pytest.raises(ValueError, match=r"time_limit: 0 must be"):
        stronger_bound(chain, platform, time_limit=0)
    with pytest.raises(ValueError, match=r"time_limit: -1 must be"):
        unit_milp(chain, platform, time_limit=-1)
    with pytest.raises(TypeError, match="chain"):
        stronger_bound("chain", platform)


@pytest.mark.parametrize(
    "chain, floor",
    [
        # A zero-length F_2 still reads a_1 when it allocates ("zero-length reader"): the old
        # floor counted only what F_2 allocates (131 B).
        (Chain(fwd=[1.0, 0.0, 1.0], bwd=[1.0, 1.0, 1.0], act=[7, 18, 17, 4], saved=[29, 46, 23], fwd_tmp=[0, 60, 0]), 142),
        # A zero-length B_2 still holds its unit, g_2 and unit 1 while it allocates: the old
        # floor left zero-length backwards to the stage floor (134 B).
        (Chain(fwd=[1.0, 0.0, 1.0], bwd=[1.0, 0.0, 1.0], act=[20, 18, 30, 1], saved=[36, 48, 13], fwd_tmp=[0, 1, 0]), 152),
    ],
)
def test_the_offload_floor_is_exact_on_zero_length_ops(chain, floor):
    """docs/model.md's rules for one instant, checked by exhaustive search: no schedule peaks
    below the floor, and one peaks at it (issue 33: 603 B where nothing fits below 701 B)."""
    from chainoffload.exact import enumerate_schedules

    assert offload_memory_floor(chain) == floor
    platform = Platform(memory=10**6, bandwidth_d2h=1000.0, bandwidth_h2d=1000.0)
    peaks = [tl.peak_memory for tl in (simulate(chain, platform, s) for s in enumerate_schedules(chain, platform))
             if tl.violation is None or tl.violation.rule == "memory"]
    assert min(peaks) == floor


# The unit MILP's rows, caught by a test of their own (issue 33: only a README figure did): its
# optimum on three small instances (duplex and one shared channel, a_i-alone moves offered), the
# size of its model, and that it stays below a feasible schedule and well above the fluid LP.
# A row dropped or weakened changes the count or lowers the optimum; one made too strong raises
# it (above the schedule, or off the pinned value).
@pytest.mark.parametrize(
    ("seed", "length", "level", "rate", "duplex", "bound", "variables", "constraints"),
    [
        (0, 6, 0.25, 0.5, True, 1.2548963094925096, 63, 133),
        (1, 7, 0.4, 0.3, False, 6.675221286758106, 145, 371),
        (2, 8, 0.2, 1.0, True, 1.4358179251596612, 191, 505),
    ],
)
def test_unit_milp_rows_pinned(seed, length, level, rate, duplex, bound, variables, constraints):
    from chainoffload import solve

    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = rate * float(chain.saved.sum()) / chain.compute_time
    platform = Platform(memory=int(lo + level * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5, duplex=duplex)
    got = unit_milp(chain, platform, time_limit=60.0)
    assert got.status == "optimal"
    assert (got.variables, got.constraints) == (variables, constraints)
    assert got.bound == pytest.approx(bound, rel=1e-6)
    assert got.bound > 1.15 * fluid_lower_bound(chain, platform)
    schedule = solve(chain, platform, "best", cpsat_work=0)
    assert schedule.feasible and got.bound <= schedule.makespan * (1 + 1e-9)


# The ladder stops SCIP at a node limit (the root with its cuts on most instances), where the
# rows that only tighten the LP relaxation count too: (7)'s whole windows and (4)'s capping at
# the excess leave the optimum as it is but lower the root's bound (measured: 6.2463 s and
# 5.6849 s here without them).
@pytest.mark.parametrize(
    ("seed", "length", "duplex", "root"),
    [(1, 7, True, 6.409562067076047), (0, 6, False, 1.4495210584022948)],
)
def test_unit_milp_root_bound_pinned(seed, length, duplex, root):
    chain = random_chain(seed, length)
    lo, hi = offload_memory_floor(chain), keep_all_peak(chain)
    bw = 0.3 * float(chain.saved.sum()) / chain.compute_time
    platform = Platform(memory=int(lo + 0.5 * (hi - lo)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5, duplex=duplex)
    got = unit_milp(chain, platform, time_limit=None, nodes=1)
    assert got.bound == pytest.approx(root, rel=1e-6)

