"""Models for the PyTorch adapter's checks: built from code and configs, random weights, no downloads.

* :class:`ResNet`: a ResNet as torchvision builds it (stem, four stages of bottleneck blocks,
  pooled linear head; ``torchvision.models.resnet50`` is ``ResNet([3, 4, 6, 3])``), written
  here because torchvision's wheel does not import with the CPU build of torch used in CI.
* :func:`gpt2`: Hugging Face GPT-2 (``GPT2LMHeadModel``) from a config; :func:`hf_tiny`: GPT-2,
  Llama, BERT or ViT from a tiny config, with a batch.
* :class:`ResidualMLP`: a few residual MLP blocks in a ModuleList, for quick checks.
* :func:`resnet_like`, :func:`gpt_like`: the same two shapes as an ``nn.Sequential`` of stages.

``tests/test_torch_models.py`` trains tiny versions against untouched copies;
``benchmarks/gpu_check.py`` runs larger ones on a GPU.
"""

from __future__ import annotations

import os

import torch
from torch import nn

__all__ = [
    "Bottleneck",
    "ResNet",
    "ResidualMLP",
    "gpt2",
    "hf_tiny",
    "HF_LAYERS",
    "resnet_like",
    "gpt_like",
    "BasicBlock",
    "GPTBlock",
]


class Bottleneck(nn.Module):
    """torchvision's bottleneck: 1x1 reduce, 3x3 (stride here), 1x1 expand by 4, residual."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet layout: conv1/bn1/relu/maxpool, layer1..layer4, avgpool, fc.

    Parameters
    ----------
    layers
        Bottleneck blocks per stage (``[3, 4, 6, 3]`` is ResNet-50).
    width
        Width of the first stage (64 in torchvision); stage k has ``width * 2**k``.
    classes
        Outputs of the head.
    """

    def __init__(self, layers: list[int], width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, classes)

    def _make_layer(self, width: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != width * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, width * Bottleneck.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(width * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, width, stride, downsample)]
        self.inplanes = width * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is built from a config: never reach for the Hub
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


#: The Hugging Face models :func:`hf_tiny` builds, and the module list that holds their layers.
HF_LAYERS = {"gpt2": "transformer.h", "llama": "model.layers", "bert": "bert.encoder.layer", "vit": "vit.layers"}


def hf_tiny(name: str, layers: int = 6) -> tuple[nn.Module, dict]:
    """A Hugging Face model from a tiny config (width 32, 4 heads, ``layers`` layers, random
    weights) and a batch for it, used as the documentation shows: ``model(**batch).loss``.

    ``name``: ``"gpt2"`` (GPT2LMHeadModel), ``"llama"`` (LlamaForCausalLM), ``"bert"``
    (BertForSequenceClassification, with a padding mask) or ``"vit"`` (ViTForImageClassification).
    """
    tf = _transformers()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 32))
    if name == "gpt2":
        config = tf.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=64, n_positions=64, use_cache=False)
        return tf.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}
    if name == "llama":
        config = tf.LlamaConfig(
            num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64, max_position_embeddings=64, use_cache=False,
        )
        return tf.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}
    if name == "bert":
        config = tf.BertConfig(
            num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64,
            max_position_embeddings=64, num_labels=3,
        )
        mask = torch.ones_like(ids)
        mask[1, 24:] = 0  # padding: an attention mask the layers take as a keyword argument
        return tf.BertForSequenceClassification(config), {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}
    if name == "vit":
        config = tf.ViTConfig(
            num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, image_size=32, patch_size=4, num_labels=3
        )
        return tf.ViTForImageClassification(config), {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}
    raise ValueError(f"name: {name!r} is not one of {', '.join(HF_LAYERS)}")


def gpt2(layers: int, d: int, heads: int, vocab: int, seq: int) -> nn.Module:
    """A Hugging Face ``GPT2LMHeadModel`` from a config (random weights, no download).

    ``use_cache`` is off, as for training (a cache would keep every layer's keys and values).
    """
    transformers = _transformers()
    config = transformers.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=seq, use_cache=False)
    return transformers.GPT2LMHeadModel(config)


class ResidualBlock(nn.Module):
    """Pre-norm MLP block with a residual: the smallest thing shaped like a transformer layer."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(self.ln(x))))


class ResidualMLP(nn.Module):
    """An input projection (8 features to ``d``), a ModuleList of residual blocks, a 3-way head.
    Seeded: two instances are equal."""

    def __init__(self, d: int = 16, layers: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList([ResidualBlock(d) for _ in range(layers)])
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


# -- the same shapes as nn.Sequential chains -------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a residual."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet_like(width: int, blocks_per_stage: int, classes: int) -> nn.Sequential:
    """A ResNet-18-shaped chain: stem, four stages of basic blocks, pooled linear head."""
    stages: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1))]
    cin = width
    for level in range(4):
        cout = width * 2**level
        for b in range(blocks_per_stage):
            stages.append(BasicBlock(cin, cout, 2 if (b == 0 and level > 0) else 1))
            cin = cout
    stages.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)))
    return nn.Sequential(*stages)


class GPTBlock(nn.Module):
    """A pre-norm causal transformer block."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    """Token and position embeddings."""

    def __init__(self, vocab: int, seq: int, d: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos


def gpt_like(vocab: int, seq: int, d: int, heads: int, layers: int) -> nn.Sequential:
    """Embedding, ``layers`` blocks, final norm and vocabulary head."""
    return nn.Sequential(Embed(vocab, seq, d), *[GPTBlock(d, heads) for _ in range(layers)], nn.Sequential(nn.LayerNorm(d), nn.Linear(d, vocab)))


# -- the families people train (issue 20) -------------------------------------------------------


class ParentResidual(nn.Module):
    """Blocks that return only their branch: the parent adds it (``h = h + block(h)``), so a
    block's output is not the next block's input."""

    def __init__(self, d: int = 32, layers: int = 8, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(layers)])
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class UNet(nn.Module):
    """A small U-Net: ``depth`` down blocks whose outputs are read again by the up blocks (skips
    to later blocks), and ``depth`` up blocks."""

    def __init__(self, width: int = 4, depth: int = 4, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.down = nn.ModuleList([nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU()) for _ in range(depth)])
        self.up = nn.ModuleList([nn.Sequential(nn.Conv2d(2 * width, width, 3, padding=1), nn.ReLU()) for _ in range(depth)])
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skips = []
        for block in self.down:
            h = block(h)
            skips.append(h)
        for block in self.up:
            h = block(torch.cat([h, skips.pop()], 1))
        return self.head(h)


def _lm(tf: object, ids: torch.Tensor, cls: str, config: object) -> tuple[nn.Module, dict]:
    return getattr(tf, cls)(config), {"input_ids": ids, "labels": ids}


def hf_family(name: str, layers: int = 8) -> tuple[nn.Module, dict]:
    """A model of one of :data:`FAMILIES` from a tiny config (random weights, no download, the
    library's defaults otherwise: ``use_cache`` stays as the config has it) and a batch for
    it, used as its documentation shows: ``model(**batch).loss``. Every stack has ``layers``
    blocks (a CNN: ``layers`` blocks over its stages)."""
    tf = _transformers()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 32))
    small = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64)
    if name in ("gpt2", "llama", "bert", "vit"):
        return hf_tiny(name, layers)
    if name == "gpt2-cache":
        config = tf.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
        return tf.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}
    if name == "mistral":
        return _lm(tf, ids, "MistralForCausalLM", tf.MistralConfig(num_hidden_layers=layers, num_key_value_heads=2, max_position_embeddings=64, **small))
    if name == "qwen2":
        return _lm(tf, ids, "Qwen2ForCausalLM", tf.Qwen2Config(num_hidden_layers=layers, num_key_value_heads=2, max_position_embeddings=64, **small))
    if name == "phi3":
        return _lm(tf, ids, "Phi3ForCausalLM", tf.Phi3Config(num_hidden_layers=layers, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0, **small))
    if name == "gpt-neox":
        return _lm(tf, ids, "GPTNeoXForCausalLM", tf.GPTNeoXConfig(num_hidden_layers=layers, max_position_embeddings=64, **small))
    if name == "falcon":
        config = tf.FalconConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, vocab_size=64)
        return _lm(tf, ids, "FalconForCausalLM", config)
    if name == "gemma":
        return _lm(tf, ids, "GemmaForCausalLM", tf.GemmaConfig(num_hidden_layers=layers, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, **small))
    if name == "opt":
        config = tf.OPTConfig(num_hidden_layers=layers, hidden_size=32, ffn_dim=64, num_attention_heads=4, vocab_size=64, word_embed_proj_dim=32, max_position_embeddings=64)
        return _lm(tf, ids, "OPTForCausalLM", config)
    if name == "mamba":
        config = tf.MambaConfig(num_hidden_layers=layers, hidden_size=32, state_size=8, vocab_size=64, expand=2, conv_kernel=4)
        return _lm(tf, ids, "MambaForCausalLM", config)
    if name == "roberta":
        config = tf.RobertaConfig(num_hidden_layers=layers, max_position_embeddings=64, num_labels=3, **small)
        return tf.RobertaForSequenceClassification(config), {"input_ids": ids, "labels": torch.tensor([0, 2])}
    if name == "albert":
        config = tf.AlbertConfig(num_hidden_layers=layers, embedding_size=16, max_position_embeddings=64, num_labels=3, **small)
        return tf.AlbertForSequenceClassification(config), {"input_ids": ids, "labels": torch.tensor([0, 2])}
    dec = torch.randint(0, 64, (2, 16))
    if name == "t5":
        config = tf.T5Config(num_layers=layers, num_decoder_layers=layers, d_model=32, d_ff=64, d_kv=8, num_heads=4, vocab_size=64, decoder_start_token_id=0)
        return tf.T5ForConditionalGeneration(config), {"input_ids": ids, "labels": dec}
    if name == "bart":
        config = tf.BartConfig(
            encoder_layers=layers, decoder_layers=layers, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, vocab_size=64, max_position_embeddings=64,
        )
        return tf.BartForConditionalGeneration(config), {"input_ids": ids, "labels": dec}
    if name == "whisper":
        config = tf.WhisperConfig(
            encoder_layers=layers, decoder_layers=layers, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
            decoder_attention_heads=4, vocab_size=64, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
        )
        config.pad_token_id = config.decoder_start_token_id = 1
        config.bos_token_id = config.eos_token_id = 2
        return tf.WhisperForConditionalGeneration(config), {"input_features": torch.randn(2, 8, 32), "labels": dec}
    if name == "clip":
        text = dict(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64, max_position_embeddings=32)
        vision = dict(num_hidden_layers=layers, hidden_size=32, intermediate_size=64, num_attention_heads=4, image_size=32, patch_size=4)
        config = tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
        return tf.CLIPModel(config), {"input_ids": ids[:, :16], "pixel_values": torch.randn(2, 3, 32, 32), "return_loss": True}
    labels = torch.tensor([0, 2])
    pixels = torch.randn(2, 3, 32, 32)
    # The CNNs keep the proportions of the models people train (HF's default configs, narrowed):
    # ResNet-50's stages are 4x its stem's width (64 -> 256 .. 2048), ConvNeXt-T's depths are
    # [3, 3, 9, 3], Swin-T's [2, 2, 6, 2]. The "-narrow" configs (every stage as wide as the stem,
    # and [2, 2, 2, 2] / [2, 2, 4] depths) put half the activations in the stem or the first stage,
    # which no schedule of the chain model can take below about 55-62 % (benchmarks/results/
    # offload_models.md says why); they stay in the table.
    if name in ("resnet", "resnet-narrow"):
        widths = [32, 64, 128, 256] if name == "resnet" else [8, 16, 32, 64]
        config = tf.ResNetConfig(embedding_size=8, hidden_sizes=widths, depths=[2, 2, 2, 2], layer_type="bottleneck", num_labels=3)
        return tf.ResNetForImageClassification(config), {"pixel_values": pixels, "labels": labels}
    if name in ("convnext", "convnext-narrow"):
        depths = [3, 3, 9, 3] if name == "convnext" else [2, 2, 2, 2]
        config = tf.ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=depths, num_labels=3)
        return tf.ConvNextForImageClassification(config), {"pixel_values": pixels, "labels": labels}
    if name == "swin":
        config = tf.SwinConfig(image_size=64, patch_size=2, embed_dim=8, depths=[2, 2, 6, 2], num_heads=[2, 2, 4, 8], window_size=4, num_labels=3)
        return tf.SwinForImageClassification(config), {"pixel_values": torch.randn(2, 3, 64, 64), "labels": labels}
    if name == "swin-narrow":
        config = tf.SwinConfig(image_size=32, patch_size=2, embed_dim=8, depths=[2, 2, 4], num_heads=[2, 2, 4], window_size=4, num_labels=3)
        return tf.SwinForImageClassification(config), {"pixel_values": pixels, "labels": labels}
    raise ValueError(f"name: {name!r} is not one of {', '.join(FAMILIES)}")


#: The architectures :func:`hf_family` builds (issue 20's table and more).
FAMILIES = (
    "gpt2", "gpt2-cache", "llama", "mistral", "qwen2", "phi3", "gpt-neox", "falcon", "gemma", "opt", "mamba",
    "bert", "roberta", "albert", "vit", "t5", "bart", "whisper", "clip", "resnet", "convnext", "swin",
    "resnet-narrow", "convnext-narrow", "swin-narrow",
)


class UNetBlock(nn.Module):
    """A U-Net block: a 3x3 convolution and a ReLU; an up block may take its skip as a second
    argument and concatenate it itself."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        if skip is not None:
            x = torch.cat([x, skip], 1)
        return torch.relu(self.conv(x))


class UNetShapes(nn.Module):
    """The U-Net shapes people write, to check that each makes one chain of its down and up paths.

    Parameters
    ----------
    skips
        ``"pop"`` (``skips.pop()``, the list empties as the up path runs), ``"index"``
        (``skips[-1 - k]``, the list lives until the forward returns) or ``"arg"`` (the up block
        takes its skip as a second argument).
    merge
        ``"cat"`` (channels concatenated) or ``"add"`` (``h + skip``); not used with ``"arg"``.
    middle
        A block between the two paths, not in either list.
    """

    def __init__(self, width: int = 4, depth: int = 8, classes: int = 3, skips: str = "pop", merge: str = "cat", middle: bool = True) -> None:
        super().__init__()
        if skips not in ("pop", "index", "arg"):
            raise ValueError(f"skips: {skips!r} is not one of 'pop', 'index', 'arg'")
        if merge not in ("cat", "add"):
            raise ValueError(f"merge: {merge!r} is not one of 'cat', 'add'")
        torch.manual_seed(0)
        self.skips, self.merge = skips, merge
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.downs = nn.ModuleList([UNetBlock(width, width) for _ in range(depth)])
        self.middle = UNetBlock(width, width) if middle else None
        cin = 2 * width if skips == "arg" or merge == "cat" else width
        self.ups = nn.ModuleList([UNetBlock(cin, width) for _ in range(depth)])
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        skips = []
        for block in self.downs:
            h = block(h)
            skips.append(h)
        if self.middle is not None:
            h = self.middle(h)
        for k, block in enumerate(self.ups):
            if self.skips == "arg":
                h = block(h, skips.pop())
                continue
            skip = skips.pop() if self.skips == "pop" else skips[-1 - k]
            h = block(torch.cat([h, skip], 1) if self.merge == "cat" else h + skip)
        return self.head(h)
