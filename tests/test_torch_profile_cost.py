"""What offload() costs in the model's own work, and that the cheaper profile measures the same
sizes: NOTE [ how many profiling steps ] in chainoffload_torch/_recorder.py.

Each test counts the model's forwards (with and without autograd) and backwards with hooks on
its root, so a profiling pass added back fails here, not only in a benchmark's timings.
"""

import dataclasses
import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
import chainoffload_torch._link as ct_link  # noqa: E402
import chainoffload_torch._recorder as recorder  # noqa: E402
import chainoffload_torch.profiler as profiler  # noqa: E402
from bench_models import torch_models  # noqa: E402
from chainoffload_torch._instrument import Instrument  # noqa: E402
from chainoffload_torch._timer import Timer  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class Calls:
    """The model's forwards with autograd, without it, and backwards through its output."""

    def __init__(self, model):
        self.grad = self.nograd = self.backward = 0
        self.hooks = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, module, args):
        if torch.is_grad_enabled():
            self.grad += 1
        else:
            self.nograd += 1

    def _post(self, module, args, out):
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        t = loss if isinstance(loss, torch.Tensor) else out
        if torch.is_grad_enabled() and isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(self._count_backward)

    def _count_backward(self, g):
        self.backward += 1

    def remove(self):
        for h in self.hooks:
            h.remove()

    @property
    def counts(self):
        return self.grad, self.nograd, self.backward


def counted(fn, model, *args, **kwargs):
    calls = Calls(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(model, *args, **kwargs)
    finally:
        calls.remove()
    return out, calls.counts


@pytest.fixture
def settles_at_once(monkeypatch):
    """Every first step counts as settled: the counts below do not depend on the timings."""
    monkeypatch.setattr(recorder, "AUTO_TOLERANCE", 1e9)


def mlp():
    return torch_models.ResidualMLP(d=16, layers=6), torch.randn(8, 8)


def with_stem():
    """A stem that keeps as much as a block: it becomes stage 1 (NOTE [ the prefix as a stage ])."""
    torch.manual_seed(0)
    return torch_models.ResNet([1, 1, 1, 1], width=4, classes=3), torch.randn(2, 3, 32, 32)


def test_offload_runs_one_forward_to_find_the_blocks_and_one_step(settles_at_once):
    model, x = mlp()
    handle, counts = counted(ct.offload, model, x, memory=0.6)
    # Block discovery: one forward with autograd (NOTE [ discovery as the warm-up ]); the probe's
    # forward alone (NOTE [ the probe's forward is not a step ]); then one step. No forward
    # without autograd: fwd_nosave is fwd plus, on CPU, the executor's host work per
    # recomputation, timed without calling a block (NOTE [ what a recomputation costs the
    # executor ] in _recompute.py).
    assert counts == (3, 0, 1)
    chain = handle.chain
    extra = [float(n) - float(f) for n, f in zip(chain.fwd_nosave, chain.fwd, strict=True)]
    assert all(0 < e < 0.1 for e in extra), extra
    handle.remove()


def test_a_stem_that_becomes_a_stage_costs_one_more_forward_not_a_second_profile(settles_at_once):
    model, x = with_stem()
    handle, counts = counted(ct.offload, model, x)  # the keep-all peak: its stages are held by its forward
    assert handle.blocks.prefix
    # Discovery, the probe on the blocks as found (its forward alone: its sizes decide the
    # layout before a backward), the probe on the new layout (its forward alone), and one step.
    assert counts == (4, 0, 1)
    handle.remove()


def test_a_first_step_slower_than_the_probe_takes_steps_until_two_agree_at_most_four(monkeypatch):
    monkeypatch.setattr(recorder, "AUTO_TOLERANCE", -1.0)  # nothing ever agrees: the cap
    model, x = mlp()
    handle, counts = counted(ct.offload, model, x, memory=0.6)
    assert counts == (2 + recorder.AUTO_MAX_STEPS, 0, recorder.AUTO_MAX_STEPS)  # discovery, the probe, the steps
    handle.remove()


def test_a_new_shape_without_a_discovery_before_it_takes_the_probe_forward_as_its_reference(settles_at_once):
    model, x = mlp()
    handle = ct.offload(model, x, memory=0.6)
    seen = []
    measure = recorder._measure

    def spy(*args, **kwargs):
        seen.append(kwargs.get("reference"))
        return measure(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recorder, "_measure", spy)
        # A new batch size over twice the first (no plan of a larger shape to lend its schedule,
        # none close enough to lend its times: NOTE [ one plan for many shapes ]): a new plan,
        # profiled at the first forward that sees it.
        _, counts = counted(lambda m, b: m(b).sum().backward(), model, torch.randn(17, 8))
    assert seen == [None]
    # The user's forward and backward; the probe's forward alone (no forward with autograd
    # ran just before: it is the reference), then one step.
    assert counts == (3, 0, 2)
    handle.remove()


def test_a_smaller_shape_that_a_larger_shapes_schedule_fits_costs_no_forward_of_its_own(settles_at_once):
    model, x = mlp()
    handle = ct.offload(model, x, memory=0.6)
    # NOTE [ one plan for many shapes ]: the step's own forward measures its sizes; no other pass.
    _, counts = counted(lambda m, b: m(b).sum().backward(), model, torch.randn(4, 8))
    assert counts == (1, 0, 1)
    assert handle.reuses == 1 and handle.replans == 0
    assert handle.plan.reused_from == handle.plans[0].key and "(4, 8)" in handle.plan.shapes
    # The next step of that shape runs the plan (nothing measured again).
    _, counts = counted(lambda m, b: m(b).sum().backward(), model, torch.randn(4, 8))
    assert counts == (1, 0, 1) and handle.reuses == 1 and handle.last_step is not None
    handle.remove()


def test_the_probe_gives_autograd_its_aliases_and_keeps_none_through_the_backward(monkeypatch, settles_at_once):
    # NOTE [ storages the forward keeps ]: autograd holds the probe's aliases as it would the
    # saved tensors (the probe peaks where a step does), and the backward frees each as it goes.
    seen = []
    forward_end = recorder._Recorder.forward_end
    backward = torch.autograd.backward

    def spy(self, p, outputs):
        if self.probe:
            refs = [a.untyped_storage() for aliases in p.aliases.values() for a in aliases]
            seen.append((len(refs), all(r.nbytes() > 0 for r in refs), p))
        forward_end(self, p, outputs)

    def spy_backward(*args, **kwargs):
        (_, _, p), = seen
        seen.append(len(p.aliases))
        return backward(*args, **kwargs)

    monkeypatch.setattr(recorder._Recorder, "forward_end", spy)
    monkeypatch.setattr(torch.autograd, "backward", spy_backward)
    model, x = mlp()
    handle = ct.offload(model, x, memory=0.6)
    (count, alive, p), held_in_backward = seen
    assert count >= 6 and alive  # every block's saved tensors, alive to the end of the forward
    assert held_in_backward == 0 and not p.aliases  # the pass itself holds none into its backward
    handle.remove()


def test_explicit_repeats_and_warmup_take_that_many_steps():
    model, x = mlp()
    handle, counts = counted(ct.offload, model, x, memory=0.6, repeats=3, warmup=1)
    assert counts == (2 + 4, 0, 4)  # discovery, the probe's forward alone, then the steps
    handle.remove()
    handle, counts = counted(ct.offload, model, x, memory=0.6, repeats=2)  # warmup: its fixed default, 1
    assert counts == (2 + 3, 0, 3)
    handle.remove()
    handle, counts = counted(ct.offload, model, x, memory=0.6, warmup=0)  # repeats: its fixed default, 3
    assert counts == (2 + 3, 0, 3)
    handle.remove()


def test_which_steps_count():
    def step(f, b):
        return {"fwd": [f / 2, f / 2], "bwd": [b]}

    kept = recorder._kept_steps
    # Adaptive: a first step no slower than the reference forward (+25 %) is the profile.
    assert kept([step(1.2, 2.0)], 1.0, None, None) == [step(1.2, 2.0)]
    assert kept([step(0.5, 2.0)], 1.0, None, None) == [step(0.5, 2.0)]  # faster than the probe: fine
    assert kept([step(1.3, 2.0)], 1.0, None, None) is None
    # A later step as fast as the probe counts alone, unless its backward got slower.
    cold, warm = step(3.0, 9.0), step(1.0, 2.0)
    assert kept([cold, warm], 1.0, None, None) == [warm]
    assert kept([step(3.0, 2.0), step(1.0, 9.0)], 1.0, None, None) is None
    # Or two in a row that agree, forward and backward, slower than the probe: both count.
    slow, slow2 = step(2.0, 2.0), step(2.2, 2.2)
    assert kept([cold, slow], 1.0, None, None) is None
    assert kept([cold, slow, slow2], 1.0, None, None) == [slow, slow2]
    assert kept([cold, step(2.0, 9.0), step(2.0, 2.0)], 1.0, None, None) is None  # backwards differ
    # At the cap, all but the first.
    steps = [cold, step(2.0, 9.0), step(2.0, 2.0), step(2.0, 9.0)]
    assert kept(steps, 1.0, None, None) == steps[1:]
    # Compared with the reference less the recorder's bookkeeping, which the reference never ran.
    assert kept([{**step(1.4, 2.0), "bookkeeping": 0.3}], 1.0, None, None) is not None
    assert kept([{**step(1.4, 2.0), "bookkeeping": 0.1}], 1.0, None, None) is None
    # No reference: a first step never counts alone.
    assert kept([warm], None, None, None) is None
    assert kept([warm, warm], None, None, None) == [warm, warm]
    # Fixed: warmup + repeats steps, the first warmup ones dropped.
    assert kept([cold], 1.0, 1, 1) is None
    assert kept([cold, warm], 1.0, 1, 1) == [warm]


def test_the_probes_checks_are_not_timed_into_its_stages_on_cpu():
    p = recorder._RecordedPass(None)
    p.marks = {"start": (0.0, 0, 0), ("f", 1): (1.0, 0, 0), ("f", 2): (3.0, 0, 0)}
    timer = Timer(torch.device("cpu"))
    assert recorder._forward_times(timer, p, 2) == [1.0, 2.0]
    p.checks = {2: 0.5}  # stage 2's start: the checks ran inside its forward
    assert recorder._forward_times(timer, p, 2) == [1.0, 1.5]


def test_nothing_runs_between_discovery_and_the_first_step(monkeypatch, settles_at_once):
    # NOTE [ discovery as the warm-up ]: the link's host copies between them made each first
    # step of a tiny model look cold (a second step).
    import chainoffload_torch.api as api

    order = []
    for module, name in ((api, "link_of"), (api, "find_blocks_warm"), (recorder, "_measure")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: order.append(_name) or _real(*a, **k))
    monkeypatch.setattr(ct_link, "_LINKS", {})
    model, x = mlp()
    ct.offload(model, x, memory=0.6).remove()
    assert order == ["link_of", "find_blocks_warm", "_measure"]


def test_repeats_and_warmup_errors_name_the_field():
    model, x = mlp()
    for kwargs, field in ((dict(repeats=0), "repeats: 0"), (dict(warmup=-1), "warmup: -1"), (dict(repeats=True), "repeats: True")):
        with pytest.raises(ValueError, match=field):
            ct.offload(model, x, memory=0.6, **kwargs)
        with pytest.raises(ValueError, match=field):
            ct.profile(model, x, **kwargs)
    ct.offload(model, x, memory=0.6, repeats=1, warmup=0).remove()  # a refused call left no hook behind


def test_profile_still_measures_fwd_nosave_for_rematerializing_methods():
    model, x = mlp()
    (chain, platform), counts = counted(ct.profile, model, x, repeats=2, warmup=1)
    assert counts == (2 + 3, 3, 3)  # the probe's forward alone; a forward without autograd after each step
    assert "fwd_nosave" in chain.to_dict() and all(t > 0 for t in chain.fwd_nosave)
    result = co.solve(chain, platform.with_memory(int(0.7 * co.keep_all_peak(chain))), "rotor")
    assert result.feasible
    # Adaptive, as offload() takes it, still with its no-grad forwards.
    (chain, _), counts = counted(ct.profile, model, x, repeats=None, warmup=None)
    assert counts[1] == counts[2] and "fwd_nosave" in chain.to_dict()
    prof, counts = counted(ct.profile_full, model, x, repeats=1, warmup=0, nosave=False, measure_platform=False)
    assert counts == (3, 0, 1) and "fwd_nosave" not in prof.chain.to_dict()


def test_the_link_is_measured_once_per_device_in_a_process(monkeypatch):
    measured = []
    real = ct_link.measure_link

    def counting(device, **kwargs):
        measured.append(str(device))
        return real(device, nbytes=1 << 16, small=1024, repeats=1)

    monkeypatch.setattr(ct_link, "measure_link", counting)
    monkeypatch.setattr(ct_link, "_LINKS", {})
    model, x = mlp()
    first = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    link = first.platform
    first.remove()
    second = ct.offload(model, x, memory=0.6, repeats=1, warmup=0)
    assert measured == ["cpu"]
    assert (second.platform.bandwidth_d2h, second.platform.latency) == (link.bandwidth_d2h, link.latency)
    second.remove()


# -- the sizes are those of the full profile -----------------------------------------------------


def sizes_decided_after_a_step(model, sample):
    """The layout and sizes as the profiler found them before the probe decided the layout: a
    full step on the blocks as found, the prefix's decision from that step's sizes, and the
    whole again on the new layout when it pays."""
    args, kwargs = profiler.as_call(sample)
    root, blocks, _ = profiler._root_and_blocks(model, args, kwargs, None)
    blocks = blocks.with_tails()  # offload()'s layout (NOTE [ the code after a block as a stage ])
    device = torch.device("cpu")
    instrument = Instrument(root, blocks, recorder._Recorder(blocks.stages, device, (root,)))
    instrument.install()
    try:
        sizes, _ = recorder._measure(instrument, root, args, kwargs, device, 1, 0)
        if recorder.prefix_pays(sizes):
            instrument.blocks = dataclasses.replace(blocks, prefix=True)
            sizes, _ = recorder._measure(instrument, root, args, kwargs, device, 1, 0)
    finally:
        instrument.remove()
    return instrument.blocks.prefix, sizes


def models():
    torch.manual_seed(0)
    gpt2, batch = torch_models.hf_tiny("gpt2")
    yield "gpt2", gpt2, batch
    yield "resnet-layout", *with_stem()
    yield "unet", torch_models.UNet(depth=4), torch.randn(2, 3, 16, 16)
    yield "residual-mlp", *mlp()


@pytest.mark.parametrize("name", ["gpt2", "resnet-layout", "unet", "residual-mlp"])
def test_sizes_and_stages_are_those_of_a_full_profile_and_of_the_old_defaults(name):
    _, model, sample = next(m for m in models() if m[0] == name)
    warnings.simplefilter("ignore")  # the U-Net's and the ResNet's held units: said elsewhere
    prefix, sizes = sizes_decided_after_a_step(model, sample)
    new = ct.offload(model, sample)  # the keep-all peak: a plan for every model
    plan = new.plan
    assert new.blocks.prefix == prefix and plan.sizes == sizes
    new.remove()
    old = ct.offload(model, sample, repeats=3, warmup=1)  # the defaults before the adaptive profile
    assert old.blocks.prefix == prefix and old.plan.sizes == sizes
    for field in ("act", "saved", "fwd_tmp", "bwd_tmp"):
        assert getattr(old.plan.chain, field).tolist() == getattr(plan.chain, field).tolist(), field
    old.remove()


def test_no_step_that_counts_ran_under_the_probe_dispatch_mode(monkeypatch):
    """NOTE [ the probe's forward is not a step ]: the probe's forward runs every op through a
    Python dispatch mode, so its stage times are never a step's; with explicit repeats too."""
    import weakref

    probes, timed = weakref.WeakSet(), []
    real_probed, real_times = recorder._probed, recorder._forward_times

    def probed(p):
        probes.add(p)
        return real_probed(p)

    def times(timer, p, n):
        timed.append(p in probes)
        return real_times(timer, p, n)

    monkeypatch.setattr(recorder, "_probed", probed)
    monkeypatch.setattr(recorder, "_forward_times", times)
    model, x = mlp()
    for kwargs in ({}, {"repeats": 1, "warmup": 0}, {"repeats": 2, "warmup": 1}):
        timed.clear()
        ct.offload(model, x, memory=0.6, **kwargs).remove()
        assert timed and not any(timed), kwargs
