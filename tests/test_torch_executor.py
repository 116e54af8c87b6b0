"""The executor: schedules carried out in real training on CPU, bitwise equal to plain training."""

import copy
import dataclasses
import gc
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


# -- models --------------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block (attention + MLP, residuals)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True)),
        nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def transformer():
    return nn.Sequential(nn.Linear(8, 32), Block(32, 4), Block(32, 4), Block(32, 4), nn.LayerNorm(32), nn.Linear(32, 8))


MODELS = {
    "mlp": (mlp, (8, 16)),
    "cnn": (cnn, (4, 3, 16, 16)),
    "transformer": (transformer, (2, 6, 8)),
}


def build(name, dtype=torch.float32, seed=0):
    make, shape = MODELS[name]
    torch.manual_seed(seed)
    model = make().to(dtype)
    x = torch.randn(*shape).to(dtype)
    return model, x


def offload_all_schedule(model, x, platform_memory=10**12):
    """Every unit that can be offloaded (all but L and the aliased ones), eager timing."""
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    units = [u for u in range(1, prof.chain.length) if u not in prof.sizes.aliased]
    plat = prof.platform.with_memory(platform_memory)
    return prof, plan_transfers(prof.chain, plat, units), plat


def loss_of(y):
    return y.float().square().mean()


def train_pair(ref, x, wrapped, steps):
    """Train an untouched copy ``ref`` and the offloaded model side by side; return per-step equality."""
    opt_a = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    opt_b = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    results = []
    for _ in range(steps):
        opt_a.zero_grad(set_to_none=False)
        opt_b.zero_grad(set_to_none=False)
        la = loss_of(wrapped(x))
        la.backward()
        lb = loss_of(ref(x))
        lb.backward()
        grads = all(torch.equal(p.grad, q.grad) for p, q in zip(wrapped.parameters(), ref.parameters(), strict=True))
        buffers = all(torch.equal(p, q) for p, q in zip(wrapped.buffers(), ref.buffers(), strict=True))
        results.append((torch.equal(la, lb), grads, buffers))
        opt_a.step()
        opt_b.step()
    return results


# -- bitwise equality, real moves ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_training_is_bitwise_equal_and_moves_what_the_schedule_says(name, dtype):
    model, x = build(name, dtype)
    prof, schedule, plat = offload_all_schedule(model, x)
    assert schedule.offloaded_units, "the test needs a schedule that offloads something"
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    for loss_eq, grads_eq, buffers_eq in train_pair(ref, x, model, steps=4):
        assert loss_eq and grads_eq and buffers_eq
    stats = off.last_step
    chain = prof.chain
    assert stats.offloaded_bytes == schedule.offloaded_bytes(chain) > 0
    assert stats.prefetched_bytes == stats.offloaded_bytes
    assert stats.released_bytes == stats.offloaded_bytes
    assert stats.unit_offloaded == {u: int(chain.saved[u - 1]) for u in schedule.offloaded_units}
    assert stats.unit_prefetched == stats.unit_offloaded
    assert stats.restored_reads > 0


@pytest.mark.parametrize("name, moves", [("mlp", "unit"), ("transformer", "act")])
def test_the_backward_really_reads_the_host_copy(monkeypatch, name, moves):
    """Corrupting the host copies changes the gradients: the data autograd reads came back from
    host (with ``moves="act"``, a_i alone went there; tests/test_torch_granularity.py)."""
    model, x = build(name)
    prof, schedule, plat = offload_all_schedule(model, x)
    transfers = tuple(dataclasses.replace(t, moves=moves) for t in schedule.transfers)
    ct.Offloader(model, prof.chain, dataclasses.replace(schedule, transfers=transfers), platform=plat)
    loss_of(model(x)).backward()
    good = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None

    from chainoffload_torch import _copy

    real = _copy.Copier.prefetch

    def corrupt(self, host, after):
        host.zero_()
        return real(self, host, after)

    monkeypatch.setattr(_copy.Copier, "prefetch", corrupt)
    loss_of(model(x)).backward()
    assert not all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), good, strict=True))


def test_kept_units_are_not_moved_and_their_tensors_stay_the_originals():
    model, x = build("mlp")
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    plat = prof.platform.with_memory(10**12)
    schedule = plan_transfers(prof.chain, plat, [2])
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    packed = []
    from chainoffload_torch._saved import Kept
    from chainoffload_torch.executor import ScheduleRun

    real_pack = ScheduleRun.pack

    def spy(self, step, t):
        out = real_pack(self, step, t)
        # A kept tensor comes back as a record holding the original (for the version check).
        packed.append((step.current, isinstance(out, Kept) and out.tensor is t))
        return out

    ScheduleRun.pack = spy
    try:
        y = model(x)
        states = off.unit_states()
    finally:
        ScheduleRun.pack = real_pack
    loss_of(y).backward()
    # Only what stage 3 saves of a_2 and what stage 2 saved are replaced by handles.
    assert {stage for stage, same in packed if not same} <= {2, 3}
    assert all(same for stage, same in packed if stage not in (2, 3))
    assert all(s is ct.EntryState.DEVICE for u, ss in states.items() if u != 2 for s in ss)
    assert states[2] and all(s is ct.EntryState.HOST for s in states[2])
    assert off.last_step.unit_offloaded == {2: int(prof.chain.saved[1])}
    assert off.last_step.offloaded_bytes == int(prof.chain.saved[1])


def test_keep_all_schedule_moves_nothing():
    model, x = build("cnn")
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, co.Schedule.keep_all(prof.chain.length))
    for row in train_pair(ref, x, model, steps=2):
        assert all(row)
    assert off.last_step.offloaded_bytes == 0 and off.last_step.prefetched_bytes == 0
    assert off.pool.buffers == 0
    # NOTE [ passive steps ]: no saved-tensor hook is pushed, so autograd's hooks stay plain.
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
        model(x).sum().backward()
    assert packed, "the outer hooks see every saved tensor: none of the offloader's are pushed above them"
    assert off.last_step.wall_time > 0


# -- steady state ------------------------------------------------------------------------------


def _live_tensors():
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch module attributes warns
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def test_no_memory_growth_over_50_steps():
    model, x = build("cnn")
    prof, schedule, plat = offload_all_schedule(model, x)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pool = off.pool
    seen = []
    for step in range(50):
        opt.zero_grad(set_to_none=False)
        loss_of(model(x)).backward()
        opt.step()
        assert off.live_entries() == 0
        assert pool.in_use == 0 and pool.in_use_bytes == 0
        if step in (4, 49):
            seen.append((pool.buffers, pool.total_bytes, _live_tensors()))
    assert seen[0] == seen[1]
    assert seen[0][0] > 0


# -- failures leave nothing behind --------------------------------------------------------------


class Boom(nn.Module):
    """Identity-like stage that raises in its forward or backward when told to."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.fail_forward = False
        self.fail_backward = False

    def forward(self, x):
        if self.fail_forward:
            raise ValueError("boom in forward")
        y = self.lin(x)
        return _Fail.apply(y, self) if self.fail_backward else y


class _Fail(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, owner):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom in backward")


def _boom_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), Boom(16), nn.Tanh(), nn.Linear(16, 4))


def _assert_clean(off, model):
    # The module hooks stay (the model is instrumented until remove()); nothing else is left.
    assert off.hooks_installed == 2 + 2 * len(model)
    assert off.live_entries() == 0
    assert off.pool.in_use == 0
    # No saved-tensor hooks left on autograd's stack.
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_exception_in_forward_leaves_no_hooks_or_buffers():
    model = _boom_model()
    x = torch.randn(4, 8)
    prof, schedule, plat = offload_all_schedule(model, x)
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    loss_of(model(x)).backward()  # one good step makes the pool
    model[2].fail_forward = True
    with pytest.raises(ValueError, match="boom in forward"):
        model(x)
    _assert_clean(off, model)
    model[2].fail_forward = False
    for p in model.parameters():
        p.grad = None
    for row in train_pair(ref, x, model, steps=2):
        assert all(row)


def test_exception_in_backward_leaves_no_hooks_or_buffers():
    model = _boom_model()
    x = torch.randn(4, 8)
    prof, schedule, plat = offload_all_schedule(model, x)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    model[2].fail_backward = True
    y = model(x)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # popped at the forward's end
    with pytest.raises(ValueError, match="boom in backward"):
        loss_of(y).backward()
    del y
    off.reset()
    _assert_clean(off, model)
    # The next step also cleans up by itself: fail again, then train without reset().
    y = model(x)
    with pytest.raises(ValueError):
        loss_of(y).backward()
    del y
    model[2].fail_backward = False
    ref = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = None
    for row in train_pair(ref, x, model, steps=2):
        assert all(row)
    _assert_clean(off, model)


# -- schedule paths ---------------------------------------------------------------------------


def test_before_waits_and_late_prefetch_still_train_exactly():
    model, x = build("mlp")
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    L = chain.length
    sched = co.Schedule.keep_all(L)
    b = {s: sched.index("B", s) for s in range(1, L + 1)}
    f = {s: sched.index("F", s) for s in range(1, L + 1)}
    transfers = [
        co.Transfer("offload", 1, f[1], "end", before=f[3]),  # compute waits for it
        co.Transfer("offload", 3, f[3], "end"),
        co.Transfer("offload", 4, f[4], "end"),
        co.Transfer("prefetch", 1, b[3], "start", before=b[2]),
        co.Transfer("prefetch", 3, b[4], "end"),  # B_4 itself reads a_3: fetched on demand
        co.Transfer("prefetch", 4, b[4], "end"),
    ]
    schedule = co.Schedule(sched.compute, tuple(transfers))
    plat = prof.platform.with_memory(10**12)
    assert not co.simulate(chain, plat, schedule).feasible  # a read violation, on purpose
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, chain, schedule, platform=plat)
    for row in train_pair(ref, x, model, steps=2):
        assert all(row)
    assert off.last_step.offloaded_bytes == schedule.offloaded_bytes(chain)
    assert off.last_step.prefetched_bytes == off.last_step.offloaded_bytes


def test_release_without_platform_and_context_manager_form():
    model, x = build("mlp")
    prof, schedule, _ = offload_all_schedule(model, x)
    ref = copy.deepcopy(model)
    ctx = ct.OffloadActivations(model, prof.chain, schedule)
    with ctx:
        y = model(x)
    states = ctx.unit_states()
    for u in schedule.offloaded_units:
        if u + 1 <= prof.chain.length:
            # Released after F_{u+1}: only the host copy (or a prefetch of it) is left.
            assert all(s in (ct.EntryState.HOST, ct.EntryState.PREFETCHING) for s in states[u]), (u, states)
    loss_of(y).backward()
    loss_of(ref(x)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    assert ctx.last_step.offloaded_bytes == schedule.offloaded_bytes(prof.chain)
    assert ctx.hooks_installed == 0


def test_no_grad_forward_is_the_plain_model_and_leaves_a_step_in_flight_alone():
    model, x = build("mlp")
    prof, schedule, plat = offload_all_schedule(model, x)
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    with torch.inference_mode():
        assert torch.equal(model(x), ref(x))
    assert off.last_step is None and off.pool.buffers == 0
    y = model(x)
    with torch.no_grad():  # an evaluation pass between a training forward and its backward
        model(x)
    loss_of(y).backward()
    loss_of(ref(x)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    assert off.last_step.offloaded_bytes == schedule.offloaded_bytes(prof.chain)


def test_rejects_mismatched_schedules():
    # (Rematerializing schedules used to be refused here; the executor now runs them:
    # tests/test_torch_recompute.py. What it still refuses of them is tested there.)
    model, x = build("mlp")
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    L = chain.length
    with pytest.raises(ValueError, match="stages"):
        ct.Offloader(model[:-1], chain, co.Schedule.keep_all(L))
    with pytest.raises(ValueError, match="stages"):
        ct.OffloadActivations(model[:-1], chain, co.Schedule.keep_all(L))
    sched = co.Schedule.keep_all(L)
    early = co.Schedule(
        sched.compute,
        (co.Transfer("offload", 2, 0, "end"), co.Transfer("prefetch", 2, sched.index("B", 4), "start")),
    )
    with pytest.raises(ValueError, match="before F_2 has made it"):
        ct.Offloader(model, chain, early)
    with pytest.raises(TypeError, match="chain"):
        ct.Offloader(model, chain.to_dict(), sched)


def test_offloading_an_aliased_unit_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(3, 8)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    assert {1, 2} <= prof.sizes.aliased
    schedule = plan_transfers(prof.chain, prof.platform.with_memory(10**12), [1])
    off = ct.Offloader(model, prof.chain, schedule)
    with pytest.raises(RuntimeError, match="keep"):
        model(x)
    assert off.live_entries() == 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


# -- the one-line entry point ----------------------------------------------------------------------


def test_offload_one_liner_fits_a_smaller_memory_and_trains_exactly():
    model, x = build("transformer")
    chain, _ = ct.profile(model, x, repeats=1, warmup=0)
    full = co.keep_all_peak(chain)
    floor = chain.stage_memory_floor()
    memory = (full + floor) // 2
    ref = copy.deepcopy(model)
    off = ct.offload(model, x, memory=memory, repeats=1)
    assert off.result.feasible and off.schedule.offloaded_units
    assert off.predicted_peak <= memory
    for row in train_pair(ref, x, model, steps=3):
        assert all(row)
    assert off.offloaded_bytes == off.schedule.offloaded_bytes(off.chain)
    table = off.table()
    assert "| stage |" in table and "offload" in table and "predicted" in table
    rows = off.decisions()
    assert [r["stage"] for r in rows] == list(range(1, chain.length + 1))
    assert {r["stage"] for r in rows if r["decision"] == "offload"} == set(off.schedule.offloaded_units)


def test_offload_keep_opts_units_out():
    model, x = build("transformer")
    chain, _ = ct.profile(model, x, repeats=1, warmup=0)
    memory = (co.keep_all_peak(chain) + chain.stage_memory_floor()) // 2
    ref = copy.deepcopy(model)
    plain = ct.offload(model, x, memory=memory, repeats=1)
    chosen = plain.schedule.offloaded_units
    plain.remove()
    keep = [chosen[0]]
    kept = ct.offload(model, x, memory=memory, keep=keep, repeats=1)
    assert keep[0] not in kept.schedule.offloaded_units
    assert any(r["decision"] == "keep (user)" for r in kept.decisions())
    for row in train_pair(ref, x, model, steps=2):
        assert all(row)
    assert keep[0] not in kept.last_step.unit_offloaded


def test_offload_errors_name_the_field():
    model, x = build("mlp")
    with pytest.raises(ValueError, match="memory"):
        ct.offload(model, x, memory="lots", repeats=1)
    with pytest.raises(ValueError, match="memory: no schedule fits.*keep-all peak.*proven floors"):
        ct.offload(model, x, memory=1, repeats=1)
    with pytest.raises(ValueError, match="memory"):
        ct.offload(model, x, memory=-0.5, repeats=1)
    with pytest.raises(ValueError, match="keep"):
        ct.offload(model, x, memory=10**9, keep=[99], repeats=1)
    with pytest.raises(ValueError, match="method"):
        ct.offload(model, x, memory=10**9, method="nope", repeats=1)


class Strided(nn.Module):
    """Saves a non-contiguous view with a storage offset, and a second view of the same storage."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        h = self.lin(x) * 2.0  # a new storage, n x d
        a = h[:, 1:].t()  # non-contiguous, offset 1
        b = h[:, :-1].t()
        return (a.sin() * b.cos()).t().contiguous()


def test_views_and_non_contiguous_tensors_move_once_and_come_back_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), Strided(9), nn.Tanh(), Strided(8), nn.Linear(7, 3))
    x = torch.randn(5, 6)
    prof, schedule, plat = offload_all_schedule(model, x)
    assert 2 in schedule.offloaded_units and 4 in schedule.offloaded_units
    # By hand, Strided on an n x d input: lin's output is saved by nothing (a product with a
    # Python scalar keeps only the scalar); h = 2 lin(x) is saved through two views, counted
    # once (n d); sin(a) and cos(b) are saved by their product (n (d-1) each); the output,
    # a contiguous copy, n (d-1). Its input is unit 1's, its weights are parameters.
    n, f32 = 5, 4
    assert prof.sizes.owned[1] == (n * 9 + 3 * n * 8) * f32
    assert prof.sizes.owned[3] == (n * 8 + 3 * n * 7) * f32
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    for row in train_pair(ref, x, model, steps=3):
        assert all(row)
    assert off.last_step.unit_offloaded[2] == int(prof.chain.saved[1])
    assert off.last_step.offloaded_bytes == schedule.offloaded_bytes(prof.chain)


def test_a_second_forward_abandons_the_first_with_a_clear_error():
    """A first forward whose outputs were dropped is abandoned by the next; one whose outputs are
    still held is not: the second runs outside the plan (NOTE [ several forwards per backward ]
    in api.py), and both backwards train as plain PyTorch."""
    model, x = build("mlp")
    prof, schedule, plat = offload_all_schedule(model, x)
    ref = copy.deepcopy(model)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    first = loss_of(model(x))
    with pytest.warns(RuntimeWarning, match="another forward before the backward"):
        second = loss_of(model(x))
    first.backward()
    second.backward()
    loss_of(ref(x)).backward()
    loss_of(ref(x)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    assert off.pool.in_use == 0 and off.last_step.offloaded_bytes > 0
    model.zero_grad()
    ref.zero_grad()
    first = model(x).sum().item()  # no output held: the step is abandoned by the next
    loss_of(model(x)).backward()
    loss_of(ref(x)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    assert off.pool.in_use == 0


def test_offloader_refuses_a_schedule_that_offloads_a_kept_unit():
    model, x = build("mlp")
    prof, schedule, plat = offload_all_schedule(model, x)
    with pytest.raises(ValueError, match=r"unit\(s\) \[2\]"):
        ct.Offloader(model, prof.chain, schedule, platform=plat, keep=[2])


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_a_prefetch_is_issued_no_earlier_than_its_simulated_start(name):
    """NOTE [ prefetch issue point ]: on a slow link the prefetches queue behind each other; each
    destination is allocated (the copy issued) at the first boundary at or after the prefetch's
    simulated start, never at its trigger, so the allocator never runs ahead of the simulator."""
    model, x = build(name)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    units = [u for u in range(1, prof.chain.length) if u not in prof.sizes.aliased]
    slow = dataclasses.replace(prof.platform, memory=10**12, bandwidth_h2d=prof.platform.bandwidth_h2d / 1e4)
    schedule = plan_transfers(prof.chain, slow, units)
    off = ct.Offloader(model, prof.chain, schedule, platform=slow)
    run = off._run
    tl = run.timeline
    issued_at: dict[int, int] = {}
    for event, transfers in enumerate(run._triggers):
        for t in transfers:
            if t.kind == "prefetch":
                issued_at[t.unit] = event

    def time_of(event):
        k, end = divmod(event, 2)
        return float(tl.op_end[k] if end else tl.op_start[k])

    queued = 0
    for idx, t in enumerate(schedule.transfers):
        if t.kind != "prefetch":
            continue
        start = float(tl.transfer_start[idx])
        e = issued_at[t.unit]
        assert e >= t.event and time_of(e) >= start * (1 - 1e-9)
        if e > t.event:
            queued += 1
            assert time_of(e - 1) < start  # the first such boundary, not a later one
    assert queued, "no prefetch waited behind another: the test would prove nothing"

    # The copies really are issued there: the step's cursor when the copier is asked.
    seen = []
    loss_of(model(x)).backward()  # the first step makes the copier
    copier = run.copier

    def spy(host, after, _real=copier.prefetch):
        seen.append(run._step.cursor)
        return _real(host, after)

    copier.prefetch = spy
    try:
        loss_of(model(x)).backward()
    finally:
        del copier.prefetch
    assert set(seen) == set(issued_at.values())
    off.remove()


def test_no_prefetched_copy_outlives_its_units_backward_in_the_executor():
    """After B_i the executor holds nothing of unit i: with the graph still alive (the loss held,
    retain_graph off), no entry with a device copy is reachable, so the allocator frees each
    prefetched copy when autograd's last reader of it has run, as the simulator frees unit i."""
    model, x = build("transformer")
    prof, schedule, plat = offload_all_schedule(model, x)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    loss = loss_of(model(x))
    loss.backward()
    assert off.last_step.prefetched_bytes > 0
    gc.collect()
    from chainoffload_torch._stages import Entry

    held = [o for o in gc.get_objects() if isinstance(o, Entry) and o.dev is not None]
    assert held == [], f"{len(held)} prefetched copies still held after the backward"
    del loss
    off.remove()


def test_a_second_backward_with_retain_graph_reads_the_same_copies_as_plain():
    """retain_graph=True: autograd keeps its records, so the prefetched copies stay with them and
    a second backward computes what plain PyTorch does (the executor has let go of them)."""
    model, x = build("transformer")
    ref = copy.deepcopy(model)
    prof, schedule, plat = offload_all_schedule(model, x)
    off = ct.Offloader(model, prof.chain, schedule, platform=plat)
    for m in (model, ref):
        loss = loss_of(m(x))
        loss.backward(retain_graph=True)
        loss.backward()
    assert off.last_step.prefetched_bytes > 0
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    off.remove()
