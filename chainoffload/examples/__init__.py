"""Small example chains shipped with the library, derived from architectures by formula.

``chainoffload example NAME`` writes one as JSON. The numbers are derived here, in code, so
that every byte and second can be traced to a formula:

* **resnet18-formula** (:func:`resnet18`) — ResNet-18 (He et al. 2016) on 224x224 RGB images,
  batch 64, float32, cut into 10 stages: the stem (conv 7x7/2, batch norm, ReLU, max-pool
  3x3/2), the 8 basic blocks, and the head (global average pool, fully connected 512 -> 1000).
  Its times are a V100 roofline; the name ``resnet18`` alone is the network chain traced with
  PyTorch (:mod:`chainoffload.networks`, A100 roofline), as for every shipped network.
* **tiny** — the three-stage chain of the tests, with round numbers, for reading a schedule by hand.

How the ResNet sizes are counted (PyTorch's autograd conventions; docs/model.md's units):

* a tensor of N float32 elements is 4N bytes; max-pool indices are int64 (8N bytes);
* a convolution saves its input and weight (weights are outside the budget; the input belongs
  to whoever made it); batch norm saves its input plus two per-channel float32 vectors (mean,
  inverse std); ReLU saves its output; max-pool saves its input and its indices; a linear
  layer saves its input; an addition saves nothing;
* so a basic block with output X bytes (C channels) saves conv1's output, ReLU1's output,
  conv2's output and its own output a_i: 4X, plus 16C bytes of batch-norm statistics per norm
  (2 norms); a downsampling block also saves the shortcut convolution's output: 5X and 3 norms;
* fwd_tmp is the largest tensor the stage makes and frees during its forward (batch norm
  outputs that ReLU replaces); bwd_tmp is two gradients of the block's largest activation
  (autograd holds the incoming and the outgoing gradient of an inner op at once).

How the times are modelled (a roofline of one NVIDIA V100-SXM2-16GB, float32): a forward op
takes max(FLOPs / 15.7e12, bytes / 900e9) seconds, with FLOPs = 2 * B * C_out * H_out * W_out *
C_in * k * k for a convolution and bytes = what it reads and writes; a stage's backward takes
twice its forward (the usual estimate: gradients with respect to inputs and to weights).
These are estimates, not measurements; ``chainoffload_torch.profile`` measures a real model.
"""

from __future__ import annotations

from collections.abc import Callable

from ..chain import Chain

__all__ = ["example", "example_names", "resnet18", "tiny"]

_PEAK_FLOPS = 15.7e12  # V100 SXM2 float32
_PEAK_BW = 900e9  # V100 HBM2 bytes/s
_F32 = 4


def _op_time(flops: float, nbytes: float) -> float:
    return max(flops / _PEAK_FLOPS, nbytes / _PEAK_BW)


def _conv(batch: int, c_in: int, c_out: int, h_out: int, k: int, h_in: int) -> tuple[float, int, float]:
    """(time, output bytes) of a k x k convolution; square feature maps."""
    out = batch * c_out * h_out * h_out * _F32
    flops = 2.0 * batch * c_out * h_out * h_out * c_in * k * k
    inp = batch * c_in * h_in * h_in * _F32
    return _op_time(flops, inp + out), out, flops


def _eltwise(nbytes: int, reads: int = 1) -> float:
    # batch norm / ReLU / add: memory bound, reads `reads` tensors and writes one
    return _op_time(nbytes / _F32 * 4.0, (reads + 1) * nbytes)


def resnet18(batch: int = 64, image: int = 224) -> Chain:
    """ResNet-18 at ``batch`` x 3 x ``image`` x ``image`` float32 as a 10-stage chain (see module doc)."""
    if batch < 1 or image < 32:
        raise ValueError(f"resnet18: batch={batch} must be >= 1 and image={image} >= 32")
    fwd, act, saved, fwd_tmp, bwd_tmp = [], [batch * 3 * image * image * _F32], [], [], []

    # stem: conv 7x7/2 -> bn -> relu -> maxpool 3x3/2
    h1 = (image + 2 * 3 - 7) // 2 + 1
    t_conv, y, _ = _conv(batch, 3, 64, h1, 7, image)
    h2 = (h1 + 2 * 1 - 3) // 2 + 1
    pooled = batch * 64 * h2 * h2 * _F32
    indices = batch * 64 * h2 * h2 * 8
    fwd.append(t_conv + _eltwise(y) * 2 + _op_time(9.0 * pooled / _F32, y + pooled))
    saved.append(y + y + indices + pooled + 16 * 64)
    act.append(pooled)
    fwd_tmp.append(y)  # the batch norm output, replaced by ReLU's
    bwd_tmp.append(2 * y)

    channels, h = 64, h2
    for stage_channels, first_stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            stride = first_stride if block == 0 else 1
            c_in, c_out = channels, stage_channels
            h_out = h // stride
            t1, x, _ = _conv(batch, c_in, c_out, h_out, 3, h)
            t2, _, _ = _conv(batch, c_out, c_out, h_out, 3, h_out)
            t = t1 + t2 + _eltwise(x) * 4 + _eltwise(x, reads=2)  # 2 bn, 2 relu, 1 add
            norms = 2
            units = 4
            if stride != 1 or c_in != c_out:
                t_ds, _, _ = _conv(batch, c_in, c_out, h_out, 1, h)
                t += t_ds + _eltwise(x)
                norms += 1
                units += 1
            fwd.append(t)
            saved.append(units * x + 16 * c_out * norms)
            act.append(x)
            fwd_tmp.append(x)
            bwd_tmp.append(2 * max(x, batch * c_in * h * h * _F32))
            channels, h = c_out, h_out

    # head: global average pool -> flatten -> linear 512 -> 1000
    pooled_vec = batch * 512 * _F32
    logits = batch * 1000 * _F32
    t_head = _op_time(batch * 512 * h * h, act[-1] + pooled_vec) + _op_time(
        2.0 * batch * 512 * 1000, pooled_vec + logits + 512 * 1000 * _F32
    )
    fwd.append(t_head)
    saved.append(pooled_vec + logits)
    act.append(logits)
    fwd_tmp.append(0)
    bwd_tmp.append(2 * pooled_vec)

    return Chain(
        fwd=fwd,
        bwd=[2.0 * t for t in fwd],
        act=act,
        saved=saved,
        fwd_tmp=fwd_tmp,
        bwd_tmp=bwd_tmp,
        name=f"resnet18-b{batch}-{image}px-fp32",
    )


def tiny() -> Chain:
    """Three stages with round numbers (times in seconds, sizes in bytes) for reading by hand."""
    return Chain(
        fwd=[1.0, 2.0, 1.0],
        bwd=[2.0, 4.0, 2.0],
        act=[10, 20, 30, 40],
        saved=[25, 35, 45],
        fwd_tmp=[5, 5, 5],
        bwd_tmp=[7, 7, 7],
        name="tiny",
    )


_EXAMPLES: dict[str, tuple[Callable[[], Chain], str]] = {
    # Not "resnet18": that name is the traced network chain (A100 roofline), as for every other
    # network of `chainoffload example`; this one is derived here by formula.
    "resnet18-formula": (
        resnet18,
        "ResNet-18 derived by formula (chainoffload.examples.resnet18), batch 64, 224x224, float32, 10 stages, "
        "V100 roofline times",
    ),
    "tiny": (tiny, "three stages with round numbers, for reading a schedule by hand"),
}


def example_names() -> dict[str, str]:
    """Names of the shipped examples and network chains, with one-line descriptions."""
    from ..networks import network_names

    names = {name: desc for name, (_, desc) in _EXAMPLES.items()}
    for name, desc in network_names().items():
        names.setdefault(name, desc)
    return names


def example(name: str) -> Chain:
    """The example chain ``name``, or the shipped network chain of that name (see :func:`example_names`)."""
    from ..networks import network, network_names

    if name in _EXAMPLES:
        return _EXAMPLES[name][0]()
    if name in network_names():
        return network(name)
    raise ValueError(f"example: unknown example {name!r}; known: {', '.join(example_names())}")
