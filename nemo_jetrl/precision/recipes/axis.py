"""The rowwise and tensorwise layouts: each GEMM operand scaled along the dim its GEMM contracts.

| GEMM                                   | a (scale)                              | b (scale)                                 |
|----------------------------------------|----------------------------------------|-------------------------------------------|
| FProp  Y [M, N]  = X [M, K] W^T        | X per token over K, [M, 1]             | W per output channel over K, [N, 1]       |
| DGrad  dX [M, K] = dY [M, N] W         | dY per token over N, [M, 1]            | W^T per input channel over N, [K, 1] (*)  |
| WGrad  dW [N, K] = dY^T [N, M] X       | dY^T per output channel over M, [N, 1] | X^T per input channel over M, [K, 1]      |

(*) rowwise: a second cast of the master W, made in each backward (with the recipe's `cache_dgrad_weight`: once per
weight change, kept with the FProp weight and re-made in place by `refill_dgrad_weight`). tensorwise: one scale per
tensor, [1, 1] everywhere, so DGrad / WGrad read the FProp bits of W and X and the DGrad bits of dY, transposed (no
re-quantization: the cast writes both layouts, `tensor_quant_dual`). Token dims are zero-padded to a multiple of 16
for WGrad (cuBLAS). GEMMs: `axis_gemm.fp8_axis_mm` (`torch._scaled_mm` on sm90, exact emulation elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.precision.axis_gemm import fp8_axis_mm, pad_rows
from nemo_jetrl.precision.axis_quant import (
    axis_dequant,
    col_quant_t,
    row_quant,
    row_quant_checked,
    tensor_quant,
    tensor_quant_dual,
)
from nemo_jetrl.precision.recipes.base import LayoutFeatures, ScaleLayout
from nemo_jetrl.precision.transpose import transpose_fp8


@dataclass(frozen=True)
class AxisLayout(ScaleLayout):
    """Scales [R, 1] or [1, 1] on every operand; the GEMMs are `fp8_axis_mm`'s."""

    def operand_dequant(self, q, scale):
        return axis_dequant(q, scale)

    def fprop(self, x, x_scale, qweight, bias, out_dtype, backend="auto") -> torch.Tensor:
        self.check_fprop_backend(backend)
        return fp8_axis_mm(x, x_scale, qweight.data, qweight.scale, out_dtype, bias=bias,
                           b_dequant=qweight.dequantized())  # fmt: skip

    def dgrad(self, dy, dy_scale, wt, out_dtype, recipe, backend="auto") -> torch.Tensor:
        return fp8_axis_mm(dy, dy_scale, wt[0], wt[1], out_dtype, b_dequant=wt[2])

    def wgrad(self, dyt, dyt_scale, xt, xt_scale, out_dtype, recipe) -> torch.Tensor:
        return fp8_axis_mm(dyt, dyt_scale, xt, xt_scale, out_dtype)


@dataclass(frozen=True)
class RowwiseLayout(AxisLayout):
    name: str = "rowwise"
    features: LayoutFeatures = LayoutFeatures()

    def weight_quant(self, w, recipe):
        return row_quant_checked(w, recipe.pow2_weight_scales)

    def weight_scale_shape(self, n, k, block):
        return n, 1

    def expert_weight_quant(self, w3, recipe):
        # one scale per row: [E, N, K] as [E * N, K] in one pass gives every expert's own rows' scales
        e, n, k = w3.shape
        data, scale, nonfinite = self.weight_quant(w3.reshape(e * n, k), recipe)
        return data.view(e, n, k), scale.view(e, n, 1), nonfinite

    def make_dgrad_weight(self, qweight, master, recipe):
        return col_quant_t(master.detach(), recipe.pow2_weight_scales)  # [K, N], [K, 1]

    def input_quant(self, x2, recipe):
        return row_quant(x2, recipe.pow2_activation_scales)  # [M, K], [M, 1]

    def input_quant_train(self, x2, recipe):
        # X per token (FProp) + X^T [K, MP] per input channel over the tokens (WGrad), MP: M padded to 16
        pow2 = recipe.pow2_activation_scales
        return (*row_quant(x2, pow2), *col_quant_t(pad_rows(x2), pow2))

    def grad_quant(self, dy2, recipe, need_dx, need_dw):
        pow2 = recipe.pow2_activation_scales
        dy = row_quant(dy2, pow2) if need_dx else (None, None)  # [M, N], [M, 1]
        dyt = col_quant_t(pad_rows(dy2), pow2) if need_dw else (None, None)  # [N, MP], [N, 1]
        return (*dy, *dyt)

    def describe(self, wgrad_x_blocks):
        return "w_per_row,a_per_row"


@dataclass(frozen=True)
class TensorwiseLayout(AxisLayout):
    name: str = "tensorwise"
    features: LayoutFeatures = LayoutFeatures()

    def weight_quant(self, w, recipe):
        return tensor_quant(w, recipe.pow2_weight_scales, count_nonfinite=True)

    def weight_scale_shape(self, n, k, block):
        return 1, 1

    def make_dgrad_weight(self, qweight, master, recipe):
        return transpose_fp8(qweight.data), qweight.scale  # [K, N], [1, 1]: the FProp bits transposed

    def group_buffer_scale(self, scales, splits):
        # one scale per member: the buffer's GEMM scales each member's rows by it, [sum N_i, 1]
        return torch.cat([s.expand(n, 1) for s, n in zip(scales, splits)])

    def input_quant(self, x2, recipe):
        return tensor_quant(x2, recipe.pow2_activation_scales)  # [M, K], [1, 1]

    def input_quant_train(self, x2, recipe):
        # X (FProp) and X^T [K, MP] (WGrad): the same bits, written transposed by the same cast
        x_fp8, xt_fp8, x_scale = tensor_quant_dual(x2, recipe.pow2_activation_scales)
        return x_fp8, x_scale, xt_fp8, x_scale

    def grad_quant(self, dy2, recipe, need_dx, need_dw):
        pow2 = recipe.pow2_activation_scales
        if need_dw:
            dy_fp8, dyt_fp8, dy_scale = tensor_quant_dual(dy2, pow2)  # [M, N], [N, MP], [1, 1]
            return dy_fp8, dy_scale, dyt_fp8, dy_scale
        if need_dx:
            return (*tensor_quant(dy2, pow2), None, None)
        return None, None, None, None

    def describe(self, wgrad_x_blocks):
        return "w_per_tensor,a_per_tensor"


ROWWISE = RowwiseLayout()
TENSORWISE = TensorwiseLayout()


def dgrad_weight(qweight, master: torch.Tensor, recipe):
    """The DGrad operand W^T of `recipe`'s layout: (e4m3 [K, N], fp32 scale, fp32 dequant or None where scaled_mm
    runs) (`ScaleLayout.dgrad_weight`)."""
    return recipe.layout.dgrad_weight(qweight, master, recipe)
