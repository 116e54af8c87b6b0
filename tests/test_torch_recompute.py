"""The executor carries out recomputation: rotor's and joint's schedules (Fck, Fn, a repeated F, lone
a_i offloaded), bitwise equal to plain training, state changed once, refusals where it cannot."""

import contextlib
import copy
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.bounds import offload_memory_floor  # noqa: E402
from recompute_blocks import ScalesInput, TanhOut  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class Blk(nn.Module):
    """A block with every kind of state a recomputation must get right: dropout (RNG), batch norm
    (running statistics, num_batches_tracked), a saved output (tanh)."""

    def __init__(self, d):
        super().__init__()
        self.l1 = nn.Linear(d, 2 * d)
        self.bn = nn.BatchNorm1d(2 * d)
        self.dp = nn.Dropout(0.3)
        self.l2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.l2(self.dp(torch.tanh(self.bn(self.l1(x)))))


def blocks_model(n=8, d=32, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, d), *[Blk(d) for _ in range(n)], nn.Linear(d, 4)), torch.randn(64, 16)


def train_equal(model, ref, x, handle, steps=3):
    """Train ``model`` (offloaded) and ``ref`` (untouched) side by side with AdamW; every step's loss,
    gradients, buffers and parameters are bitwise equal."""
    oa = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ob = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(steps):
        torch.manual_seed(step)
        la = model(x).square().mean()
        la.backward()
        rng_a = torch.get_rng_state()
        torch.manual_seed(step)
        lb = ref(x).square().mean()
        lb.backward()
        # The RNG after the step is plain training's: the recomputations drew nothing of their own.
        assert torch.equal(rng_a, torch.get_rng_state()), step
        assert torch.equal(la, lb), step
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), step
        assert all(torch.equal(p, q) for p, q in zip(model.buffers(), ref.buffers(), strict=True)), step
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def schedule_for(chain, platform, method, memory):
    result = co.solve(chain, platform.with_memory(memory), method=method)
    assert result.feasible, (method, memory, result.message)
    return result.schedule


@pytest.mark.parametrize("method", ["rotor", "joint", "recompute-all", "sqrt-checkpoint"])
def test_recomputing_schedules_below_the_pure_offloading_floor_train_bitwise_equal(method):
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    floor = offload_memory_floor(chain)
    memory = floor - 1 if method != "sqrt-checkpoint" else co.keep_all_peak(chain) - 1
    schedule = schedule_for(chain, prof.platform, method, memory)
    assert schedule.has_remat
    handle = ct.Offloader(model, chain, schedule, platform=prof.platform.with_memory(memory))
    train_equal(model, ref, x, handle)
    stats = handle.last_step
    recomputes = sum(1 for k, (kind, _) in enumerate(schedule.compute) if kind != "B" and k >= chain.length)
    assert stats.recomputed_ops == recomputes > 0
    assert stats.offloaded_bytes == schedule.offloaded_bytes(chain)
    assert stats.prefetched_bytes == stats.offloaded_bytes
    assert handle.live_entries() == 0
    handle.remove()


def test_a_joint_schedule_that_offloads_lone_checkpoints_moves_act_bytes_alone():
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    L = chain.length
    # Fck every block but the last; a_3 (a lone checkpoint Fck_3 made) goes to the host and back
    # before the recomputation that starts from it.
    comp = [("F", 1)] + [("Fck", i) for i in range(2, L)] + [("F", L), ("B", L)]
    for i in range(L - 1, 1, -1):
        comp += [("F", i), ("B", i)]
    comp.append(("B", 1))
    k_fck3 = comp.index(("Fck", 3))
    k_f4 = comp.index(("F", 4), L)
    schedule = co.Schedule(
        tuple(comp),
        (co.Transfer("offload", 3, k_fck3, "end"), co.Transfer("prefetch", 3, k_f4 - 2, "end", before=k_f4)),
    )
    platform = prof.platform.with_memory(co.keep_all_peak(chain))
    assert co.simulate(chain, platform, schedule).feasible
    handle = ct.Offloader(model, chain, schedule, platform=platform)
    train_equal(model, ref, x, handle)
    assert handle.last_step.unit_offloaded == {3: int(chain.act[3])}
    assert handle.last_step.offloaded_bytes == schedule.offloaded_bytes(chain) == int(chain.act[3])
    assert handle.last_step.restored_reads == 0  # the recomputation read the copy, not autograd


def test_batch_norm_statistics_move_once_where_torch_checkpoint_moves_them_twice():
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    cp = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    torch.manual_seed(0)
    model(x).square().mean().backward()
    torch.manual_seed(0)
    ref(x).square().mean().backward()
    torch.manual_seed(0)
    h = cp[0](x)
    for blk in cp[1:-1]:
        h = torch.utils.checkpoint.checkpoint(blk, h, use_reentrant=False)
    cp[-1](h).square().mean().backward()
    for a, b, c in zip(model[1:-1], ref[1:-1], cp[1:-1], strict=True):
        assert torch.equal(a.bn.running_mean, b.bn.running_mean) and torch.equal(a.bn.running_var, b.bn.running_var)
        assert int(a.bn.num_batches_tracked) == int(b.bn.num_batches_tracked) == 1
        assert int(c.bn.num_batches_tracked) == 2 and not torch.equal(c.bn.running_mean, b.bn.running_mean)


class Counting(nn.Module):
    """A block that changes plain state in its forward and reads it: a recomputation must see the
    value the original call saw, and leave the count as one call left it."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.lin(x)) * (1.0 + 0.1 * self.calls)


def test_a_counter_attribute_moves_once_and_the_recomputation_sees_the_original_value():
    torch.manual_seed(0)
    model = nn.Sequential(*[Counting(16) for _ in range(8)])
    x = torch.randn(4, 16)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    ref = copy.deepcopy(model)  # after profiling, whose forwards count too (a profile's own side effect)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    train_equal(model, ref, x, handle)
    assert [m.calls for m in model] == [m.calls for m in ref]


def test_what_cannot_be_recomputed_is_refused():
    model, x = blocks_model()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    L = chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    # The last block (with the head and the loss) run without saving, or recomputed.
    last_ck = co.Schedule(tuple([("F", i) for i in range(1, L)] + [("Fck", L), ("F", L)] + fixed[L:]))
    with pytest.raises((ValueError, co.ScheduleError), match=f"stage {L}|F_{L}"):
        ct.Offloader(model, chain, last_ck)
    # Without the blocks to call again.
    remat = co.Schedule(tuple([("Fck", 1)] + fixed[1:L] + fixed[L:-1] + [("F", 1), ("B", 1)]))
    with pytest.raises(ValueError, match="blocks"):
        ct.executor.ScheduleRun(chain, remat)


class InPlace(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        x.mul_(0.5)  # its hidden input, changed in place: the checkpoint it would restart from is gone
        return self.lin(x) + 1.0


def test_a_block_that_modifies_its_input_in_place_is_refused_not_recomputed_wrong():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), *[InPlace(16) for _ in range(7)])
    x = torch.randn(4, 16)
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    L = prof.chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    sched = co.Schedule(tuple([("F", 1), ("Fck", 2)] + fixed[2:L] + fixed[L:-2] + [("F", 2), ("B", 2), ("B", 1)]))
    ct.Offloader(model, prof.chain, sched)
    with pytest.raises(RuntimeError, match="modifies its hidden input in place"):
        model(x).square().mean().backward()
    # Plain PyTorch trains it; the refusal is the adapter's, and a plan that keeps it trains equal.
    ref(x).square().mean().backward()


def test_a_block_with_a_forward_pre_hook_of_its_own_is_refused():
    model, x = blocks_model()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    model[3].register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    with pytest.raises(RuntimeError, match="forward pre-hooks of its own"):
        model(x).square().mean().backward()


def test_a_schedule_that_recomputes_from_the_wrong_instance_is_caught():
    """The executor checks which a_{i-1} instance each recomputation reads (the mutation 'recompute
    from the wrong checkpoint' is killed here)."""
    model, x = blocks_model()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    run = handle._run
    k = next(k for k, (kind, i) in enumerate(schedule.compute) if k >= prof.chain.length and kind != "B" and i > 1)
    run.remat.maker_of_read[k] = -5
    with pytest.raises(RuntimeError, match="does not hold"):
        model(x).square().mean().backward()


# -- Hugging Face models, below the pure-offloading floor ----------------------------------------


def hf_model(name, layers=8):
    """A Hugging Face model from a tiny config (``layers`` blocks per stack, dropout on) and a batch."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 32))
    if name == "gpt2":
        config = tf.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=64, n_positions=64, use_cache=False)
        return tf.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}
    if name == "llama":
        config = tf.LlamaConfig(
            num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64, max_position_embeddings=64, use_cache=False, attention_dropout=0.1,
        )
        return tf.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}
    if name == "bert":
        config = tf.BertConfig(
            num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64,
            max_position_embeddings=64, num_labels=3,
        )
        mask = torch.ones_like(ids)
        mask[1, 24:] = 0  # an attention mask the layers take as a keyword argument
        return tf.BertForSequenceClassification(config), {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}
    config = tf.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=layers, num_decoder_layers=layers, num_heads=4,
        dropout_rate=0.1, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
    )
    return tf.T5ForConditionalGeneration(config), {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5"])
def test_hugging_face_models_train_bitwise_equal_with_rotor_and_joint_below_the_pure_offloading_floor(name):
    model, batch = hf_model(name)
    model.train()
    probe = ct.offload(model, batch, memory=1.0, method="best", repeats=1, warmup=0)
    chain, resident = probe.chain, probe.plan.resident_bytes
    below = offload_memory_floor(chain) + resident - 1  # no pure-offloading schedule fits here
    probe.remove()
    ref = copy.deepcopy(model)
    opt_a = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_b = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    step = 0
    for method in ("rotor", "joint"):
        handle = ct.offload(model, batch, memory=below, method=method, repeats=1, warmup=0)
        assert handle.schedule.has_remat and handle.predicted_peak <= below
        for _ in range(3):
            torch.manual_seed(step)
            la = model(**batch).loss
            la.backward()
            torch.manual_seed(step)
            lb = ref(**batch).loss
            lb.backward()
            assert torch.equal(la, lb), (method, step)
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)), (method, step)
            opt_a.step()
            opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()
            step += 1
        assert handle.last_step.recomputed_ops > 0
        assert handle.last_step.offloaded_bytes == handle.plan.offloaded_bytes
        assert "recompute (" in handle.table()
        handle.remove()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def test_offload_chooses_recomputation_below_the_floor_and_pure_offloading_where_it_is_free():
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    probe = ct.offload(model, x, memory=1.0, repeats=1, warmup=0)
    chain = probe.chain
    assert probe.result.method == "best" and not probe.schedule.offloaded_units  # keep-all: nothing to choose
    probe.remove()
    below = offload_memory_floor(chain) - 1
    handle = ct.offload(model, x, memory=below, repeats=1, warmup=0)
    assert handle.result.method in ("rotor", "joint") and handle.schedule.has_remat
    train_equal(model, ref, x, handle)
    handle.remove()
    # Forced: a method that cannot fit says so with the floors.
    with pytest.raises(ValueError, match="no schedule fits"):
        ct.offload(model, x, memory=below, method="best", repeats=1, warmup=0)


def test_a_recomputation_during_the_forward_runs_between_the_blocks():
    """Fck_i then F_i over the lone a_i it made, before F_{i+1} (a shape the core's strategies draw):
    the recomputation runs between block i's end and block i+1's start, and trains equal."""
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    L = prof.chain.length
    comp = [("F", 1), ("F", 2), ("Fck", 3), ("F", 3)] + [("F", i) for i in range(4, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    schedule = co.Schedule(tuple(comp))
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    train_equal(model, ref, x, handle)
    assert handle.last_step.recomputed_ops == 1


def test_a_resnet_with_batch_norm_trains_bitwise_equal_with_rotor_and_joint():
    """A ResNet-18-shaped chain (stem, basic blocks with batch norm, head): rotor's and joint's
    plans, 3 AdamW steps, running statistics included. (On this chain the pure-offloading floor
    is the floor of any schedule, the stem's stage: rotor and joint are run halfway from it to
    the keep-all peak.)"""
    from bench_models import torch_models

    torch.manual_seed(0)
    model, x = torch_models.resnet_like(8, 2, 10), torch.randn(4, 3, 32, 32)
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    below = (floor + probe.plan.keep_all_peak) // 2
    probe.remove()
    for method in ("rotor", "joint"):
        ref = copy.deepcopy(model)
        handle = ct.offload(model, x, memory=below, method=method, repeats=1, warmup=0)
        # joint takes the best of its own, rotor's and pure offloading's plans: here it may move
        # units without recomputing; rotor recomputes.
        assert handle.predicted_peak <= below and (handle.schedule.has_remat or method == "joint")
        train_equal(model, ref, x, handle)
        assert handle.last_step.recomputed_ops > 0 or method == "joint"
        handle.remove()


def test_the_table_says_per_block_recompute_how_many_times_checkpoint_and_offload_a_i_alone():
    model, x = blocks_model()
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    L = prof.chain.length
    # recompute-all: stage i < L runs again L - i times; every a_i but a_{L-1} is a checkpoint.
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    model(x).square().mean().backward()
    rows = {r["stage"]: r["decision"] for r in handle.decisions()}
    for i in range(1, L):
        n = L - i
        assert rows[i].startswith(f"recompute ({n} time{'s' if n > 1 else ''})"), rows[i]
        assert ("checkpoint" in rows[i]) == (i < L - 1), rows[i]
    assert rows[L] == "keep"
    assert "recompute (" in handle.table()
    handle.remove()
    # A lone a_i offloaded: "offload a_i alone".
    comp = [("F", 1)] + [("Fck", i) for i in range(2, L)] + [("F", L), ("B", L)]
    for i in range(L - 1, 1, -1):
        comp += [("F", i), ("B", i)]
    comp.append(("B", 1))
    k3 = comp.index(("Fck", 3))
    sched = co.Schedule(tuple(comp), (co.Transfer("offload", 3, k3, "end"), co.Transfer("prefetch", 3, k3 + 2, "end")))
    handle = ct.Offloader(model, prof.chain, sched, platform=prof.platform.with_memory(co.keep_all_peak(prof.chain)))
    rows = {r["stage"]: r["decision"] for r in handle.decisions()}
    assert rows[3] == "recompute (1 time); offload a_i alone; a_i kept as a checkpoint (recomputations start from it)"
    handle.remove()


def test_a_saved_tensor_modified_in_place_after_a_block_run_without_saving_raises_as_plain_pytorch():
    torch.manual_seed(0)
    model = nn.Sequential(*[TanhOut(8) if i != 4 else ScalesInput(8) for i in range(8)])
    x = torch.randn(4, 8)
    ref = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as plain:
        ref(x).square().mean().backward()
    chain = co.Chain(fwd=[1.0] * 8, bwd=[1.0] * 8, act=[128] * 9, saved=[256] * 8, name="hand")
    L = 8
    # Block 4 (whose tanh output block 5 scales in place) runs as Fck and is recomputed before B_4.
    comp = [("F", 1), ("F", 2), ("F", 3), ("Fck", 4)] + [("F", i) for i in range(5, L + 1)]
    comp += [("B", i) for i in range(L, 4, -1)] + [("F", 4), ("B", 4), ("B", 3), ("B", 2), ("B", 1)]
    ct.Offloader(model, chain, co.Schedule(tuple(comp)))
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as ours:
        model(x).square().mean().backward()
    assert str(plain.value).split(" is at version")[0] in str(ours.value)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_recomputation_runs_under_the_autocast_state_of_the_original_call(where):
    """Trained under torch.autocast (bfloat16 on CPU): the recomputations in the backward, where
    autocast is off, must compute what the forward computed, in its dtypes. ``backward``: the
    forward without autocast and the backward called under it (which changes nothing of plain
    training's backward): the recomputations must run without it, as their forwards did."""
    model, x = blocks_model()
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    handle = ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    fwd = torch.autocast("cpu", dtype=torch.bfloat16) if where == "forward" else contextlib.nullcontext()
    bwd = torch.autocast("cpu", dtype=torch.bfloat16) if where == "backward" else contextlib.nullcontext()
    for step in range(2):
        torch.manual_seed(step)
        with fwd:
            la = model(x).float().square().mean()
        with bwd:
            la.backward()
        torch.manual_seed(step)
        with fwd:
            lb = ref(x).float().square().mean()
        with bwd:
            lb.backward()
        assert torch.equal(la, lb)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
        assert handle.last_step.recomputed_ops > 0
    handle.remove()


# -- state a block's arguments carry (a key/value cache, a list it appends to) ----------------------


# Blocks given a key/value cache (Falcon's and Whisper's, with transformers' default use_cache=True)
# are recomputed with the cache's state put back: tests/test_torch_recompute_cache.py.


class Logs(nn.Module):
    """A block that appends to a list its caller gives it (a log, a list of features)."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, log):
        y = x + torch.tanh(self.lin(x))
        log.append(y.detach().sum())
        return y


class LogsModel(nn.Module):
    def __init__(self, n=8, d=16):
        super().__init__()
        self.stem = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Logs(d) for _ in range(n))
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        log = []
        h = self.stem(x)
        for b in self.blocks:
            h = b(h, log)
        return self.head(h) + 0 * torch.stack(log).sum()


def test_a_block_that_appends_to_a_list_it_is_given_is_never_recomputed():
    torch.manual_seed(0)
    model, x = LogsModel(), torch.randn(32, 8)
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    probe.remove()
    banned = ct.offload(model, x, memory=floor, repeats=1, warmup=0)
    reasons = banned.plan.not_recomputable
    assert sum("changes an argument it is given" in why for why in reasons.values()) >= 7
    assert not banned.schedule.has_remat
    ref = copy.deepcopy(model)
    train_equal(model, ref, x, banned)
    banned.remove()
    with pytest.raises(ValueError, match="changes an argument it is given"):
        ct.offload(model, x, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    # A schedule given by hand: the executor sees the list changed since the call it would repeat.
    prof = ct.profile_full(model, x, repeats=1, warmup=0, blocks="blocks")
    L = prof.chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    sched = co.Schedule(tuple([("F", 1), ("Fck", 2)] + fixed[2:L] + fixed[L:-2] + [("F", 2), ("B", 2), ("B", 1)]))
    ct.Offloader(model, prof.chain, sched, blocks=prof.blocks)
    with pytest.raises(RuntimeError, match="changed after its forward read them"):
        model(x).square().mean().backward()


class Flaky(nn.Module):
    """Raises when called again after the test arms it (a recomputation that fails)."""

    armed = False

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        if Flaky.armed:
            raise ValueError("boom")
        return x + torch.tanh(self.lin(x))


def test_a_recomputation_that_fails_says_what_happened_and_what_to_do():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), *[Flaky(16) for _ in range(8)], nn.Linear(16, 2))
    x = torch.randn(4, 8)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    schedule = schedule_for(prof.chain, prof.platform, "recompute-all", co.keep_all_peak(prof.chain))
    ct.Offloader(model, prof.chain, schedule, platform=prof.platform)
    loss = model(x).square().mean()
    Flaky.armed = True
    try:
        with pytest.raises(RuntimeError, match=r"recomputing block \d+ .*failed: ValueError: boom.*method='best'"):
            loss.backward()
    finally:
        Flaky.armed = False


def test_checkpointing_what_the_executor_can_recompute_is_a_candidate_of_every_recomputing_method():
    """At the memory checkpoint-all with the banned stages kept whole holds, a method's plan is never
    slower than it: where the method found nothing (or something slower), that schedule is the plan."""
    from chainoffload.solvers.remat_baselines import checkpoint_all_schedule
    from chainoffload_torch.plans import _checkpointing_if_faster

    chain = co.Chain(
        fwd=[1.0] * 6, bwd=[2.0] * 6, act=[10, 10, 10, 10, 10, 10, 10], saved=[50, 30, 30, 30, 30, 30],
    )
    banned = {1: "the code before the first block", 6: "the last block"}
    ck = checkpoint_all_schedule(6, whole={1})
    free = co.Platform(memory=2**40, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    tl = co.simulate(chain, free, ck)
    platform = free.with_memory(tl.peak_memory)
    nothing = co.Result("rotor", co.Status.INFEASIBLE, None, min_memory=tl.peak_memory + 1)
    got = _checkpointing_if_faster(chain, platform, nothing, banned)
    assert got.feasible and got.schedule == ck and got.makespan == tl.makespan and got.min_memory is None
    assert ("Fck", 1) not in got.schedule.compute and got.schedule.compute.count(("F", 1)) == 1
    # A faster plan that fits stays; below the checkpointing peak nothing changes.
    keep_all = co.Schedule(tuple([("F", i) for i in range(1, 7)] + [("B", i) for i in range(6, 0, -1)]))
    fast = co.Result("rotor", co.Status.FEASIBLE, keep_all, makespan=18.0)
    roomy = free.with_memory(co.keep_all_peak(chain))
    assert _checkpointing_if_faster(chain, roomy, fast, banned) is fast
    assert _checkpointing_if_faster(chain, free.with_memory(tl.peak_memory - 1), nothing, banned) is nothing


# -- a recomputed Fck / Fn runs without autograd on CPU (NOTE [ what an Fck or Fn costs ]) --------


def _grad_modes(model):
    """Wrappers of the blocks' forwards that log, per block call, (block, whether grad mode was
    on), and their undoers. Not forward hooks: a recomputation that stops at its last saved
    tensor never reaches them (NOTE [ a recomputation stops at its last saved tensor ]); nor
    pre-hooks, which a recomputed block must not have."""
    log = []

    def logged(b, forward):
        def run(*args, **kwargs):
            log.append((b, torch.is_grad_enabled()))
            return forward(*args, **kwargs)
        return run

    class Undo:
        def __init__(self, m):
            self.m = m

        def remove(self):
            del self.m.forward

    for b, m in enumerate(model, start=1):
        m.forward = logged(b, m.forward)
    return log, [Undo(m) for m in model]


def _reforwards(schedule, length):
    """Per step: the Fck / Fn ops after the forward (recomputations that keep nothing), and the F ones."""
    seen, nosave, saving = set(), 0, 0
    for kind, i in schedule.compute:
        if kind == "B":
            continue
        if i in seen:
            nosave += kind != "F"
            saving += kind == "F"
        seen.add(i)
    return nosave, saving


def test_a_recomputed_fck_or_fn_runs_without_autograd_on_cpu_and_trains_bitwise_equal():
    """recompute-all re-runs every block from a_0 before each backward: the Fck / Fn among those
    re-runs keep nothing and run under no_grad on CPU, the F ones with autograd; dropout masks,
    batch norm statistics, losses, gradients and AdamW's parameters stay plain PyTorch's."""
    model, x = blocks_model(n=6)
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    schedule = schedule_for(chain, prof.platform, "recompute-all", offload_memory_floor(chain) - 1)
    nosave, saving = _reforwards(schedule, chain.length)
    assert nosave > 0 and saving > 0
    handle = ct.Offloader(model, chain, schedule, platform=prof.platform.with_memory(offload_memory_floor(chain) - 1))
    log, hooks = _grad_modes(model)
    train_equal(model, ref, x, handle)
    for h in hooks:
        h.remove()
    steps = 3
    # The forward's own calls (one per block per step) run with autograd; so do the recomputed F.
    assert sum(1 for _, on in log if not on) == steps * nosave
    assert sum(1 for _, on in log if on) == steps * (chain.length + saving)
    handle.remove()


class FoldsByRequiresGrad(nn.Module):
    """ATen's matmul folds a batched operand into one mm when the other operand requires grad and
    runs bmm otherwise, and scaled_dot_product_attention picks its kernel from its inputs: under
    no_grad the activations here require no grad, so the recomputation takes the other path. On
    CPU the bits must not change (NOTE [ what an Fck or Fn costs ])."""

    def __init__(self, d, t):
        super().__init__()
        self.mix = nn.Linear(d, t)
        self.qkv = nn.Linear(d, 3 * d)
        self.dp = nn.Dropout(0.2)
        self.out = nn.Linear(d, d)

    def forward(self, x):  # x: (batch, t, d)
        w = torch.tanh(self.mix(x.mean(0)))  # (t, t): an activation, requires grad with autograd on
        h = torch.matmul(x.transpose(1, 2), w)  # (batch, d, t) non-contiguous @ (t, t)
        h = h.transpose(1, 2)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        a = nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        return x + self.out(self.dp(a))


def test_a_no_grad_recomputation_is_bitwise_where_kernels_are_chosen_by_requires_grad():
    torch.manual_seed(0)
    d, t = 24, 10
    model = nn.Sequential(nn.Linear(d, d), *[FoldsByRequiresGrad(d, t) for _ in range(5)], nn.Linear(d, 3))
    x = torch.randn(4, t, d)
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, x, repeats=1, warmup=0)
    chain = prof.chain
    schedule = schedule_for(chain, prof.platform, "recompute-all", offload_memory_floor(chain) - 1)
    assert _reforwards(schedule, chain.length)[0] > 0
    handle = ct.Offloader(model, chain, schedule, platform=prof.platform.with_memory(offload_memory_floor(chain) - 1))
    train_equal(model, ref, x, handle)
    assert handle.last_step.recomputed_ops > 0
    handle.remove()


# -- copies that do not overlap compute (NOTE [ copies on CPU ]) -------------------------------


def test_where_copies_do_not_overlap_compute_offload_chooses_by_compute_plus_copies():
    """A chain whose units are large beside a slow link: overlapped, offloading hides its copies
    (best or joint wins); counted inline, as on CPU, the same copies cost more than recomputing,
    and rotor, which moves nothing, wins. The step time chosen by is the simulator's either way."""
    import types

    from chainoffload_torch.plans import solve_for, step_time

    L = 6
    chain = co.Chain(fwd=[1.0] * L, bwd=[2.0] * L, act=[1] * (L + 1), saved=[100] * L)
    sizes = types.SimpleNamespace(resident=set(), aliased=(), unmovable={}, held=set(), held_why={}, resident_bytes=0)
    blocks = types.SimpleNamespace(modules=[None] * L, prefix=False, is_linked=lambda b: True, unsafe={})
    for share in (0.4, 0.6, 0.75):
        platform = co.Platform(memory=int(share * co.keep_all_peak(chain)), bandwidth_d2h=100 / 0.9, bandwidth_h2d=100 / 0.9)
        over = solve_for(chain, platform, None, (), sizes, {}, blocks=blocks, overlap=True)
        inline = solve_for(chain, platform, None, (), sizes, {}, blocks=blocks, overlap=False)
        t_over, t_inline = co.simulate(chain, platform, over.schedule), co.simulate(chain, platform, inline.schedule)
        assert over.schedule.offloaded_units and not inline.schedule.offloaded_units, share
        assert inline.method == "rotor" and inline.schedule.has_remat
        # Overlapped, the offloading plan is faster; inline, it is slower than what was chosen.
        assert step_time(t_over, True) < step_time(t_inline, True)
        assert step_time(t_inline, False) < step_time(t_over, False) == t_over.serial_makespan
        assert t_over.serial_makespan > t_over.makespan  # its copies, counted


def test_on_cpu_the_plan_predicts_compute_plus_copies_and_the_table_says_copies_do_not_overlap():
    model, x = blocks_model()
    probe = ct.offload(model, x, memory=1.0, repeats=1, warmup=0)
    peak = probe.plan.keep_all_peak
    probe.remove()
    handle = ct.offload(model, x, memory=int(0.6 * peak), method="best", repeats=1, warmup=0)
    plan = handle.plan
    assert plan.overlap is False and plan.schedule.offloaded_units
    timeline = co.simulate(plan.chain, plan.platform, plan.schedule)
    assert plan.makespan == timeline.serial_makespan > timeline.makespan
    table = handle.table()
    assert "a copy does not overlap compute" in table and f"simulated step: {timeline.serial_makespan:.6g} s" in table
    handle.remove()
    # A plan given by hand on CPU predicts the same way, whatever link its platform states.
    hand = ct.Offloader(model, plan.chain, plan.schedule, platform=plan.platform)
    assert hand.plan.overlap is False and hand.plan.makespan == timeline.serial_makespan
    hand.remove()
class ViewOut(nn.Module):
    """Returns a view of its linear's output; ``inplace``: starts with ``relu_`` on its input, so
    the view the block before returned is modified in place (its history rebased on its base)."""

    def __init__(self, d, inplace):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.inplace = inplace

    def forward(self, x):
        if self.inplace:
            x = x.relu_()
        return self.lin(x).view(x.shape)


def test_a_block_whose_output_view_a_later_block_modifies_in_place_is_never_recomputed():
    # An in-place op on a view sends the gradient to the base's node in the block's graph, around
    # the output's node and the tensor hook on it that marks when the recomputation runs: the
    # backward would read the block's saved tensors before any recomputation filled them.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), *[ViewOut(16, inplace=i == 4) for i in range(9)], nn.Linear(16, 4))
    x = torch.randn(4, 16)
    ref = copy.deepcopy(model)
    handle = ct.offload(model, x, memory=0.7, method="rotor", repeats=1, warmup=0)
    banned = handle.plan.not_recomputable
    why = "its output is a view that later code modifies in place"
    off = int(handle.blocks.prefix)
    mods = handle.blocks.modules
    # The block before the one that starts with relu_ (1-based block b, stage b + off).
    viewed = {b + off for b in range(1, len(mods)) if getattr(mods[b], "inplace", False)}
    assert len(viewed) == 1 and {s for s, w in banned.items() if why in w} == viewed
    assert handle.schedule.has_remat  # the others are recomputed
    assert why in handle.table()
    train_equal(model, ref, x, handle)
    handle.remove()


def test_a_hand_given_schedule_that_recomputes_such_a_block_raises_and_says_what_to_do():
    torch.manual_seed(0)
    model = nn.Sequential(*[ViewOut(8, inplace=i == 4) for i in range(8)])
    x = torch.randn(4, 8)
    chain = co.Chain(fwd=[1.0] * 8, bwd=[1.0] * 8, act=[128] * 9, saved=[256] * 8, name="hand")
    L = 8
    # Block 4, whose output view block 5 modifies in place, runs as Fck and is recomputed at B_4.
    comp = [("F", 1), ("F", 2), ("F", 3), ("Fck", 4)] + [("F", i) for i in range(5, L + 1)]
    comp += [("B", i) for i in range(L, 4, -1)] + [("F", 4), ("B", 4), ("B", 3), ("B", 2), ("B", 1)]
    ct.Offloader(model, chain, co.Schedule(tuple(comp)))
    with pytest.raises(RuntimeError, match="view that later code modifies in place.*let offload\\(\\) plan"):
        model(x).square().mean().backward()
