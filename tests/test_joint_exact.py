"""The exact joint DP (one transfer in flight per channel) against rotor, its bound and the simulator."""

import math

import numpy as np
import pytest

from chainoffload._kernels.joint_exact import STRIDE, VARIANTS, item_credit_stage, spine_table
from chainoffload._kernels.rotor import rotor_table
from chainoffload.chain import Chain
from chainoffload.platform import Platform
from chainoffload.result import Status
from chainoffload.simulate import keep_all_peak, simulate
from chainoffload.solvers.joint_exact import exact_table, joint_exact
from chainoffload.solvers.rotor import rotor, slots_for
from remat_cases import fraction_platform, instances, random_chain, slow_link_chain


def test_dp_value_bounds_the_simulated_makespan():
    # NOTE [ joint recurrence ]: the table's value is an upper bound of the simulated
    # makespan (exact without transfers); the plan passes at the first try, no repair.
    checked = with_transfers = 0
    for chain, platform in instances(0, 40):
        res = joint_exact(chain, platform, slots=200)
        if not res.status.has_schedule:
            continue
        checked += 1
        assert res.info["shrink"] == 1.0
        assert res.timeline is None or res.timeline.feasible
        assert res.makespan <= res.info["dp_makespan"] * (1 + 1e-9)
        if res.schedule.transfers:
            with_transfers += 1
        else:
            assert math.isclose(res.info["dp_makespan"], res.makespan, rel_tol=1e-9)
    assert checked >= 30 and with_transfers >= 10


def test_transfers_start_on_an_idle_channel_at_their_trigger():
    # The model's claim: no transfer ever queues behind another one, so each starts exactly
    # when its trigger fires (an offload at its maker's end, a prefetch at the end of B_c).
    seen = half_duplex = 0
    for chain, platform in instances(5, 40):
        res = joint_exact(chain, platform, slots=200)
        if not res.status.has_schedule or not res.schedule.transfers:
            continue
        tl = simulate(chain, platform, res.schedule)
        assert tl.feasible and tl.peak_memory <= platform.memory
        for t, tr in enumerate(res.schedule.transfers):
            fired = tl.op_end[tr.op] if tr.at == "end" else tl.op_start[tr.op]
            assert tl.transfer_start[t] == pytest.approx(fired, abs=1e-12)
        offloads = [t.unit for t in res.schedule.transfers if t.kind == "offload"]
        prefetches = [t.unit for t in res.schedule.transfers if t.kind == "prefetch"]
        assert sorted(offloads) == sorted(prefetches) and len(set(offloads)) == len(offloads)
        seen += 1
        half_duplex += not platform.duplex
    assert seen >= 10 and half_duplex >= 3


def test_overlap_pays_on_a_slow_link():
    # Transfers overlap compute: on a link too slow for the old "wait for every copy"
    # recurrence to gain anything, offloading still removes part of rotor's overhead.
    chain = slow_link_chain(np.random.default_rng(7))
    platform = fraction_platform(chain, 0.6)
    j, r = joint_exact(chain, platform), rotor(chain, platform)
    # Moving a unit takes 10 to 40 times its forward: no copy of a unit hides behind one op.
    assert np.all(chain.saved / 25e9 > 5 * chain.fwd)
    assert j.schedule.transfers
    removed = (r.makespan - j.makespan) / (r.makespan - chain.compute_time)
    assert removed > 0.05, removed


def test_fast_link_credits_late_enough_to_hide_the_prefetch():
    # A copy (0.51 s) shorter than a forward (1 s): the earliest credit stage u0 = i + 2
    # would leave the prefetch no backward op to hide behind; the late variant (u0 + 1)
    # hides it behind B_{i+2}, so every other unit moves and nothing waits.
    length = 12
    chain = Chain([1.0] * length, [2.0] * length, [100] * (length + 1), [1000] * length, [0] * length, [0] * length)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.6 * (top - floor)), bandwidth_d2h=2000.0, bandwidth_h2d=2000.0,
                        latency=0.01)
    table = exact_table(chain, platform, slots_for(chain, platform.memory, 500))
    unit1 = STRIDE * 1 + VARIANTS  # unit 1 whole, variant 0; variant 1 is the late credit
    assert table.item_u[unit1] == 3 and table.item_u[unit1 + 1] == 4
    j, r = joint_exact(chain, platform), rotor(chain, platform)
    assert r.makespan > chain.compute_time + 1
    assert j.makespan == pytest.approx(chain.compute_time, rel=1e-12)
    assert j.info["dp_makespan"] == pytest.approx(j.makespan, rel=1e-12)


def test_exact_never_worse_than_rotor_at_the_same_slots():
    for chain, platform in instances(1, 40):
        j, r = joint_exact(chain, platform, slots=200), rotor(chain, platform, slots=200)
        if r.status.has_schedule and r.info.get("source") == "dp":
            assert j.status.has_schedule and j.makespan <= r.makespan * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_unlimited_bandwidth_reaches_compute_time_where_rotor_cannot(seed):
    rng = np.random.default_rng(100 + seed)
    chain = random_chain(rng, 10)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.5 * (top - floor)), bandwidth_d2h=math.inf, bandwidth_h2d=math.inf)
    r = rotor(chain, platform)
    j = joint_exact(chain, platform)
    assert r.makespan > chain.compute_time * 1.001  # rotor must recompute here
    assert j.makespan == pytest.approx(chain.compute_time, rel=1e-12)


def test_joint_offloads_checkpoints_when_it_pays():
    # Slow recomputation and a fast link: the DP must move data rather than recompute it all.
    rng = np.random.default_rng(11)
    chain = random_chain(rng, 12)
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.3 * (top - floor)), bandwidth_d2h=1e8, bandwidth_h2d=1e8)
    j = joint_exact(chain, platform)
    assert j.schedule.transfers and j.makespan < rotor(chain, platform).makespan


def test_credit_stage_against_a_direct_computation():
    rng = np.random.default_rng(3)
    for _ in range(40):
        length = int(rng.integers(1, 12))
        none_ = length + 1
        fwd_min = rng.uniform(0.1, 1.0, length)
        bwd = rng.uniform(0.1, 2.0, length)
        d = np.repeat(rng.choice([0.0, 0.3, 1.5, 4.0, np.inf], 2 * length + 2), VARIANTS)
        h = np.repeat(rng.choice([0.0, 0.3, 1.5, 4.0, 9.0, np.inf], 2 * length + 2), VARIANTS)
        got_u, got_v = item_credit_stage.py_func(fwd_min, bwd, d, h, length)
        jit_u, jit_v = item_credit_stage(fwd_min, bwd, d, h, length)
        assert np.array_equal(got_u, jit_u) and np.array_equal(got_v, jit_v)
        for p in range(STRIDE, STRIDE * (length + 1), VARIANTS):
            i = p // STRIDE
            want = [(none_, none_)] * VARIANTS
            if i < length and np.isfinite(d[p]) and np.isfinite(h[p]):
                early = next((u for u in range(i + 2, length + 1) if fwd_min[i:u - 1].sum() >= d[p]), none_)
                hide = next((v for v in range(i + 2, length + 1) if bwd[i + 1:v - 1].sum() >= h[p]), none_)
                if early <= length:
                    want[0] = (early, early)
                    if hide <= length and hide != early:
                        want[1] = (max(early, hide), hide)
                    if min(early, hide) - 1 >= i + 2:
                        want[2] = (early, min(early, hide) - 1)
            got = [(got_u[p + k], got_v[p + k]) for k in range(VARIANTS)]
            assert got == want, (p, got, want)


def test_spine_kernel_as_python_matches_the_jitted_one():
    # Kernels also run under NUMBA_DISABLE_JIT=1; run the spine as Python on small chains.
    for chain, platform in instances(6, 4, lengths=(2, 6)):
        sl = slots_for(chain, platform.memory, 30)
        table = exact_table(chain, platform, sl)
        from chainoffload.solvers.joint_exact import _item_arrays

        x, _, h = _item_arrays(chain, platform, sl)
        rot, _ = rotor_table(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved, sl.fwd_tmp, sl.bwd_tmp,
                             sl.budget)
        opt, choice, row_of = spine_table.py_func(chain.fwd, chain.bwd, chain.fwd_nosave, sl.act, sl.saved,
                                                  sl.fwd_tmp, sl.bwd_tmp, x, table.item_u, table.item_v, h, rot,
                                                  sl.budget)
        assert np.array_equal(opt, table.spine) and np.array_equal(choice, table.spine_choice)
        assert np.array_equal(row_of, table.row_of) and row_of[1, 0] >= 0
        # The kernel skips budgets below where a child becomes finite: that needs every
        # row to be finite on an upward-closed range of budgets.
        finite = np.isfinite(opt)
        assert np.all(finite[:, :-1] <= finite[:, 1:])


def test_exact_bad_slots_is_a_clear_error(chain3):
    with pytest.raises(ValueError, match="slots"):
        joint_exact(chain3, Platform(memory=200, bandwidth_d2h=1.0, bandwidth_h2d=1.0), slots=0)


def test_rejected_plan_is_repaired_or_reported_infeasible(monkeypatch):
    import chainoffload.solvers.joint_exact as joint_module

    chain, platform = next(c for c in instances(8, 20) if joint_exact(c[0], c[1]).status.has_schedule)
    calls = []

    def reject_first(chain_, platform_, schedule):
        calls.append(schedule)
        if len(calls) == 1:  # as if the model were wrong once: over memory at 1 byte
            return simulate(chain_, platform_.with_memory(1), schedule)
        return simulate(chain_, platform_, schedule)

    monkeypatch.setattr(joint_module, "simulate", reject_first)
    res = joint_exact(chain, platform)
    assert res.status.has_schedule and res.info["shrink"] < 1.0 and len(calls) == 2
    assert simulate(chain, platform, res.schedule).feasible

    monkeypatch.setattr(joint_module, "simulate", lambda c, p, s: simulate(c, p.with_memory(1), s))
    res = joint_exact(chain, platform)
    assert res.status == Status.INFEASIBLE and res.schedule is None and "joint-exact: no plan fits" in res.message


def test_backward_credit_lets_left_segments_use_an_offloaded_unit(monkeypatch):
    # Variant 1 with v < u: the bytes of a slow offload serve the backward parts of the nodes
    # in [v, c) too (their left segments re-run with more memory). Taking that away (keeping
    # only credits at the forward) must never help, and must hurt somewhere.
    # The solver reaches its kernels through _kernels.lazy, which looks the function up in
    # the kernel module on every call: patching the module patches what the solver calls.
    import chainoffload._kernels.joint_exact as joint_module

    full = joint_module.item_credit_stage

    def forward_credit_only(fwd_min, bwd, d, h, length):
        u, v = full(fwd_min, bwd, d, h, length)
        u, v = u.copy(), v.copy()
        drop = v < u
        u[drop] = v[drop] = length + 1
        return u, v

    rng = np.random.default_rng(5)
    strictly = 0
    for _ in range(3):
        chain = slow_link_chain(rng)
        for frac in (0.2, 0.4, 0.6):
            platform = fraction_platform(chain, frac)
            with_back = joint_exact(chain, platform, slots=200)
            monkeypatch.setattr(joint_module, "item_credit_stage", forward_credit_only)
            without = joint_exact(chain, platform, slots=200)
            monkeypatch.setattr(joint_module, "item_credit_stage", full)
            assert with_back.makespan <= without.makespan * (1 + 1e-9)
            strictly += with_back.makespan < without.makespan * (1 - 1e-6)
    assert strictly >= 1
