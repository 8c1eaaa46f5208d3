"""An FP8 linear whose input an op makes inside the linear's own autograd function: `linear_after(linear, op, *ins)`
is `linear(op.apply(*ins))` with the same bits, forward and backward, but the op's high-precision output lives only
until the linear has quantized it.

Called as `down_proj(silu_mul(gate, up))`, the BF16 product [T, F] stays alive through down_proj's GEMM (the caller
holds it), beside its FP8 copies X and X^T: at the gated MLP of a long micro-batch that product is the largest
tensor of the step after gate/up (docs/long_responses.md). Here the function makes it, casts it (X for FProp, X^T
for WGrad, the same casts as `Fp8LinearFunction`), drops it and then runs the GEMM; the backward runs the linear's
FP8 DGrad / WGrad and hands dX to the op's backward. The op keeps its own inputs for that (as SiLU * up does anyway).
Under activation checkpointing the linear's X^T and transient FP8 weight are dropped before the op's backward runs,
so the two backwards hold no more at once than two separate functions' would.

An op is an object with `forward(*ins) -> x [..., K]` (no autograd), `backward(ins, dx) -> grads of ins` and
`apply(*ins)` (differentiable: the plain path where the linear does not train in FP8); `models.fused_train_ops.
SiluMulInput` is the trainer's.
"""

from __future__ import annotations

from typing import Protocol

import torch

from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.linear import (
    Fp8Linear,
    fp8_linear_backward,
    keep_for_backward,
    linear_gemm,
    output_dtype,
    train_input_quant,
)
from nemo_jetrl.precision.quantized import save_with_weight, saved_with_weight

_FIXED_ARGS = 8  # op, weight, bias, qweight, recipe, gemm, partial_dtype, transient: then the op's inputs


class InputOp(Protocol):
    def forward(self, *ins: torch.Tensor) -> torch.Tensor: ...

    def backward(self, ins: tuple[torch.Tensor, ...], dx: torch.Tensor) -> tuple[torch.Tensor | None, ...]: ...

    def apply(self, *ins: torch.Tensor) -> torch.Tensor: ...


class _OpThenFp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, weight, bias, qweight, recipe, gemm, partial_dtype, transient, *ins):
        # ins: the op's inputs; x = op.forward(*ins): [..., K]; weight: [N, K] master; y: [..., N]
        x = op.forward(*ins)
        if x.shape[-1] != weight.shape[-1]:
            raise ValueError(f"linear_after: the op made [..., {x.shape[-1]}], the linear takes [..., {weight.shape[-1]}]")
        x_shape, x_dtype, out_dtype = x.shape, x.dtype, partial_dtype or output_dtype(x)
        with no_autocast(x.device.type):
            x_fp8, x_scale, saved = train_input_quant(x.reshape(-1, x_shape[-1]), recipe, ctx.needs_input_grad[1])
            del x  # the op's output: its FP8 copies are all the GEMM and the backward read
            y2 = qweight.layout.fprop(x_fp8, x_scale, qweight, bias, out_dtype, gemm.fprop)  # y2: [M, N]
        save_with_weight(ctx, (*ins, *saved), qweight, transient)
        keep_for_backward(ctx, recipe, gemm, weight, bias, x_shape, x_dtype)
        ctx.op, ctx.n_ins = op, len(ins)
        return y2.reshape(*x_shape[:-1], y2.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        saved, qweight = saved_with_weight(ctx)
        ins, xt = saved[: ctx.n_ins], saved[ctx.n_ins :]
        del saved
        need_ins = any(ctx.needs_input_grad[_FIXED_ARGS:])
        need_w, need_b = ctx.needs_input_grad[1:3]
        grad_x, grad_w, grad_b = fp8_linear_backward(ctx, grad_out, xt, qweight, need_ins, need_w, need_b)
        # X^T and a transient FP8 weight, recomputed by activation checkpointing, are held only here (the checkpoint
        # lets go of what it hands out): gone before the op's backward allocates, as after a separate linear's
        del xt, qweight
        grad_ins = ctx.op.backward(ins, grad_x) if need_ins else (None,) * ctx.n_ins
        return None, grad_w, grad_b, None, None, None, None, None, *grad_ins


def linear_after(linear: torch.nn.Module, op: InputOp, *ins: torch.Tensor) -> torch.Tensor:
    """`linear(op.apply(*ins))`, bitwise; an `Fp8Linear` training in FP8 makes the op's output inside its autograd
    function and frees it before its GEMM (module docstring). Any other linear or mode, and a linear with module hooks
    (FSDP2's unshard and reshard, which run only through `linear(...)`): the plain call."""
    hooked = linear._forward_pre_hooks or linear._forward_hooks or linear._backward_hooks
    if not isinstance(linear, Fp8Linear) or linear.mode != "train" or not linear.train_fp8 or hooked:
        return linear(op.apply(*ins))
    qweight = linear.quantized_weight()
    weight, bias = linear.train_operands()
    return _OpThenFp8Linear.apply(
        op, weight, bias, qweight, linear.recipe, linear_gemm(linear), linear.partial_dtype, linear.transient_weight,
        *ins,
    )  # fmt: skip
