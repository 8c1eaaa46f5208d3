"""The trainer's FP8 projections of one weight group (q/k/v, gate/up) as ONE GEMM per pass.

Sibling linears read the same input X. Run one by one, each quantizes X again (both layouts: FProp's 1x128 groups
and WGrad's groups along the tokens), and each runs three narrow GEMMs; at hidden 4,096 the k and v projections
(N = 1,024) run slower in FP8 than in BF16 (docs/performance.md). `GroupedFp8LinearFunction` quantizes X once and
runs FProp, DGrad and WGrad once over the group's shared FP8 buffer (`Fp8WeightGroup`, e4m3 [sum N_i, K]):

- FProp  Y [M, sum N_i] = Q(X) @ Q(W_group)^T, returned as the members' column views;
- DGrad  dX [M, K] = Q(dY) [M, sum N_i] @ Q(W_group) (the buffer's 128x128 tiles transposed), one GEMM instead of
  one per member plus the sum of their dX;
- WGrad  dW_group [sum N_i, K] = Q(dY^T) @ Q(X^T)^T, each member's gradient its rows.

The members' outputs are the function's own outputs (column views of Y), so their gradients come back one per
member and are joined into dY here: without a copy where the consumer's backward wrote them side by side into one
buffer (the fused SiLU*up does, for gate/up: `utils.columns.join_columns`), else by concatenation.

Every tile and every 1x128 group holds the values it holds per member (each N_i is a multiple of 128), so the
quantized operands are bitwise the per-member ones; the GEMMs' accumulation order may differ in the last bits.
The rollout's fast path already runs FProp grouped (`project_shared_input(..., grouped=True)`), so the trainer's
forward is now the same GEMM as the rollout's prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.linear import Fp8Linear, local_tensor, output_dtype
from nemo_jetrl.precision.quantized import QuantizedWeight, save_with_weight, saved_with_weight
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.recipes.gemm_choice import choose_gemm, linear_gemm
from nemo_jetrl.utils.columns import join_columns


class GroupedFp8LinearFunction(torch.autograd.Function):
    """(Y_1, ..., Y_n), the column views [..., N_i] of Y [..., sum N_i] = Q(X) Q(W_group)^T + concat(b_i); FP8
    DGrad / WGrad over the whole group.

    Inputs after x: the group's `QuantizedWeight`, the member widths, the recipe, the output dtype, `transient` (the
    buffer kept as saved tensors: `quantized.save_with_weight`), then the members' master weights and (when they
    have them) their biases, so that each member's parameters get their gradients.
    """

    @staticmethod
    def forward(ctx, x, qweight: QuantizedWeight, splits, recipe: PrecisionRecipe, out_dtype, transient, *params):
        # x: [..., K]; params: weights [N_i, K] (values in qweight) then biases [N_i] (or none)
        n = len(splits)
        weights, biases = params[:n], params[n:]
        layout, gemm = recipe.layout, choose_gemm(recipe)
        x2 = x.reshape(-1, x.shape[-1])  # x2: [M, K]
        need_dw = any(ctx.needs_input_grad[6 : 6 + n])
        saved: tuple[torch.Tensor, ...] = ()
        with no_autocast(x.device.type):
            if need_dw:  # X [M, K] 1x128 along K (FProp) + X^T [K, MP] along the tokens (WGrad), read once
                x_fp8, x_scale, xt_fp8, xt_scale = layout.input_quant_train(x2, recipe)
                saved = (xt_fp8, xt_scale)
            else:
                x_fp8, x_scale = layout.input_quant(x2, recipe)
            bias = torch.cat([b.detach() for b in biases]) if biases else None  # [sum N_i], read live each call
            y2 = layout.fprop(x_fp8, x_scale, qweight, bias, out_dtype, gemm.fprop)  # y2: [M, sum N_i]
        save_with_weight(ctx, saved, qweight, transient)
        ctx.recipe, ctx.splits, ctx.n = recipe, tuple(splits), n
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.weight_dtypes = [w.dtype for w in weights]
        ctx.bias_dtypes = [b.dtype for b in biases]
        return tuple(y2.reshape(*x.shape[:-1], y2.shape[-1]).split(splits, dim=-1))  # [..., N_i] views

    @staticmethod
    def backward(ctx, *grad_outs):
        recipe, splits, n = ctx.recipe, ctx.splits, ctx.n
        saved, qweight = saved_with_weight(ctx)
        layout, gemm = recipe.layout, choose_gemm(recipe)
        need_dx = ctx.needs_input_grad[0]
        need_dw = any(ctx.needs_input_grad[6 : 6 + n])
        grad_out = join_columns(grad_outs)  # [..., sum N_i]: a view when the members' gradients lie side by side
        dy2 = grad_out.reshape(-1, grad_out.shape[-1])  # dy2: [M, sum N_i]
        grad_x, grad_ws, grad_bs = None, [None] * n, [None] * len(ctx.bias_dtypes)
        with no_autocast(grad_out.device.type):
            # dY [M, sum N_i] 1x128 along N (DGrad) + dY^T [sum N_i, MP] along the tokens (WGrad), read once
            dy_fp8, dy_scale, dyt_fp8, dyt_scale = layout.grad_quant(dy2, recipe, need_dx, need_dw)
            if need_dx:  # DGrad: dX [M, K] = Q(dY) [M, sum N_i] @ Q(W_group) [sum N_i, K]
                wt = layout.dgrad_weight(qweight, None, recipe)  # [K, sum N_i], the buffer's tiles transposed
                grad_x = layout.dgrad(dy_fp8, dy_scale, wt, ctx.x_dtype, recipe, gemm.dgrad).reshape(ctx.x_shape)
            if need_dw:  # WGrad: dW_group [sum N_i, K] = Q(dY^T) [sum N_i, MP] @ Q(X^T)^T [MP, K]
                xt_fp8, xt_scale = saved
                dw = layout.wgrad(dyt_fp8, dyt_scale, xt_fp8, xt_scale, ctx.weight_dtypes[0], recipe)
                grad_ws = [g if ctx.needs_input_grad[6 + i] else None for i, g in enumerate(dw.split(splits))]
            if ctx.bias_dtypes and any(ctx.needs_input_grad[6 + n :]):  # plain FP32 reductions over the tokens
                db = dy2.float().sum(0)  # [sum N_i]
                grad_bs = [g.to(dt) for g, dt in zip(db.split(splits), ctx.bias_dtypes)]
        return (grad_x, None, None, None, None, None, *grad_ws, *grad_bs)


def trains_grouped(x: torch.Tensor, linears: Sequence[Fp8Linear], group) -> bool:
    """Whether the trainer runs `linears` (exactly `group`'s members, in order) as one grouped GEMM per pass: FP8
    training in a layout that supports it (`LayoutFeatures.grouped_training`) on CUDA with the default GEMM choice (the exact mode and matched kernels keep their per-linear
    GEMMs; off CUDA the per-linear emulation keeps its bits), no tensor-parallel shard (a shared buffer exists), and
    the group's `train_grouped` switch on (benchmarks turn it off for the per-linear ablation)."""
    first = linears[0]
    return (
        x.is_cuda
        and group is not None
        and getattr(group, "train_grouped", False)
        and tuple(linears) == group.members
        and first.mode == "train"
        and first.train_fp8
        and first.recipe.layout.features.grouped_training
        and all(linear_gemm(m) == choose_gemm(m.recipe) and m.partial_dtype is None for m in linears)
    )


def grouped_train_projections(x: torch.Tensor, group) -> list[torch.Tensor] | None:
    """[m(x) for m in group.members] through `GroupedFp8LinearFunction` (column views of one [..., sum N_i]
    output); None when the members hold no shared buffer (sharded master weights)."""
    qweight = group.quantized_weight()
    if qweight is None:
        return None
    members = group.members
    weights = [local_tensor(m.weight) for m in members]
    biases = [local_tensor(m.bias) for m in members] if members[0].bias is not None else []
    transient = members[0].transient_weight
    ys = GroupedFp8LinearFunction.apply(
        x, qweight, group.splits, members[0].recipe, output_dtype(x), transient, *weights, *biases
    )
    return list(ys)
