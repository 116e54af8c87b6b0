"""Blocks given a key/value cache are recomputed, with the cache's state put back around the
recomputation (NOTE [ state a recomputation puts back ] in _recompute.py): decoders trained with
transformers' default use_cache=True and encoder-decoders with an EncoderDecoderCache train bitwise
equal below the pure-offloading floor, the returned cache holds the same tensors, and a cache a
recomputation cannot put back (tensors written in place, no __dict__) is never recomputed, saying why."""

import copy
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
from torch import nn  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.bounds import offload_memory_floor  # noqa: E402
from chainoffload_torch._recompute import ObjectState, argument_state, state_call_ended  # noqa: E402
from chainoffload_torch._saved import Kept  # noqa: E402
from chainoffload_torch._tree import held_tensors  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("torch_one_thread"),
    pytest.mark.filterwarnings("ignore:chainoffload_torch. the model's output holds"),
]

def _ids():
    torch.manual_seed(0)
    return torch.randint(0, 64, (2, 32))


def decoder(name):
    """A tiny decoder of 8 layers, random weights, use_cache left at its default (True), dropout
    on wherever the config has one."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64, max_position_embeddings=64)
    if name == "gpt2":
        config = tf.GPT2Config(n_layer=8, n_embd=32, n_head=4, vocab_size=64, n_positions=64)  # dropouts 0.1 by default
        cls = tf.GPT2LMHeadModel
    elif name == "llama":
        config, cls = tf.LlamaConfig(num_hidden_layers=8, num_key_value_heads=2, attention_dropout=0.1, **small), tf.LlamaForCausalLM
    elif name == "mistral":
        config = tf.MistralConfig(num_hidden_layers=8, num_key_value_heads=2, attention_dropout=0.1, sliding_window=16, **small)
        cls = tf.MistralForCausalLM
    elif name == "qwen2":
        config, cls = tf.Qwen2Config(num_hidden_layers=8, num_key_value_heads=2, attention_dropout=0.1, **small), tf.Qwen2ForCausalLM
    elif name == "opt":
        config = tf.OPTConfig(
            num_hidden_layers=8, hidden_size=32, ffn_dim=64, num_attention_heads=4, vocab_size=64, word_embed_proj_dim=32,
            max_position_embeddings=64, dropout=0.1, attention_dropout=0.1,
        )
        cls = tf.OPTForCausalLM
    elif name == "gpt-neox":
        config = tf.GPTNeoXConfig(num_hidden_layers=8, attention_dropout=0.1, hidden_dropout=0.1, **small)
        cls = tf.GPTNeoXForCausalLM
    elif name == "falcon":
        config = tf.FalconConfig(
            num_hidden_layers=8, hidden_size=32, num_attention_heads=4, vocab_size=64, attention_dropout=0.1, hidden_dropout=0.1,
        )
        cls = tf.FalconForCausalLM
    elif name == "gemma":
        config = tf.GemmaConfig(num_hidden_layers=8, num_key_value_heads=2, head_dim=8, attention_dropout=0.1, **small)
        cls = tf.GemmaForCausalLM
    else:
        raise ValueError(name)
    model = cls(config)
    model.train()
    assert model.config.use_cache
    ids = _ids()
    return model, {"input_ids": ids, "labels": ids}


def encoder_decoder(name):
    """T5 or Whisper, 8 encoder and 8 decoder layers, dropout on: in training their decoder layers
    take an EncoderDecoderCache (BART's, in this transformers, take none)."""
    torch.manual_seed(0)
    if name == "t5":
        config = tf.T5Config(
            num_layers=8, num_decoder_layers=8, d_model=32, d_ff=64, d_kv=8, num_heads=4, vocab_size=64, decoder_start_token_id=0,
            dropout_rate=0.1,
        )
        model = tf.T5ForConditionalGeneration(config)
        batch = {"input_ids": _ids(), "labels": torch.randint(0, 64, (2, 16))}
    else:
        config = tf.WhisperConfig(
            encoder_layers=8, decoder_layers=8, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, vocab_size=64, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
            dropout=0.1, attention_dropout=0.1,
        )
        config.pad_token_id = config.decoder_start_token_id = 1
        config.bos_token_id = config.eos_token_id = 2
        model = tf.WhisperForConditionalGeneration(config)
        torch.manual_seed(1)
        batch = {"input_features": torch.randn(2, 8, 32), "labels": torch.randint(0, 64, (2, 16))}
    model.train()
    assert model.config.use_cache
    return model, batch


def floor_of(model, batch):
    """The pure-offloading floor of a whole step (no schedule without recomputation fits below)."""
    probe = ct.offload(model, batch, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    probe.remove()
    return floor


def cache_tensors(out):
    return list(held_tensors(out.past_key_values, depth=8))


def train_equal_with_cache(model, ref, batch, handle, steps=3):
    """``steps`` AdamW steps of both: losses, gradients, weights and every tensor of the returned
    cache ``torch.equal``; returns the number of cache tensors compared."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    n = 0
    for step in range(steps):
        torch.manual_seed(step)
        out = model(**batch)
        out.loss.backward()
        torch.manual_seed(step)
        want = ref(**batch)
        want.loss.backward()
        assert torch.equal(out.loss, want.loss), step
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad), step
        got, expected = cache_tensors(out), cache_tensors(want)
        assert len(got) == len(expected) > 0 and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), step
        n = len(got)
        assert handle.last_step.recomputed_ops > 0
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    return n


def recomputed_rows(handle, part=""):
    return [r for r in handle.decisions() if part in r["module"] and r["decision"].startswith("recompute")]


# -- 1. decoders with their default cache ------------------------------------------------------------


@pytest.mark.parametrize(
    "name, method",
    [("gpt2", "rotor"), ("llama", "joint"), ("mistral", "rotor"), ("qwen2", "joint"), ("opt", "rotor"), ("gpt-neox", "joint"),
     ("falcon", "rotor"), ("gemma", "joint")],
)
def test_a_decoder_with_its_default_cache_recomputes_below_the_offloading_floor_bitwise_equal(name, method):
    model, batch = decoder(name)
    ref = copy.deepcopy(model)
    floor = floor_of(model, batch)
    handle = ct.offload(model, batch, memory=floor - 1, method=method, repeats=1, warmup=0)
    assert handle.schedule.has_remat
    table = handle.table()
    assert "never recomputed" not in table and "Cache" not in table
    # Layers that take the cache (every one does) are recomputed, the last (the head's) excepted.
    rows = recomputed_rows(handle)
    assert rows and all(r["stage"] < 8 for r in rows)
    assert train_equal_with_cache(model, ref, batch, handle) == len(cache_tensors(ref(**batch)))
    handle.remove()


@pytest.mark.parametrize("name", ["t5", "whisper"])
def test_an_encoder_decoder_recomputes_its_decoder_layers_given_an_encoder_decoder_cache(name):
    model, batch = encoder_decoder(name)
    ref = copy.deepcopy(model)
    # The decoder's layers take an EncoderDecoderCache: its self-attention cache and the
    # cross-attention's keys and values, cached at the first call (is_updated).
    captured = []
    first = model.decoder.block[0] if name == "t5" else model.model.decoder.layers[0]
    hook = first.register_forward_pre_hook(lambda m, a, kw: captured.append((*a, *kw.values())), with_kwargs=True)
    model(**batch)
    hook.remove()
    assert any(isinstance(v, tf.EncoderDecoderCache) for v in captured[0])
    floor = floor_of(model, batch)
    handle = ct.offload(model, batch, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    assert handle.schedule.has_remat and "never recomputed: takes" not in handle.table()
    assert recomputed_rows(handle, "decoder.")
    train_equal_with_cache(model, ref, batch, handle)
    handle.remove()


def test_the_backward_reads_the_cache_s_own_tensors_not_the_recomputed_twins():
    """A recomputation makes every key and value again; the backward reads the cache's own tensors
    (views of their storages, as plain training does), so the twins die with the recomputation."""
    model, batch = decoder("gpt2")
    floor = floor_of(model, batch)
    handle = ct.offload(model, batch, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    run = handle._run
    torch.manual_seed(0)
    out = model(**batch)
    slots = {i: list(v) for i, v in run._step.slots.items()}
    cache = {StorageWeakRef(t.untyped_storage()).cdata for t in cache_tensors(out)}
    out.loss.backward()
    assert len(slots) >= 4
    for i, saved in slots.items():
        tensors = [s.record.tensor for s in saved if isinstance(s.record, Kept)]
        # Its attention saved its values (its keys it copies as it transposes them): the cache's own.
        assert sum(StorageWeakRef(t.untyped_storage()).cdata in cache for t in tensors) >= 1, i
    handle.remove()


# -- 2. the memory the plan predicts -------------------------------------------------------------------


from test_torch_coverage import _memory_at, _Storages  # noqa: E402


def _over_at_every_op(model, batch, handle):
    """(op, "start" / "end", live bytes - predicted bytes) at the start of every op of the plan
    (the forward, every recomputation, every backward op) and at the end of every recomputation
    (against the memory at its start: what it allocated, before what its end frees). Predicted:
    the simulated memory plus what stays resident outside the chain. The model has trained a step
    before, so that the .grad of every weight exists (outside the chain, as in docs/model.md)."""
    plan = handle.plan
    model(**batch).loss.backward()
    tl = co.simulate(plan.chain, plan.platform, plan.schedule)
    run = handle._run
    track = _Storages()
    seen = []
    fire, recompute = run._fire, run._recompute

    def predicted(k):
        return _memory_at(tl, float(tl.op_start[k])) + plan.resident_bytes

    def spy(step, event):
        k, end = divmod(event, 2)
        if not end:
            seen.append((plan.schedule.op_name(k), "start", track.live() - predicted(k)))
        fire(step, event)

    def after(step, k):
        recompute(step, k)
        seen.append((plan.schedule.op_name(k), "end", track.live() - predicted(k)))

    run._fire, run._recompute = spy, after
    try:
        with track:
            torch.manual_seed(0)
            out = model(**batch)
            out.loss.backward()
            del out
    finally:
        del run._fire, run._recompute
    return seen


@pytest.mark.parametrize("name", ["gpt2", "mistral"])
def test_the_prediction_holds_at_every_op_of_a_plan_that_recomputes_layers_given_the_cache(name):
    """The bytes alive at the start of every forward op and recomputation are at most the
    prediction: what the cache holds that no unit owns (the keys autograd does not save) counts
    from the forward on. At the end of a recomputation, no more above the memory at its start
    than the same model's recomputing plan without the cache (use_cache=False) is: the cache's
    twins die with the recomputation, and while it runs restore_tmp charges them. (A
    recomputation runs in the backward's hook, before the backward op before it lets go of its
    last transient, which CPU does not measure: bwd_tmp is 0 there; a gap of recomputation's own.)
    At the start of a backward op, no more than the same model's pure-offloading plan is (the same
    unmeasured transient)."""
    model, batch = decoder(name)
    floor = floor_of(model, batch)
    best = ct.offload(model, batch, memory=floor, method="best", repeats=1, warmup=0)
    gap_b = max(0, max(over for op, _, over in _over_at_every_op(model, batch, best) if op.startswith("B_")))
    best.remove()
    plain = {**batch, "use_cache": False}
    without = ct.offload(model, plain, memory=floor_of(model, plain) - 1, method="rotor", repeats=1, warmup=0)
    gap_end = max(0, max(over for _, at, over in _over_at_every_op(model, plain, without) if at == "end"))
    without.remove()
    handle = ct.offload(model, batch, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    plan = handle.plan
    assert handle.schedule.has_remat and any(plan.sizes.restore_tmp)
    assert all(int(f) >= int(r) for f, r in zip(plan.chain.fwd_tmp, plan.sizes.restore_tmp, strict=True))
    seen = _over_at_every_op(model, batch, handle)
    assert sum(1 for _, at, _ in seen if at == "end") >= 4
    over = [s for s in seen if s[2] > (gap_b if s[0].startswith("B_") else gap_end if s[1] == "end" else 0)]
    assert not over, (gap_b, gap_end, over)
    handle.remove()


# -- 3. state a recomputation cannot put back -----------------------------------------------------------


class InPlaceCache:
    """A cache with preallocated keys, written in place (as transformers' StaticCache writes them)."""

    def __init__(self, n, shape):
        self.keys = torch.zeros(n, *shape)


class SlotsCache:
    __slots__ = ("keys",)

    def __init__(self):
        self.keys = []


class ListCache:
    """A cache that appends its layers' keys, as a DynamicCache does."""

    def __init__(self):
        self.keys = []


class CachedBlock(nn.Module):
    def __init__(self, d, i):
        super().__init__()
        self.i = i
        self.k = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Dropout(0.2), nn.Linear(4 * d, d))

    def forward(self, x, cache):
        k = self.k(x)
        if isinstance(cache, InPlaceCache):
            cache.keys[self.i].copy_(k)  # in place: the state before the call is gone
            k = cache.keys[self.i]
        else:
            cache.keys.append(k)
        return x + self.mlp(torch.tanh(k) * x)


class CachedModel(nn.Module):
    def __init__(self, kind, n=8, d=32):
        super().__init__()
        self.kind = kind
        self.stem = nn.Linear(16, d)
        self.blocks = nn.ModuleList(CachedBlock(d, i) for i in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        h = self.stem(x)
        cache = {"inplace": lambda: InPlaceCache(len(self.blocks), h.shape), "slots": SlotsCache, "list": ListCache}[self.kind]()
        for b in self.blocks:
            h = b(h, cache)
        return self.head(h), cache


def _cached(kind):
    torch.manual_seed(0)
    return CachedModel(kind), torch.randn(64, 16)


def _loss(model, x, seed):
    torch.manual_seed(seed)
    out, cache = model(x)
    return out.square().mean(), cache


def test_a_cache_of_its_own_that_appends_is_put_back_and_recomputed_bitwise_equal():
    model, x = _cached("list")
    ref = copy.deepcopy(model)
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    probe.remove()
    handle = ct.offload(model, x, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    assert handle.schedule.has_remat and "never recomputed: takes" not in handle.table()
    for step in range(3):
        la, ca = _loss(model, x, step)
        la.backward()
        lb, cb = _loss(ref, x, step)
        lb.backward()
        assert torch.equal(la, lb) and len(ca.keys) == len(cb.keys) == 8
        assert all(torch.equal(a, b) for a, b in zip(ca.keys, cb.keys, strict=True))
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
        assert handle.last_step.recomputed_ops > 0
        model.zero_grad()
        ref.zero_grad()
    handle.remove()


@pytest.mark.parametrize(
    "kind, why",
    [
        ("inplace", "never recomputed: changes a tensor of its state argument in place"),
        ("slots", "never recomputed: takes a SlotsCache (cache), whose state a recomputation cannot put back (no attributes"),
    ],
)
def test_a_cache_a_recomputation_cannot_put_back_is_never_recomputed_and_says_why(kind, why):
    model, x = _cached(kind)
    ref = copy.deepcopy(model)
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    probe.remove()
    # Below the pure-offloading floor only recomputing them would fit: refused, with the reason.
    with pytest.raises(ValueError, match="never recomputed|which the executor cannot"):
        ct.offload(model, x, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    handle = ct.offload(model, x, memory=floor, repeats=1, warmup=0)
    assert handle.table().count(why) == 7  # every block but the last (which holds the head)
    assert not recomputed_rows(handle)
    for step in range(2):
        la, _ = _loss(model, x, step)
        la.backward()
        lb, _ = _loss(ref, x, step)
        lb.backward()
        assert torch.equal(la, lb)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
        model.zero_grad()
        ref.zero_grad()
    handle.remove()


def test_a_hand_given_schedule_that_recomputes_a_block_whose_cache_is_written_in_place_is_refused_at_the_step():
    model, x = _cached("inplace")
    prof = ct.profile_full(model, x, repeats=1, warmup=0, blocks="blocks")
    L = prof.chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    sched = co.Schedule(tuple([("F", 1), ("Fck", 2)] + fixed[2:L] + fixed[L:-2] + [("F", 2), ("B", 2), ("B", 1)]))
    ct.Offloader(model, prof.chain, sched, blocks=prof.blocks)
    with pytest.raises(RuntimeError, match=r"block 2 changes a tensor of its state argument in place.*method='best'"):
        out, _ = model(x)
        out.square().mean().backward()


def test_a_hand_given_schedule_recomputing_a_decoder_layer_with_its_cache_trains_bitwise_equal():
    """Before, the executor refused this schedule at the step (a DynamicCache argument)."""
    model, batch = decoder("falcon")
    ref = copy.deepcopy(model)
    prof = ct.profile_full(model, batch, repeats=1, warmup=0, blocks="transformer.h")
    L = prof.chain.length
    fixed = [("F", i) for i in range(1, L + 1)] + [("B", i) for i in range(L, 0, -1)]
    sched = co.Schedule(tuple([("F", 1), ("Fck", 2)] + fixed[2:L] + fixed[L:-2] + [("F", 2), ("B", 2), ("B", 1)]))
    handle = ct.Offloader(model, prof.chain, sched, blocks=prof.blocks)
    assert train_equal_with_cache(model, ref, batch, handle, steps=2) > 0
    assert handle.last_step.recomputed_ops == 1


class Drifting(CachedBlock):
    """Appends keys scaled by a counter it keeps in a list, state no picture of the arguments sees:
    a recomputation computes other keys than the forward did."""

    def __init__(self, d, i):
        super().__init__(d, i)
        self.scale = [1.0]

    def forward(self, x, cache):
        k = self.k(x) * self.scale[0]
        self.scale[0] += 1.0
        cache.keys.append(k)
        return x + self.mlp(torch.tanh(k) * x)


def test_a_recomputation_that_puts_other_values_into_the_cache_raises_never_trains_on():
    model, x = _cached("list")
    torch.manual_seed(0)
    model.blocks = nn.ModuleList(Drifting(32, i) for i in range(8))
    probe = ct.offload(model, x, memory=1.0, method="best", repeats=1, warmup=0)
    floor = offload_memory_floor(probe.chain) + probe.plan.resident_bytes
    probe.remove()
    handle = ct.offload(model, x, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    assert handle.schedule.has_remat
    loss, _ = _loss(model, x, 0)
    with pytest.raises(RuntimeError, match=r"recomputing block \d+ .*put other values than its forward did into the state object"):
        loss.backward()
    handle.remove()


# -- 4. the picture itself --------------------------------------------------------------------------------


def test_a_picture_puts_attributes_lists_and_dicts_back_by_reference():
    cache = tf.EncoderDecoderCache(tf.DynamicCache(), tf.DynamicCache())
    k = torch.randn(2, 4, 3, 8)
    cache.self_attention_cache.update(k, k, 0)
    before = ObjectState([cache])
    assert before.why is None
    keys0 = cache.self_attention_cache.layers[0].keys
    cache.self_attention_cache.update(k, k, 1)
    cache.cross_attention_cache.update(k, k, 1)
    cache.is_updated[1] = True
    structure, tensors, versions, why = state_call_ended(before)
    assert why is None and len(tensors) > 2
    now = ObjectState([cache], also=[c[1] for c in before.containers])
    before.apply()
    assert len(cache.self_attention_cache.layers) == 1 and cache.is_updated == {}
    assert cache.self_attention_cache.layers[0].keys is keys0
    now.apply()
    assert len(cache.self_attention_cache.layers) == 2 and cache.is_updated == {1: True}
    # In place on a tensor the picture holds: refused.
    keys0.add_(1)
    assert "in place" in state_call_ended(before)[3]


def test_what_a_picture_cannot_put_back():
    lin = nn.Linear(2, 2)
    x = torch.randn(2)
    assert argument_state(lin, (x, SlotsCache()), {}, ("arg", 0))[1].startswith("takes a SlotsCache (positional argument 1)")
    for inside in (nn.Linear(2, 2), lambda: 0, torch.Generator()):  # a module, a function, a C object
        holder = ListCache()
        holder.keys.append(inside)
        assert "cannot put back (it holds a" in argument_state(lin, (x, holder), {}, ("arg", 0))[1]
    deep = ListCache()
    node = deep.keys
    for _ in range(40):
        node.append([])
        node = node[0]
    assert "deeper" in argument_state(lin, (x, deep), {}, ("arg", 0))[1]
    wide = ListCache()
    wide.keys.extend(range(70000))
    assert "larger than" in argument_state(lin, (x, wide), {}, ("arg", 0))[1]
    state, why = argument_state(lin, (x, ListCache()), {"mask": None}, ("arg", 0))
    assert why is None and isinstance(state, ObjectState)
    assert argument_state(lin, (x,), {"mask": torch.ones(2), "sizes": [1, 2]}, ("arg", 0)) == (None, None)


def test_a_cache_tensor_changed_in_place_before_the_backward_raises_as_plain_pytorch_does():
    """A change in place of a cache tensor between the forward and the backward fails the
    backward, as plain PyTorch's own check does: the recomputation sees the moved version before it
    runs, and the views of the cache's tensors the backward then reads share their version counter."""
    model, batch = decoder("gpt2")
    ref = copy.deepcopy(model)
    floor = floor_of(model, batch)
    handle = ct.offload(model, batch, memory=floor - 1, method="rotor", repeats=1, warmup=0)
    redone = [r["module"] for r in recomputed_rows(handle, "transformer.h.")]
    assert redone
    layer = int(redone[0].rsplit(".", 1)[1])  # a layer whose own saved tensors the forward dropped

    def changed(m):
        torch.manual_seed(0)
        out = m(**batch)
        with torch.no_grad():
            out.past_key_values.layers[layer].values.mul_(1.0)  # the values its attention saved
        return out

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        changed(ref).loss.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation|is at version|modified in place after its forward"):
        changed(model).loss.backward()
    handle.remove()
