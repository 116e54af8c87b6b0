"""The adapter never trains on other numbers than plain PyTorch (issue 19's silent cases).

Each model here has 8+ blocks and is trained plain (an untouched deep copy) and offloaded, with
``torch.manual_seed`` before each forward; the losses, gradients and parameters after every step
must be ``torch.equal``, or both runs must raise the same error. Regression tests for the three
cases that once trained on wrong gradients without a word:

* an in-place change of the hidden state between blocks (parent code, a forward pre-hook);
* lazy conjugate / negative views saved by a block;
* a block modifying a tensor autograd saved (plain PyTorch raises; saved-tensor hooks used to
  switch that check off, even with nothing offloaded).
"""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
from chainoffload_torch._saved import Kept, Packed, check_version, rebuild, version_probe  # noqa: E402
from chainoffload_torch._stages import unmovable_kind  # noqa: E402

N_BLOCKS = 8
INPLACE_ERROR = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _train(model: nn.Module, x, steps: int):
    """Losses, gradients and parameters after each of ``steps`` SGD steps, or the exception."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    try:
        for i in range(steps):
            opt.zero_grad()
            torch.manual_seed(100 + i)
            loss = model(x)
            loss.backward()
            out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
            opt.step()
            out[-1] += ([p.detach().clone() for p in model.parameters()],)
    except RuntimeError as exc:
        return exc
    return out


def _same(a, b) -> bool:
    # Runs of different lengths differ; within a step, both models have the same parameters.
    return len(a) == len(b) and all(
        torch.equal(la, lb) and all(torch.equal(g, h) for g, h in zip(ga, gb, strict=True)) and all(torch.equal(p, q) for p, q in zip(pa, pb, strict=True))
        for (la, ga, pa), (lb, gb, pb) in zip(a, b, strict=True)
    )


def compare(make, x, memory, steps: int = 3, expect_moved: bool = True):
    """Train ``make()`` plain and offloaded at ``memory``; assert equal numbers or the same error.

    Returns the handle (removed) and the offloaded run's result.
    """
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    plain = _train(ref, x, steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            handle = ct.offload(model, x, memory=memory)
        except RuntimeError as exc:
            # Refused while profiling: only right where plain PyTorch raises the same.
            assert isinstance(plain, RuntimeError), f"offload() raised but plain training did not: {exc}"
            assert str(exc).startswith(str(plain).split(" Hint:")[0].split(", which")[0])
            return None, exc
        got = _train(model, x, steps)
    try:
        if isinstance(plain, RuntimeError):
            assert isinstance(got, RuntimeError), "plain PyTorch raised, the offloaded model trained"
            assert str(got).split(" Hint:")[0] == str(plain).split(" Hint:")[0]
        else:
            assert not isinstance(got, RuntimeError), f"offloaded training raised: {got}"
            assert _same(plain, got), "offloaded training differs from plain PyTorch"
            if expect_moved:
                assert handle.offloaded_bytes > 0, "nothing was offloaded: the test would prove nothing"
        return handle, got
    finally:
        handle.remove()


class Net(nn.Module):
    """Blocks in an ``nn.ModuleList``; ``between`` runs on the hidden state after each block."""

    def __init__(self, block, between=None, n: int = N_BLOCKS):
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(n))
        self.between = between

    def forward(self, x):
        h = x
        for b in self.blocks:
            h = b(h)
            if self.between is not None:
                self.between(h)
        return h.abs().pow(2).sum() if h.is_complex() else h.pow(2).sum()


class GeluLinear(nn.Module):
    """Saves its input (gelu) but not its output: changing the output in place is legal."""

    def __init__(self, d: int = 16, dtype=torch.float32):
        super().__init__()
        self.lin = nn.Linear(d, d, dtype=dtype)

    def forward(self, x):
        return self.lin(nn.functional.gelu(x))


X = torch.randn(4, 16)


# -- 1. the hidden state changed in place between blocks ---------------------------------------


@pytest.mark.parametrize("memory", [1.0, 0.6, 0.45])
@pytest.mark.parametrize("change", ["mul_", "iadd"])
def test_hidden_state_changed_in_place_between_blocks_trains_as_plain(change, memory):
    def between(h):
        if change == "mul_":
            h.mul_(0.9)
        else:
            h += 1

    handle, _ = compare(lambda: Net(GeluLinear, between), X, memory, expect_moved=memory < 1)
    if memory < 1:
        # The copies queued at the end of each block were stale: they were made again.
        assert handle.last_step.recopied_bytes > 0


@pytest.mark.parametrize("when", ["before", "after"])
def test_pre_hook_scaling_the_hidden_state_in_place_trains_as_plain(when):
    def hook(module, args):
        args[0].mul_(0.5)

    def make():
        net = Net(GeluLinear)
        if when == "before":
            for b in net.blocks[1:]:
                b.register_forward_pre_hook(hook)
        return net

    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    if when == "after":
        for b in ref.blocks[1:]:
            b.register_forward_pre_hook(hook)
    plain = _train(ref, X, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        handle = ct.offload(model, X, memory=0.6)
        if when == "after":  # registered on the offloaded model after offload(): runs after its hooks
            for b in model.blocks[1:]:
                b.register_forward_pre_hook(hook)
        got = _train(model, X, 3)
    assert handle.offloaded_bytes > 0
    assert not isinstance(got, RuntimeError), got
    assert _same(plain, got)
    handle.remove()


# -- 2. lazy conjugate and negative views ------------------------------------------------------


class ConjBlock(nn.Module):
    """Complex: the product saves a lazy conjugate view of z (conj bit set, data unconjugated)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d, dtype=torch.complex64)

    def forward(self, x):
        z = torch.tanh(self.lin(x))
        return z * z.conj() * 0.1 + z


class NegBlock(nn.Module):
    """Real: the product saves a negative view (neg bit set, data un-negated)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        z = self.lin(x)
        return torch.tanh(z * torch._neg_view(z)) + z


class ConjImagBlock(nn.Module):
    """The imaginary part of a conjugate view is a negative view of real data."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d, dtype=torch.complex64)

    def forward(self, x):
        z = self.lin(x)
        im = z.conj().imag
        return torch.tanh(z) + (im * torch.tanh(im)).to(z.dtype) * 0.1


@pytest.mark.parametrize("block", [ConjBlock, NegBlock, ConjImagBlock])
@pytest.mark.parametrize("memory", [0.6, 0.4])
def test_conj_and_neg_views_come_back_with_their_bits(block, memory):
    x = torch.randn(4, 16, dtype=torch.complex64) if block is not NegBlock else X
    compare(lambda: Net(block), x, memory)


# -- 3. a saved tensor modified in place: plain PyTorch raises, so must we ----------------------


class SavedThenModified(nn.Module):
    """``y = sigmoid(x); y.add_(1)``: sigmoid saved y, which is then changed."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        y = torch.sigmoid(self.lin(x))
        y.add_(1)
        return y * 0.5


@pytest.mark.parametrize("memory", [1.0, 0.5])
def test_modifying_a_saved_tensor_raises_as_plain_pytorch_does(memory):
    torch.manual_seed(0)
    model = Net(SavedThenModified)
    with pytest.raises(RuntimeError, match=INPLACE_ERROR):
        model(X).backward()
    # Refused while profiling, with autograd's own message: nothing trains on wrong values.
    with pytest.raises(RuntimeError, match=INPLACE_ERROR):
        ct.offload(model, X, memory=memory)


def test_modifying_a_saved_tensor_after_offload_raises_in_the_backward():
    """The model changes after offload() (a flag flipped): the executor's own check fires."""

    class Flip(GeluLinear):
        modify = False

        def forward(self, x):
            y = torch.sigmoid(self.lin(x))
            if Flip.modify:
                y.add_(1)
            return y

    torch.manual_seed(0)
    for memory in (1.0, 0.5):
        model = Net(Flip)
        handle = ct.offload(model, X, memory=memory)
        Flip.modify = True
        try:
            with pytest.raises(RuntimeError, match=INPLACE_ERROR) as err:
                model(X).backward()
            if handle.schedule.offloaded_units:
                assert "chainoffload_torch: saved in the forward of block" in str(err.value)
            else:
                # NOTE [ passive steps ]: nothing moves, no hooks: autograd's own check fires.
                assert "chainoffload_torch" not in str(err.value)
        finally:
            Flip.modify = False
            handle.remove()


def test_an_optimizer_step_between_forward_and_backward_raises_as_plain():
    """The weights autograd saved change before the backward: plain PyTorch raises."""

    def run(model):
        loss = model(X)
        with torch.no_grad():  # what an optimizer step does to the weights
            for p in model.parameters():
                p.add_(1)
        loss.backward()

    torch.manual_seed(0)
    model = Net(GeluLinear)
    ref = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match=INPLACE_ERROR):
        run(ref)
    handle = ct.offload(model, X, memory=0.5)
    with pytest.raises(RuntimeError, match=INPLACE_ERROR):
        run(model)
    handle.remove()


def test_a_stale_host_copy_is_never_read():
    """Changing the hidden state after its copy was queued, then saving it: the backward must
    read the changed bytes (a copy made again), not the bytes of the first copy."""
    handle, _ = compare(lambda: Net(GeluLinear, lambda h: h.mul_(-1.5)), X, 0.45)
    assert handle.last_step.recopied_bytes > 0


# -- tensor identity: every kind of saved tensor --------------------------------------------


class ViewsBlock(nn.Module):
    """Saves views of views, non-contiguous strides and an offset into the storage."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        z = self.lin(x)
        v = z.t()[2:].unsqueeze(0).transpose(1, 2)  # a view of a view of a view, non-contiguous, offset
        w = (v * v.flip(-1)).squeeze(0).t()
        return z + torch.tanh(nn.functional.pad(w, (0, 0, 0, 0))).sum(-1, keepdim=True) * 0.01


class MixedDtypeBlock(nn.Module):
    """Half the work in bfloat16 and float64: saved tensors of three dtypes."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        b = torch.tanh(self.lin(x).to(torch.bfloat16))
        d = torch.sin(b.to(torch.float64))
        return (d * d).to(torch.float32) + x


class RequiresGradBlock(nn.Module):
    """Saves a tensor made inside the block that requires grad and has a grad_fn chain."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x):
        s = torch.sigmoid(self.scale * 2)  # grad_fn, requires grad, saved by mul below
        return torch.tanh(self.lin(x) * s)


@pytest.mark.parametrize("block", [ViewsBlock, MixedDtypeBlock, RequiresGradBlock])
def test_saved_tensors_of_every_strided_kind_come_back_identical(block):
    compare(lambda: Net(block), X, 0.5)


class Tagged(torch.Tensor):
    """A plain tensor subclass (as quantization wrappers and DTensor are)."""


class SubclassBlock(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        z = self.lin(x)
        t = z.as_subclass(Tagged)
        return torch.tanh(t * t).as_subclass(torch.Tensor) + z


class SparseBlock(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        z = self.lin(x)
        s = (z * (z > 0)).to_sparse()  # the sparse product saves a sparse tensor
        return torch.sparse.mm(s, self.lin.weight.t()) * 0.1 + z


@pytest.mark.parametrize(("block", "kind"), [(SubclassBlock, "Tagged (a tensor subclass)"), (SparseBlock, "sparse_coo tensor")])
def test_tensors_a_byte_copy_cannot_rebuild_keep_their_unit_resident_and_say_why(block, kind):
    torch.manual_seed(0)
    model = Net(block)
    prof = ct.profile_full(model, X, repeats=1, warmup=0)
    assert set(prof.sizes.unmovable) == set(range(1, N_BLOCKS + 1))
    assert all(kind in v for v in prof.sizes.unmovable.values())
    # Trained at the least memory anything fits in: equal, and the table names the kind.
    handle, _ = compare(lambda: Net(block), X, 1.0, expect_moved=False)
    rows = handle.decisions()
    assert all(r["decision"].startswith("keep") for r in rows)
    assert any(kind in r["decision"] for r in rows)


def test_unmovable_kinds():
    assert unmovable_kind(torch.randn(3)) is None
    assert unmovable_kind(torch.randn(3).as_subclass(Tagged)) == "Tagged (a tensor subclass)"
    assert unmovable_kind(torch.randn(3, 3).to_sparse()) == "sparse_coo tensor"
    assert unmovable_kind(torch.randn(3, 3).to_sparse_csr()) == "sparse_csr tensor"
    assert unmovable_kind(torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)) == "quantized tensor"
    assert unmovable_kind(torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])) == "nested tensor"
    if hasattr(torch.Tensor, "names"):  # named tensors are gone from recent PyTorch
        assert unmovable_kind(torch.randn(2, 3, names=("a", "b"))) == "named tensor"


# -- the records themselves -------------------------------------------------------------------


def test_version_probe_shares_the_counter_and_holds_no_storage():
    x = torch.randn(64)
    view = x[8:]
    probe = version_probe(view)
    assert probe.untyped_storage().nbytes() == 0
    assert x._version == probe._version == 0  # making the probe left the version as it was
    x.add_(1)
    assert probe._version == 1
    view.mul_(2)
    assert probe._version == 2
    del x, view
    assert probe._version == 2  # still readable once the original is gone


def test_rebuild_restores_dtype_strides_offset_and_bits():
    base = torch.randn(6, 4, dtype=torch.complex64)
    for t in (base.t()[1:], base.conj().t(), torch._neg_view(base.real)[2:], base[1:, ::2].conj().imag):
        storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        back = rebuild(Packed(None, t, version_probe(t), 1), storage.clone())
        assert back.dtype == t.dtype and back.shape == t.shape and back.stride() == t.stride()
        assert back.is_conj() == t.is_conj() and back.is_neg() == t.is_neg()
        assert torch.equal(back.resolve_conj().resolve_neg(), t.resolve_conj().resolve_neg())


def test_check_version_message_is_autograds():
    x = torch.randn(4, 8, requires_grad=True)
    y = torch.sigmoid(x)
    kept = Kept(y, 2)
    check_version(kept, y._version, "nowhere")  # unchanged: no error
    with pytest.raises(RuntimeError) as ours:
        check_version(kept, y._version + 1, "in the forward of block 2 (blocks.1); kept on the device")
    y2 = torch.sigmoid(x)
    y2.add_(1)
    with pytest.raises(RuntimeError) as theirs:
        y2.sum().backward()
    assert str(ours.value).split(" (chainoffload_torch")[0] == str(theirs.value)
