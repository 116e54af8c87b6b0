"""JSON round trips of chains, platforms and schedules, and the strategies' own promises."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from _budget import examples
from chainoffload import Chain, Platform, Schedule, keep_all_peak
from chainoffload.testing import chains, instances, platforms, schedules

# Every text name survives a JSON round trip, unicode and control characters included.
NAMED_CHAINS = chains(max_length=6, nosave=False, name=st.text(max_size=12)) | chains(max_length=6, nosave=True)


@settings(max_examples=examples(2))
@given(NAMED_CHAINS)
def test_chain_json_round_trip(chain):
    text = chain.to_json()
    back = Chain.from_json(text)
    assert back == chain
    assert back.to_dict() == chain.to_dict()
    # the interchange format is plain JSON with docs/model.md's keys
    data = json.loads(text)
    assert len(data["act"]) == chain.length + 1 and len(data["fwd"]) == chain.length
    assert ("fwd_nosave" in data) == chain._explicit_nosave


@settings(max_examples=examples(2))
@given(platforms(zero_bandwidth=True, inf_bandwidth=True) | platforms(chain=chains(max_length=4)))
def test_platform_json_round_trip(platform):
    back = Platform.from_json(platform.to_json())
    assert back == platform
    for name in ("bandwidth_d2h", "bandwidth_h2d"):
        assert type(getattr(back, name)) is float
    assert type(back.memory) is int


@settings(max_examples=examples(2))
@given(st.data())
def test_schedule_json_round_trip(data):
    chain = data.draw(chains(max_length=8))
    schedule = data.draw(schedules(chain))
    back = Schedule.from_json(schedule.to_json())
    assert back == schedule
    assert back.transfers == schedule.transfers  # list order is part of a schedule (ties)
    back.validate(chain)


@settings(max_examples=examples(2))
@given(st.data())
def test_chains_respect_their_bounds(data):
    lo_len = data.draw(st.integers(1, 5))
    hi_len = data.draw(st.integers(lo_len, 7))
    max_bytes = data.draw(st.integers(0, 10**6))
    res = data.draw(st.sampled_from([None, 0.25, 1.0]))
    chain = data.draw(chains(min_length=lo_len, max_length=hi_len, max_bytes=max_bytes, min_time=0.5, max_time=3.0, time_resolution=res))
    assert lo_len <= chain.length <= hi_len
    for field in ("act", "saved", "fwd_tmp", "bwd_tmp"):
        arr = getattr(chain, field)
        assert arr.dtype.kind == "i" and all(0 <= int(v) <= max_bytes for v in arr), field
    for field in ("fwd", "bwd"):
        for v in getattr(chain, field).tolist():
            assert type(v) is float and math.isfinite(v) and 0.5 <= v <= 3.0, field
            if res is not None:
                assert v / res == round(v / res), (field, v, res)


@settings(max_examples=examples(2))
@given(instances(chains=chains(max_length=6), memory_slack=0.5, zero_bandwidth=True, inf_bandwidth=True))
def test_platform_memory_between_floor_and_above_peak(instance):
    chain, platform = instance
    floor = chain.stage_memory_floor()
    peak = keep_all_peak(chain)
    assert floor <= platform.memory <= max(floor, peak + math.ceil(0.5 * peak))
    assert platform.latency >= 0 and math.isfinite(platform.latency)
    for bw in (platform.bandwidth_d2h, platform.bandwidth_h2d):
        assert bw == 0 or bw == math.inf or bw > 0


def test_platform_edge_cases_are_drawn():
    # The edge cases asked for are reachable: both fitting and not fitting, and both 0 and inf.
    seen = set()

    @settings(max_examples=examples(4, least=100), database=None)
    @given(instances(chains=chains(max_length=3), zero_bandwidth=True, inf_bandwidth=True))
    def collect(instance):
        chain, platform = instance
        seen.add("fits" if platform.memory >= keep_all_peak(chain) else "tight")
        for bw in (platform.bandwidth_d2h, platform.bandwidth_h2d):
            seen.add("zero" if bw == 0 else "inf" if math.isinf(bw) else "finite")
        seen.add("duplex" if platform.duplex else "half")

    collect()
    assert seen >= {"fits", "tight", "zero", "inf", "finite", "duplex", "half"}, seen
