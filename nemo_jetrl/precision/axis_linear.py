"""FP8 training GEMMs of the rowwise and tensorwise recipes: each operand scaled along the dim its GEMM contracts.

| GEMM                                   | a (scale)                             | b (scale)                                 |
|----------------------------------------|---------------------------------------|-------------------------------------------|
| FProp  Y [M, N]  = X [M, K] W^T        | X per token over K, [M, 1]            | W per output channel over K, [N, 1]       |
| DGrad  dX [M, K] = dY [M, N] W         | dY per token over N, [M, 1]           | W^T per input channel over N, [K, 1] (*)  |
| WGrad  dW [N, K] = dY^T [N, M] X       | dY^T per output channel over M, [N, 1] | X^T per input channel over M, [K, 1]      |

(*) rowwise: a second cast of the master W, made in each backward (with the recipe's `cache_dgrad_weight`: once per
weight change, kept with the FProp weight and re-made in place by `refill_dgrad_weight`). tensorwise: one scale per tensor, so DGrad / WGrad read the FProp bits of W and X and the DGrad
bits of dY, transposed (no re-quantization: the cast writes both layouts, `tensor_quant_dual`). Token dims are
zero-padded to a multiple of 16 for WGrad (cuBLAS).
"""

from __future__ import annotations

import torch

from nemo_jetrl.precision.axis_gemm import fp8_axis_mm, pad_rows
from nemo_jetrl.precision.axis_quant import axis_dequant, col_quant_t, row_quant, tensor_quant, tensor_quant_dual
from nemo_jetrl.precision.gemm import gemm_backend, no_autocast
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.transpose import transpose_fp8


def dgrad_weight(qweight, master: torch.Tensor, recipe: PrecisionRecipe):
    """The DGrad operand W^T: (e4m3 [K, N], fp32 scale [K, 1] or [1, 1], fp32 dequant [K, N] or None where
    scaled_mm runs), cached on `qweight` (a `QuantizedWeight`, re-made at every weight change) with the recipe's
    `cache_dgrad_weight`, else made for this backward only."""
    if "dgrad" in qweight._cache:
        return qweight._cache["dgrad"]
    dgrad = _make_dgrad_weight(qweight, master, recipe)
    if recipe.cache_dgrad_weight:
        qweight._cache["dgrad"] = dgrad
    return dgrad


def refill_dgrad_weight(qweight, master: torch.Tensor, recipe: PrecisionRecipe) -> None:
    """Re-make the cached DGrad operand (if any) into its own tensors after an in-place re-quantization
    (`Fp8Linear.requantize_in_place`): a captured training step reads W^T where it lies."""
    if "dgrad" not in qweight._cache:
        return
    with torch.no_grad():
        for mine, fresh in zip(qweight._cache["dgrad"], _make_dgrad_weight(qweight, master, recipe)):
            if mine is not None and mine is not fresh:
                mine.copy_(fresh)


def _make_dgrad_weight(qweight, master: torch.Tensor, recipe: PrecisionRecipe):
    if recipe.granularity == "tensorwise":
        data_t, scale_t = transpose_fp8(qweight.data), qweight.scale  # [K, N], [1, 1]
    else:
        data_t, scale_t = col_quant_t(master.detach(), recipe.pow2_weight_scales)  # [K, N], [K, 1]
    emulated = gemm_backend(data_t.device) == "emulated"
    return data_t, scale_t, axis_dequant(data_t, scale_t) if emulated else None


class AxisFp8LinearFunction(torch.autograd.Function):
    """Y = Q(X) Q(W)^T with FP8 DGrad and WGrad in the rowwise / tensorwise layouts of the module docstring;
    gradients leave in the dtypes of x / weight / bias."""

    @staticmethod
    def forward(ctx, x, weight, bias, qweight, recipe: PrecisionRecipe, out_dtype):
        # x: [..., K]; weight: [N, K] master (its FProp bits live in qweight); bias: [N] or None
        pow2, rowwise = recipe.pow2_activation_scales, recipe.granularity == "rowwise"
        x2 = x.reshape(-1, x.shape[-1])  # x2: [M, K]
        with no_autocast(x.device.type):
            need_dw = ctx.needs_input_grad[1]
            if rowwise or not need_dw:
                x_fp8, x_scale = (row_quant if rowwise else tensor_quant)(x2, pow2)  # [M, K], [M, 1] | [1, 1]
            if need_dw:
                # WGrad operand X^T [K, MP] (MP: M padded to 16 with zero tokens): rowwise per input channel over
                # the tokens; tensorwise the FProp bits themselves, written transposed by the same cast
                if rowwise:
                    ctx.save_for_backward(*col_quant_t(pad_rows(x2), pow2))
                else:
                    x_fp8, xt_fp8, x_scale = tensor_quant_dual(x2, pow2)
                    ctx.save_for_backward(xt_fp8, x_scale)
            y2 = fp8_axis_mm(x_fp8, x_scale, qweight.data, qweight.scale, out_dtype, bias=bias,
                             b_dequant=qweight.dequantized())  # fmt: skip
        ctx.qweight, ctx.recipe, ctx.master = qweight, recipe, weight
        ctx.x_shape, ctx.x_dtype, ctx.weight_dtype = x.shape, x.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y2.reshape(*x.shape[:-1], y2.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        recipe = ctx.recipe
        pow2, rowwise = recipe.pow2_activation_scales, recipe.granularity == "rowwise"
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dy2 = grad_out.reshape(-1, grad_out.shape[-1])  # dy2: [M, N]
        grad_x = grad_w = grad_b = None
        with no_autocast(grad_out.device.type):
            if rowwise:
                dy_fp8, dy_scale = row_quant(dy2, pow2) if need_dx else (None, None)  # [M, N], [M, 1]
                dyt = col_quant_t(pad_rows(dy2), pow2) if need_dw else None  # [N, MP], [N, 1]
            elif need_dw:
                dy_fp8, dyt_fp8, dy_scale = tensor_quant_dual(dy2, pow2)  # [M, N], [N, MP], [1, 1]
                dyt = (dyt_fp8, dy_scale)
            else:
                dy_fp8, dy_scale = tensor_quant(dy2, pow2)  # [M, N], [1, 1]
            # grad_input (DGrad): dX [M, K] = Q(dY) [M, N] @ Q(W^T) [K, N]^T
            if need_dx:
                wt_fp8, wt_scale, wt_dequant = dgrad_weight(ctx.qweight, ctx.master, recipe)
                grad_x = fp8_axis_mm(dy_fp8, dy_scale, wt_fp8, wt_scale, ctx.x_dtype, b_dequant=wt_dequant)
                grad_x = grad_x.reshape(ctx.x_shape)
            # grad_weight (WGrad): dW [N, K] = Q(dY^T) [N, MP] @ Q(X^T) [K, MP]^T, contraction over the tokens
            if need_dw:
                xt_fp8, xt_scale = ctx.saved_tensors  # [K, MP]
                grad_w = fp8_axis_mm(*dyt, xt_fp8, xt_scale, ctx.weight_dtype)
            # grad_bias: plain FP32 reduction over tokens
            if ctx.bias_dtype is not None and need_db:
                grad_b = dy2.float().sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None
