"""The rotor DP against a brute-force enumeration, against the plain-Python dense table, and the remat baselines."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from chainoffload import simulate
from chainoffload._kernels.rotor import CAP, INF_U, bound_at
from chainoffload.chain import Chain
from chainoffload.generators import transformer_chain
from chainoffload.networks import network
from chainoffload.platform import Platform
from chainoffload.result import Status
from chainoffload.schedule import Schedule
from chainoffload.simulate import keep_all_peak
from chainoffload.solvers import methods, solve
from chainoffload.solvers.remat_baselines import (
    checkpoint_all_schedule,
    compute_seconds,
    family_schedules,
    sequence_length,
)
from chainoffload.solvers.rotor import (
    DEFAULT_SLOTS,
    default_slots,
    emit_segment,
    exact_quantum,
    fill_rotor_table,
    lift_slots,
    rotor,
    rotor_schedule,
    slots_for,
)
from naive_rotor import naive_bound_table, naive_rotor_table

UNLIMITED = 2**62


def random_chain(rng, length, grain=1000):
    act = rng.integers(1, 100, length + 1) * grain
    saved = act[1:] + rng.integers(0, 300, length) * grain
    fwd = rng.uniform(0.5, 2.0, length)
    return Chain(fwd, fwd * rng.uniform(1, 3, length), act, saved, rng.integers(0, 50, length) * grain,
                 rng.integers(0, 50, length) * grain, fwd_nosave=fwd * rng.uniform(0.5, 1.0, length))


def persistent_sequences(s, t):
    """Every persistent checkpointing sequence of segment (s, t): F_all on s, or checkpoint a_{j-1}."""
    if s == t:
        yield [("F", s), ("B", s)]
        return
    for sub in persistent_sequences(s + 1, t):
        yield [("F", s)] + sub + [("B", s)]
    for j in range(s + 1, t + 1):
        fwd = [("Fck", s)] + [("Fn", k) for k in range(s + 1, j)]
        lefts = list(persistent_sequences(s, j - 1))
        for right in persistent_sequences(j, t):
            for left in lefts:
                yield fwd + right + left


def brute_force(chain):
    """(peak, makespan) of every persistent sequence, simulated exactly (no slots)."""
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    out = []
    for ops in persistent_sequences(1, chain.length):
        tl = simulate(chain, free, Schedule(tuple(ops), ()))
        out.append((tl.peak_memory, tl.makespan))
    return out


def best_within(table, memory):
    return min((ms for peak, ms in table if peak <= memory), default=math.inf)


def test_enumeration_size():
    # 1, 2, 6, 22, 90 sequences for L = 1..5 (T(n) = T(n-1) + sum_k T(k) T(n-k)).
    assert [sum(1 for _ in persistent_sequences(1, n)) for n in range(1, 6)] == [1, 2, 6, 22, 90]


@pytest.mark.parametrize("seed", range(4))
def test_rotor_matches_brute_force_within_slot_rounding(seed):
    rng = np.random.default_rng(seed)
    chain = random_chain(rng, 6 + seed % 2)
    table = brute_force(chain)
    floor, top = min(p for p, _ in table), keep_all_peak(chain)
    slots = 400
    for memory in np.linspace(floor, top, 9).astype(int):
        platform = Platform(memory=int(memory), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
        res = rotor(chain, platform, slots=slots)
        exact = best_within(table, memory)
        quantum = slots_for(chain, int(memory), slots).quantum
        # Each DP check sums at most L + 6 rounded sizes, each rounded up by under one slot.
        slack = (chain.length + 6) * quantum
        relaxed = best_within(table, memory - slack)
        if res.status.has_schedule:
            assert res.makespan >= exact * (1 - 1e-12)
            assert res.makespan <= relaxed * (1 + 1e-12)
        else:
            assert relaxed == math.inf


def test_rotor_exact_when_sizes_are_whole_slots():
    # With every size a multiple of the quantum, rounding loses nothing: rotor is the optimum.
    rng = np.random.default_rng(7)
    chain = random_chain(rng, 6, grain=1000)
    table = brute_force(chain)
    for peak, _ in sorted(set(table))[::7]:
        budget = peak - int(chain.act[0])
        slots = budget // 1000
        res = rotor(chain, Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=slots)
        assert slots_for(chain, peak, slots).quantum == 1000
        assert res.status.has_schedule
        assert math.isclose(res.makespan, best_within(table, peak), rel_tol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_keep_all_memory_recomputes_nothing(seed):
    chain = random_chain(np.random.default_rng(10 + seed), 12)
    peak = keep_all_peak(chain)
    res = solve(chain, Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0), method="rotor")
    assert res.status == Status.OPTIMAL and res.makespan == chain.compute_time
    assert not any(k in ("Fck", "Fn") for k, _ in res.schedule.compute)
    # The table itself (no keep-all shortcut) with room for the rounding: ties go to F_all.
    sl = slots_for(chain, peak + (chain.length + 6) * slots_for(chain, peak, 500).quantum, 500)
    ops = rotor_schedule(fill_rotor_table(chain, sl).choice, sl, chain.length).compute
    assert ops == Schedule.keep_all(chain.length).compute


@pytest.mark.parametrize("method", ["rotor", "sqrt-checkpoint", "recompute-all"])
def test_every_remat_schedule_is_feasible_in_the_simulator(method):
    rng = np.random.default_rng(42)
    for _ in range(8):
        chain = random_chain(rng, int(rng.integers(2, 20)))
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        memory = int(floor + rng.uniform(0, 1.1) * (top - floor))
        res = solve(chain, Platform(memory=memory, bandwidth_d2h=1e6, bandwidth_h2d=1e6), method=method)
        assert res.status in (Status.FEASIBLE, Status.OPTIMAL, Status.INFEASIBLE), res.message
        if res.status.has_schedule:
            assert res.timeline.feasible and res.peak_memory <= memory
        else:
            assert res.min_memory is None or res.min_memory > memory or method == "rotor"


def test_rotor_never_worse_than_the_baselines():
    rng = np.random.default_rng(5)
    for _ in range(6):
        chain = random_chain(rng, 16)
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        platform = Platform(memory=int((floor + top) / 2), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
        r = solve(chain, platform, method="rotor")
        for base in ("sqrt-checkpoint", "recompute-all"):
            b = solve(chain, platform, method=base)
            if b.status.has_schedule:
                # Both baselines are persistent sequences; rotor may lose only slot rounding.
                assert r.status.has_schedule and r.makespan <= b.makespan * 1.02


def test_recompute_all_needs_least_memory():
    rng = np.random.default_rng(9)
    chain = random_chain(rng, 6)
    table = brute_force(chain)
    frugal = simulate(chain, Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0),
                      solve(chain, Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0),
                            method="recompute-all").schedule)
    assert frugal.peak_memory == min(p for p, _ in table)


def test_slots_must_be_positive(chain3):
    with pytest.raises(ValueError, match="slots"):
        rotor(chain3, Platform(memory=200, bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=0)


def test_rotor_kernel_runs_as_python():
    # NUMBA_DISABLE_JIT=1 runs the kernels as plain Python: same table, same schedule; the
    # 40-stage chain spans three column blocks of the lean fill, with tiles above the diagonal.
    code = (
        "import numpy as np, json, sys;"
        "sys.path.insert(0, 'tests');"
        "from test_rotor import random_chain;"
        "from chainoffload.examples import tiny;"
        "from chainoffload.platform import Platform;"
        "from chainoffload.solvers.rotor import rotor;"
        "c = random_chain(np.random.default_rng(21), 40);"
        "out = [rotor(tiny(), Platform(memory=175, bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=50),"
        "       rotor(c, Platform(memory=int(0.5 * c.saved.sum()), bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=60)];"
        "print(json.dumps([[r.makespan, [list(op) for op in r.schedule.compute]] for r in out]))"
    )
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import json

    from chainoffload.examples import tiny

    chain = random_chain(np.random.default_rng(21), 40)
    jitted = [rotor(tiny(), Platform(memory=175, bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=50),
              rotor(chain, Platform(memory=int(0.5 * chain.saved.sum()), bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=60)]
    for (makespan, ops), res in zip(json.loads(out.stdout), jitted, strict=True):
        assert res.info["source"] in ("dp", "dp-lifted")  # the table's plan, not a fixed policy
        assert makespan == res.makespan
        assert [tuple(op) for op in ops] == list(res.schedule.compute)


def naive(chain, sl):
    return naive_rotor_table(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget)


def assert_same_table(chain, sl, block=None, scale=None):
    """The exact table equals the naive dense one bit for bit, and its choice exactly."""
    opt, choice = naive(chain, sl)
    table = fill_rotor_table(chain, sl, block=block, scale=scale)
    lean_choice = table.choice
    for (s, t, m), value in opt.items():
        assert table.value(s, t, m) == value, (s, t, m)
        assert lean_choice[s, t, m] == choice[s, t, m], (s, t, m)
    return opt


def lean_chain(rng, length):
    """Chains whose sizes are a few slots, as in long chains at S = 500 (rows end early)."""
    act = rng.integers(1 << 20, 1 << 26, length + 1)
    saved = act[1:] * rng.integers(1, 6, length)
    fwd = saved * 2e-12 * rng.uniform(0.5, 2.0, length)
    return Chain(fwd, 2 * fwd, act, saved, act[1:] // 2, act[1:], fwd_nosave=fwd * rng.uniform(0.3, 1.0, length))


@pytest.mark.parametrize("seed", range(12))
def test_lean_table_equals_the_naive_dense_table(seed):
    rng = np.random.default_rng(100 + seed)
    length = int(rng.integers(1, 10))
    chain = (random_chain if seed % 2 else lean_chain)(rng, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    memory = int(floor + rng.uniform(-0.1, 1.1) * (top - floor))
    sl = slots_for(chain, memory, int(rng.integers(5, 90)))
    # Tiles of 1..3 segments a side put both parts of an option outside the tile, one inside, or both.
    assert_same_table(chain, sl, block=int(rng.integers(1, 4)))


def test_lean_table_equals_the_naive_dense_table_with_ties():
    # Zero recompute times make checkpointing tie with F_all in exact arithmetic: the float
    # sums then decide, and the lean table must decide as the dense one did.
    rng = np.random.default_rng(3)
    chain = random_chain(rng, 7)
    chain = Chain(chain.fwd, chain.bwd, chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp, fwd_nosave=np.zeros(7))
    for fraction in (0.3, 0.7):
        memory = int(chain.stage_memory_floor() + fraction * (keep_all_peak(chain) - chain.stage_memory_floor()))
        assert_same_table(chain, slots_for(chain, memory, 60), block=2)


@pytest.mark.parametrize("name", ["resnet18", "inception_v3", "gpt2_12", "densenet121"])
def test_lean_table_equals_the_naive_dense_table_on_networks(name):
    chain = network(name)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    sl = slots_for(chain, int(floor + 0.4 * (top - floor)), 40)
    opt = assert_same_table(chain, sl)
    # The solver reports the top entry, and its schedule simulates to it.
    res = rotor(chain, Platform(memory=int(floor + 0.4 * (top - floor)), bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=40)
    if res.info["source"] == "dp":
        assert res.info["dp_makespan"] == opt[1, chain.length, sl.budget]
        assert math.isclose(res.makespan, res.info["dp_makespan"], rel_tol=1e-12)


def test_rebuilt_schedule_is_the_dense_tables():
    rng = np.random.default_rng(11)
    for length in (5, 9):
        chain = lean_chain(rng, length)
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        sl = slots_for(chain, int(floor + 0.3 * (top - floor)), 120)
        _, choice = naive(chain, sl)
        ops_dense: list = []
        emit_segment(ops_dense, choice, sl, 1, length, sl.budget)  # a dict is indexable like the array
        assert list(rotor_schedule(fill_rotor_table(chain, sl).choice, sl, length).compute) == ops_dense


def test_default_slots_keep_500_up_to_a_thousand_stages():
    assert default_slots(10) == default_slots(1000) == DEFAULT_SLOTS
    assert 100 < default_slots(3000) < DEFAULT_SLOTS
    assert default_slots(10**6) == 1
    chain = random_chain(np.random.default_rng(4), 6)
    platform = Platform(memory=int(0.6 * keep_all_peak(chain)), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    assert rotor(chain, platform).info["slots"] == DEFAULT_SLOTS


def test_table_is_lean():
    # 4 bytes a bound, none for the budgets at which a segment keeps everything: below the
    # dense float64 table's values alone, and far below them with its choices.
    rng = np.random.default_rng(8)
    chain = lean_chain(rng, 60)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    sl = slots_for(chain, int(floor + 0.3 * (top - floor)), 500)
    table = fill_rotor_table(chain, sl)
    table.value(1, chain.length, sl.budget)
    dense = (chain.length + 2) ** 2 * (sl.budget + 1)
    assert table.nbytes < dense * 8 / 2
    assert table.nbytes < dense * (8 + 4) / 3


def zero_size_chain(rng, length):
    """A chain with a 0-byte activation and zero recompute times: rows read each other's current
    budget (a 0-slot shift), and checkpointing ties with F_all."""
    chain = random_chain(rng, length)
    act, saved = chain.act.copy(), chain.saved.copy()
    i = int(rng.integers(1, length))
    act[i], saved[i - 1] = 0, int(rng.integers(0, 3)) * 1000
    act[0] = 0
    nosave = chain.fwd_nosave * (rng.random(length) < 0.6)
    return Chain(chain.fwd, chain.bwd, act, saved, chain.fwd_tmp, chain.bwd_tmp, fwd_nosave=nosave)


@pytest.mark.parametrize("seed", range(16))
def test_bound_table_equals_the_naive_one(seed):
    # NOTE [ rotor by bounds ]: the integer table is the recurrence over floored overheads,
    # whatever the rows filled together (1 when a 0-slot item makes rows read each other).
    rng = np.random.default_rng(300 + seed)
    length = int(rng.integers(1, 11))
    chain = (random_chain, lean_chain, zero_size_chain)[seed % 3](rng, max(length, 2) if seed % 3 == 2 else length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    memory = int(floor + rng.uniform(-0.1, 1.1) * (top - floor))
    sl = slots_for(chain, memory, int(rng.integers(5, 90)))
    scale = 2.0 ** int(rng.integers(-4, 45))  # up to 2^45: bounds cap at CAP
    table = fill_rotor_table(chain, sl, block=int(rng.integers(1, 20)), scale=scale)
    ref = naive_bound_table(chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp, sl.budget, scale, CAP)
    for (s, t, m), v in ref.items():
        got = int(bound_at(table.store, table.zs, table.rof, s, t, m))
        assert (math.inf if got == INF_U else got) == v, (s, t, m)


@pytest.mark.parametrize("seed", range(6))
def test_exact_table_whatever_the_units(seed):
    # The units only decide how many exact entries are made: coarse units (even 1 s, every
    # bound 0), fine ones (bounds capped), the default; zero-size items and ties included.
    rng = np.random.default_rng(400 + seed)
    chain = (zero_size_chain if seed % 2 else lean_chain)(rng, int(rng.integers(3, 9)))
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    sl = slots_for(chain, int(floor + rng.uniform(0.0, 1.0) * (top - floor)), int(rng.integers(20, 80)))
    for scale in (1.0, 2.0**50, None):
        assert_same_table(chain, sl, block=int(rng.integers(1, 17)), scale=scale)


def test_exact_entries_are_few_on_a_long_chain():
    # The top entry of a 120-stage chain at 500 slots needs its schedule's entries and their
    # near ties, not the table's 3.6 million.
    rng = np.random.default_rng(12)
    chain = lean_chain(rng, 120)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    sl = slots_for(chain, platform.memory, 500)
    table = fill_rotor_table(chain, sl)
    schedule = rotor_schedule(table.choice, sl, chain.length)
    assert table.exact_count < 20_000
    assert simulate(chain, platform, schedule).makespan == pytest.approx(table.value(1, chain.length, sl.budget), rel=1e-12)


# Coarse units (2^8 per second: every bound near 0, every entry a near tie) make the exact
# search visit most of the table: 0.1 s of CPU at 20 stages (25,000 entries), 200 s at 120.
@pytest.mark.parametrize("length", [20, pytest.param(120, marks=pytest.mark.thorough(seconds=200))])
def test_coarse_units_give_the_same_schedule_with_more_entries(length):
    rng = np.random.default_rng(12)
    chain = lean_chain(rng, length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    sl = slots_for(chain, int(floor + 0.3 * (top - floor)), 500)
    table = fill_rotor_table(chain, sl)
    schedule = rotor_schedule(table.choice, sl, chain.length)
    coarse = fill_rotor_table(chain, sl, scale=2.0**8)
    assert rotor_schedule(coarse.choice, sl, chain.length) == schedule
    assert coarse.value(1, chain.length, sl.budget) == table.value(1, chain.length, sl.budget)
    assert coarse.exact_count > 10 * table.exact_count


def test_solve_prepares_rotors_kernels_before_its_clock():
    # NOTE [ lazy kernels ]: importing the solver does not import Numba; solve()'s prepare
    # step makes rotor's kernels ready (compiled or loaded) before the method's clock starts.
    code = (
        "import sys; from chainoffload.solvers import rotor as r;"
        "assert 'numba' not in sys.modules;"
        "from chainoffload import _compile;"
        "cm = _compile.prepare('rotor', 9); cm.__enter__();"
        "print(_compile._loaded('rotor'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_interpreted_kernels_give_the_same_rotor_answer():
    # A cold start may run interpreted copies of the kernel modules (NOTE [ lazy kernels ]).
    from chainoffload import solve
    from chainoffload._kernels import INTERPRETED

    chain = random_chain(np.random.default_rng(5), 9)
    platform = Platform(memory=int(0.5 * chain.saved.sum()), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    jitted = solve(chain, platform, "rotor", slots=60)
    INTERPRETED[0] = True
    try:
        interpreted = solve(chain, platform, "rotor", slots=60)
    finally:
        INTERPRETED[0] = False
    assert jitted.info["source"] in ("dp", "dp-lifted")
    assert interpreted.schedule == jitted.schedule and interpreted.makespan == jitted.makespan


# -- checkpoint-all, and rotor against its family (NOTE [ never lose to the family ]) ------------

def test_checkpoint_all_is_hf_gradient_checkpointing():
    # Every stage but the last keeps only its input in the forward, and is re-run just before its backward.
    assert checkpoint_all_schedule(3).compute == (
        ("Fck", 1), ("Fck", 2), ("F", 3), ("B", 3), ("F", 2), ("B", 2), ("F", 1), ("B", 1))
    assert checkpoint_all_schedule(1).compute == (("F", 1), ("B", 1))
    for length in (1, 2, 7, 30):
        assert sequence_length("checkpoint-all", length) == len(checkpoint_all_schedule(length).compute) == 3 * length - 1


def test_checkpoint_all_keeping_whole_stages_runs_them_once_and_holds_their_units():
    """HF's checkpointing leaves the embeddings unwrapped: a stage of ``whole`` runs F_all once
    and keeps its unit until its backward, the others as checkpoint-all."""
    assert checkpoint_all_schedule(4, whole={1}).compute == (
        ("F", 1), ("Fck", 2), ("Fck", 3), ("F", 4), ("B", 4), ("F", 3), ("B", 3), ("F", 2), ("B", 2), ("B", 1))
    assert checkpoint_all_schedule(5, whole=()) == checkpoint_all_schedule(5)
    chain = random_chain(np.random.default_rng(4), 8)
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    plain = simulate(chain, free, checkpoint_all_schedule(8))
    kept = simulate(chain, free, checkpoint_all_schedule(8, whole={1, 5}))
    assert kept.feasible and kept.peak_memory >= plain.peak_memory
    assert math.isclose(kept.makespan, plain.makespan - float(chain.fwd_nosave[0] + chain.fwd_nosave[4]), rel_tol=1e-12)
    with pytest.raises(ValueError, match="whole"):
        checkpoint_all_schedule(3, whole={4})


def test_checkpoint_all_method_fits_exactly_at_its_peak():
    chain = random_chain(np.random.default_rng(3), 9)
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    tl = simulate(chain, free, checkpoint_all_schedule(chain.length))
    at = solve(chain, free.with_memory(tl.peak_memory), "checkpoint-all")
    assert at.status.has_schedule and at.makespan == tl.makespan and at.peak_memory == tl.peak_memory
    # It recomputes every stage but the last once: its time is the chain's plus those forwards.
    assert math.isclose(at.makespan, chain.compute_time + float(np.sum(chain.fwd_nosave[:-1])), rel_tol=1e-12)
    assert compute_seconds(chain, at.schedule) == at.makespan
    below = solve(chain, free.with_memory(tl.peak_memory - 1), "checkpoint-all")
    assert below.status == Status.INFEASIBLE and below.min_memory == tl.peak_memory
    assert "checkpoint-all" in methods()


def test_checkpoint_all_needs_less_than_keep_all_and_more_than_recompute_all():
    chain = transformer_chain("llama", 8)
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    peaks = {name: simulate(chain, free, build()).peak_memory for name, (_, build) in family_schedules(8).items()}
    assert peaks["recompute-all"] <= peaks["checkpoint-all"] < keep_all_peak(chain)


def test_exact_quantum_divides_the_budget_and_every_size():
    chain = random_chain(np.random.default_rng(0), 6, grain=1000)
    memory = int(chain.act[0]) + 40_000 * 1000
    g = exact_quantum(chain, memory)
    assert g % 1000 == 0
    for a in (chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp):
        assert not np.any(a % g)
    sl = slots_for(chain, memory, 40_000, exact=True)
    assert sl.quantum == g and sl.budget * g == memory - int(chain.act[0])
    # Too many slots for the exact cut: the even cut, as without ``exact``.
    assert slots_for(chain, memory, 50, exact=True).quantum == slots_for(chain, memory, 50).quantum
    assert exact_quantum(chain, int(chain.act[0])) == 0


def test_rotor_uses_the_exact_slot_and_then_is_the_optimum():
    # Sizes on a 1000-byte grid: at every peak of the brute force the exact slot needs at most
    # 4000 slots, so rotor is the exact optimum there with nothing lifted.
    rng = np.random.default_rng(7)
    chain = random_chain(rng, 6, grain=1000)
    table = brute_force(chain)
    for peak, _ in sorted(set(table))[::5]:
        res = rotor(chain, Platform(memory=peak, bandwidth_d2h=0.0, bandwidth_h2d=0.0), slots=4000)
        if res.info.get("source") == "keep-all":
            continue
        assert res.info["lift_slots"] == 0 and res.info["quantum"] % 1000 == 0
        assert res.makespan == best_within(table, peak) or math.isclose(res.makespan, best_within(table, peak), rel_tol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_lifted_plans_recover_what_rounding_loses(seed):
    # Profile-like sizes (no common slot), few slots: the plan at the rounded budget loses time
    # that the table's plans above it, tried in bytes, win back; every plan returned fits.
    rng = np.random.default_rng(100 + seed)
    chain = random_chain(rng, 6, grain=1)
    table = brute_force(chain)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    lifted = 0
    for memory in np.linspace(floor, top, 25).astype(int)[1:-1]:
        platform = Platform(memory=int(memory), bandwidth_d2h=0.0, bandwidth_h2d=0.0)
        res = solve(chain, platform, "rotor", slots=20)
        sl = slots_for(chain, int(memory), 20)
        plain = fill_rotor_table(chain, sl)
        value = plain.value(1, chain.length, sl.budget)
        if res.status.has_schedule:
            assert res.peak_memory <= memory and res.timeline.feasible
            assert res.makespan <= value or not math.isfinite(value)
            lifted += res.info.get("source") == "dp-lifted"
            assert res.info["lift_slots"] == lift_slots(chain.length, 20)
        else:
            assert not math.isfinite(value)
        assert res.makespan >= best_within(table, memory) * (1 - 1e-12)
    assert lifted >= 1


def test_rotor_is_no_slower_than_the_fixed_policies_on_a_t5_like_chain():
    # The defect: on a 16-stage T5-like chain with sizes as a profile gives them, rotor at
    # checkpoint-all's exact peak returned a plan 2 % slower (its slots rounded that peak down).
    rng = np.random.default_rng(11)
    base = transformer_chain("t5", 8)
    act = (base.act * (1 + rng.uniform(-0.1, 0.1, base.length + 1)) // 512 * 512).astype(np.int64)
    chain = base.replace(act=act, saved=np.maximum((base.saved * (1 + rng.uniform(-0.1, 0.1, base.length))) // 512 * 512,
                                                   act[1:]).astype(np.int64))
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    for name, (_, build) in family_schedules(chain.length).items():
        tl = simulate(chain, free, build())
        res = rotor(chain, free.with_memory(tl.peak_memory))
        assert res.status.has_schedule and res.makespan <= tl.makespan, (name, res.makespan, tl.makespan, res.info)


@pytest.mark.parametrize("kind", ["llama", "bert", "t5"])
def test_transformer_chains_are_built_as_documented(kind):
    chain = transformer_chain(kind, 8)
    assert chain.length == (16 if kind == "t5" else 8) and chain.name == f"{kind}-like-L{chain.length}"
    # The head and the loss sit in the last stage: the biggest unit, the longest forward.
    assert chain.saved[-1] == chain.saved.max() and chain.fwd[-1] == chain.fwd.max()
    assert np.all(chain.fwd_nosave < chain.fwd) and np.all(chain.bwd > chain.fwd)
    assert np.all(chain.act % 4 == 0) and np.all(chain.saved % 4 == 0)
    # Blocks of one kind on the same tokens have the same figures.
    assert len(set(chain.saved[1:7].tolist())) == 1
    bigger = transformer_chain(kind, 8, seq=1024)
    assert np.all(bigger.saved > chain.saved) and bigger.compute_time > chain.compute_time


def test_transformer_chain_rejects_bad_input():
    with pytest.raises(ValueError, match="kind"):
        transformer_chain("gpt", 8)
    with pytest.raises(ValueError, match="layers"):
        transformer_chain("llama", 0)
    with pytest.raises(ValueError, match="hidden"):
        transformer_chain("llama", 4, hidden=1000, heads=16)
    with pytest.raises(ValueError, match="flops"):
        transformer_chain("bert", 4, flops=0.0)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 10, 17])
def test_closed_form_times_of_the_fixed_policies_are_their_sequences(length):
    # rotor skips a policy whose closed-form time is above its plan's: the form must be the sequence's.
    from chainoffload.solvers.rotor import _family_seconds

    chain = random_chain(np.random.default_rng(length), length)
    free = Platform(memory=UNLIMITED, bandwidth_d2h=0.0, bandwidth_h2d=0.0)
    for name, (ops, build) in family_schedules(length).items():
        schedule = build()
        assert len(schedule.compute) == ops
        makespan = simulate(chain, free, schedule).makespan
        assert math.isclose(_family_seconds(chain, name), makespan, rel_tol=1e-12)
        assert math.isclose(compute_seconds(chain, schedule), makespan, rel_tol=1e-12)
