"""The executor recomputes the code before the first block (a CNN stem, embeddings) when it is
stage 1: the model's forward run again on its recorded arguments up to the first block's call,
under the original RNG, autocast and grad mode, the state outside the blocks put back and
restored; bitwise equal to plain training. Where it cannot (hooks on the model, a cache
argument), it is never recomputed and the table says why."""

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.bounds import offload_memory_floor  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block (batch norm, in-place ReLU, a 1x1 downsample)."""

    def __init__(self, cin, c, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = None
        if stride != 1 or cin != c:
            self.downsample = nn.Sequential(nn.Conv2d(cin, c, 1, stride=stride, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class NarrowResNet(nn.Module):
    """torchvision's ResNet layout (7x7 stride-2 stem with batch norm and max pooling, layer1 ..
    layer4 of basic blocks, pooled linear head) with every stage as wide as the stem: the stem
    holds about half the activations, so no pure-offloading schedule goes below ~75 % of the
    keep-all peak. ``steps`` counts forwards in the stem's code (a plain attribute)."""

    def __init__(self, width=8, per_stage=2, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.drop = nn.Dropout(0.2)
        for k in range(1, 5):
            blocks = [BasicBlock(width, width, 2 if k > 1 and j == 0 else 1) for j in range(per_stage)]
            setattr(self, f"layer{k}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        x = self.drop(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        for k in range(1, 5):
            x = getattr(self, f"layer{k}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def train_equal(model, ref, x, steps=3):
    """AdamW on both, side by side: loss, every gradient, buffer and parameter torch.equal."""
    oa = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ob = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(steps):
        torch.manual_seed(step)
        la = model(x).square().mean()
        la.backward()
        torch.manual_seed(step)
        lb = ref(x).square().mean()
        lb.backward()
        assert torch.equal(la, lb), step
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert all(torch.equal(p, q) for p, q in zip(model.buffers(), ref.buffers(), strict=True)), step
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def narrow():
    torch.manual_seed(0)
    return NarrowResNet(), torch.randn(2, 3, 32, 32)


def test_a_resnet_whose_stem_is_as_wide_as_its_first_stage_trains_at_60_percent_by_recomputing_the_stem():
    model, x = narrow()
    ref = copy.deepcopy(model)
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    chain = handle.chain
    assert len(handle.blocks) == 8 and chain.length == 9  # the stem is stage 1
    # No pure-offloading schedule fits: the stem must be recomputed.
    assert offload_memory_floor(chain) + handle.plan.resident_bytes > 0.6 * handle.plan.keep_all_peak
    with pytest.raises(ValueError, match="no schedule fits"):
        ct.offload(copy.deepcopy(model), x, memory=0.6, method="best", repeats=1, warmup=0)
    rows = {r["stage"]: r["decision"] for r in handle.decisions()}
    assert rows[1].startswith("recompute ("), rows[1]
    assert handle.predicted_peak <= 0.6 * handle.plan.keep_all_peak
    train_equal(model, ref, x)
    assert handle.last_step.recomputed_ops >= 1
    # The stem's counter and its batch norm moved once per step, as in plain training.
    assert model.steps == ref.steps
    assert torch.equal(model.bn1.num_batches_tracked, ref.bn1.num_batches_tracked)
    handle.remove()


def test_recompute_all_recomputes_the_stem_first_and_trains_equal():
    """recompute-all starts every recomputation from a_0: with the stem as stage 1 each of them
    runs the model's forward again up to the first block (Fn_1 before every backward but B_1)."""
    model, x = narrow()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    ref = copy.deepcopy(model)  # after the profile, whose passes leave no trace
    L = prof.chain.length
    schedule = co.solve(prof.chain, prof.platform, method="recompute-all").schedule
    assert schedule.compute.count(("Fn", 1)) == L - 1
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform, blocks=prof.blocks)
    train_equal(model, ref, x)
    assert handle.last_step.recomputed_ops == sum(range(1, L))
    assert model.steps == ref.steps
    handle.remove()


def test_the_stem_is_never_recomputed_under_a_forward_pre_hook_of_the_model_and_the_table_says_why():
    model, x = narrow()
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(1))
    ref = copy.deepcopy(model)
    handle = ct.offload(model, x, memory=0.9, method="rotor", repeats=1, warmup=0)
    assert handle.plan.not_recomputable[1].startswith("the model has forward pre-hooks")
    assert "never recomputed: the model has forward pre-hooks" in handle.table()
    assert ("Fn", 1) not in handle.schedule.compute and ("Fck", 1) not in handle.schedule.compute
    train_equal(model, ref, x, steps=2)
    handle.remove()


def test_a_schedule_that_recomputes_the_stem_of_a_model_given_a_pre_hook_later_is_refused_at_the_step():
    model, x = narrow()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = co.solve(prof.chain, prof.platform, method="recompute-all").schedule
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform, blocks=prof.blocks)
    model.register_forward_pre_hook(lambda m, a: None)
    with pytest.raises(RuntimeError, match="code before the first block.*pre-hooks"):
        model(x).square().mean().backward()
    # Refused before anything was left behind: no saved-tensor hooks, no step in flight.
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert handle.live_entries() == 0
    handle.remove()


def test_the_stem_recomputed_in_the_forward_between_two_blocks():
    """Fck_1 followed at once by F_1: the stem's recomputation runs inside the first block's call
    (the model's forward re-entered, stopped at that block again)."""
    model, x = narrow()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    # The profile's own passes left no trace: the copy is taken after them.
    ref = copy.deepcopy(model)
    L = prof.chain.length
    assert prof.blocks.prefix
    comp = [("Fck", 1), ("F", 1)] + [("F", i) for i in range(2, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    handle = ct.Offloader(model, prof.chain, co.Schedule(tuple(comp)), platform=prof.platform, blocks=prof.blocks)
    train_equal(model, ref, x, steps=2)
    assert handle.last_step.recomputed_ops == 1
    handle.remove()


# The fuzz's models 1105 and 4579 (refused before the code before the first block could be
# recomputed) are regression tests in test_torch_fuzz_regressions.py.


def test_the_prediction_holds_at_every_op_of_a_plan_that_recomputes_the_stem():
    """The storages alive at the start of every op (the forward, the stem's recomputation, every
    backward op) are at most the simulated memory then plus what stays resident outside the chain."""
    from test_torch_coverage import _assert_live_within_prediction

    model, x = narrow()
    handle = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    assert handle.decisions()[0]["decision"].startswith("recompute (")
    _assert_live_within_prediction(model, x, handle)
    handle.remove()


class ChangesItsArgument(NarrowResNet):
    """Its forward counts its calls in a tensor argument, in place, after the blocks ran (as a
    loss may fill its labels): the stem, recomputed in the backward, would see other values."""

    def forward(self, x, count):
        out = super().forward(x)
        count.add_(1)
        return out


def test_the_stem_is_never_recomputed_when_the_forward_changes_an_argument_in_place():
    torch.manual_seed(0)
    model, x, count = ChangesItsArgument(), torch.randn(2, 3, 32, 32), torch.zeros((), dtype=torch.int64)
    handle = ct.offload(model, (x, count), memory=0.9, method="rotor", repeats=1, warmup=0)
    assert handle.plan.not_recomputable[1].startswith("the model's forward changes an argument")
    assert ("Fn", 1) not in handle.schedule.compute and ("Fck", 1) not in handle.schedule.compute
    handle.remove()


def test_the_stem_recomputed_under_the_autocast_of_the_step_trains_equal():
    """The step runs under CPU autocast (bfloat16): the stem's recomputation in the backward runs
    under it too, although the backward itself does not."""
    model, x = narrow()
    ref = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bfloat16 stem: below its pure-offloading floor, 83 %
        handle = ct.offload(model, x, memory=0.75, repeats=1, warmup=0)
    assert handle.decisions()[0]["decision"].startswith("recompute (")
    for step in range(2):
        outs = []
        for m in (model, ref):
            torch.manual_seed(step)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(x).float().square().mean()
            loss.backward()
            outs.append(loss)
        assert torch.equal(*outs), step
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert all(torch.equal(p, q) for p, q in zip(model.buffers(), ref.buffers(), strict=True)), step
    assert handle.last_step.recomputed_ops >= 1
    handle.remove()


class DrawsBeforeItsBlocks(NarrowResNet):
    """The stem's output scaled by Python's and NumPy's global generators, as a random
    augmentation or stochastic depth drawn in the parent would: a recomputation of the code
    before the first block draws again."""

    def forward(self, x):
        import random

        import numpy as np

        self.steps += 1
        x = self.drop(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        x = x * (0.5 + random.random()) * float(0.5 + np.random.rand())
        for k in range(1, 5):
            x = getattr(self, f"layer{k}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_the_stem_recomputed_draws_what_the_forward_drew_from_python_and_numpy():
    """The merged executor once recomputed the code before the first block under torch's
    generator only: its random.random() and np.random.rand() drew new numbers, and a_1 (and
    every gradient below it) differed silently (the property test's seed 373 with LayerDrop and
    a NumPy draw). A recomputation now runs under the Python and NumPy states of the forward."""
    import random

    import numpy as np

    torch.manual_seed(0)
    model, x = DrawsBeforeItsBlocks(), torch.randn(2, 3, 32, 32)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    ref = copy.deepcopy(model)
    schedule = co.solve(prof.chain, prof.platform, method="recompute-all").schedule
    assert ("Fn", 1) in schedule.compute
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform, blocks=prof.blocks)
    oa = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ob = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        for m in (model, ref):
            torch.manual_seed(step)
            random.seed(step)
            np.random.seed(step)
            m(x).square().mean().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        for opt in (oa, ob):
            opt.step()
            opt.zero_grad()
    assert handle.last_step.recomputed_ops >= 1
    handle.remove()
