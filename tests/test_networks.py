"""The shipped network chains (chainoffload/networks) and the builder that makes them."""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib import resources
from pathlib import Path

import pytest

from chainoffload import Chain, keep_all_peak
from chainoffload.networks import load_network, network, network_info, network_names

REPO = Path(__file__).resolve().parents[1]
BUILDER = REPO / "benchmarks" / "networks"
NAMES = list(network_names())

# Stage counts of the split documented in chainoffload/networks/README.md.
LENGTHS = {
    "resnet18": 1 + 8 + 1,
    "resnet50": 1 + 16 + 1,
    "resnet101": 1 + 33 + 1,
    "resnet152": 1 + 50 + 1,
    "vgg16": 13 + 3,
    "vgg19": 16 + 3,
    "densenet121": 1 + (3 + 6 + 12 + 8) + 3 + 1,
    "inception_v3": 2 + 11 + 1,
    "gpt2_12": 1 + 12 + 1,
    "gpt2_48": 1 + 48 + 1,
}

# Parameter counts published for these architectures (torchvision's model tables; Inception-v3's
# 27,161,264 less its auxiliary classifier's 3,326,696; GPT-2 small and XL with tied embeddings).
PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "densenet121": 7_978_856,
    "inception_v3": 27_161_264 - 3_326_696,
    "gpt2_12": 124_439_808,
    "gpt2_48": 1_557_611_200,
}


def test_names_listed_in_order_with_descriptions():
    assert NAMES == list(LENGTHS)
    for name, desc in network_names().items():
        assert isinstance(desc, str) and len(desc) > 20, name


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_chain_loads_and_validates(name):
    chain = network(name)
    assert isinstance(chain, Chain) and chain.name == name
    assert chain.length == LENGTHS[name]
    # the same file through the JSON readers of the core
    path = resources.files("chainoffload.networks").joinpath(f"{name}.json")
    text = path.read_text(encoding="utf-8")
    assert Chain.from_json(text) == chain
    with resources.as_file(path) as real:
        assert Chain.load(real) == chain
    assert load_network(name) == chain
    # the file is small: it ships in the wheel
    assert len(text) < 16_000
    info = network_info(name)
    assert len(info["stages"]) == len(info["fwd_flops"]) == len(info["bwd_flops"]) == chain.length
    assert info["parameters"] == PARAMETERS[name]
    assert chain.act[-1] == 4  # every chain ends in a float32 scalar loss
    assert (chain.fwd > 0).all() and (chain.bwd > 0).all()
    peak, floor = keep_all_peak(chain), chain.stage_memory_floor()
    assert floor <= peak <= int(chain.act[0]) + int(chain.saved.sum()) + int(chain.fwd_tmp.max()) + int(chain.bwd_tmp.max()) + int(chain.act.max()) * 2


# torchvision's published forward "GFLOPS" (multiply-accumulates) per image.
GMACS = {
    "resnet18": 1.81,
    "resnet50": 4.09,
    "resnet101": 7.80,
    "resnet152": 11.51,
    "vgg16": 15.47,
    "vgg19": 19.63,
    "densenet121": 2.83,
    "inception_v3": 5.71,
}


@pytest.mark.parametrize("name", list(GMACS))
def test_forward_flops_match_published_macs(name):
    info = network_info(name)
    batch = info["input"]["shape"][0]
    per_image = sum(info["fwd_flops"]) / 2 / batch / 1e9
    assert per_image == pytest.approx(GMACS[name], abs=0.006)
    # backward: a weight- and an input-gradient product per forward one, except that the very
    # first convolution needs no input gradient (a_0 is data)
    fwd, bwd = sum(info["fwd_flops"]), sum(info["bwd_flops"])
    assert 2 * fwd - info["fwd_flops"][0] <= bwd < 2 * fwd


@pytest.mark.parametrize("name", NAMES)
def test_v100_twin_has_the_same_sizes_and_slower_compute(name):
    a100, v100 = network(name), network(name, gpu="V100")
    assert v100.name == f"{name}-v100" and v100.length == a100.length
    for field in ("act", "saved", "fwd_tmp", "bwd_tmp"):
        assert getattr(v100, field).tolist() == getattr(a100, field).tolist(), field
    # Every op is slower on the V100 roofline (lower peaks and bandwidth), so every stage is.
    assert (v100.fwd > a100.fwd).all() and (v100.bwd > a100.bwd).all()
    assert "V100" in network_info(name)["times_v100"] and "no TF32" in network_info(name)["times_v100"]


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(ValueError, match=r"gpu 'H100' is not one of A100, V100"):
        network("resnet18", gpu="H100")


def test_unknown_network_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown network 'resnet34'.*resnet18"):
        network("resnet34")
    with pytest.raises(ValueError, match="unknown network"):
        network_info("nope")


def test_catalog_entries_are_copies():
    info = network_info("resnet18")
    info["stages"].clear()
    assert len(network_info("resnet18")["stages"]) == 10


# -- sizes against figures derived by hand from the architectures ------------------------------


def _resnet50_saved_by_formula(batch: int = 64, image: int = 224) -> tuple[int, list[int]]:
    """sum(saved) and act[] of ResNet-50 from the architecture, float32 (see the README's rules).

    A bottleneck saves conv1's and conv2's outputs and the in-place ReLUs after them (batch norm
    saves its input, ReLU its output), conv3's output, the block output, and for the first block
    of a group the shortcut convolution's output; each batch norm two float32 vectors per channel.
    """
    f32 = 4
    act = [batch * 3 * image * image * f32]
    h = image // 2  # conv 7x7/2
    total = 2 * batch * 64 * h * h * f32 + 2 * 64 * f32  # conv out + BN/ReLU out, stats
    h //= 2  # max-pool 3x3/2
    total += batch * 64 * h * h * (8 + f32)  # indices (int64) + output
    act.append(batch * 64 * h * h * f32)
    c_in = 64
    for group, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for j in range(count):
            stride = 2 if group > 0 and j == 0 else 1
            h_out = h // stride
            block = 2 * batch * width * h * h * f32  # conv1 out + ReLU1 out, at the input resolution
            block += 2 * batch * width * h_out * h_out * f32  # conv2 out + ReLU2 out
            block += 2 * batch * 4 * width * h_out * h_out * f32  # conv3 out + block output
            norms = [width, width, 4 * width]
            if j == 0:
                block += batch * 4 * width * h_out * h_out * f32  # shortcut conv out
                norms.append(4 * width)
            block += sum(2 * c * f32 for c in norms)
            total += block
            act.append(batch * 4 * width * h_out * h_out * f32)
            c_in, h = 4 * width, h_out
    # head: the pooled vector (saved by the fc layer), log-softmax output (saved by the loss), loss
    total += batch * c_in * f32 + batch * 1000 * f32 + f32
    act.append(f32)
    return total, act


def test_resnet50_sizes_match_the_architecture():
    chain = network("resnet50")
    expected_saved, expected_act = _resnet50_saved_by_formula()
    assert chain.act.tolist() == expected_act
    # the formula leaves out only bytes-sized scalars (the loss's total weight)
    assert abs(int(chain.saved.sum()) - expected_saved) <= 64
    # keep-all: a_0, every unit, plus one stage's transient at the worst moment
    expected_peak = expected_act[0] + expected_saved
    assert 4.5 * 2**30 < expected_saved < 5.5 * 2**30  # about 80 MiB per 224x224 image
    assert keep_all_peak(chain) == pytest.approx(expected_peak, rel=0.10)
    assert keep_all_peak(chain) >= expected_peak


def test_gpt2_block_saves_seventeen_activations_of_width_d():
    """A GPT-2 block at bf16 saves 17 tensors' worth of B x T x d (flash attention; see README)."""
    for name, (batch, width, heads) in {"gpt2_12": (8, 768, 12), "gpt2_48": (4, 1600, 25)}.items():
        chain = network(name)
        x = batch * 1024 * width * 2
        # ln_1 out 1, qkv 3, attention out 1, dropout mask 1/2 (bool), residual 1, ln_2 out 1,
        # fc out 4, GELU out 4, dropout mask 1/2, block output 1
        big = 17 * x
        # layer-norm mean/rstd (2 norms x 2 float32 per token), log-sum-exp (float32 per head and
        # token), and flash attention's two int64 RNG words
        small = 2 * 2 * batch * 1024 * 4 + batch * heads * 1024 * 4 + 16
        blocks = chain.saved[1:-1]
        assert len(blocks) == chain.length - 2
        assert (blocks == blocks[0]).all()
        assert int(blocks[0]) == pytest.approx(big + small, abs=64)
        assert (chain.act[1:-1] == x).all()


def test_vgg16_conv_stage_saves_only_its_relu_output():
    chain = network("vgg16")
    # conv3 (128 channels at 112x112): ReLU in place saves the conv output, the next conv reads it
    assert int(chain.saved[2]) == int(chain.act[3]) == 64 * 128 * 112 * 112 * 4
    # conv2 + pool: ReLU output, pool indices (int64), pool output
    assert int(chain.saved[1]) == 64 * 64 * 224 * 224 * 4 + 64 * 64 * 112 * 112 * (8 + 4)


# -- the builder ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builder():
    """benchmarks/networks/build.py as a module (by path: "build" is also a PyPI package's name)."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(BUILDER))  # build.py's own imports (network_models, network_trace)
    try:
        spec = importlib.util.spec_from_file_location("chainoffload_networks_build", BUILDER / "build.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BUILDER))


@pytest.fixture(scope="module")
def rebuilt(builder, tmp_path_factory):
    out = tmp_path_factory.mktemp("nets")
    assert builder.main(["--only", "resnet18", "--out", str(out)]) == 0
    return out


def test_build_regenerates_resnet18_identically(rebuilt):
    shipped = resources.files("chainoffload.networks")
    assert (rebuilt / "resnet18.json").read_text() == shipped.joinpath("resnet18.json").read_text()
    assert (rebuilt / "resnet18-v100.json").read_text() == shipped.joinpath("resnet18-v100.json").read_text()
    catalog = json.loads((rebuilt / "catalog.json").read_text())
    assert catalog["resnet18"] == network_info("resnet18")


@pytest.mark.thorough  # a second trace of resnet18 (the fast profile's rebuild covers build.py)
def test_build_takes_measured_times(builder, tmp_path):
    times = {"resnet18": {"fwd": [0.001] * 10, "bwd": [0.002] * 10, "source": "a test"}}
    (tmp_path / "t.json").write_text(json.dumps(times))
    assert builder.main(["--only", "resnet18", "--out", str(tmp_path), "--times", str(tmp_path / "t.json")]) == 0
    chain = Chain.load(tmp_path / "resnet18.json")
    assert chain.fwd.tolist() == [0.001] * 10 and chain.bwd.tolist() == [0.002] * 10
    assert chain.saved.tolist() == network("resnet18").saved.tolist()
    assert json.loads((tmp_path / "catalog.json").read_text())["resnet18"]["times"] == "measured: a test"


@pytest.mark.thorough  # traces resnet18 before it reads the times
def test_build_rejects_bad_times(builder, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"resnet18": {"fwd": [0.001] * 9, "bwd": [0.002] * 10}}))
    assert builder.main(["--only", "resnet18", "--out", str(tmp_path), "--times", str(bad)]) == 2
    assert "resnet18.fwd: expected a list of 10 seconds" in capsys.readouterr().err
    bad.write_text(json.dumps({"resnet34": {"fwd": [], "bwd": []}}))
    assert builder.main(["--out", str(tmp_path), "--times", str(bad)]) == 2
    assert "unknown network(s) resnet34" in capsys.readouterr().err
    assert builder.main(["--only", "alexnet", "--out", str(tmp_path)]) == 2
    assert "unknown network(s) alexnet" in capsys.readouterr().err


# -- the tracer on a case counted by hand ------------------------------------------------------


def test_trace_counts_a_small_stage_by_hand(builder):
    import torch
    from torch import nn

    import network_models as models
    import network_trace as trace

    batch, c, h = 2, 4, 8
    with torch.device("meta"):
        stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        mid = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())  # out-of-place ReLU
        head = nn.Sequential(nn.Flatten(), nn.Linear(c * (h // 2) ** 2, 10), models._ClassifierLoss(batch))
    staged = models.Staged([("stem", stem), ("mid", mid), ("head", head)], (batch, 3, h, h), torch.float32, torch.float32, "t")
    act0, figs = trace.measure(staged)
    n_full, n_half = batch * c * h * h * 4, batch * c * (h // 2) ** 2 * 4
    stats = 2 * c * 4  # batch norm's saved mean and inverse std
    assert act0 == batch * 3 * h * h * 4
    # stem: conv out (batch norm's input), ReLU out in place of the BN out, pool indices (int64), pool out
    assert figs[0].saved == 2 * n_full + stats + 2 * n_half + n_half and figs[0].fwd_tmp == 0
    # mid: conv out and the ReLU out (ReLU saves its result, even out of place); the BN out is
    # transient (fwd_tmp); its input (unit 1's) is not counted
    assert figs[1].saved == 2 * n_half + stats and figs[1].act == n_half
    assert figs[1].fwd_tmp == n_half
    # head: the flattened input is unit 2's; log-softmax output, the loss and its total weight
    assert figs[2].saved == batch * 10 * 4 + 4 + 4 and figs[2].act == 4
    assert figs[2].fwd_tmp == batch * 10 * 4  # the logits, freed once log-softmax has run
    for f in figs:
        assert f.retained == f.saved
        assert f.fwd > 0 and f.bwd > 0
    # FLOPs: PyTorch's formula for the convolutions (2 x MACs); the first stage has no input gradient
    assert figs[0].fwd_flops == 2 * batch * c * h * h * 3 * 9
    assert figs[0].bwd_flops == figs[0].fwd_flops
    assert figs[1].bwd_flops == 2 * figs[1].fwd_flops


def test_trace_rejects_modules_off_meta(builder):
    import torch
    from torch import nn

    import network_models as models
    import network_trace as trace

    with torch.device("meta"):
        on_meta = nn.Linear(2, 2)
    staged = models.Staged([("lin", nn.Linear(2, 2)), ("meta", on_meta)], (1, 2), torch.float32, torch.float32, "t")
    with pytest.raises(ValueError, match=r"all be on the meta device.*\['cpu', 'meta'\]"):
        trace.measure(staged)


def _small(kind: str):
    import network_models as models

    if kind == "resnet":
        staged = models.resnet(50, batch=2, image=64)
        staged.stages = staged.stages[:3]  # stem and two bottlenecks; B_L starts from ones
        return staged
    if kind == "gpt":
        # dropout off: PyTorch's CPU attention kernels have no dropout (the math fallback would run)
        return models.gpt2(2, 64, 4, batch=2, seq=32, dropout=0.0)
    if kind == "densenet":
        staged = models.densenet121(batch=2, image=64)
        staged.stages = staged.stages[:5]
        return staged
    staged = models.vgg(16, batch=2, image=32)
    staged.stages = staged.stages[-3:]  # fc1 (with dropout), fc2, fc3 + loss
    staged.input_shape = (2, 512, 2, 2)  # what the last conv stage would hand fc1 at 64x64
    return staged


# ResNet's convolutions in the fast profile; attention, concatenation and dropout in the thorough one.
@pytest.mark.parametrize("kind", ["resnet", *(pytest.param(k, marks=pytest.mark.thorough) for k in ("gpt", "densenet", "vgg"))])
def test_meta_trace_equals_a_real_cpu_run(builder, kind):
    """NOTE [ meta device checks ] in network_trace: the same figures with real tensors on CPU."""
    import torch

    import network_trace as trace

    torch.manual_seed(0)
    cpu = _small(kind)
    with torch.device("meta"):
        meta = _small(kind)
    a_cpu, f_cpu = trace.measure(cpu)
    a_meta, f_meta = trace.measure(meta)
    assert a_cpu == a_meta
    # the CUDA flash-attention op traced on meta also saves its RNG seed and offset (a few bytes
    # of int64); PyTorch's CPU attention kernel saves none. Otherwise the figures are identical.
    slack = 64 if kind == "gpt" else 0
    for c, m in zip(f_cpu, f_meta, strict=True):
        assert (c.label, c.act) == (m.label, m.act)
        assert 0 <= m.saved - c.saved <= slack and c.retained == c.saved and m.retained == m.saved, c.label
        assert abs(c.fwd_tmp - m.fwd_tmp) <= slack and abs(c.bwd_tmp - m.bwd_tmp) <= slack, c.label
        if kind != "gpt":  # torch's FLOP formulas do not cover the CPU attention kernel
            assert c.fwd_flops == m.fwd_flops and c.bwd_flops == m.bwd_flops


def test_roofline_picks_the_peak_by_dtype_and_op(builder):
    import torch

    import network_trace as trace

    r = trace.A100_SXM4_40GB
    aten = torch.ops.aten
    flops = 1e12
    assert r.op_time(aten.mm.default, torch.bfloat16, flops, 0) == pytest.approx(flops / (312e12 * 0.6))
    assert r.op_time(aten.convolution.default, torch.float32, flops, 0) == pytest.approx(flops / (156e12 * 0.6))
    assert r.op_time(aten.mm.default, torch.float32, flops, 0) == pytest.approx(flops / (19.5e12 * 0.6))
    assert r.op_time(aten.add.Tensor, torch.float32, 0, 1e9) == pytest.approx(1e9 / (1.555e12 * 0.8))
    # The V100 has no TF32: a float32 convolution runs at the fp32 peak; half precision on the
    # fp16 tensor cores.
    v = trace.V100_SXM2_16GB
    assert v.op_time(aten.convolution.default, torch.float32, flops, 0) == pytest.approx(flops / (15.7e12 * 0.6))
    assert v.op_time(aten.mm.default, torch.bfloat16, flops, 0) == pytest.approx(flops / (125e12 * 0.6))
    assert v.op_time(aten.add.Tensor, torch.float32, 0, 1e9) == pytest.approx(1e9 / (0.9e12 * 0.8))
