"""The networks behind ``chainoffload/networks/*.json``, in plain ``torch.nn``, cut into stages.

Each builder returns a :class:`Staged` network: a list of ``(label, module)`` stages whose
composition is the whole training forward pass, loss included (the last stage returns the
scalar loss, so ``act[L]`` is 4 bytes and B_L starts from the loss gradient), plus the shape
and dtype of the input ``a_0``.

The architectures follow the published papers and torchvision's reference implementations
(``torchvision.models.resnet``, ``vgg``, ``densenet``, ``inception``) layer by layer — same
kernel sizes, strides, paddings, channel counts, ``bias=False`` before batch norm, in-place ReLU
where torchvision uses it — and GPT-2 (Radford et al. 2019) as in nanoGPT / Hugging Face's
``GPT2Model``. torchvision is not a dependency; the code below is written from the
architectures, not copied. Deliberate differences, all documented in the networks README:

* Inception-v3 has no auxiliary classifier (it branches off the chain at Mixed_6e; a chain
  cannot hold a side branch) and no input transform.
* DenseNet's dense layers are grouped two per stage; a stage's input and output are the
  concatenation of all feature maps of the block so far (torchvision keeps a Python list and
  concatenates inside each layer; the tensors that autograd saves are the same).
* GPT-2 uses ``scaled_dot_product_attention``'s flash kernel (what PyTorch runs on an A100 for
  bf16), called directly so that the meta-device trace records what a GPU saves (q, k, v, the
  output and the log-sum-exp), not the math fallback's T x T attention matrix.
* GPT-2 computes in bfloat16 throughout (parameters and activations, as with FSDP's
  ``param_dtype=torch.bfloat16`` in torchtitan) and takes the loss in float32 on upcast logits.
* Labels / targets are non-persistent buffers of the last stage (all-zero on the meta device),
  so they are outside the activation budget like parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Staged", "BUILDERS", "param_count", "resnet", "vgg", "densenet121", "inception_v3", "gpt2"]


@dataclasses.dataclass
class Staged:
    """A network cut into stages for one training iteration.

    Attributes
    ----------
    stages
        ``(label, module)`` in forward order; stage i's module maps a_{i-1} to a_i.
    input_shape, input_dtype
        Shape and dtype of a_0 (images, or token ids).
    dtype
        Dtype of parameters and activations.
    description
        One line for ``network_names()``.
    """

    stages: list[tuple[str, nn.Module]]
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    dtype: torch.dtype
    description: str


class _Dropout(nn.Module):
    """Dropout through ``native_dropout``, the fused kernel PyTorch runs on a GPU.

    ``F.dropout`` on CPU and meta takes another path (a mask in the input's dtype, multiplied in
    and saved by the multiplication); on CUDA it calls ``native_dropout``, which saves a bool mask.
    Calling it directly makes the trace save what a GPU saves.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


class _ClassifierLoss(nn.Module):
    """Cross-entropy against fixed labels held as a non-persistent buffer (outside the budget)."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.register_buffer("labels", torch.zeros(batch, dtype=torch.long), persistent=False)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, self.labels)


# -- ResNet (He et al. 2016; torchvision's v1.5: stride on the 3x3 of a bottleneck) ------------


def _conv_bn(c_in: int, c_out: int, k: int, stride: int = 1, padding: int = 0) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding, bias=False), nn.BatchNorm2d(c_out)]


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(c_in, planes, 3, stride, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, 1, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (
            nn.Sequential(*_conv_bn(c_in, planes, 1, stride)) if stride != 1 or c_in != planes else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        width = planes
        self.conv1, self.bn1 = _conv_bn(c_in, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride, 1)
        self.conv3, self.bn3 = _conv_bn(width, planes * 4, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (
            nn.Sequential(*_conv_bn(c_in, planes * 4, 1, stride)) if stride != 1 or c_in != planes * 4 else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


def _classifier_head(features: int, batch: int, classes: int = 1000) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(features, classes), _ClassifierLoss(batch))


def resnet(depth: int, batch: int = 64, image: int = 224) -> Staged:
    """ResNet-18/34/50/101/152: stem, one stage per residual block, head (pool, fc, loss)."""
    layers = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    block = _BasicBlock if depth < 50 else _Bottleneck
    stem = nn.Sequential(*_conv_bn(3, 64, 7, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
    stages: list[tuple[str, nn.Module]] = [("stem", stem)]
    c_in = 64
    for group, (planes, count) in enumerate(zip((64, 128, 256, 512), layers, strict=True), start=1):
        for j in range(count):
            stride = 2 if group > 1 and j == 0 else 1
            stages.append((f"layer{group}.{j}", block(c_in, planes, stride)))
            c_in = planes * block.expansion
    stages.append(("head", _classifier_head(c_in, batch)))
    return Staged(
        stages,
        (batch, 3, image, image),
        torch.float32,
        torch.float32,
        f"ResNet-{depth}, batch {batch}, {image}x{image}, float32, {len(stages)} stages (stem, blocks, head)",
    )


# -- VGG (Simonyan & Zisserman 2015, configurations D and E, no batch norm) ---------------------

_VGG_CFG = {
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


def vgg(depth: int, batch: int = 64, image: int = 224) -> Staged:
    """VGG-16/19: one stage per conv + ReLU (a max-pool joins the conv before it), then fc1, fc2, fc3 + loss."""
    stages: list[tuple[str, nn.Module]] = []
    c_in, conv_index = 3, 0
    for item in _VGG_CFG[depth]:
        if item == "M":
            label, seq = stages[-1]
            seq.append(nn.MaxPool2d(2, 2))
            stages[-1] = (label + "+pool", seq)
            continue
        conv_index += 1
        seq = nn.Sequential(nn.Conv2d(c_in, item, 3, padding=1), nn.ReLU(inplace=True))
        stages.append((f"conv{conv_index}", seq))
        c_in = item
    stages.append(
        ("fc1", nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(True), _Dropout()))
    )
    stages.append(("fc2", nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(True), _Dropout())))
    stages.append(("fc3", nn.Sequential(nn.Linear(4096, 1000), _ClassifierLoss(batch))))
    return Staged(
        stages,
        (batch, 3, image, image),
        torch.float32,
        torch.float32,
        f"VGG-{depth}, batch {batch}, {image}x{image}, float32, {len(stages)} stages (each conv, fc1, fc2, fc3)",
    )


# -- DenseNet-121 (Huang et al. 2017; growth 32, bottleneck 4 x growth, compression 0.5) --------


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(c_in), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(c_in, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class _DenseGroup(nn.Module):
    """Consecutive dense layers; input and output are the block's concatenated features so far."""

    def __init__(self, c_in: int, count: int, growth: int = 32, bn_size: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DenseLayer(c_in + j * growth, growth, bn_size) for j in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            inp = features[0] if len(features) == 1 else torch.cat(features, 1)
            features.append(layer(inp))
        return torch.cat(features, 1)


def densenet121(batch: int = 64, image: int = 224, per_stage: int = 2) -> Staged:
    """DenseNet-121: stem, dense layers ``per_stage`` at a time, transitions, head."""
    growth = 32
    stem = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
    )
    stages: list[tuple[str, nn.Module]] = [("stem", stem)]
    channels = 64
    for b, count in enumerate((6, 12, 24, 16), start=1):
        for start in range(0, count, per_stage):
            n = min(per_stage, count - start)
            stages.append((f"block{b}.{start + 1}-{start + n}", _DenseGroup(channels, n, growth)))
            channels += n * growth
        if b < 4:
            trans = nn.Sequential(
                nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, channels // 2, 1, bias=False), nn.AvgPool2d(2, 2)
            )
            stages.append((f"transition{b}", trans))
            channels //= 2
    head = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(inplace=True), _classifier_head(channels, batch))
    stages.append(("head", head))
    return Staged(
        stages,
        (batch, 3, image, image),
        torch.float32,
        torch.float32,
        f"DenseNet-121, batch {batch}, {image}x{image}, float32, {len(stages)} stages "
        f"(stem, {per_stage} dense layers each, transitions, head)",
    )


# -- Inception-v3 (Szegedy et al. 2016), torchvision's layout without the auxiliary head -------


class _BasicConv2d(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel, stride=1, padding=0) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(c_out, eps=0.001),
            nn.ReLU(inplace=True),
        )


class _InceptionA(nn.Module):
    def __init__(self, c_in: int, pool_features: int) -> None:
        super().__init__()
        self.b1 = _BasicConv2d(c_in, 64, 1)
        self.b5 = nn.Sequential(_BasicConv2d(c_in, 48, 1), _BasicConv2d(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(_BasicConv2d(c_in, 64, 1), _BasicConv2d(64, 96, 3, padding=1), _BasicConv2d(96, 96, 3, padding=1))
        self.bp = _BasicConv2d(c_in, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.bp(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), pool], 1)


class _InceptionB(nn.Module):
    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.b3 = _BasicConv2d(c_in, 384, 3, stride=2)
        self.b3d = nn.Sequential(_BasicConv2d(c_in, 64, 1), _BasicConv2d(64, 96, 3, padding=1), _BasicConv2d(96, 96, 3, stride=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b3d(x), F.max_pool2d(x, 3, 2)], 1)


class _InceptionC(nn.Module):
    def __init__(self, c_in: int, c7: int) -> None:
        super().__init__()
        self.b1 = _BasicConv2d(c_in, 192, 1)
        self.b7 = nn.Sequential(
            _BasicConv2d(c_in, c7, 1), _BasicConv2d(c7, c7, (1, 7), padding=(0, 3)), _BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        )
        self.b7d = nn.Sequential(
            _BasicConv2d(c_in, c7, 1),
            _BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            _BasicConv2d(c7, c7, (1, 7), padding=(0, 3)),
            _BasicConv2d(c7, c7, (7, 1), padding=(3, 0)),
            _BasicConv2d(c7, 192, (1, 7), padding=(0, 3)),
        )
        self.bp = _BasicConv2d(c_in, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.bp(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), self.b7(x), self.b7d(x), pool], 1)


class _InceptionD(nn.Module):
    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.b3 = nn.Sequential(_BasicConv2d(c_in, 192, 1), _BasicConv2d(192, 320, 3, stride=2))
        self.b7 = nn.Sequential(
            _BasicConv2d(c_in, 192, 1),
            _BasicConv2d(192, 192, (1, 7), padding=(0, 3)),
            _BasicConv2d(192, 192, (7, 1), padding=(3, 0)),
            _BasicConv2d(192, 192, 3, stride=2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7(x), F.max_pool2d(x, 3, 2)], 1)


class _InceptionE(nn.Module):
    def __init__(self, c_in: int) -> None:
        super().__init__()
        self.b1 = _BasicConv2d(c_in, 320, 1)
        self.b3_1 = _BasicConv2d(c_in, 384, 1)
        self.b3_2a = _BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.b3_2b = _BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.b3d_1 = nn.Sequential(_BasicConv2d(c_in, 448, 1), _BasicConv2d(448, 384, 3, padding=1))
        self.b3d_3a = _BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.b3d_3b = _BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.bp = _BasicConv2d(c_in, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.b3_1(x)
        b3 = torch.cat([self.b3_2a(b3), self.b3_2b(b3)], 1)
        b3d = self.b3d_1(x)
        b3d = torch.cat([self.b3d_3a(b3d), self.b3d_3b(b3d)], 1)
        pool = self.bp(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.b1(x), b3, b3d, pool], 1)


def inception_v3(batch: int = 64, image: int = 299) -> Staged:
    """Inception-v3: two stem stages, the 11 Mixed modules, head (pool, dropout, fc, loss)."""
    stages: list[tuple[str, nn.Module]] = [
        (
            "stem1",
            nn.Sequential(
                _BasicConv2d(3, 32, 3, stride=2), _BasicConv2d(32, 32, 3), _BasicConv2d(32, 64, 3, padding=1), nn.MaxPool2d(3, 2)
            ),
        ),
        ("stem2", nn.Sequential(_BasicConv2d(64, 80, 1), _BasicConv2d(80, 192, 3), nn.MaxPool2d(3, 2))),
        ("Mixed_5b", _InceptionA(192, 32)),
        ("Mixed_5c", _InceptionA(256, 64)),
        ("Mixed_5d", _InceptionA(288, 64)),
        ("Mixed_6a", _InceptionB(288)),
        ("Mixed_6b", _InceptionC(768, 128)),
        ("Mixed_6c", _InceptionC(768, 160)),
        ("Mixed_6d", _InceptionC(768, 160)),
        ("Mixed_6e", _InceptionC(768, 192)),
        ("Mixed_7a", _InceptionD(768)),
        ("Mixed_7b", _InceptionE(1280)),
        ("Mixed_7c", _InceptionE(2048)),
        (
            "head",
            nn.Sequential(nn.AdaptiveAvgPool2d(1), _Dropout(0.5), nn.Flatten(), nn.Linear(2048, 1000), _ClassifierLoss(batch)),
        ),
    ]
    return Staged(
        stages,
        (batch, 3, image, image),
        torch.float32,
        torch.float32,
        f"Inception-v3 (no auxiliary head), batch {batch}, {image}x{image}, float32, {len(stages)} stages "
        "(2 stem, 11 Mixed modules, head)",
    )


# -- GPT-2 (Radford et al. 2019): pre-norm transformer blocks, GELU (tanh), dropout 0.1 --------


class _Embedding(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, dropout: float) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.drop = _Dropout(dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.attn_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.c_fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = _Dropout(dropout)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.device.type == "meta":
            # NOTE [ flash attention on meta ]: the public scaled_dot_product_attention picks the
            # math fallback on meta (no flash kernel is "available" there), which saves the
            # T x T attention probabilities; an A100 runs the flash kernel, which saves only
            # q, k, v, the output and the log-sum-exp. Call the flash op directly (it has meta and
            # autograd formulas) so that the trace records what the GPU saves.
            out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, self.dropout, True)[0]
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = self._attention(q, k, v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.attn_proj(y))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class _LMHead(nn.Module):
    def __init__(self, width: int, vocab: int, batch: int, seq: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("targets", torch.zeros(batch, seq, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(x))
        # the loss in float32, on upcast logits, as torchtitan does and as autocast would
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), self.targets.view(-1))


def gpt2(layers: int, width: int, heads: int, batch: int, seq: int = 1024, dropout: float = 0.1) -> Staged:
    """A GPT-2-like stack: embedding, ``layers`` transformer blocks, head (final norm, LM head, loss), bfloat16."""
    vocab = 50257
    emb = _Embedding(vocab, 1024, width, dropout)
    head = _LMHead(width, vocab, batch, seq)
    head.lm_head.weight = emb.wte.weight  # tied, as in GPT-2 (a parameter: outside the budget either way)
    stages: list[tuple[str, nn.Module]] = [("embedding", emb)]
    stages += [(f"block{j}", _Block(width, heads, dropout)) for j in range(layers)]
    stages.append(("head", head))
    return Staged(
        stages,
        (batch, seq),
        torch.long,
        torch.bfloat16,
        f"GPT-2-like, {layers} layers, width {width}, {heads} heads, batch {batch}, sequence {seq}, bfloat16, "
        f"flash attention, {len(stages)} stages (embedding, blocks, head + loss)",
    )


#: name -> builder; the shipped JSON files are ``<name>.json``.
BUILDERS: dict[str, Callable[[], Staged]] = {
    "resnet18": lambda: resnet(18),
    "resnet50": lambda: resnet(50),
    "resnet101": lambda: resnet(101),
    "resnet152": lambda: resnet(152),
    "vgg16": lambda: vgg(16),
    "vgg19": lambda: vgg(19),
    "densenet121": lambda: densenet121(),
    "inception_v3": lambda: inception_v3(),
    "gpt2_12": lambda: gpt2(12, 768, 12, batch=8),
    "gpt2_48": lambda: gpt2(48, 1600, 25, batch=4),
}


def param_count(staged: Staged) -> int:
    """Number of distinct parameters (tied weights once), for checking against the papers."""
    seen: dict[int, int] = {}
    for _, module in staged.stages:
        for p in module.parameters():
            seen[id(p)] = p.numel()
    return sum(seen.values())

