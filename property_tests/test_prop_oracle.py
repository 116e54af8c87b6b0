"""The simulator against the naive oracle (tests/naive.py) on random schedules of both kinds.

Chains with zero-length ops, sizes of 0 and times on a half-second grid (so that ops end
exactly when transfers do, and several events share an instant), links whose transfer times
are on the same grid or free (infinite bandwidth), both duplex modes, memory limits around the
peak, and schedules triggered anywhere the format allows (read violations included). The
oracle is written from docs/model.md alone; every op and transfer time, the memory after every
instant, the peak and the first violation must be equal. ``benchmarks/oracle.py`` runs the same
check on 10^4 schedules of each kind.
"""

import math
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Platform, keep_all_peak, simulate
from chainoffload.testing import chains, well_formed_schedules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from naive import assert_agrees, simulate_naive  # noqa: E402

BANDWIDTHS = (0.5, 1.0, 4.0, 20.0, math.inf)


@st.composite
def cases(draw, remat: bool | None):
    """A chain on a time grid, a schedule of it, and a platform whose transfers fall on the grid too."""
    chain = draw(chains(max_length=6, max_bytes=40, max_time=2.0, time_resolution=0.5, nosave=True))
    schedule = draw(well_formed_schedules(chain, remat=remat))
    peak = keep_all_peak(chain)
    memory = draw(st.one_of(st.just(10**9), st.integers(0, 2 * peak + 10), st.sampled_from([peak, max(peak - 1, 0)])))
    platform = Platform(
        memory=memory,
        bandwidth_d2h=draw(st.sampled_from(BANDWIDTHS)),
        bandwidth_h2d=draw(st.sampled_from(BANDWIDTHS)),
        latency=draw(st.sampled_from((0.0, 0.0, 0.5))),
        duplex=draw(st.booleans()),
    )
    return chain, platform, schedule


def check(case) -> None:
    chain, platform, schedule = case
    assert_agrees(simulate(chain, platform, schedule), simulate_naive(chain, platform, schedule))


@settings(max_examples=examples(4))
@given(cases(remat=False))
def test_fixed_order_agrees_with_the_oracle(case):
    check(case)


@settings(max_examples=examples(4))
@given(cases(remat=True))
def test_recomputing_schedules_agree_with_the_oracle(case):
    check(case)
