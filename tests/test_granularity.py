"""Offload granularity: a transfer moves a whole unit or a_i alone (``moves``), in the format, the
simulator (against the naive oracle) and the joint DP's schedules."""

import json
import sys
from pathlib import Path

import pytest

from chainoffload import Chain, Platform, simulate
from chainoffload.schedule import Schedule, ScheduleError, Transfer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from naive import assert_agrees, simulate_naive  # noqa: E402

F1, F2, F3, B3, B2, B1 = range(6)


def plat(memory=10**9, bw=25.0):
    return Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=0.0)


def pair(unit, off_op, pre_op, moves, before=None):
    return (Transfer("offload", unit, off_op, "end", moves=moves), Transfer("prefetch", unit, pre_op, "end", before, moves))


def test_act_alone_moves_act_and_keeps_the_rest(chain3):
    """O_1 of a_1 alone: 20 B move (0.8 s), the rest of unit 1 (5 B) stays until B_1."""
    whole = Schedule.from_units(3, pair(1, F1, B3, "unit", before=B2))
    alone = Schedule.from_units(3, pair(1, F1, B3, "act", before=B2))
    tw, ta = simulate(chain3, plat(), whole), simulate(chain3, plat(), alone)
    assert (tw.offloaded_bytes, ta.offloaded_bytes) == (25, 20)
    assert alone.offloaded_bytes(chain3) == 20 and alone.transfer_bytes(chain3).tolist() == [20, 20]
    assert ta.transfer_end[0] - ta.transfer_start[0] == pytest.approx(20 / 25)
    # the peak (t = 4, F_3 running, unit 1 gone) keeps the 5 B of unit 1 that did not move
    assert (tw.peak_memory, ta.peak_memory) == (167, 172)
    for schedule, tl in ((whole, tw), (alone, ta)):
        assert_agrees(tl, simulate_naive(chain3, plat(), schedule))
    # nothing leaks: both end where keep-all ends (g_0 only)
    keep = simulate(chain3, plat(), Schedule.keep_all(3))
    assert tw.memory_bytes[-1] == ta.memory_bytes[-1] == keep.memory_bytes[-1]


def test_act_alone_on_a_lone_activation_moves_the_same_bytes(chain3):
    """Fck_1 makes a lone a_1: ``act`` and ``unit`` move the same act[1] bytes, same timeline."""
    compute = (("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1))
    got = []
    for moves in ("unit", "act"):
        s = Schedule(compute, pair(1, 0, 3, moves))
        tl = simulate(chain3, plat(), s)
        assert_agrees(tl, simulate_naive(chain3, plat(), s))
        got.append((tl.offloaded_bytes, tl.peak_memory, tl.makespan, tl.memory_bytes.tolist()))
    assert got[0] == got[1] and got[0][0] == 20


def test_transfer_parts_say_what_each_transfer_moves(chain3):
    """``transfer_parts``: a_i alone when the schedule asks for it or an Fck_i made it, else the unit."""
    assert Schedule.from_units(3, pair(1, F1, B3, "unit")).transfer_parts(chain3) == ("unit", "unit")
    assert Schedule.from_units(3, pair(1, F1, B3, "act")).transfer_parts(chain3) == ("act", "act")
    compute = (("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1))
    assert Schedule(compute, pair(1, 0, 3, "unit")).transfer_parts(chain3) == ("act", "act")
    with pytest.raises(ScheduleError):
        Schedule.from_units(3, pair(4, F1, B3, "unit")).transfer_parts(chain3)


def test_act_alone_of_a_whole_unit_in_a_recomputing_schedule(chain3):
    """F_all on stage 2 inside a re-run: a_2 alone leaves, the rest stays; the oracle agrees."""
    compute = (("Fck", 1), ("F", 2), ("F", 3), ("B", 3), ("B", 2), ("F", 1), ("B", 1))
    for memory in (10**9, 150, 120):
        s = Schedule(compute, pair(2, 1, 3, "act"))
        tl = simulate(chain3, plat(memory), s)
        assert_agrees(tl, simulate_naive(chain3, plat(memory), s))
        assert tl.offloaded_bytes == 30


def test_json_round_trip_and_default():
    s = Schedule.from_units(3, pair(1, F1, B3, "act"))
    data = json.loads(s.to_json())
    assert [t.get("moves") for t in data["transfers"]] == ["act", "act"]
    assert Schedule.from_dict(data) == s == Schedule.from_json(s.to_json())
    plain = Schedule.from_units(3, pair(1, F1, B3, "unit"))
    assert all("moves" not in t for t in plain.to_dict()["transfers"])  # files without it stay as they were
    assert Schedule.from_dict(plain.to_dict()).transfers[0].moves == "unit"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["transfers"][0].update(moves="half"), r"transfers\[0\]\.moves: 'half' is not 'unit'"),
        (lambda d: d["transfers"][0].update(moves=1), r"transfers\[0\]\.moves: expected a string"),
        (lambda d: d["transfers"][1].pop("moves"), r"transfers\[1\]\.moves: the prefetch of unit 1 moves 'unit' but its offload"),
    ],
)
def test_bad_moves_are_named(chain3, edit, message):
    data = Schedule.from_units(3, pair(1, F1, B3, "act")).to_dict()
    edit(data)
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_dict(data).validate(chain3)


def test_resolve_defaults_to_whole_units(chain3):
    """The array-level entry without ``tr_act`` (search loops of pure offloading) moves whole units."""
    from chainoffload.schedule import resolve

    s = Schedule.from_units(3, pair(1, F1, B3, "unit"))
    arrays = s.arrays()
    assert len(arrays) == 8 and arrays[-1].tolist() == [0, 0]
    assert resolve(3, *arrays[:7]).tr_size.tolist() == resolve(3, *arrays).tr_size.tolist()


def test_act_alone_hides_behind_compute_where_the_unit_does_not():
    """A unit ten times its output on a slow link: a_1 alone moves in the forward's shadow, the
    whole unit makes the backward wait 16 s."""
    chain = Chain(fwd=[1.0, 1.0, 1.0], bwd=[2.0, 2.0, 2.0], act=[1, 10, 10, 10], saved=[100, 100, 100],
                  fwd_tmp=[0, 0, 0], bwd_tmp=[0, 0, 0])
    p = plat(bw=10.0)
    s = Schedule.from_units(3, pair(1, F1, F3, "act"))
    tl = simulate(chain, p, s)
    assert_agrees(tl, simulate_naive(chain, p, s))
    assert tl.feasible and tl.makespan == 9.0 and tl.offloaded_bytes == 10
    whole = simulate(chain, p, Schedule.from_units(3, pair(1, F1, F3, "unit")))
    assert whole.makespan == 25.0
