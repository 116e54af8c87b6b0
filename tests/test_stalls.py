"""Stall attribution on hand-built schedules of the three-stage chain, every interval by hand.

The chain (tests/conftest.py): fwd 1, 2, 1; bwd 2, 4, 2; saved 25, 35, 45. Without waits the ops
run F_1 [0,1], F_2 [1,3], F_3 [3,4], B_3 [4,6], B_2 [6,10], B_1 [10,12]. At 25 B/s a unit's copy
takes 1 s (unit 1), 1.4 s (unit 2) or 1.8 s (unit 3).
"""

import pytest

from chainoffload import Platform, Schedule, Transfer, simulate, solve
from chainoffload.examples import resnet18
from chainoffload.stalls import Stall, stall_summary, stalls

F1, F2, F3, B3, B2, B1 = range(6)


def plat(d2h=25.0, h2d=25.0, duplex=True):
    return Platform(memory=10**9, bandwidth_d2h=d2h, bandwidth_h2d=h2d, duplex=duplex)


def sched(*transfers):
    return Schedule.from_units(3, transfers)


def test_keep_all_never_stalls(chain3):
    assert stalls(simulate(chain3, plat(), Schedule.keep_all(3))) == []


def test_backward_waits_for_its_prefetch(chain3):
    # O_1 [1, 2]; P_1 triggered at the end of B_3 (t=6): [6, 7]. B_2 reads a_1 (its input), so
    # compute idles from 6 to 7, for P_1, started as soon as it was triggered.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 1, F1), Transfer("prefetch", 1, B3)))
    (s,) = stalls(tl)
    assert (s.op, s.op_name, s.transfer, s.transfer_name) == (B2, "B_2", 1, "P_1")
    assert (s.start, s.end) == pytest.approx((6.0, 7.0))
    assert (s.cause, s.explicit, s.late_because, s.behind) == ("prefetch", False, "trigger", None)
    assert s.duration == pytest.approx(1.0)
    assert s.message.startswith("B_2 waits 1 s for P_1 to bring unit 1 back (B_2 reads unit 1)")


def test_explicit_wait_for_an_offload_to_free_memory(chain3):
    # O_1 at 25/3 B/s takes 3 s: [1, 4]. F_3 waits for it (before): F_2 ends at 3, F_3 starts at 4.
    # P_1 triggered at the start of B_3 (t=5): [5, 6]; B_2 starts at 7 (B_3 [5, 7]), no wait.
    s_ = sched(Transfer("offload", 1, F1, before=F3), Transfer("prefetch", 1, B3, "start"))
    tl = simulate(chain3, plat(d2h=25 / 3), s_)
    (s,) = stalls(tl)
    assert (s.op_name, s.transfer_name, s.cause, s.explicit) == ("F_3", "O_1", "offload", True)
    assert (s.start, s.end) == pytest.approx((3.0, 4.0))
    assert "O_1 to free unit 1 (an explicit wait)" in s.message


def test_a_stall_of_the_second_op_is_reported(chain3):
    # The first op that can wait at all is op 1: F_2 waits (before) for O_1, [1, 2] at 25 B/s,
    # so compute idles from 1 to 2. A scan that starts one op late would miss it.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 1, F1, before=F2), Transfer("prefetch", 1, B3)))
    first = stalls(tl)[0]
    assert (first.op, first.op_name, first.transfer_name, first.cause, first.explicit) == (F2, "F_2", "O_1", "offload", True)
    assert (first.start, first.end) == pytest.approx((1.0, 2.0))
    assert sum(s.duration for s in stalls(tl)) == pytest.approx(tl.makespan - chain3.compute_time)


def test_explicit_wait_for_a_prefetch(chain3):
    # P_1 at the end of B_3 with before=B_2 is both explicit and implicit: explicit wins.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 1, F1), Transfer("prefetch", 1, B3, before=B2)))
    (s,) = stalls(tl)
    assert (s.op_name, s.transfer_name, s.cause, s.explicit, s.transfers) == ("B_2", "P_1", "prefetch", True, (1,))


def test_prefetch_waiting_for_its_offload(chain3):
    # O_2 [3, 4.4]; P_2 triggered at the end of F_3 (t=4) waits for O_2: [4.4, 5.8]. B_3 reads
    # a_2, so compute idles from 4 to 5.8, and P_2 was late because of O_2.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 2, F2), Transfer("prefetch", 2, F3)))
    (s,) = stalls(tl)
    assert (s.op_name, s.transfer_name, s.late_because, s.behind) == ("B_3", "P_2", "offload", 0)
    assert (s.start, s.end) == pytest.approx((4.0, 5.8))
    assert s.message.endswith("P_2 waited for O_2 to end")


def test_half_duplex_queue_and_two_prefetches(chain3):
    # One shared channel at 25 B/s, in trigger order:
    #   O_2 (end of F_2, t=3)                       [3, 4.4]
    #   O_3 (end of F_3, t=4), behind O_2            [4.4, 6.2]
    #   P_2 (end of F_3), behind O_3                 [6.2, 7.6]
    #   P_3 (end of F_3), behind P_2                 [7.6, 9.4]
    # B_3 reads units 3 and 2: it starts at 9.4, when P_3 (the later one) ends. B_3 [9.4, 11.4],
    # B_2 [11.4, 15.4], B_1 [15.4, 17.4]: one stall [4, 9.4], and 17.4 = 12 + 5.4.
    s_ = sched(
        Transfer("offload", 2, F2),
        Transfer("offload", 3, F3),
        Transfer("prefetch", 2, F3),
        Transfer("prefetch", 3, F3),
    )
    tl = simulate(chain3, plat(duplex=False), s_)
    assert tl.transfer_start.tolist() == pytest.approx([3, 4.4, 6.2, 7.6])
    (s,) = stalls(tl)
    assert (s.op_name, s.transfer, s.transfer_name, s.transfers) == ("B_3", 3, "P_3", (3,))
    assert (s.start, s.end) == pytest.approx((4.0, 9.4))
    assert (s.cause, s.explicit, s.late_because, s.behind) == ("prefetch", False, "channel", 2)
    assert s.message.endswith("P_3 was queued behind P_2")
    assert tl.makespan == pytest.approx(17.4)


def test_two_stalls_in_time_order(chain3):
    # The explicit offload wait of F_3 ([3, 4], O_1 at 25/3 B/s), so F_3 [4, 5] and B_3 [5, 7];
    # P_1 is triggered at the end of B_3 and takes 1 s: B_2 idles [7, 8].
    s_ = sched(Transfer("offload", 1, F1, before=F3), Transfer("prefetch", 1, B3))
    tl = simulate(chain3, plat(d2h=25 / 3), s_)
    got = [(s.op_name, s.transfer_name, s.cause) for s in stalls(tl)]
    assert got == [("F_3", "O_1", "offload"), ("B_2", "P_1", "prefetch")]
    assert [x for s in stalls(tl) for x in (s.start, s.end)] == pytest.approx([3.0, 4.0, 7.0, 8.0])
    assert sum(s.duration for s in stalls(tl)) == pytest.approx(tl.makespan - chain3.compute_time)


def test_late_prefetch_is_a_violation_not_a_stall(chain3):
    # P_1 triggered at the start of B_2 cannot be waited for: B_2 reads a missing unit, and
    # compute does not idle for it.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 1, F1), Transfer("prefetch", 1, B2, "start")))
    assert tl.violation is not None and tl.violation.rule == "read"
    assert stalls(tl) == []


@pytest.mark.parametrize("method", ["best", "offload-all", "joint"])
def test_stalls_account_for_every_idle_second(method):
    # On real solver output (fixed order and rematerialization alike): the stalls add up to the
    # makespan less the ops' own time, and each ends exactly when its transfer does.
    chain = resnet18()
    platform = Platform(memory=int(1.2 * 2**30), bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
    result = solve(chain, platform, method)
    assert result.feasible
    tl = result.timeline
    found = stalls(tl)
    busy = float((tl.op_end - tl.op_start).sum())
    assert sum(s.duration for s in found) == pytest.approx(tl.makespan - busy, rel=1e-9, abs=1e-12)
    for s in found:
        assert isinstance(s, Stall) and s.end == tl.transfer_end[s.transfer] == tl.op_start[s.op]
        assert s.start == tl.op_end[s.op - 1]
    if method == "offload-all":  # 12 GB/s cannot hide copies of a whole ResNet-18
        assert {s.cause for s in found} == {"offload", "prefetch"}
    # The array form the CLI's table uses names the same ops, durations and transfers.
    ops, durations, transfers = stall_summary(tl)
    assert ops.tolist() == [s.op for s in found]
    assert transfers.tolist() == [s.transfer for s in found]
    assert durations.tolist() == [s.duration for s in found]


def test_summary_of_an_explicit_wait(chain3):
    # O_2 (end of F_2 at 3 s, 1.4 s) must end before F_3 starts: F_3 waits [3, 4.4] for it.
    tl = simulate(chain3, plat(), sched(Transfer("offload", 2, F2, before=F3), Transfer("prefetch", 2, F3)))
    found = stalls(tl)
    assert (found[0].op_name, found[0].transfer_name, found[0].explicit) == ("F_3", "O_2", True)
    ops, durations, transfers = stall_summary(tl)
    assert ops.tolist() == [s.op for s in found] and transfers.tolist() == [s.transfer for s in found]
    assert durations.tolist() == [s.duration for s in found]
    assert [len(a) for a in stall_summary(simulate(chain3, plat(), Schedule.keep_all(3)))] == [0, 0, 0]


def test_rejects_what_is_not_a_timeline(chain3):
    with pytest.raises(TypeError, match="stalls: timeline must be a Timeline"):
        stalls("nope")
    with pytest.raises(TypeError, match="stall_summary: timeline must be a Timeline .* got str"):
        stall_summary("nope")
    # A Result is the usual mistake: the message points at its timeline.
    result = solve(chain3, plat())
    with pytest.raises(TypeError, match=r"got Result; pass its \.timeline"):
        stalls(result)
    assert stalls(result.timeline) == stalls(simulate(chain3, result.timeline.platform, result.schedule))
