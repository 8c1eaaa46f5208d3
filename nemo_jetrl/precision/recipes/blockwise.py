"""The blockwise layout (Jet-RL / DeepSeek-V3): 1x128 groups for activations and gradients, 128x128 weight tiles.

| GEMM                              | a (scale)                                  | b (scale)                                    |
|-----------------------------------|--------------------------------------------|----------------------------------------------|
| FProp  Y [M, N]  = X W^T          | X 1x128 along K, [M, K/128]                | W 128x128 tiles, [N/128, K/128]              |
| DGrad  dX [M, K] = dY W           | dY 1x128 along N, [M, N/128]               | W^T: the FProp tiles transposed (no re-cast) |
| WGrad  dW [N, K] = dY^T X         | dY^T 1x128 along the tokens, [N, M'/128]   | X^T 1x128 along the tokens or 128x128 tiles  |

The WGrad operands are written by the same pass as the FProp / DGrad casts (`act_quant_dual`); M' is M padded to a
multiple of 128 with zero tokens. GEMMs: `gemm.fp8_blockwise_mm` (scaled_mm on sm90, DeepGEMM, the split-K Triton
kernel, the batch-invariant GEMM or the exact emulation, as the `GemmChoice` and the device decide).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_jetrl.precision.gemm import fp8_blockwise_mm
from nemo_jetrl.precision.quant import (
    act_quant,
    act_quant_dual,
    triton_available,
    weight_dequant,
    weight_quant_checked,
)
from nemo_jetrl.precision.recipes.base import DGradWeight, LayoutFeatures, ScaleLayout

_EVERY_FEATURE = LayoutFeatures(
    vllm_weights=True,
    exact_gemm=True,
    sharded_refit=True,
    deep_gemm=True,
    fused_input_cast=True,
    grouped_training=True,
    grouped_experts=True,
)


@dataclass(frozen=True)
class BlockwiseLayout(ScaleLayout):
    name: str = "blockwise"
    features: LayoutFeatures = _EVERY_FEATURE

    def weight_quant(self, w, recipe):
        return weight_quant_checked(w, recipe.block_size, recipe.pow2_weight_scales)

    def weight_scale_shape(self, n, k, block):
        return -(-n // block), -(-k // block)

    def expert_weight_quant(self, w3, recipe):
        # [E, N, K] as [E * N, K] in one pass: with N a multiple of the block no tile straddles two experts
        e, n, k = w3.shape
        if n % recipe.block_size:
            return super().expert_weight_quant(w3, recipe)
        data, scale, nonfinite = self.weight_quant(w3.reshape(e * n, k), recipe)
        return data.view(e, n, k), scale.view(e, n // recipe.block_size, -1), nonfinite

    def weight_dequant(self, q, scale, block):
        return weight_dequant(q, scale, block)

    def dgrad_weight(self, qweight, master, recipe) -> DGradWeight:
        # W^T: [K, N] e4m3, the forward's 128x128 tiles transposed (no re-quantization); refilled by `refill`
        wt_fp8, wt_scale = qweight.transposed(recipe.cache_dgrad_weight)
        return wt_fp8, wt_scale, qweight.dequantized(transposed=True)

    def input_quant(self, x2, recipe):
        return act_quant(x2, recipe.block_size, recipe.pow2_activation_scales)

    def input_quant_train(self, x2, recipe):
        # X: [M, K] 1x128 along K (FProp) + X^T: [K, M'] along the tokens, 1x128 or 128x128 (WGrad), one read
        return act_quant_dual(x2, recipe.block_size, recipe.pow2_activation_scales, recipe.wgrad_x_blocks)

    def grad_quant(self, dy2, recipe, need_dx, need_dw):
        # dY: [M, N] 1x128 along N (DGrad) + dY^T: [N, M'] 1x128 along the tokens (WGrad), one read; a zero-advantage
        # sequence's and the prompt's rows of dY are zero (`zero_rows`: the kernel form that stays fast on them)
        block, pow2 = recipe.block_size, recipe.pow2_activation_scales
        if need_dw:
            return act_quant_dual(dy2, block, pow2, "1x128", zero_rows=True)
        if need_dx:
            return (*act_quant(dy2, block, pow2, zero_rows=True), None, None)
        return None, None, None, None

    def fprop(self, x, x_scale, qweight, bias, out_dtype, backend="auto") -> torch.Tensor:
        return fp8_blockwise_mm(
            x, x_scale, qweight.data, qweight.scale, out_dtype, bias=bias, block=qweight.block, backend=backend,
            w_dequant=qweight.dequantized() if backend == "auto" else None,
        )  # fmt: skip

    def dgrad(self, dy, dy_scale, wt, out_dtype, recipe, backend="auto") -> torch.Tensor:
        return fp8_blockwise_mm(
            dy, dy_scale, wt[0], wt[1], out_dtype, block=recipe.block_size, backend=backend, w_dequant=wt[2]
        )

    def wgrad(self, dyt, dyt_scale, xt, xt_scale, out_dtype, recipe) -> torch.Tensor:
        return fp8_blockwise_mm(
            dyt, dyt_scale, xt, xt_scale, out_dtype, w_blocks=recipe.wgrad_x_blocks, block=recipe.block_size
        )

    def grouped_fprop(self, x2, qweight, counts, recipe, out_dtype, backend="auto"):
        # CUDA: one grouped Triton launch (kernels/triton_grouped_gemm.py), batch-invariant whatever `backend` asks
        # for (the exact mode's and the matched kernels' forward alike); elsewhere the per-expert twin
        if not x2.is_cuda or not triton_available():
            return None
        from nemo_jetrl.precision.kernels.triton_grouped_gemm import grouped_fp8_gemm

        x_fp8, x_scale = self.input_quant(x2, recipe)  # [M, K], [M, K/128]: per token, as each expert's own cast
        return grouped_fp8_gemm(x_fp8, x_scale, qweight.data, qweight.scale, counts, out_dtype)

    def grouped_dgrad(self, dy2, qweight, counts, recipe, out_dtype):
        # CUDA: dX = Q(dY) (1x128 along N, the DGrad cast) @ each expert's W^T tiles [K, N], one grouped launch
        if not dy2.is_cuda or not triton_available():
            return None
        from nemo_jetrl.precision.kernels.triton_grouped_gemm import grouped_fp8_gemm, transposed_experts

        wt, wt_scale = qweight._cache.get("experts_t") or transposed_experts(qweight.data, qweight.scale)
        if recipe.cache_dgrad_weight:  # kept until the weight changes, as a linear's W^T
            qweight._cache["experts_t"] = wt, wt_scale
        dy_fp8, dy_scale = act_quant(dy2, recipe.block_size, recipe.pow2_activation_scales, zero_rows=True)  # [M, N]
        return grouped_fp8_gemm(dy_fp8, dy_scale, wt, wt_scale, counts, out_dtype)

    def fused_input_cast(self, recipe):
        return recipe.block_size, recipe.pow2_activation_scales

    def describe(self, wgrad_x_blocks):
        return f"w128x128,a1x128,wgrad_x={wgrad_x_blocks}"


BLOCKWISE = BlockwiseLayout()
