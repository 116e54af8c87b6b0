"""chainoffload.order: the fixed order's positions, events and windows, checked against the sequence itself."""

import pytest

from chainoffload.order import (
    b_pos,
    event,
    f_pos,
    fixed_order,
    prefetch_deadline,
    reader_pos,
    transfer_events,
    trigger,
    wait_ops,
)


@pytest.mark.parametrize("length", [1, 2, 3, 7])
def test_positions_are_those_of_the_sequence(length):
    ops = fixed_order(length)
    assert len(ops) == 2 * length and fixed_order(length) is ops  # one shared tuple
    for i in range(1, length + 1):
        assert ops[f_pos(i)] == ("F", i)
        assert ops[b_pos(length, i)] == ("B", i)
        assert ops[reader_pos(length, i)] == ("B", i + 1 if i < length else length)


def test_events_and_triggers_are_inverse():
    assert [event(0, "start"), event(0, "end"), event(3, "start"), event(3, "end")] == [0, 1, 6, 7]
    for e in range(20):
        assert event(*trigger(e)) == e


def test_windows_of_the_three_stage_chain():
    # F_1 F_2 F_3 B_3 B_2 B_1: unit 1 exists from the end of F_1 (event 1); B_2 (op 4) reads it,
    # so its last trigger is the end of B_3 (event 7). Unit 3: F_3 ends at event 5, B_3 starts at 6.
    assert transfer_events(3, 1) == (1, 7) and prefetch_deadline(3, 1) == 8
    assert transfer_events(3, 3) == (5, 5) and prefetch_deadline(3, 3) == 6
    # O_1 may make F_2, F_3 or B_3 wait; nothing can wait for O_3 (B_3 needs unit 3 back anyway)
    assert list(wait_ops(3, 1)) == [1, 2, 3]
    assert list(wait_ops(3, 2)) == [2]
    assert list(wait_ops(3, 3)) == []
