"""The simulator on rematerialization schedules: hand-computed memory curves and structural errors.

All hand examples use the tiny chain: fwd [1, 2, 1], bwd [2, 4, 2], act [10, 20, 30, 40],
saved [25, 35, 45], fwd_tmp 5, bwd_tmp 7 (see chainoffload.examples.tiny).
"""

import numpy as np
import pytest

from chainoffload import Chain, simulate
from chainoffload.platform import Platform
from chainoffload.schedule import Schedule, ScheduleError, Transfer
from chainoffload.solvers.remat_baselines import recompute_all_schedule, sqrt_checkpoint_schedule

BIG = Platform(memory=10**9, bandwidth_d2h=10.0, bandwidth_h2d=10.0)


def mem_after(tl, time):
    """Memory in use just after every event at ``time`` has happened."""
    idx = np.flatnonzero(tl.memory_time <= time)
    return int(tl.memory_bytes[idx[-1]])


def mem_at_op_start(tl, k):
    """Memory right after op k's start allocations (the value at its start instant, last event there)."""
    return mem_after(tl, tl.op_start[k])


def sched(ops, transfers=()):
    return Schedule(tuple(ops), tuple(transfers))


CKPT1 = [("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1)]


def test_fck_checkpoint_curve(chain3):
    # Fck_1 keeps only a_1 (20 B, not saved[1] = 25 B); B_2 frees that lone a_1; F_1 re-runs later.
    tl = simulate(chain3, BIG, sched(CKPT1))
    assert tl.feasible
    assert list(tl.op_start) == [0, 1, 3, 4, 6, 10, 11]
    assert tl.makespan == 13
    # t=1: a_0 10 + a_1 20, then F_2 allocates 40 -> 70; t=4: B_3 on top of 110 -> 187.
    assert mem_after(tl, 1) == 70
    assert tl.peak_memory == 187 and tl.peak_time == 4
    # t=10: B_2 freed g_2, unit 2, bwd_tmp and the lone a_1: a_0 + g_1 = 30, F_1 adds 30.
    assert mem_after(tl, 10) == 60
    assert int(tl.memory_bytes[-1]) == 10  # g_0 is the chain's input gradient and stays


def test_recompute_all_curve(chain3):
    # Fn_1 keeps a_0 (never freed), Fn_2 frees a_1, B_3 frees the lone a_2.
    tl = simulate(chain3, BIG, recompute_all_schedule(3))
    assert tl.feasible
    assert tl.makespan == 16
    assert mem_after(tl, 3) == 90  # a_0, a_2 (a_1 freed by Fn_2), then F_3's 45 + 5
    assert tl.peak_memory == 162 == chain3.stage_memory_floor()
    assert mem_after(tl, 6) == 65  # a_0 + g_2, then Fn_1 again: 20 + 5
    assert mem_after(tl, 13) == 60


def test_f_all_rerun_replaces_lone_activation(chain3):
    # F_1 over a resident lone a_1: both counted while F_1 runs, the lone one freed at its end.
    tl = simulate(chain3, BIG, sched([("Fck", 1), ("F", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("B", 1)]))
    assert tl.feasible
    assert mem_after(tl, 1) == 10 + 20 + 25 + 5
    assert mem_after(tl, 2) == 10 + 25 + 40
    assert tl.peak_memory == 192 and tl.makespan == 13


def test_offload_of_lone_activation(chain3):
    # O_1 moves the lone a_1 (20 B, 2 s at 10 B/s) made by Fck_1; F_2 still reads it, so the GPU
    # copy goes at max(end of O_1, end of F_2) = 3; P_1 at the end of B_3 makes B_2 wait to 8.
    transfers = [Transfer("offload", 1, 0, "end"), Transfer("prefetch", 1, 3, "end")]
    tl = simulate(chain3, BIG, sched(CKPT1, transfers))
    assert tl.feasible
    assert tl.offloaded_bytes == 20
    assert list(tl.transfer_start) == [1, 6] and list(tl.transfer_end) == [3, 8]
    assert tl.op_start[4] == 8 and tl.makespan == 15
    assert mem_after(tl, 3) == 95  # 65 after F_2, a_1 gone (45), F_3 adds 50
    assert tl.peak_memory == 167  # B_3 without a_1
    assert mem_after(tl, 6) == 95  # frees of B_3 first, then P_1's 20 B


def test_prefetch_triggered_by_its_reader_is_a_read_violation(chain3):
    # Unit 2 is whole; B_3 reads a_2 and cannot wait for a prefetch its own start triggers.
    transfers = [Transfer("offload", 2, 1, "end"), Transfer("prefetch", 2, 3, "start")]
    tl = simulate(chain3, BIG, sched(CKPT1, transfers))
    assert tl.violation is not None and tl.violation.rule == "read" and tl.violation.op == "B_3"
    assert tl.offloaded_bytes == 35


def test_memory_violation_names_the_op(chain3):
    tl = simulate(chain3, BIG.with_memory(186), sched(CKPT1))
    assert tl.violation.rule == "memory" and tl.violation.op == "B_3" and tl.violation.bytes == 187


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("Fck", 1), ("Fn", 2), ("F", 3), ("B", 3), ("F", 2), ("B", 2), ("F", 1), ("B", 1)], "reads a_1"),
        ([("F", 1), ("Fn", 2), ("F", 3), ("B", 3), ("B", 2), ("B", 1)], "kept whole"),
        ([("Fck", 1), ("F", 2), ("F", 3), ("B", 2), ("B", 3), ("F", 1), ("B", 1)], "order B_3..B_1"),
        ([("F", 1), ("Fck", 2), ("F", 3), ("B", 3), ("B", 2), ("B", 1)], "needs unit 2 whole"),
        ([("F", 1), ("F", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("B", 1)], "already resident whole"),
        ([("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1), ("F", 1)], "after its backward"),
        ([("F", 1), ("F", 2), ("F", 3), ("B", 3), ("Fck", 2), ("B", 2), ("B", 1)], "no reader"),
        ([("Fck", 1), ("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1)], "already resident"),
        ([("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2)], "B_1 never runs"),
    ],
)
def test_structural_errors(chain3, ops, message):
    with pytest.raises(ScheduleError, match=message):
        simulate(chain3, BIG, sched(ops))


def test_offload_before_its_maker_ends_is_a_read_violation(chain3):
    # As in the fixed order: the offload would copy a_1 before Fck_1 has made it.
    transfers = [Transfer("offload", 1, 0, "start"), Transfer("prefetch", 1, 3, "end")]
    v = simulate(chain3, BIG, sched(CKPT1, transfers)).violation
    assert (v.rule, v.op, v.time, v.bytes) == ("read", "O_1", 0.0, 20)


def test_prefetch_after_the_data_is_freed_is_a_read_violation(chain3):
    # B_2 (op 4) reads and frees the lone a_1: it needs the prefetched copy, triggered only at its end.
    transfers = [Transfer("offload", 1, 0, "end"), Transfer("prefetch", 1, 4, "end")]
    v = simulate(chain3, BIG, sched(CKPT1, transfers)).violation
    assert (v.rule, v.op, v.time, v.bytes) == ("read", "B_2", 6.0, 20)


def test_sqrt_checkpoint_sequence_shape():
    ops = sqrt_checkpoint_schedule(4).compute
    assert ops == (
        ("Fck", 1), ("Fn", 2), ("F", 3), ("F", 4), ("B", 4), ("B", 3), ("F", 1), ("F", 2), ("B", 2), ("B", 1),
    )


def test_remat_schedule_json_roundtrip(chain3):
    s = sched(CKPT1, [Transfer("offload", 1, 0, "end"), Transfer("prefetch", 1, 3, "end")])
    back = Schedule.from_dict(s.to_dict())
    assert back == s and back.has_remat
    assert simulate(chain3, BIG, back).makespan == 15


def test_zero_length_rules_hold_for_recomputing_schedules():
    # The regression chain of test_simulate (keep-all peak 4 B): B_2 takes no time, so it frees
    # unit 2 only after its own allocation of bwd_tmp[2] = 2 B. Recomputing unit 1 instead of
    # keeping it: peak = unit 2 (1 B) + 2 B = 3 B (a kernel that freed first would say 2 B).
    chain = Chain(fwd=[0.0, 0.125], bwd=[0.0, 0.0], act=[0, 0, 0], saved=[1, 1], fwd_tmp=[0, 0], bwd_tmp=[0, 2])
    tl = simulate(chain, BIG, sched([("Fck", 1), ("F", 2), ("B", 2), ("F", 1), ("B", 1)]))
    assert (tl.peak_memory, tl.peak_time) == (3, 0.125)
    assert mem_after(tl, 0.125) == 0  # F_1 re-runs and B_1 frees it at that same instant
