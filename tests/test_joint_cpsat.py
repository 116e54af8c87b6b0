"""joint's CP-SAT improver (NOTE [ joint: CP-SAT re-timing ] in chainoffload/solvers/joint_cpsat.py)."""

import pytest

from chainoffload.platform import Platform
from chainoffload.simulate import keep_all_peak, simulate
from chainoffload.solvers.joint import joint
from chainoffload.solvers.joint_cpsat import JOINT_CPSAT_WORK, _items, _Model, improve
from chainoffload.solvers.rotor import rotor
from remat_cases import instances


def _inception_point():
    # Found by benchmarks/joint_cpsat.py: Inception-v3's V100 twin, 12 GB/s, 10 % of the way
    # from the floor to the keep-all peak. Joint's plan recomputes stage 11 (Fck_11 ... F_11);
    # kept whole instead, with the transfers CP-SAT re-chooses, it fits and is 1.4 % faster.
    from chainoffload.networks import network

    chain = network("inception_v3", gpu="V100")
    floor, peak = chain.stage_memory_floor(), keep_all_peak(chain)
    platform = Platform(memory=int(floor + 0.1 * (peak - floor)), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
    return chain, platform


def test_improver_finds_a_faster_plan_on_inception_v3_and_is_deterministic():
    chain, platform = _inception_point()
    stand_in = rotor(chain, platform)  # pure offloading's place in the comparison, for speed
    base = joint(chain, platform, offload=stand_in, cpsat_work=0)
    assert base.schedule.has_remat and "cpsat" not in base.info
    got = improve(chain, platform, base.schedule, base.makespan, work=JOINT_CPSAT_WORK)
    assert got.makespan < base.makespan * (1 - 1e-3)
    tl = simulate(chain, platform, got.schedule)
    assert tl.feasible and tl.makespan == got.makespan
    assert got.info["edits_improved"] >= 1
    # Wired into joint with the default work: the same search again, so the same schedule, the
    # same figures (deterministic: no clock read), and it says what it did.
    res = joint(chain, platform, offload=stand_in)
    assert res.makespan == got.makespan and res.schedule == got.schedule
    assert res.info["cpsat"] == {**got.info, "from": base.makespan} and res.info["source"] == base.info["source"]


def test_improver_never_returns_a_rejected_or_slower_schedule():
    seen = remat = 0
    for chain, platform in instances(71, 30, lengths=(3, 10)):
        if not platform.can_transfer:
            continue
        stand_in = rotor(chain, platform, slots=90)
        base = joint(chain, platform, slots=90, offload=stand_in, cpsat_work=0)
        if not base.status.has_schedule:
            continue
        seen += 1
        remat += base.schedule.has_remat
        got = improve(chain, platform, base.schedule, base.makespan, work=0.3)
        tl = simulate(chain, platform, got.schedule)
        assert tl.feasible and tl.makespan == got.makespan
        assert got.makespan <= base.makespan
        assert tuple(got.schedule.compute) == tuple(base.schedule.compute) or got.info["edits_improved"] >= 1
        res = joint(chain, platform, slots=90, offload=stand_in, cpsat_work=0.3)
        assert res.makespan == got.makespan and res.schedule == got.schedule
    assert seen >= 15 and remat >= 5


def test_model_replays_the_incumbent_it_is_hinted():
    # The model states the simulator's rules: the incumbent's decisions, completed by CP-SAT with
    # every hinted variable fixed, give its simulated makespan up to the rounding slack, whether
    # the plan stalls or not (the re-timing runs only on a stalling one; here it is forced).
    from chainoffload.solvers.cpsat.grid import TimeGrid
    from chainoffload.solvers.lns import _Runner

    checked = 0
    for chain, platform in instances(72, 40, lengths=(3, 10)):
        if not platform.can_transfer:
            continue
        base = joint(chain, platform, slots=90, offload=rotor(chain, platform, slots=90), cpsat_work=0)
        if not base.status.has_schedule or not base.schedule.has_remat or not base.schedule.transfers:
            continue
        grid = TimeGrid.build(chain, platform)
        model = _Model(chain, platform, tuple(base.schedule.compute), _items(chain.length, base.schedule.compute), grid)
        if not model.hint(base.schedule):
            continue
        solver, status = _Runner(1.0, float("inf")).solve(model.md, 1.0, fix_hint=True)
        assert status in ("OPTIMAL", "FEASIBLE")
        assert float(solver.objective_value) / grid.scale == pytest.approx(base.makespan, abs=model.slack / grid.scale)
        again = model.checked(solver)
        assert again is not None and again[1] == pytest.approx(base.makespan, rel=1e-9)
        checked += 1
    assert checked >= 5


def test_work_must_be_a_number_of_deterministic_seconds():
    chain, platform = next((c, p) for c, p in instances(73, 5) if p.can_transfer)
    res = joint(chain, platform, slots=60, offload=rotor(chain, platform, slots=60), cpsat_work=0)
    for bad in (-1, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="cpsat_work"):
            joint(chain, platform, slots=60, offload=res, cpsat_work=bad)
    with pytest.raises(ValueError, match="work"):
        improve(chain, platform, res.schedule, res.makespan, work=0)
