"""The profiler: sizes by hand on small models, timing and link fields, model state left alone."""

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


F32 = 4


class Scale(nn.Module):
    """x * w * b with a parameter w and a buffer b: the products save x, w and b, and
    neither the parameter nor the buffer is ever part of a unit."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.register_buffer("b", torch.randn(d))

    def forward(self, x):
        return x * self.w * self.b


class TwoViews(nn.Module):
    """Saves two views of one new tensor: that storage counts once."""

    def forward(self, x):
        h = x * 2.0  # new storage, n x d
        a, b = h[:, :4], h[:, 4:]
        return a * b  # saves a and b (views of h); output n x 4


class Exp(nn.Module):
    """exp saves its output: unit = the output only."""

    def forward(self, x):
        return x.exp()


def test_sizes_of_an_mlp_by_hand():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Tanh())
    x = torch.randn(5, 16)
    sizes = ct.measure_sizes(model, x)
    assert sizes.act == (5 * 16 * F32, 5 * 32 * F32, 5 * 32 * F32, 5 * 8 * F32, 5 * 8 * F32)
    # Linear saves its input (an earlier unit's) and its weight (a parameter): only its output
    # is its own. ReLU and Tanh save their output, which is their unit anyway.
    assert sizes.saved == sizes.act[1:]
    assert sizes.owned == sizes.saved
    assert sizes.aliased == frozenset()


def test_parameters_buffers_and_views_are_counted_right():
    torch.manual_seed(0)
    model = nn.Sequential(Scale(8), TwoViews(), Exp())
    x = torch.randn(3, 8, requires_grad=True)
    sizes = ct.measure_sizes(model, x)
    n = 3
    # Scale: x * w saves x (unit 0) and w (parameter); (x*w) * b saves b (buffer) only, since
    # b needs no gradient: its unit is its output alone.
    # TwoViews: h (n x 8, saved through two views, counted once) + output (n x 4).
    # Exp: its output.
    assert sizes.act == (n * 8 * F32, n * 8 * F32, n * 4 * F32, n * 4 * F32)
    assert sizes.saved == (n * 8 * F32, n * 8 * F32 + n * 4 * F32, n * 4 * F32)


def test_inplace_and_view_stages_are_marked_aliased():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Flatten(0), nn.Linear(24, 2))
    sizes = ct.measure_sizes(model, torch.randn(3, 8))
    # ReLU(inplace) writes a_1: units 1 and 2 share it. Flatten returns a view of a_3.
    assert sizes.aliased == frozenset({1, 2, 3, 4})
    assert all(s >= a for s, a in zip(sizes.saved, sizes.act[1:], strict=True))


def test_profile_returns_a_valid_chain_and_platform_and_leaves_the_model_alone(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))
    x = torch.randn(2, 3, 6, 6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    chain, platform = ct.profile(model, x, repeats=2, warmup=1)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats untouched
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert chain.length == 5 and chain.name == "Sequential"
    assert list(chain.act) == list(ct.measure_sizes(model, x).act)
    assert all(t > 0 for t in chain.fwd) and all(t >= 0 for t in chain.bwd) and chain.bwd[0] > 0
    assert list(chain.fwd_tmp) == [0] * 5 and list(chain.bwd_tmp) == [0] * 5  # CPU: no allocator peak
    assert platform.bandwidth_d2h > 0 and platform.bandwidth_h2d > 0 and math.isfinite(platform.bandwidth_d2h)
    assert platform.duplex is True
    assert platform.memory == co.keep_all_peak(chain)
    chain.save(tmp_path / "c.json")
    platform.save(tmp_path / "p.json")
    assert co.Chain.load(tmp_path / "c.json") == chain
    assert co.Platform.load(tmp_path / "p.json") == platform


def test_profile_of_a_list_of_blocks_and_explicit_memory():
    torch.manual_seed(0)
    blocks = [nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 2)]
    chain, platform = ct.profile(blocks, torch.randn(3, 4), repeats=1, memory=12345, name="blocks")
    assert chain.name == "blocks" and chain.length == 3 and platform.memory == 12345


def test_measure_link_on_cpu():
    link = ct.measure_link("cpu", nbytes=1 << 20, small=1024, repeats=3)
    assert set(link) == {"bandwidth_d2h", "bandwidth_h2d", "latency", "duplex"}
    assert link["bandwidth_d2h"] > 1e6 and link["bandwidth_h2d"] > 1e6 and link["latency"] >= 0
    co.Platform(memory=1, **link)  # a valid platform
    with pytest.raises(ValueError, match="small"):
        ct.measure_link("cpu", nbytes=1024, small=1024)


def test_profile_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="blocks: found no list of blocks that Linear.forward calls"):
        ct.measure_sizes(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(TypeError, match="model"):
        ct.measure_sizes("not a model", torch.randn(1, 2))
    with pytest.raises(ValueError, match="same module"):
        lin = nn.Linear(2, 2)
        ct.measure_sizes([lin, lin], torch.randn(1, 2))
    with pytest.raises(TypeError, match="sample"):
        ct.measure_sizes(nn.Sequential(nn.Linear(2, 2)), [1.0, 2.0])

    class Nothing(nn.Module):
        def forward(self, x):
            return None

    with pytest.raises(TypeError, match="stage 2 returned a NoneType"):
        ct.measure_sizes(nn.Sequential(nn.Linear(2, 2), Nothing()), torch.randn(1, 2))
    with pytest.raises(ValueError, match="repeats"):
        ct.profile(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2), repeats=0)


class TanhBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x).tanh()  # tanh saves its output: the unit is a_i alone


class WithPrefixAndSuffix(nn.Module):
    """sin in the prefix saves its input (a storage of the prefix's own, besides its output); exp
    in the suffix saves its output (the suffix's own): NOTE [ prefix and suffix ]. ``wide``
    blocks keep five hidden states' worth, narrow ones (tanh) one."""

    def __init__(self, d=8, layers=3, wide=False):
        super().__init__()
        self.inp = nn.Linear(4, d)
        block = (lambda: nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, d))) if wide else (lambda: TanhBlock(d))
        self.blocks = nn.ModuleList([block() for _ in range(layers)])
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x).sin()
        for block in self.blocks:
            h = block(h)
        return self.head(h).exp()


def test_a_prefix_that_keeps_as_much_as_a_block_is_stage_1_and_the_suffix_is_in_the_last_unit():
    torch.manual_seed(0)
    model = WithPrefixAndSuffix()
    n, d = 5, 8
    sizes = ct.measure_sizes(model, torch.randn(n, 4))
    # The prefix keeps sin's input and its output (2 n d floats), a block n d: the prefix is
    # stage 1, a_0 is nothing (the model's input is the caller's) and nothing stays outside.
    assert sizes.act == (0, n * d * F32, n * d * F32, n * d * F32, n * d * F32)
    assert sizes.saved == (2 * n * d * F32, n * d * F32, n * d * F32, n * d * F32 + n * 3 * F32)  # exp's output in unit 4
    assert sizes.resident_bytes == 0 and sizes.prefix_unit == 0
    prof = ct.profile_full(model, torch.randn(n, 4), repeats=1, warmup=0, measure_platform=False)
    assert prof.blocks.prefix and prof.blocks.stage_names[0] == "(before blocks.0)"
    # The prefix's time is stage 1's and the suffix's stage 4's: the chain's compute time is a step's.
    chain = prof.chain
    assert chain.length == 4 and all(t > 0 for t in chain.fwd) and all(t > 0 for t in chain.bwd)


def test_a_small_prefix_keeps_its_storages_resident_outside_the_chain_and_a0_is_its_output():
    torch.manual_seed(0)
    model = WithPrefixAndSuffix(wide=True)
    n, d = 5, 8
    sizes = ct.measure_sizes(model, torch.randn(n, 4))
    # A block keeps tanh's output (4 n d) and its own output: more than the prefix's 2 n d. a_0 is
    # the first block's input alone (the size of g_0 too); sin's input stays resident outside.
    assert sizes.act[0] == n * d * F32 and len(sizes.saved) == 3
    assert sizes.prefix_unit == 2 * n * d * F32 and sizes.prefix_bytes == sizes.resident_bytes == n * d * F32
    chain, _ = ct.profile(model, torch.randn(n, 4), repeats=1, warmup=0)
    assert chain.length == 3 and all(t > 0 for t in chain.fwd)


class WithLogits(nn.Module):
    """A language-model-like suffix: the head's logits are returned beside the loss, and the
    loss (log_softmax) saves its own result, not the logits: they are no unit's."""

    def __init__(self, d=8, vocab=50, layers=8):
        super().__init__()
        self.blocks = nn.ModuleList([TanhBlock(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, x, labels):
        h = x
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_the_outputs_own_storages_count_in_unit_L_and_every_earlier_backward():
    # Regression (H200, GPT-2 small): the logits were in no unit, and the step ran 1.56 GiB
    # above the simulation from F_L on (NOTE [ the output's own storages ]).
    torch.manual_seed(0)
    n, d, vocab = 6, 8, 50
    model = WithLogits(d, vocab)
    sample = (torch.randn(n, d), torch.randint(0, vocab, (n,)))
    sizes = ct.measure_sizes(model, sample)
    # The logits; the loss, which the loop holds through its whole backward with the gradient it
    # seeds it with, is resident (docs/model.md, "Storages no unit owns").
    assert sizes.output_bytes == n * vocab * F32 and sizes.unowned_bytes == 2 * F32
    prof = ct.profile_full(model, sample, repeats=1, warmup=0, measure_platform=False)
    chain = prof.chain
    assert chain.saved[-1] == prof.sizes.saved[-1] + prof.sizes.output_bytes
    assert all(b >= prof.sizes.output_bytes for b in chain.bwd_tmp[:-1])
    # A model whose output is saved by its own suffix (exp) has none.
    assert ct.measure_sizes(WithPrefixAndSuffix(), torch.randn(5, 4)).output_bytes == 0


def test_copies_on_cpu_do_not_overlap_compute_and_the_engine_says_so():
    """On CPU the executor's copy engine copies inline on the compute thread; the link it measures
    there is a memcpy, not a channel beside compute, and copies_overlap says so. The test engine,
    which copies on a thread of its own, overlaps; so do CUDA's side streams."""
    from chainoffload_torch._engine_choice import use_engine
    from chainoffload_torch._engines import CudaEngine, ImmediateEngine
    from chainoffload_torch._link import copies_overlap
    from chainoffload_torch.testing_engine import ThreadedEngine

    assert copies_overlap("cpu") is False
    assert ImmediateEngine.overlaps is False and CudaEngine.overlaps is True
    with use_engine(ThreadedEngine(delay=(0.0, 0.0), seed=0)):
        assert copies_overlap("cpu") is True
    assert copies_overlap(torch.device("cpu")) is False
    assert copies_overlap("cuda:0") is True  # the engine is chosen by the device's type, no GPU needed
