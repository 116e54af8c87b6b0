"""The copier's synchronization, exercised on the threaded test engine (NOTE [ copy engines ]).

First the engine itself: copies run late, in order, on their stream's thread; events, waits and
queries behave as CUDA's; a missing wait is reported. Then the executor on it: chains of 10
stages trained at several memory limits, on duplex and half-duplex platforms, bitwise equal to
untouched copies while every copy is really asynchronous; schedules that make the host-buffer
guards and the abort path matter; and a subset of the adapter's own tests run on the engine.
``benchmarks/copy_mutations.py`` drops each wait from a copy of the copier and checks that
these tests fail.
"""

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.planner import plan_transfers  # noqa: E402
from chainoffload_torch import _engine_choice, testing_engine  # noqa: E402
from chainoffload_torch._copy import Copier  # noqa: E402
from chainoffload_torch._engine_choice import use_engine  # noqa: E402
from chainoffload_torch._pool import HostPool  # noqa: E402
from chainoffload_torch.testing_engine import CopyEngineError, ThreadedEngine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_torch_executor as tte  # noqa: E402
import test_torch_granularity as ttg  # noqa: E402
from bench_models import torch_models  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CPU = torch.device("cpu")
POISON = torch.tensor([0xFF], dtype=torch.uint8)


def slow(**kw):
    """An engine whose copies wait five seconds unless something waits for them: long enough
    that "not run yet" holds on a loaded machine, and no test waits it out."""
    return ThreadedEngine(delay=(5.0, 5.1), **kw)


def data(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g)


def poisoned(t):
    return bool((t == POISON).all())


# -- the engine's own semantics ---------------------------------------------------------------------


def test_a_copy_runs_later_and_its_event_completes_when_it_has():
    eng = slow()
    d2h = eng.stream(CPU, "d2h")
    src, host = data(), eng.host_empty(4096, False)
    assert poisoned(host)  # a new host buffer reads as NaN until a copy fills it
    compute = eng.current_stream(CPU)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, host, src)
    event = eng.record(d2h)
    assert not event.query() and poisoned(host)  # queued, not run: the host went on at once
    t0 = time.monotonic()
    event.synchronize()
    assert time.monotonic() - t0 < 0.4  # waiting for it pulls it forward
    assert event.query() and torch.equal(host, src)
    assert eng.late == 1 and eng.copies == 1 and not eng.violations


def test_without_a_wait_a_copy_ends_after_its_delay():
    eng = ThreadedEngine(delay=(0.02, 0.02))
    d2h = eng.stream(CPU, "d2h")
    src, host = data(), eng.host_empty(4096, False)
    eng.wait_stream(d2h, eng.current_stream(CPU))
    t0 = time.monotonic()
    eng.copy(d2h, host, src)
    event = eng.record(d2h)
    while not event.query():
        time.sleep(0.001)
    assert 0.02 <= time.monotonic() - t0 < 1.0
    assert torch.equal(host, src)


def test_a_stream_runs_its_copies_in_the_order_they_were_queued():
    eng = ThreadedEngine(delay=(0.0, 0.004), seed=3)
    d2h = eng.stream(CPU, "d2h")
    compute = eng.current_stream(CPU)
    events, hosts, srcs = [], [], []
    for k in range(12):
        src, host = data(seed=k), eng.host_empty(4096, False)
        eng.wait_stream(d2h, compute)
        eng.copy(d2h, host, src)
        events.append(eng.record(d2h))
        hosts.append(host)
        srcs.append(src)
    seen = set()
    while True:
        # Latest first: an event seen complete means every earlier one was complete by then.
        done = [e.query() for e in reversed(events)][::-1]
        assert done == sorted(done, reverse=True), done  # FIFO: the completed ones are a prefix
        seen.add(sum(done))
        if all(done):
            break
        time.sleep(0.0005)
    assert all(torch.equal(h, s) for h, s in zip(hosts, srcs, strict=True))
    assert len(seen) > 2  # they completed over time, not all at once


def test_an_event_covers_everything_queued_before_it_on_its_stream():
    eng = slow()
    d2h = eng.stream(CPU, "d2h")
    pairs = [(data(seed=k), eng.host_empty(4096, False)) for k in range(3)]
    for src, host in pairs:
        eng.wait_stream(d2h, eng.current_stream(CPU))
        eng.copy(d2h, host, src)
    eng.record(d2h).synchronize()
    assert all(torch.equal(h, s) for s, h in pairs)


def test_wait_event_orders_another_streams_copy_after_it():
    eng = slow()
    d2h, h2d = eng.stream(CPU, "d2h"), eng.stream(CPU, "h2d")
    compute = eng.current_stream(CPU)
    src, host = data(), eng.host_empty(4096, False)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, host, src)
    offloaded = eng.record(d2h)
    assert not offloaded.query()  # nothing waits for it yet: its five seconds hold
    dev = eng.device_empty(4096, CPU)
    assert poisoned(dev)  # a prefetch's destination reads as NaN until its copy ran
    eng.wait_stream(h2d, compute)
    # From here the H2D stream's worker waits for the offload, which then runs at once: whether
    # it has by the next line is the scheduler's choice (seen on a loaded machine), so only the
    # prefetch, which nothing waits for, is sure not to have run.
    eng.wait_event(h2d, offloaded)
    eng.copy(h2d, dev, host)
    prefetched = eng.record(h2d)
    assert not prefetched.query()
    eng.wait_event(compute, prefetched)  # the compute stream is the host: it blocks here
    assert offloaded.query() and prefetched.query()
    eng.reading(dev)
    assert torch.equal(dev, src)
    assert not eng.violations


def test_a_copy_that_skips_a_wait_is_reported_even_when_it_would_have_been_in_time():
    eng = ThreadedEngine(delay=(0.0, 0.0))
    d2h, h2d = eng.stream(CPU, "d2h"), eng.stream(CPU, "h2d")
    compute = eng.current_stream(CPU)
    src, host = data(), eng.host_empty(4096, False)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, host, src)
    offloaded = eng.record(d2h)
    time.sleep(0.01)
    eng.wait_stream(h2d, compute)
    with pytest.raises(CopyEngineError, match="H2D copy's read of its source .* not ordered after operation"):
        eng.copy(h2d, eng.device_empty(4096, CPU), host)  # the D2H copy has run, by luck
    assert len(eng.violations) == 1
    # A query that sees the event complete orders the host after it, as on CUDA, and the
    # H2D stream inherits that through wait_stream(compute).
    assert offloaded.query()
    dev = eng.device_empty(4096, CPU)
    eng.wait_stream(h2d, compute)
    eng.copy(h2d, dev, host)
    eng.wait_event(compute, eng.record(h2d))
    eng.reading(dev)
    assert torch.equal(dev, src) and len(eng.violations) == 1


def test_a_copy_stream_must_wait_for_compute_at_each_trigger():
    eng = ThreadedEngine()
    d2h = eng.stream(CPU, "d2h")
    compute = eng.current_stream(CPU)
    first, second = eng.host_empty(4096, False), eng.host_empty(4096, False)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, first, data())  # ordered: the source was made before the wait
    with pytest.raises(CopyEngineError, match="D2H copy's read of its source"):
        eng.copy(d2h, second, data(seed=1))  # compute may have run since the last call
    h2d = eng.stream(CPU, "h2d")
    host = eng.host_empty(4096, False)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, host, data())
    eng.wait_event(h2d, eng.record(d2h))
    with pytest.raises(CopyEngineError, match="H2D copy's write of its destination"):
        eng.copy(h2d, eng.device_empty(4096, CPU), host)  # allocated on compute after h2d last waited


def test_compute_waiting_on_an_event_blocks_the_host_until_the_copy_ran():
    eng = slow()
    d2h = eng.stream(CPU, "d2h")
    compute = eng.current_stream(CPU)
    src, host = data(), eng.host_empty(4096, False)
    eng.wait_stream(d2h, compute)
    eng.copy(d2h, host, src)
    event = eng.record(d2h)
    eng.wait_event(compute, event)
    assert event.query() and torch.equal(host, src)
    eng.freed(src)  # ordered: compute waited for the copy that reads it
    assert not eng.violations


def test_duplex_streams_carry_one_direction_and_a_shared_stream_both():
    eng = ThreadedEngine()
    d2h, h2d, both = eng.stream(CPU, "d2h"), eng.stream(CPU, "h2d"), eng.stream(CPU, "both")
    compute = eng.current_stream(CPU)
    host = eng.host_empty(4096, False)
    eng.wait_stream(h2d, compute)
    with pytest.raises(CopyEngineError, match="D2H copy queued on the H2D stream"):
        eng.copy(h2d, host, data())
    eng.wait_stream(d2h, compute)
    with pytest.raises(CopyEngineError, match="H2D copy queued on the D2H stream"):
        eng.copy(d2h, eng.device_empty(4096, CPU), host)
    src = data()
    eng.wait_stream(both, compute)
    eng.copy(both, host, src)
    dev = eng.device_empty(4096, CPU)
    eng.wait_stream(both, compute)
    eng.copy(both, dev, host)  # FIFO on one stream: ordered after the offload without an event
    eng.wait_event(compute, eng.record(both))
    eng.reading(dev)
    assert torch.equal(dev, src)
    with pytest.raises(CopyEngineError, match="between a host buffer"):
        eng.copy(both, data(), data())


def test_a_freed_source_is_poisoned_only_when_nothing_else_holds_it():
    eng = ThreadedEngine()
    alone = data()
    eng.freed(alone)
    assert poisoned(alone)
    held = data()
    view = held[1:]
    eng.freed(held)
    assert not poisoned(held) and view.numel() == 4095


def test_compute_reading_a_prefetch_it_did_not_wait_for_is_reported_or_reads_poison():
    for check in (True, False):
        eng = slow(check=check)
        copier = Copier(CPU, duplex=True, engine=eng)
        pool = HostPool(pin=False, engine=eng)
        src = data()
        host, guard = pool.take(4096)
        done = copier.offload(src, host, guard)
        copier.wait(done)
        dev, event = copier.prefetch(host, done)
        if check:
            with pytest.raises(CopyEngineError, match="compute's read of a prefetched storage"):
                eng.reading(dev)
        else:
            eng.reading(dev)
            assert poisoned(dev)  # the copy into it is half a second away: wrong data, not an error
        copier.await_prefetch(event, dev)
        assert torch.equal(dev, src)


def test_the_pool_poisons_a_buffer_it_hands_out_again_once_its_guard_has_passed():
    eng = slow()
    copier = Copier(CPU, duplex=True, engine=eng)
    pool = HostPool(pin=False, engine=eng)
    src = data()
    host, guard = pool.take(4096)
    assert guard is None
    done = copier.offload(src, host, guard)
    copier.wait(done)
    dev, event = copier.prefetch(host, done)
    pool.give(host, event)
    again, guard = pool.take(4096)  # the same buffer, its H2D copy still queued
    assert again.data_ptr() == host.data_ptr() and guard is event and not guard.query()
    assert torch.equal(again, src)  # untouched by the host: the queued copy still reads it
    copier.await_prefetch(event, dev)
    assert torch.equal(dev, src)
    pool.give(again, None)
    third, guard = pool.take(4096)
    assert guard is None and poisoned(third)  # nothing reads it any more: the new owner may scribble


def test_the_pool_frees_an_idle_buffer_only_after_its_guard():
    eng = slow()
    copier = Copier(CPU, duplex=True, engine=eng)
    pool = HostPool(pin=False, engine=eng)
    src = data()
    host, guard = pool.take(4096)
    done = copier.offload(src, host, guard)
    dev, event = copier.prefetch(host, done)
    pool.give(host, event)
    pool.clear()  # synchronizes the guard before the buffer goes
    assert pool.buffers == 0 and event.query()
    copier.await_prefetch(event, dev)
    assert torch.equal(dev, src) and not eng.violations


def test_a_prefetch_waits_for_its_offload_though_compute_did_not():
    eng = slow()
    copier = Copier(CPU, duplex=True, engine=eng)
    pool = HostPool(pin=False, engine=eng)
    src = data()
    host, guard = pool.take(4096)
    done = copier.offload(src, host, guard)
    dev, event = copier.prefetch(host, done)  # compute never waited for the offload
    copier.await_prefetch(event, dev)
    assert torch.equal(dev, src) and done.query() and not eng.violations


def test_a_host_buffer_reused_while_its_prefetch_is_queued_waits_for_the_guard():
    eng = slow()
    copier = Copier(CPU, duplex=True, engine=eng)
    pool = HostPool(pin=False, engine=eng)
    first, second = data(seed=1), data(seed=2)
    host, guard = pool.take(4096)
    done = copier.offload(first, host, guard)
    dev, event = copier.prefetch(host, done)
    pool.give(host, event)
    host2, guard2 = pool.take(4096)
    assert host2.data_ptr() == host.data_ptr()
    done2 = copier.offload(second, host2, guard2)  # must not overwrite before the prefetch read it
    copier.await_prefetch(event, dev)
    copier.wait(done2)
    assert torch.equal(dev, first) and torch.equal(host2, second) and not eng.violations


def test_abort_waits_for_every_copy_in_flight():
    eng = slow()
    copier = Copier(CPU, duplex=False, engine=eng)
    pool = HostPool(pin=False, engine=eng)
    src = data()
    host, guard = pool.take(4096)
    done = copier.offload(src, host, guard)
    copier.synchronize()
    assert done.query() and torch.equal(host, src)
    pool.give(host)
    again, _ = pool.take(4096)
    assert poisoned(again) and not eng.violations


def test_the_environment_variable_chooses_the_cpu_engine(monkeypatch):
    monkeypatch.setattr(_engine_choice, "_from_env", None)
    monkeypatch.setenv("CHAINOFFLOAD_COPY_ENGINE", "threaded")
    monkeypatch.setenv("CHAINOFFLOAD_COPY_DELAY", "0.001,0.003")
    eng = _engine_choice.engine_for("cpu")
    assert isinstance(eng, ThreadedEngine) and eng.delay == (0.001, 0.003)
    assert Copier(CPU).engine is eng and HostPool(pin=False).engine is eng
    assert _engine_choice.engine_for("cuda").name == "cuda"
    monkeypatch.setenv("CHAINOFFLOAD_COPY_ENGINE", "immediate")
    assert _engine_choice.engine_for("cpu").name == "immediate"
    with use_engine(eng):
        assert _engine_choice.engine_for("cpu") is eng
    monkeypatch.setenv("CHAINOFFLOAD_COPY_ENGINE", "gpu")
    with pytest.raises(ValueError, match="CHAINOFFLOAD_COPY_ENGINE"):
        _engine_choice.engine_for("cpu")
    monkeypatch.delenv("CHAINOFFLOAD_COPY_ENGINE")
    assert _engine_choice.engine_for("cpu").name == "immediate"


def test_the_threaded_engine_from_the_environment_names_a_bad_setting(monkeypatch):
    monkeypatch.delenv("CHAINOFFLOAD_COPY_DELAY", raising=False)
    monkeypatch.delenv("CHAINOFFLOAD_COPY_SEED", raising=False)
    assert testing_engine.from_env().delay == (0.0, 0.002)
    monkeypatch.setenv("CHAINOFFLOAD_COPY_SEED", "5")
    a, b = testing_engine.from_env(), testing_engine.from_env()
    assert [a._rng.random() for _ in range(3)] == [b._rng.random() for _ in range(3)]  # seeded alike
    for raw in ("0.001", "a,b"):
        monkeypatch.setenv("CHAINOFFLOAD_COPY_DELAY", raw)
        with pytest.raises(ValueError, match=f"CHAINOFFLOAD_COPY_DELAY='{raw}': expected LOW,HIGH"):
            testing_engine.from_env()
    monkeypatch.setenv("CHAINOFFLOAD_COPY_DELAY", "0.003,0.001")
    with pytest.raises(ValueError, match="CHAINOFFLOAD_COPY_DELAY='0.003,0.001': expected 0 <= LOW <= HIGH"):
        testing_engine.from_env()
    monkeypatch.setenv("CHAINOFFLOAD_COPY_DELAY", "0,0.001")
    monkeypatch.setenv("CHAINOFFLOAD_COPY_SEED", "x")
    with pytest.raises(ValueError, match="CHAINOFFLOAD_COPY_SEED='x': expected an integer"):
        testing_engine.from_env()


def test_the_adapter_loads_the_threaded_engine_only_when_asked():
    # The test engine is test machinery: importing the adapter and making a CPU copier and pool
    # by default never imports it.
    code = (
        "import sys, torch, chainoffload_torch;"
        "from chainoffload_torch._copy import Copier; from chainoffload_torch._pool import HostPool;"
        "Copier(torch.device('cpu')); HostPool(pin=False);"
        "sys.exit(1 if 'chainoffload_torch.testing_engine' in sys.modules else 0)"
    )
    env = {k: v for k, v in os.environ.items() if k != "CHAINOFFLOAD_COPY_ENGINE"}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0


# -- the executor on the threaded engine ------------------------------------------------------------


def gpt_like():
    torch.manual_seed(0)
    return torch_models.gpt_like(64, 16, 32, 4, 8), torch.randint(0, 64, (2, 16))


def resnet_like():
    torch.manual_seed(0)
    return torch_models.resnet_like(8, 2, 10), torch.randn(2, 3, 32, 32)


class TanhLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def even_mlp(layers=8, d=24):
    """``layers`` stages of Linear + Tanh between two projections: every unit is one storage
    (the output tanh saves) of the same size, so host buffers pass from unit to unit."""
    torch.manual_seed(0)
    stages = [nn.Linear(6, d)] + [TanhLayer(d) for _ in range(layers)] + [nn.Linear(d, 3)]
    return nn.Sequential(*stages), torch.randn(5, 6)


_PROFILES = {}


def profiled(name):
    """(model, input, profile) of a chain of 10 stages, profiled once per session."""
    if name not in _PROFILES:
        model, x = {"gpt-like": gpt_like, "resnet-like": resnet_like, "even-mlp": even_mlp}[name]()
        _PROFILES[name] = (model, x, ct.profile_full(model, x, repeats=1, warmup=0))
    return _PROFILES[name]


def schedules(name, duplex):
    """Plans at three memory limits: every movable unit, and the solver's at 30 % and 60 % of
    the way from the stage floor to the keep-all peak."""
    model, x, prof = profiled(name)
    chain = prof.chain
    plat = prof.platform.replace(duplex=duplex)
    units = [u for u in range(1, chain.length) if u not in prof.sizes.resident]
    out = [("every unit", plat.with_memory(2**62), plan_transfers(chain, plat.with_memory(2**62), units))]
    full, floor = co.keep_all_peak(chain), chain.stage_memory_floor()
    for frac in (0.3, 0.6):
        platm = plat.with_memory(int(floor + frac * (full - floor)))
        result = co.solve(chain, platm, keep=sorted(prof.sizes.resident))
        assert result.feasible
        out.append((f"{int(100 * frac)} %", platm, result.schedule))
    return out


def loss_of(y):
    return y.float().square().mean()


def train_against_copy(model, x, ref, steps=3):
    """Train ``model`` (offloaded) and ``ref`` (untouched) side by side with one seed per
    forward; assert the losses, gradients, parameters and buffers stay bitwise equal."""
    opt_a = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_b = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        opt_a.zero_grad(set_to_none=False)
        opt_b.zero_grad(set_to_none=False)
        torch.manual_seed(step)
        la = loss_of(model(x))
        la.backward()
        torch.manual_seed(step)
        lb = loss_of(ref(x))
        lb.backward()
        assert torch.equal(la, lb), step
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        opt_a.step()
        opt_b.step()
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert all(torch.equal(p, q) for p, q in zip(model.buffers(), ref.buffers(), strict=True)), step


@pytest.mark.parametrize("duplex", [True, False], ids=["duplex", "half-duplex"])
@pytest.mark.parametrize("name", ["gpt-like", "resnet-like", "even-mlp"])
def test_offloaded_training_on_the_threaded_engine_is_bitwise_equal(name, duplex):
    base, x, prof = profiled(name)
    assert prof.chain.length >= 10
    eng = ThreadedEngine(delay=(0.0, 0.002), seed=3 * len(name) + duplex)
    moved_units = set()
    for label, platform, schedule in schedules(name, duplex):
        assert schedule.offloaded_units, label
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        with use_engine(eng):
            off = ct.Offloader(model, prof.chain, schedule, platform=platform)
        assert off.pool.engine is eng
        train_against_copy(model, x, ref)
        stats = off.last_step
        assert off._run.copier.engine is eng
        assert stats.offloaded_bytes == schedule.offloaded_bytes(prof.chain) == stats.prefetched_bytes > 0, label
        assert stats.unit_offloaded == {u: int(prof.chain.saved[u - 1]) for u in schedule.offloaded_units}, label
        assert stats.restored_reads > 0 and off.pool.in_use == 0
        moved_units.update(schedule.offloaded_units)
        off.remove()
    assert len(moved_units) >= 2
    assert not eng.violations
    assert eng.late > 0.5 * eng.copies > 0  # most copies had not run when the host went on


def test_a_prefetch_during_the_forward_hands_its_buffer_to_a_later_offload():
    """P_1 is triggered at the end of F_2, so its host buffer goes back to the pool while its
    copy may still be queued, and O_3, at the end of F_3, takes that same buffer: only the
    buffer's guard orders the D2H write after the H2D read."""
    base, x, prof = profiled("even-mlp")
    chain = prof.chain
    assert len({int(s) for s in chain.saved[1:9]}) == 1  # units 2..9: one size class
    sched = co.Schedule.keep_all(chain.length)
    f = {s: sched.index("F", s) for s in range(1, chain.length + 1)}
    b = {s: sched.index("B", s) for s in range(1, chain.length + 1)}
    transfers = []
    for u in (2, 4, 6):
        transfers += [co.Transfer("offload", u, f[u], "end"), co.Transfer("prefetch", u, f[u + 1], "end")]
    for u in (3, 5, 7):
        transfers += [co.Transfer("offload", u, f[u], "end"), co.Transfer("prefetch", u, b[u + 1], "start")]
    # At one event the prefetch goes first, so that its buffer is back before the offload takes one.
    schedule = co.Schedule(sched.compute, tuple(sorted(transfers, key=lambda t: (t.event, t.kind == "offload"))))
    for duplex in (True, False):
        eng = slow()
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        with use_engine(eng):
            off = ct.Offloader(model, chain, schedule, platform=prof.platform.replace(duplex=duplex).with_memory(2**62))
        train_against_copy(model, x, ref)
        assert off.last_step.offloaded_bytes == schedule.offloaded_bytes(chain)
        assert off.pool.made == 3  # the buffers of 2, 4, 6 came back and served 3, 5, 7
        assert not eng.violations and eng.late > 0


class Boom(TanhLayer):
    def __init__(self, d):
        super().__init__(d)
        self.fail = False

    def forward(self, x):
        if self.fail:
            raise ValueError("boom")
        return super().forward(x)


def test_a_forward_that_fails_with_copies_in_flight_leaves_no_copy_behind():
    torch.manual_seed(0)
    d = 24
    base = nn.Sequential(nn.Linear(6, d), *[TanhLayer(d) for _ in range(3)], Boom(d), nn.Linear(d, 3))
    x = torch.randn(5, 6)
    prof = ct.profile_full(base, x, repeats=1, warmup=0)
    chain = prof.chain
    units = [u for u in range(1, chain.length)]
    schedule = plan_transfers(chain, prof.platform.with_memory(2**62), units)
    eng = slow()
    model, ref = copy.deepcopy(base), copy.deepcopy(base)
    with use_engine(eng):
        off = ct.Offloader(model, chain, schedule, platform=prof.platform.with_memory(2**62))
    model[4].fail = True  # O_4 is queued at the end of F_4, then F_5 raises
    with pytest.raises(ValueError, match="boom"):
        model(x)
    assert off.pool.in_use == 0 and off.live_entries() == 0
    model[4].fail = False
    train_against_copy(model, x, ref, steps=2)
    assert not eng.violations


# -- the adapter's own tests on the threaded engine ------------------------------------------------------

ADAPTER_TESTS = {
    "bitwise-transformer-f32": lambda mp: tte.test_training_is_bitwise_equal_and_moves_what_the_schedule_says("transformer", torch.float32),
    "bitwise-cnn-bf16": lambda mp: tte.test_training_is_bitwise_equal_and_moves_what_the_schedule_says("cnn", torch.bfloat16),
    "host-copy-is-read": lambda mp: tte.test_the_backward_really_reads_the_host_copy(mp, "transformer", "act"),
    "before-waits-late-prefetch": lambda mp: tte.test_before_waits_and_late_prefetch_still_train_exactly(),
    "no-platform-context-manager": lambda mp: tte.test_release_without_platform_and_context_manager_form(),
    "exception-in-backward": lambda mp: tte.test_exception_in_backward_leaves_no_hooks_or_buffers(),
    "second-forward": lambda mp: tte.test_a_second_forward_abandons_the_first_with_a_clear_error(),
    "views": lambda mp: tte.test_views_and_non_contiguous_tensors_move_once_and_come_back_exactly(),
    "no-memory-growth": lambda mp: tte.test_no_memory_growth_over_50_steps(),
    "one-liner": lambda mp: tte.test_offload_one_liner_fits_a_smaller_memory_and_trains_exactly(),
    "act-alone-cnn": lambda mp: ttg.test_act_alone_trains_exactly_and_moves_only_the_outputs("cnn"),
}


@pytest.mark.parametrize("which", list(ADAPTER_TESTS))
def test_adapter_tests_pass_on_the_threaded_engine(which, monkeypatch):
    eng = ThreadedEngine(delay=(0.0, 0.002), seed=7)
    with use_engine(eng):
        ADAPTER_TESTS[which](monkeypatch)
    assert eng.copies > 0 and eng.late > 0 and not eng.violations


class DropBlock(nn.Module):
    """Linear, batch norm, tanh, dropout, linear, residual: RNG and running statistics that a
    recomputation must reproduce and leave as one forward leaves them."""

    def __init__(self, d):
        super().__init__()
        self.l1 = nn.Linear(d, 2 * d)
        self.bn = nn.BatchNorm1d(2 * d)
        self.l2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.l2(torch.nn.functional.dropout(torch.tanh(self.bn(self.l1(x))), 0.3, self.training))


def recomputing_schedules(chain, platform):
    """A hand-made schedule that checkpoints every block but the last and sends two instances to
    the host and back: the lone a_3 that Fck_3 made (read by the recomputation that starts from
    it) and the whole unit 5 its recomputed F_5 made (read by B_5); and joint's plan at the least
    memory it fits on a fast link."""
    L = chain.length
    comp = [("F", 1)] + [("Fck", i) for i in range(2, L)] + [("F", L), ("B", L)]
    for i in range(L - 1, 1, -1):
        comp += [("F", i), ("B", i)]
    comp.append(("B", 1))
    k_ck3, k_f4 = comp.index(("Fck", 3)), comp.index(("F", 4), L)
    k_f5 = comp.index(("F", 5), L)
    hand = co.Schedule(
        tuple(comp),
        (
            co.Transfer("offload", 3, k_ck3, "end"),
            co.Transfer("offload", 5, k_f5, "end"),
            co.Transfer("prefetch", 5, k_f5, "end", before=k_f5 + 1),
            co.Transfer("prefetch", 3, k_f4 - 2, "end", before=k_f4),
        ),
    )
    fast = platform.replace(bandwidth_d2h=1e15, bandwidth_h2d=1e15, latency=0.0)
    out = [("hand", fast.with_memory(co.keep_all_peak(chain)), hand)]
    floor = chain.stage_memory_floor()
    result = co.solve(chain, fast.with_memory(int(floor + 0.1 * (co.keep_all_peak(chain) - floor))), method="joint")
    assert result.feasible and result.schedule.has_remat and result.schedule.offloaded_units
    out.append(("joint", fast.with_memory(int(result.peak_memory)), result.schedule))
    return out


@pytest.mark.parametrize("duplex", [True, False], ids=["duplex", "half-duplex"])
def test_recomputing_training_on_the_threaded_engine_is_bitwise_equal(duplex):
    """Checkpoints offloaded and prefetched for the recomputations that start from them, on copies
    that run late: every recomputation reads a prefetch it waited for, with the RNG and batch norm
    state of the original call."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), *[DropBlock(32) for _ in range(8)], nn.Linear(32, 4))
    x = torch.randn(16, 16)
    prof = ct.profile_full(base, x, repeats=1, warmup=0)
    eng = ThreadedEngine(delay=(0.0, 0.002), seed=11 + duplex)
    for label, platform, schedule in recomputing_schedules(prof.chain, prof.platform.replace(duplex=duplex)):
        model, ref = copy.deepcopy(base), copy.deepcopy(base)
        with use_engine(eng):
            off = ct.Offloader(model, prof.chain, schedule, platform=platform)
        train_against_copy(model, x, ref)
        stats = off.last_step
        assert stats.recomputed_ops > 0, label
        assert stats.offloaded_bytes == schedule.offloaded_bytes(prof.chain) == stats.prefetched_bytes > 0, label
        assert off.pool.in_use == 0
        off.remove()
    assert not eng.violations
