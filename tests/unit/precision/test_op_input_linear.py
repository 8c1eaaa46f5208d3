"""`linear_after(linear, op, *ins)`: an FP8 linear that makes its input with an op inside its own autograd function
gives `linear(op(*ins))`'s output and gradients to the bit, and the op's output is gone before the GEMM runs."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe
from nemo_jetrl.precision.op_input_linear import linear_after


class SiluMulTwin:
    """silu(gate) * up in torch; its backward is autograd's through the same ops (bitwise the plain path's)."""

    made: list[weakref.ref] = []

    @staticmethod
    def forward(gate, up):
        x = F.silu(gate) * up
        SiluMulTwin.made.append(weakref.ref(x))
        return x

    @staticmethod
    def backward(ins, dx):
        with torch.enable_grad():
            gate, up = (t.detach().requires_grad_() for t in ins)
            return torch.autograd.grad(F.silu(gate) * up, (gate, up), dx)

    @staticmethod
    def apply(gate, up):
        return F.silu(gate) * up


def _linear(bias: bool) -> Fp8Linear:
    torch.manual_seed(0)
    return Fp8Linear(256, 128, bias=bias, recipe=PrecisionRecipe.preset("jetrl"), dtype=torch.bfloat16)


def _run(linear, fused: bool, grad_out):
    torch.manual_seed(1)
    gate, up = (torch.randn(2, 7, 256, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    linear.zero_grad()
    y = linear_after(linear, SiluMulTwin, gate, up) if fused else linear(SiluMulTwin.apply(gate, up))
    y.backward(grad_out)
    grads = [gate.grad, up.grad, linear.weight.grad] + ([linear.bias.grad] if linear.bias is not None else [])
    return y.detach(), grads


@pytest.mark.parametrize("bias", [False, True])
def test_the_op_made_inside_the_linear_gives_the_plain_bits(bias):
    linear = _linear(bias)
    grad_out = torch.randn(2, 7, 128, dtype=torch.bfloat16)
    (y0, g0), (y1, g1) = _run(linear, False, grad_out), _run(linear, True, grad_out)
    assert y0.abs().sum() > 0 and all(g.abs().sum() > 0 for g in g0)
    assert torch.equal(y0, y1)
    for a, b in zip(g0, g1, strict=True):
        assert torch.equal(a, b)


def test_the_ops_output_is_freed_before_the_gemm(monkeypatch):
    linear = _linear(False)
    layout = type(linear.recipe.layout)
    fprop = layout.fprop
    alive_at_gemm = []

    def spy(self, *args, **kwargs):
        alive_at_gemm.append([ref() is not None for ref in SiluMulTwin.made])
        return fprop(self, *args, **kwargs)

    monkeypatch.setattr(layout, "fprop", spy)
    SiluMulTwin.made.clear()
    _run(linear, True, torch.randn(2, 7, 128, dtype=torch.bfloat16))
    assert alive_at_gemm == [[False]]  # one GEMM, after the product was dropped


def test_a_linear_not_training_in_fp8_takes_the_plain_path():
    linear = _linear(False)
    linear.mode = "reference"
    SiluMulTwin.made.clear()
    gate, up = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(3, 256, dtype=torch.bfloat16)
    y = linear_after(linear, SiluMulTwin, gate, up)
    assert SiluMulTwin.made == [] and torch.equal(y, linear(F.silu(gate) * up))


def test_a_width_the_linear_does_not_take_is_refused():
    with pytest.raises(ValueError, match=r"the op made \[\.\.\., 64\], the linear takes \[\.\.\., 256\]"):
        linear_after(_linear(False), SiluMulTwin, torch.randn(3, 64), torch.randn(3, 64))


def test_under_checkpointing_the_saved_fp8_input_is_gone_before_the_ops_backward(monkeypatch):
    """Recomputed by activation checkpointing, X^T is held only by the backward: it is freed before the op's backward
    allocates its gradients (as a separate linear's backward returns before the op's runs)."""
    from torch.utils.checkpoint import checkpoint

    from nemo_jetrl.precision import op_input_linear

    casts = []
    quant = op_input_linear.train_input_quant

    def spy(*args, **kwargs):
        out = quant(*args, **kwargs)
        casts.append([weakref.ref(t) for t in out[2]])
        return out

    monkeypatch.setattr(op_input_linear, "train_input_quant", spy)
    alive = []

    class Op(SiluMulTwin):
        @staticmethod
        def backward(ins, dx):
            alive.append([ref() is not None for refs in casts for ref in refs])
            return SiluMulTwin.backward(ins, dx)

    linear = _linear(False)
    gate, up = (torch.randn(2, 7, 256, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    y = checkpoint(lambda g, u: linear_after(linear, Op, g, u), gate, up, use_reentrant=False)
    y.sum().backward()
    assert len(casts) == 2  # the forward's cast and the recomputation's, X^T and its scale each
    assert alive == [[False] * 4] and gate.grad.abs().sum() > 0


def test_a_linear_with_module_hooks_takes_the_plain_call():
    """FSDP2 unshards and reshards a linear's weight in its module hooks, which only `linear(...)` runs."""
    linear = _linear(False)
    calls = []
    linear.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape)))
    SiluMulTwin.made.clear()
    gate, up = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(3, 256, dtype=torch.bfloat16)
    y = linear_after(linear, SiluMulTwin, gate, up)
    assert calls == [(3, 256)] and SiluMulTwin.made == []  # the hook saw the product; the op ran as `apply`
    assert torch.equal(y, linear(F.silu(gate) * up))
