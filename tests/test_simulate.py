"""Every memory and timing rule of docs/model.md on the three-stage chain, computed by hand.

The chain (tests/conftest.py): fwd 1, 2, 1; bwd 2, 4, 2; act 10, 20, 30, 40; saved 25, 35, 45;
fwd_tmp 5; bwd_tmp 7. Ops: 0 F_1 [0,1], 1 F_2 [1,3], 2 F_3 [3,4], 3 B_3 [4,6], 4 B_2 [6,10],
5 B_1 [10,12]. Keep-all memory: 10 | 40 at 0 | 75 at 1 | 120 at 3 | 192 at 4 (B_3 allocates g_2 30,
g_3 40 and bwd_tmp 7 on top of a_0 10 and the three units 105) | 127 at 6 | 72 at 10 | 10 at 12.
"""

import math

import numpy as np
import pytest

from chainoffload import Platform, Schedule, ScheduleError, Transfer, keep_all_peak, simulate
from chainoffload.platform import PlatformError

F1, F2, F3, B3, B2, B1 = range(6)
BIG = 10**9


def plat(memory=BIG, d2h=25.0, h2d=25.0, latency=0.0, duplex=True):
    return Platform(memory=memory, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=latency, duplex=duplex)


def sched(*transfers):
    return Schedule.from_units(3, transfers)


def final_memory(tl):
    return int(tl.memory_bytes[-1])


def mem_after(tl, time):
    """Memory in use after every event at or before ``time`` (what holds until the next instant)."""
    return int(tl.memory_bytes[np.searchsorted(tl.memory_time, time, side="right") - 1])


def curve(tl):
    """Memory after each instant, as a dict."""
    return {float(t): int(b) for t, b in zip(tl.memory_time, tl.memory_bytes, strict=True)}


def highest_at(tl, time):
    """The most memory in use at any point of instant ``time`` (between its events included)."""
    return int(tl.memory_bytes[tl.memory_time == time].max())


def test_keep_all(chain3):
    tl = simulate(chain3, plat(), Schedule.keep_all(3))
    assert tl.feasible and tl.violation is None
    assert tl.makespan == 12.0
    assert tl.peak_memory == 192 and tl.peak_time == 4.0
    np.testing.assert_array_equal(tl.op_start, [0, 1, 3, 4, 6, 10])
    np.testing.assert_array_equal(tl.op_end, [1, 3, 4, 6, 10, 12])
    # after the last event only g_0 (act[0]) is left: a_0 is freed at the end of B_1
    assert final_memory(tl) == 10
    assert tl.offloaded_bytes == 0
    # every instant: g_L at B_L's start, a_0 until B_1's end, frees before allocations
    assert curve(tl) == {0.0: 40, 1.0: 75, 3.0: 120, 4.0: 192, 6.0: 127, 10.0: 72, 12.0: 10}


def test_a0_resident_all_along(chain3):
    bigger = chain3.replace(act=[110, 20, 30, 40])
    tl = simulate(bigger, plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 192 + 100
    assert tl.memory_bytes[0] == 110


def test_fwd_tmp_counts_during_the_forward_only(chain3):
    # F_3's transient at t=3: 70 + 45 + 100 = 215, above the B_3 peak of 192
    tl = simulate(chain3.replace(fwd_tmp=[5, 5, 100]), plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 215 and tl.peak_time == 3.0
    # F_2's transient at t=1: 35 + 35 + 100 = 170 < 192, freed at its end
    tl = simulate(chain3.replace(fwd_tmp=[5, 100, 5]), plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 192


def test_bwd_tmp_and_gradients(chain3):
    tl = simulate(chain3.replace(bwd_tmp=[7, 7, 100]), plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 192 + 93
    # B_L allocates g_L too: a bigger act[3] raises the B_3 peak twice (saved[3] >= act[3] as well)
    tl = simulate(chain3.replace(act=[10, 20, 30, 45]), plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 192 + 5


def test_offload_frees_after_next_forward(chain3):
    # O_1: end of F_1, 25 B at 25 B/s -> [1, 2]; freed at max(2, end F_2 = 3) = 3.
    # P_1: end of B_3 (t=6), [6, 7]; B_2 waits for it: +1 s.
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2))
    tl = simulate(chain3, plat(), s)
    assert tl.feasible
    np.testing.assert_array_equal(tl.transfer_start, [1, 6])
    np.testing.assert_array_equal(tl.transfer_end, [2, 7])
    assert tl.makespan == 13.0
    assert tl.peak_memory == 192 - 25
    assert tl.offloaded_bytes == 25
    # O_1 has ended at t=2, but F_2 still reads a_1 until t=3: the unit stays until then
    assert mem_after(tl, 2.0) == mem_after(tl, 2.5) == 75
    # just after t=3: the unit and F_2's transient are gone, F_3 allocated 50
    assert mem_after(tl, 3.0) == 120 - 25


def test_slow_offload_frees_when_the_copy_ends(chain3):
    # O_1 takes 3 s -> [1, 4]: freed at 4, the instant B_3 allocates; frees go first: peak 167.
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2))
    tl = simulate(chain3, plat(d2h=25 / 3, h2d=25.0), s)
    assert tl.transfer_end[0] == pytest.approx(4.0)
    # 25 / (25/3) is 3.0000000000000004 in floats: the free lands just after B_3's start
    tl = simulate(chain3, plat(d2h=25 / 3.5, h2d=25.0), s)
    assert tl.peak_memory == 192
    tl = simulate(chain3, plat(d2h=12.5, h2d=25.0), s)  # 2 s -> [1, 3]: freed with F_2's end
    assert tl.peak_memory == 167


def test_frees_before_allocations_at_one_instant(chain3):
    # Latency only, bandwidth infinite: O_1 ends exactly at t=4 = start of B_3.
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2))
    tl = simulate(chain3, Platform(memory=167, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf, latency=3.0), s)
    assert tl.transfer_end[0] == 4.0
    assert tl.peak_memory == 167 and tl.feasible


def test_prefetch_allocates_at_its_start(chain3):
    # P_1 triggered at the start of B_3 (t=4): allocated at 4, so the offload bought nothing there.
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "start"))
    tl = simulate(chain3, plat(), s)
    assert tl.peak_memory == 192 and tl.peak_time == 4.0
    assert mem_after(tl, 4.0) == mem_after(tl, 4.5) == 192  # the 25 B count from 4, not from P_1's end at 5
    assert mem_after(tl, 3.5) == 95
    assert tl.makespan == 12.0  # P_1 [4, 5] ends before B_2 starts at 6


def test_prefetch_allocation_counts_before_a_zero_length_ops_frees(chain3):
    # B_3 takes no time (t=4); P_1 starts at 4 too. Its 25 B count before B_3's frees at that
    # instant (the conservative side): 90 + 25 + B_3's 77 = 192, not 90 + 77 = 167.
    c = chain3.replace(bwd=[2.0, 4.0, 0.0])
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "start"))
    tl = simulate(c, plat(), s)
    assert tl.transfer_start[1] == 4.0 and tl.op_start[B3] == tl.op_end[B3] == 4.0
    assert (tl.peak_memory, tl.peak_time) == (192, 4.0)
    assert mem_after(tl, 4.0) == 100
    assert tl.op_start[B2] == 5.0  # B_2 reads a_1: it waits for P_1 [4, 5]


def test_next_forward_reads_the_original_copy_without_waiting(chain3):
    # P_1 is queued right after O_1 (end of F_1) and runs [2, 3] behind it. F_2 reads a_1 from
    # the original copy, without waiting; that copy goes at max(end O_1, end F_2) = 3, so both
    # copies count during [2, 3].
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, F1, "end"))
    tl = simulate(chain3, plat(), s)
    assert tl.feasible
    np.testing.assert_array_equal(tl.transfer_start, [1, 2])
    assert tl.op_start[F2] == 1.0 and tl.makespan == 12.0
    assert mem_after(tl, 1.0) == 75 and mem_after(tl, 2.0) == 100 and mem_after(tl, 3.0) == 120


def test_zero_length_next_forward_still_reads_the_offloaded_unit(chain3):
    # F_2 takes no time (t=1) and O_1 none either: a_1 is released at t=1, but only after F_2's
    # own allocation there (F_2 reads it): 35 + F_2's 35 + 100 = 170 at t=1, not 145.
    c = chain3.replace(fwd=[1.0, 0.0, 1.0], fwd_tmp=[5, 100, 5])
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end"))
    tl = simulate(c, plat(d2h=math.inf, h2d=math.inf), s)
    assert tl.feasible and tl.transfer_end[0] == 1.0
    assert highest_at(tl, 1.0) == 170 == tl.peak_memory
    assert mem_after(tl, 1.0) == 95


def test_backward_waits_for_prefetches_of_j_and_j_minus_1(chain3):
    # Unit 2 out at the end of F_2 ([3, 4.4]); P_2 at the end of F_3 waits for it: [4.4, 5.8].
    # B_3 reads a_2 (its input), so it waits for P_2: starts at 5.8 instead of 4.
    s = sched(Transfer("offload", 2, F2, "end"), Transfer("prefetch", 2, F3, "end"))
    tl = simulate(chain3, plat(), s)
    assert tl.transfer_start[1] == pytest.approx(4.4)
    assert tl.op_start[B3] == pytest.approx(5.8)
    assert tl.makespan == pytest.approx(13.8)


def test_backward_waits_for_the_prefetch_of_its_own_unit(chain3):
    # Unit 3 out at the end of F_3 ([4, 5.8]) and straight back (P_3 queued then, behind it:
    # [5.8, 7.6]); B_3 reads unit 3, so it waits: starts at 7.6 instead of 4. No `before`.
    s = sched(Transfer("offload", 3, F3, "end"), Transfer("prefetch", 3, F3, "end"))
    tl = simulate(chain3, plat(), s)
    np.testing.assert_allclose(tl.transfer_start, [4.0, 5.8])
    assert tl.op_start[B3] == pytest.approx(7.6)
    assert tl.makespan == pytest.approx(15.6)
    # the original is released at the end of O_3 (no later forward reads it), P_3 allocates then
    assert mem_after(tl, 5.0) == 115 and mem_after(tl, 6.0) == 115
    assert tl.peak_memory == 192


def test_explicit_before_makes_compute_wait(chain3):
    s = sched(Transfer("offload", 1, F1, "end", before=F3), Transfer("prefetch", 1, B3, "start"))
    tl = simulate(chain3, plat(d2h=25 / 3), s)  # O_1 [1, 4]: F_3 waits until 4
    assert tl.op_start[F3] == pytest.approx(4.0)
    assert tl.makespan == pytest.approx(13.0)


def test_half_duplex_shares_one_fifo(chain3):
    # O_2 [3, 4.4] on D2H; P_1 triggered at the start of F_3 (t=3, after the end of F_2).
    s = sched(
        Transfer("offload", 1, F1, "end"),
        Transfer("offload", 2, F2, "end"),
        Transfer("prefetch", 1, F3, "start"),
        Transfer("prefetch", 2, F3, "end"),
    )
    duplex = simulate(chain3, plat(), s)
    np.testing.assert_allclose(duplex.transfer_start, [1, 3, 3, 4.4])
    shared = simulate(chain3, plat(duplex=False), s)
    # P_1 queues behind O_2 on the one channel, P_2 behind P_1
    np.testing.assert_allclose(shared.transfer_start, [1, 3, 4.4, 5.4])
    assert duplex.op_start[B3] == pytest.approx(5.8)
    assert shared.op_start[B3] == pytest.approx(6.8)


def test_latency_is_added_per_transfer(chain3):
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2))
    tl = simulate(chain3, plat(latency=0.5), s)
    np.testing.assert_allclose(tl.transfer_end, [2.5, 7.5])
    assert tl.makespan == pytest.approx(13.5)


def test_memory_violation_names_op_time_and_bytes(chain3):
    tl = simulate(chain3, plat(memory=191), Schedule.keep_all(3))
    assert not tl.feasible
    v = tl.violation
    assert (v.rule, v.op, v.time, v.bytes) == ("memory", "B_3", 4.0, 192)
    assert "exceeds the limit 191" in v.message
    assert tl.makespan == 12.0  # the timeline is still reported


def test_offload_before_its_unit_exists_is_a_read_violation(chain3):
    s = sched(Transfer("offload", 2, F2, "start"), Transfer("prefetch", 2, B3, "start"))
    v = simulate(chain3, plat(), s).violation
    assert (v.rule, v.op, v.time) == ("read", "O_2", 1.0)


def test_late_prefetch_is_a_read_violation(chain3):
    # B_2 reads a_1; P_1 is triggered only at the start of B_2
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B2, "start"))
    v = simulate(chain3, plat(), s).violation
    assert (v.rule, v.op, v.bytes) == ("read", "B_2", 25)


def test_zero_length_op_transient_is_counted(chain3):
    c = chain3.replace(fwd=[1.0, 2.0, 0.0], fwd_tmp=[5, 5, 100])
    tl = simulate(c, plat(), Schedule.keep_all(3))
    assert tl.peak_memory == 215


def test_bandwidth_zero_with_offloads_is_an_error(chain3):
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "start"))
    with pytest.raises(PlatformError, match="bandwidth_d2h: 0 but the schedule offloads unit 1"):
        simulate(chain3, plat(d2h=0.0), s)
    assert simulate(chain3, plat(d2h=0.0), Schedule.keep_all(3)).feasible


def test_infinite_bandwidth_hides_transfers(chain3):
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2))
    tl = simulate(chain3, plat(d2h=math.inf, h2d=math.inf), s)
    assert tl.makespan == 12.0 and tl.peak_memory == 167


def test_arrays_are_read_only(chain3):
    tl = simulate(chain3, plat(), Schedule.keep_all(3))
    with pytest.raises(ValueError):
        tl.op_start[0] = 5.0


@pytest.mark.parametrize(
    "schedule, pattern",
    [
        (Schedule((("F", 1), ("F", 2), ("B", 3), ("F", 3), ("B", 2), ("B", 1))), r"compute\[2\]: expected F_3"),
        (Schedule((("F", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2))), r"expected 6 ops"),
        (Schedule((("F", 1), ("F", 2), ("F", 4), ("B", 3), ("B", 2), ("B", 1))), r"stage 4 is not in 1..3"),
        (Schedule((("X", 1),)), r"unknown op kind 'X'"),
        (sched(Transfer("offload", 1, F1, "end")), r"unit 1 is offloaded but never prefetched"),
        (sched(Transfer("prefetch", 1, B3, "end")), r"unit 1 is prefetched but never offloaded"),
        (
            sched(Transfer("prefetch", 1, F1, "end"), Transfer("offload", 1, F1, "end")),
            r"prefetch of unit 1 is triggered before its offload",
        ),
        (sched(Transfer("offload", 0, F1, "end")), r"unit: 0 is not a stage"),
        (sched(Transfer("offload", 1, 9, "end")), r"trigger.op: 9 is not an op index"),
        (sched(Transfer("offload", 1, F1, "middle")), r"trigger.at: 'middle'"),
        (sched(Transfer("offload", 1, F2, "end", before=F2)), r"before: 1 must be an op index after"),
        (sched(Transfer("upload", 1, F1, "end")), r"kind: 'upload'"),
        (
            sched(
                Transfer("offload", 1, F1, "end"),
                Transfer("offload", 1, F2, "end"),
                Transfer("prefetch", 1, B3, "start"),
            ),
            r"unit 1 has a second offload",
        ),
    ],
)
def test_malformed_schedules_raise(chain3, schedule, pattern):
    with pytest.raises(ScheduleError, match=pattern):
        simulate(chain3, plat(), schedule)


def test_schedule_json_round_trip(tmp_path):
    s = sched(Transfer("offload", 1, F1, "end", before=F3), Transfer("prefetch", 1, B3, "start"))
    path = tmp_path / "s.json"
    s.save(path)
    assert Schedule.load(path) == s
    assert Schedule.from_json(s.to_json()) == s
    d = s.to_dict()
    assert d["transfers"][0] == {"kind": "offload", "unit": 1, "trigger": {"op": 0, "at": "end"}, "before": 2}
    assert "before" not in d["transfers"][1]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"transfers": []}', "missing field 'compute'"),
        ('{"compute": [["F"]]}', r"compute\[0\]: expected \[kind, stage\]"),
        ('{"compute": [["F", 1.5]]}', r"compute\[0\] stage: expected an integer"),
        ('{"compute": [], "transfers": [{"kind": "offload", "unit": 1}]}', r"transfers\[0\]: missing field 'trigger'"),
        ('{"compute": [], "transfers": [{"kind": "offload", "unit": 1, "trigger": {"op": 0}}]}', r"transfers\[0\]\.trigger"),
        ('{"compute": [], "extra": 1}', "unknown field"),
        ("{", "malformed JSON"),
    ],
)
def test_schedule_json_errors(text, pattern):
    with pytest.raises(ScheduleError, match=pattern):
        Schedule.from_json(text)


def test_kernel_runs_as_python(chain3):
    """The kernels' Python bodies (what NUMBA_DISABLE_JIT=1 and a cold CLI run use) give the same timeline."""
    from chainoffload._kernels import INTERPRETED

    def schedule():  # a fresh object each time: the resolved structure is cached on it
        return sched(Transfer("offload", 2, F2, "end"), Transfer("prefetch", 2, F3, "end"))

    p = plat()
    jitted = simulate(chain3, p, schedule())
    INTERPRETED[0] = True  # the interpreted copies of the kernel modules (NOTE [ lazy kernels ])
    try:
        plain = simulate(chain3, p, schedule())
    finally:
        INTERPRETED[0] = False
    np.testing.assert_array_equal(plain.op_start, jitted.op_start)
    np.testing.assert_array_equal(plain.memory_time, jitted.memory_time)
    np.testing.assert_array_equal(plain.memory_bytes, jitted.memory_bytes)
    assert plain.peak_memory == jitted.peak_memory and plain.makespan == jitted.makespan


def test_zero_length_backward_still_holds_its_inputs_while_it_allocates():
    # B_2 takes no time: its free of unit 2 must come after its own allocation of bwd_tmp[2],
    # so keep-all peaks at saved[1] + saved[2] + bwd_tmp[2] = 4 B (not 2 B).
    from chainoffload import Chain

    chain = Chain(fwd=[0.0, 0.125], bwd=[0.0, 0.0], act=[0, 0, 0], saved=[1, 1], fwd_tmp=[0, 0], bwd_tmp=[0, 2])
    assert keep_all_peak(chain) == 4 >= chain.stage_memory_floor()


def _read_only(arr):
    arr.setflags(write=False)
    return arr


def test_array_level_replay_equals_simulate(chain3):
    """The private entry for search loops: arrays in, the kernel's outputs out, no Schedule object."""
    from chainoffload.schedule import resolve
    from chainoffload.simulate import replay

    op_kind, op_stage = Schedule.keep_all(3).arrays()[:2]
    # O_1 at the end of F_1, P_1 at the end of B_3 with B_2 waiting (test_offload_frees_after_next_forward);
    # read-only like Schedule.arrays() and the planner's, so the kernel's one compiled signature serves
    tr = [_read_only(np.array(v, dtype=np.int64)) for v in ([0, 1], [1, 1], [F1, B3], [1, 1], [-1, B2])]
    out = replay(chain3, plat(), resolve(3, op_kind, op_stage, *tr))
    op_start, op_end, tr_start, tr_end, _, _, _, peak, peak_time, rule, _, _, _ = out
    tl = simulate(chain3, plat(), sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "end", before=B2)))
    np.testing.assert_array_equal(op_start, tl.op_start)
    np.testing.assert_array_equal(tr_end, tl.transfer_end)
    assert (peak, peak_time, rule, op_end[-1]) == (tl.peak_memory, tl.peak_time, 0, tl.makespan) == (167, 4.0, 0, 13.0)
    # the same structure replays on another chain of the same length
    bigger = chain3.replace(bwd_tmp=[7, 7, 107])
    assert replay(bigger, plat(), resolve(3, op_kind, op_stage, *tr))[7] == 167 + 100
    # a sequence error is a ScheduleError naming the op
    bad_kind, bad_stage = _read_only(np.array([0, 1, 0, 1])), _read_only(np.array([1, 2, 2, 1]))  # F_1 B_2 F_2 B_1
    empty = [_read_only(np.zeros(0, dtype=np.int64))] * 5
    with pytest.raises(ScheduleError, match=r"compute\[1\] \(B_2\): B_2 needs unit 2 whole"):
        resolve(2, bad_kind, bad_stage, *empty)


# -- copies that do not overlap compute (Timeline.serial_makespan) -----------------------------


def test_serial_makespan_is_compute_plus_every_transfer_in_schedule_order(chain3):
    """By hand: offload unit 1 at F_1's end, prefetch it at B_3's start, over 25 B/s with
    latency 0.5 s: overlapped, the copies hide (makespan 12); inline, they add 2 x (25 / 25 + 0.5)."""
    s = sched(Transfer("offload", 1, F1, "end"), Transfer("prefetch", 1, B3, "start"))
    tl = simulate(chain3, plat(latency=0.5), s)
    assert tl.feasible and tl.makespan == 12.0
    assert tl.serial_makespan == 12.0 + 2 * (25 / 25.0 + 0.5)
    # No transfer: the two are the same figure.
    keep = simulate(chain3, plat(), Schedule.keep_all(3))
    assert keep.serial_makespan == keep.makespan == 12.0


def test_serial_makespan_sums_the_schedule_ops_and_transfers_of_random_schedules():
    """On random chains and well-formed schedules (recomputing ones too): the serial time is the
    durations of the schedule's ops (fwd, bwd, fwd_nosave by kind) plus each transfer's
    latency + bytes / bandwidth, added in schedule order, and never below the makespan."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from chainoffload.testing import strategies as cst

    @settings(max_examples=60, deadline=None)
    @given(st.data())
    def check(data):
        chain = data.draw(cst.chains(min_length=1, max_length=6))
        platform = data.draw(cst.platforms(chain=chain))
        schedule = data.draw(cst.well_formed_schedules(chain))
        tl = simulate(chain, platform, schedule)
        expected = 0.0
        for kind, i in schedule.compute:
            expected += {"F": chain.fwd, "B": chain.bwd}.get(kind, chain.fwd_nosave)[i - 1]
        for t, size in zip(schedule.transfers, schedule.transfer_bytes(chain), strict=True):
            expected += platform.d2h_time(size) if t.kind == "offload" else platform.h2d_time(size)
        assert math.isclose(tl.serial_makespan, expected, rel_tol=1e-9, abs_tol=1e-12)
        assert tl.serial_makespan >= tl.makespan * (1 - 1e-12)

    check()
