"""Random chains of realistic spread, for tests, benchmarks and users who test their own solvers.

Real networks have stages whose activations differ by one or two orders of magnitude (a
ResNet's first block against its last, an attention layer against a norm), a saved footprint a
few times the output (the inputs and intermediates autograd keeps), and times that grow with
the bytes a stage touches. :func:`random_chain` draws chains with those traits, reproducibly.
"""

from __future__ import annotations

import math

import numpy as np

from .chain import Chain

__all__ = ["random_chain", "transformer_chain", "TRANSFORMER_KINDS"]


def random_chain(
    rng: np.random.Generator | int,
    length: int,
    *,
    act_size: int = 1 << 20,
    spread: float = 100.0,
    saved_ratio: tuple[float, float] = (1.0, 4.0),
    time_per_byte: float = 1e-9,
    time_noise: float = 0.3,
    bwd_ratio: tuple[float, float] = (1.5, 2.5),
    tmp_ratio: float = 0.25,
    name: str | None = None,
) -> Chain:
    """Draw a chain of ``length`` stages with sizes and times of realistic spread.

    Parameters
    ----------
    rng
        A numpy ``Generator``, or an integer seed for a fresh one. The same seed gives the same chain.
    length
        Number of stages L (>= 1).
    act_size
        The smallest activation size in bytes; a_i is drawn log-uniformly in
        ``[act_size, act_size * spread]`` (a_0 included).
    spread
        Ratio of the largest to the smallest activation size (>= 1); 100 is two orders of magnitude.
    saved_ratio
        ``saved[i] / act[i]`` is drawn uniformly in this range (low >= 1): what autograd keeps
        besides the output.
    time_per_byte
        Seconds of forward compute per saved byte, on average.
    time_noise
        Standard deviation of the log-normal noise on each forward time (0: times exactly
        proportional to saved bytes).
    bwd_ratio
        ``bwd[i] / fwd[i]`` is drawn uniformly in this range.
    tmp_ratio
        ``fwd_tmp[i]`` and ``bwd_tmp[i]`` are drawn uniformly in ``[0, tmp_ratio * act[i]]``.
    name
        The chain's label; default ``"random-L<length>"``.

    Returns
    -------
    Chain
        A validated chain; sizes are whole bytes, times in seconds.

    Raises
    ------
    ValueError
        If a parameter is out of range; the message names it.
    """
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(int(rng))
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy Generator or an integer seed, got {type(rng).__name__}")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"length: expected an integer >= 1, got {length!r}")
    if not (isinstance(act_size, (int, np.integer)) and act_size >= 1):
        raise ValueError(f"act_size: expected an integer >= 1 byte, got {act_size!r}")
    if not (math.isfinite(spread) and spread >= 1):
        raise ValueError(f"spread: expected a finite ratio >= 1, got {spread!r}")
    lo, hi = saved_ratio
    if not (1.0 <= lo <= hi and math.isfinite(hi)):
        raise ValueError(f"saved_ratio: expected (low, high) with 1 <= low <= high, got {saved_ratio!r}")
    if not (math.isfinite(time_per_byte) and time_per_byte > 0):
        raise ValueError(f"time_per_byte: expected a finite time > 0, got {time_per_byte!r}")
    if not (math.isfinite(time_noise) and time_noise >= 0):
        raise ValueError(f"time_noise: expected a finite value >= 0, got {time_noise!r}")
    blo, bhi = bwd_ratio
    if not (0 < blo <= bhi and math.isfinite(bhi)):
        raise ValueError(f"bwd_ratio: expected (low, high) with 0 < low <= high, got {bwd_ratio!r}")
    if not (math.isfinite(tmp_ratio) and tmp_ratio >= 0):
        raise ValueError(f"tmp_ratio: expected a finite value >= 0, got {tmp_ratio!r}")
    length = int(length)
    act = np.floor(act_size * np.exp(rng.uniform(0.0, math.log(spread), length + 1))).astype(np.int64)
    saved = np.ceil(act[1:] * rng.uniform(lo, hi, length)).astype(np.int64)
    fwd = saved * time_per_byte * np.exp(rng.normal(0.0, time_noise, length))
    bwd = fwd * rng.uniform(blo, bhi, length)
    fwd_tmp = np.floor(act[1:] * rng.uniform(0.0, tmp_ratio, length)).astype(np.int64)
    bwd_tmp = np.floor(act[1:] * rng.uniform(0.0, tmp_ratio, length)).astype(np.int64)
    return Chain(
        fwd.tolist(),
        bwd.tolist(),
        act.tolist(),
        saved.tolist(),
        fwd_tmp.tolist(),
        bwd_tmp.tolist(),
        name=name if name is not None else f"random-L{length}",
    )


#: The architectures :func:`transformer_chain` builds.
TRANSFORMER_KINDS = ("llama", "bert", "t5")


def transformer_chain(
    kind: str,
    layers: int = 8,
    *,
    batch: int = 4,
    seq: int = 512,
    hidden: int = 1024,
    heads: int = 16,
    ffn: int | None = None,
    vocab: int = 32000,
    flops: float = 2e11,
    bytes_per_second: float = 2e10,
    name: str | None = None,
) -> Chain:
    """The chain of a Llama-, BERT- or T5-like model, one stage per block, counted by hand.

    Each stage's ``saved`` is what autograd keeps of an eager fp32 block of that kind (its
    output included, its input not: that belongs to the stage before, as the adapter counts
    it), its times are its matrix FLOPs at ``flops`` per second plus the bytes it writes at
    ``bytes_per_second`` (backward: twice the FLOPs), ``fwd_nosave`` is the forward less the
    time to write what only autograd keeps. The last stage holds the head and the loss (the
    logits and their log-softmax), as the PyTorch adapter's chain does.

    * ``"llama"``: pre-norm decoder blocks (RMSNorm, rotary q / k, softmax attention, SwiGLU
      with ``ffn`` = 2.75 ``hidden`` by default).
    * ``"bert"``: post-norm encoder blocks (LayerNorm, attention with dropout on the
      probabilities, GELU with ``ffn`` = 4 ``hidden``, dropout masks of one byte an element),
      with the MLM head.
    * ``"t5"``: ``layers`` encoder blocks then ``layers`` decoder blocks (self-attention,
      cross-attention on the encoder's output, ReLU FFN of 4 ``hidden``), the decoder on
      ``seq // 4`` tokens; each decoder block keeps its own keys and values of the encoder's
      output. That output itself, which every decoder block reads, is resident outside the
      chain (as the adapter counts such a tensor), so the last encoder stage hands the first
      decoder block the decoder's hidden state: act of that stage is the decoder's width.

    Parameters
    ----------
    kind
        One of :data:`TRANSFORMER_KINDS`.
    layers
        Blocks (for ``"t5"``: encoder blocks, and as many decoder blocks), >= 1.
    batch, seq, hidden, heads, ffn, vocab
        The shape: sequences per batch, tokens per sequence, model width, attention heads,
        the FFN's inner width (default by kind), the vocabulary of the head.
    flops, bytes_per_second
        The device's matrix throughput (FLOP/s) and memory bandwidth (bytes/s) the times are
        made of.
    name
        The chain's label; default ``"<kind>-like-L<stages>"``.

    Returns
    -------
    Chain
        A validated chain; sizes are whole bytes (multiples of 4), times in seconds.

    Raises
    ------
    ValueError
        An unknown ``kind`` or a parameter out of range; the message names it.
    """
    if kind not in TRANSFORMER_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(TRANSFORMER_KINDS)}")
    for field, value in (("layers", layers), ("batch", batch), ("seq", seq), ("hidden", hidden), ("heads", heads),
                         ("vocab", vocab)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{field}: expected an integer >= 1, got {value!r}")
    if ffn is not None and (isinstance(ffn, bool) or not isinstance(ffn, (int, np.integer)) or ffn < 1):
        raise ValueError(f"ffn: expected an integer >= 1 or None, got {ffn!r}")
    for field, value in (("flops", flops), ("bytes_per_second", bytes_per_second)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{field}: expected a finite number > 0, got {value!r}")
    if hidden % heads:
        raise ValueError(f"hidden: {hidden} is not a multiple of heads={heads}")
    f32 = 4
    inner = int(ffn) if ffn is not None else {"llama": (11 * hidden) // 4, "bert": 4 * hidden, "t5": 4 * hidden}[kind]

    def block(tokens: int, ctx: int, cross: int = 0) -> tuple[int, int, int, int, float, float]:
        """(saved, fwd_tmp, bwd_tmp, written-but-not-kept bytes, fwd FLOPs, bytes written) of one block."""
        nh = tokens * hidden * f32
        probs = tokens * heads * ctx * f32
        ni = tokens * inner * f32
        if kind == "llama":
            # norm out, q k v, rotated q k and their rotate_half copies, context, o_proj out,
            # residual, norm out; probs; gate, up, silu, product; down out; the output.
            saved = nh * (1 + 3 + 4 + 1 + 1 + 1 + 1) + probs + 4 * ni + nh + nh
            mm = 2 * tokens * (4 * hidden * hidden + 3 * hidden * inner) + 4 * tokens * ctx * hidden
        elif kind == "bert":
            masks = tokens * heads * ctx + 2 * tokens * hidden  # one byte an element
            # q k v, probs, dropped probs, context, dense out, residual + LN in / out, FFN in, GELU
            # out, dense out, residual + LN in, the output.
            saved = nh * (3 + 1 + 1 + 2) + 2 * probs + masks + 2 * ni + nh + nh + nh
            mm = 2 * tokens * (4 * hidden * hidden + 2 * hidden * inner) + 4 * tokens * ctx * hidden
        else:
            cross_kv = 2 * cross * hidden * f32
            attn = nh * (1 + 3 + 1 + 1 + 1) + probs  # norm, q k v, context, o out, residual; probs
            if cross:
                attn += nh * (1 + 1 + 1 + 1 + 1) + cross_kv + tokens * heads * cross * f32
            saved = attn + nh + 2 * ni + nh + nh
            mm = 2 * tokens * (4 * hidden * hidden + 2 * hidden * inner) + 4 * tokens * ctx * hidden
            if cross:
                mm += 2 * tokens * 2 * hidden * hidden + 2 * cross * 2 * hidden * hidden + 4 * tokens * cross * hidden
        # Each norm also keeps its per-token statistics (RMSNorm: 1/rms; LayerNorm: mean and 1/std).
        saved += {"llama": 2, "bert": 4, "t5": 3 if cross else 2}[kind] * tokens * f32
        fwd_tmp = probs  # the scores before the softmax
        bwd_tmp = 2 * probs + ni  # the gradients of scores and probs, and of one FFN activation
        unkept = saved - nh  # only autograd keeps these: a forward without it does not write them
        return saved, fwd_tmp, bwd_tmp, unkept, float(mm), float(saved + fwd_tmp)

    def head(tokens: int) -> tuple[int, int, int, float, float]:
        logits = tokens * vocab * f32
        # normed hidden and its statistics, logits, log-softmax, the targets (int64)
        saved = tokens * hidden * f32 + tokens * f32 + 2 * logits + tokens * 8
        if kind == "bert":
            saved += 3 * tokens * hidden * f32  # transform: dense out, GELU out, LN out
        return saved, logits, 2 * logits, 2.0 * tokens * hidden * vocab, float(saved)

    stages = []
    enc_tokens = batch * seq
    if kind == "t5":
        dec_tokens = batch * max(1, seq // 4)
        stages += [block(enc_tokens, seq) for _ in range(layers)]
        stages += [block(dec_tokens, max(1, seq // 4), cross=enc_tokens) for _ in range(layers)]
        outs = [enc_tokens] * (layers - 1) + [dec_tokens] * (layers + 1)
        first = enc_tokens
    else:
        stages += [block(enc_tokens, seq) for _ in range(layers)]
        outs = [enc_tokens] * layers
        first = enc_tokens
    fwd, bwd, nosave, saved, fwd_tmp, bwd_tmp = [], [], [], [], [], []
    for saved_b, tmp_f, tmp_b, unkept, mm, written in stages:
        t = mm / flops + written / bytes_per_second
        fwd.append(t)
        bwd.append(2 * mm / flops + 2 * written / bytes_per_second)
        nosave.append(t - unkept / bytes_per_second)
        saved.append(saved_b)
        fwd_tmp.append(tmp_f)
        bwd_tmp.append(tmp_b)
    act = [first * hidden * f32] + [n * hidden * f32 for n in outs]
    h_saved, h_tmp, h_btmp, h_mm, h_written = head(outs[-1])
    fwd[-1] += h_mm / flops + h_written / bytes_per_second
    bwd[-1] += 2 * h_mm / flops + 2 * h_written / bytes_per_second
    nosave[-1] += h_mm / flops + h_written / bytes_per_second
    saved[-1] += h_saved
    fwd_tmp[-1] = max(fwd_tmp[-1], h_tmp)
    bwd_tmp[-1] = max(bwd_tmp[-1], h_btmp)
    return Chain(fwd, bwd, act, saved, fwd_tmp, bwd_tmp, fwd_nosave=nosave,
                 name=name if name is not None else f"{kind}-like-L{len(fwd)}")
