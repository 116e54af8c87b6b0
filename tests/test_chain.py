import json
import math

import numpy as np
import pytest

from chainoffload import Chain, ChainError, Platform, PlatformError
from chainoffload.examples import example, example_names, resnet18


def good(**changes):
    data = dict(fwd=[1.0, 2.0, 1.0], bwd=[2.0, 4.0, 2.0], act=[10, 20, 30, 40], saved=[25, 35, 45], fwd_tmp=[5, 5, 5], bwd_tmp=[7, 7, 7])
    data.update(changes)
    return data


def test_arrays_are_readonly_contiguous_and_typed(chain3):
    for name in ("fwd", "bwd", "fwd_nosave"):
        arr = getattr(chain3, name)
        assert arr.dtype == np.float64 and arr.flags.c_contiguous and not arr.flags.writeable
    for name in ("act", "saved", "fwd_tmp", "bwd_tmp"):
        arr = getattr(chain3, name)
        assert arr.dtype == np.int64 and arr.flags.c_contiguous and not arr.flags.writeable
    with pytest.raises(ValueError):
        chain3.saved[0] = 1
    with pytest.raises(AttributeError, match="immutable"):
        chain3.fwd = np.zeros(3)


def test_basic_properties(chain3):
    assert chain3.length == len(chain3) == 3
    assert chain3.compute_time == 12.0
    np.testing.assert_array_equal(chain3.fwd_nosave, chain3.fwd)
    # B_3 alone: a_0 10 + a_2 30 + saved 45 + g_3 40 + g_2 30 + bwd_tmp 7
    assert chain3.stage_memory_floor() == 162


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(fwd=[1.0, -2.0, 1.0]), r"chain\.fwd: stage 2 has fwd=-2\.0"),
        (dict(bwd=[1.0, math.nan, 1.0]), r"chain\.bwd: stage 2 has bwd=nan"),
        (dict(bwd=[1.0, math.inf, 1.0]), r"chain\.bwd: stage 2 has bwd=inf"),
        (dict(bwd=[1.0, 2.0]), r"chain\.bwd: expected 3 values"),
        (dict(act=[10, 20, 30]), r"chain\.act: expected 4 values"),
        (dict(saved=[25, 15, 45]), r"chain\.saved: stage 2 has saved=15 < act=30"),
        (dict(saved=[25, 35.5, 45]), r"chain\.saved: stage 2 .* whole bytes"),
        (dict(fwd_tmp=[5, -5, 5]), r"chain\.fwd_tmp: stage 2 has fwd_tmp=-5"),
        (dict(act=[10, 20, "x", 40]), r"chain\.act: stage 2 has act='x'"),
        (dict(fwd=[]), r"at least one stage"),
        (dict(fwd_nosave=[1.0, 1.0]), r"chain\.fwd_nosave: expected 3 values"),
        (dict(act=[math.nan, 20, 30, 40]), r"chain\.act: stage 0 has act=nan"),
    ],
)
def test_bad_chain_names_field_and_stage(changes, pattern):
    with pytest.raises(ChainError, match=pattern):
        Chain(**good(**changes))


def test_json_round_trip(tmp_path, chain3):
    path = tmp_path / "c.json"
    chain3.save(path)
    assert Chain.load(path) == chain3
    with_nosave = chain3.replace(fwd_nosave=[0.5, 1.5, 0.5])
    assert Chain.from_json(with_nosave.to_json()) == with_nosave
    assert "fwd_nosave" not in chain3.to_dict()


def test_json_errors(tmp_path):
    with pytest.raises(ChainError, match="malformed JSON"):
        Chain.from_json('{"fwd": [1,')
    with pytest.raises(ChainError, match="missing field"):
        Chain.from_dict({"fwd": [1.0]})
    with pytest.raises(ChainError, match="unknown field.*flops"):
        Chain.from_dict({**good(), "flops": [1]})
    with pytest.raises(ChainError, match="cannot read"):
        Chain.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(good(saved=[1, 35, 45])))
    with pytest.raises(ChainError, match=r"bad\.json: chain\.saved: stage 1"):
        Chain.load(bad)


def test_platform_validation_and_round_trip(tmp_path):
    p = Platform(memory=6 * 1024**3, bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5, duplex=False)
    path = tmp_path / "p.json"
    p.save(path)
    assert Platform.load(path) == p
    # A file holds JSON numbers; human units are for the command line's flags.
    with pytest.raises(PlatformError, match=r"platform\.memory: '6GiB' is a string; write a JSON number \(the number 6442450944\)"):
        Platform.from_dict({"memory": "6GiB", "bandwidth_d2h": 12e9, "bandwidth_h2d": 12e9})
    assert p.d2h_time(12_000) == pytest.approx(1e-5 + 1e-6)
    assert Platform(memory=1, bandwidth_d2h=0, bandwidth_h2d=1).can_transfer is False
    assert math.isinf(Platform(memory=1, bandwidth_d2h=0, bandwidth_h2d=1).d2h_time(5))
    assert Platform(memory=1, bandwidth_d2h=math.inf, bandwidth_h2d=math.inf).h2d_time(10**9) == 0.0


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(memory=-1), r"platform\.memory: -1"),
        (dict(memory=1.5), r"platform\.memory: 1\.5"),
        (dict(bandwidth_d2h=math.nan), r"platform\.bandwidth_d2h: nan"),
        (dict(bandwidth_h2d=-1.0), r"platform\.bandwidth_h2d: -1\.0"),
        (dict(latency=math.inf), r"platform\.latency: inf"),
        (dict(duplex="yes"), r"platform\.duplex: 'yes'"),
    ],
)
def test_bad_platform(kwargs, pattern):
    base = dict(memory=100, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    base.update(kwargs)
    with pytest.raises(PlatformError, match=pattern):
        Platform(**base)


def test_platform_json_errors():
    with pytest.raises(PlatformError, match="malformed JSON"):
        Platform.from_json("{")
    with pytest.raises(PlatformError, match="missing field.*bandwidth_h2d"):
        Platform.from_dict({"memory": 1, "bandwidth_d2h": 1})
    with pytest.raises(PlatformError, match="unknown field.*speed"):
        Platform.from_dict({"memory": 1, "bandwidth_d2h": 1, "bandwidth_h2d": 1, "speed": 3})
    with pytest.raises(PlatformError, match="platform.memory"):
        Platform.from_dict({"memory": "lots", "bandwidth_d2h": 1, "bandwidth_h2d": 1})


def test_examples():
    assert set(example_names()) >= {"resnet18", "resnet18-formula", "tiny"}
    # `chainoffload example resnet18` is the traced network chain, like every other network name;
    # the formula-derived chain (V100 roofline) has its own name.
    from chainoffload.networks import network

    assert example("resnet18") == network("resnet18")
    assert example("resnet18-formula") == resnet18() and "V100" in example_names()["resnet18-formula"]
    r = resnet18()
    assert r.length == 10
    # stem output: 64 x 64 x 56 x 56 float32
    assert r.act[1] == 64 * 64 * 56 * 56 * 4
    # a plain basic block of the first stage saves 4 activations plus 2 x 16C bytes of batch-norm stats
    assert r.saved[1] == 4 * r.act[2] + 2 * 16 * 64
    assert r.act[10] == 64 * 1000 * 4
    with pytest.raises(ValueError, match="unknown example 'vgg'"):
        example("vgg")
    with pytest.raises(ValueError, match="batch=0"):
        resnet18(batch=0)
