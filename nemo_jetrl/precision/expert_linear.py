"""The expert linears of a mixture-of-experts layer: E weights [E, N, K], each applied to its own group of rows.

    y = expert_linear(x, split):  x [M, K] rows sorted by expert (expert 0's rows first), split.counts [E] rows per
                                  expert  ->  y [M, N], y[rows of e] = x[rows of e] @ W[e]^T

`ExpertLinear` holds high-precision weights (BF16 / FP32; HF's 3D expert tensors, `gate_up_proj` [E, 2F, H] and
`down_proj` [E, H, F]). `Fp8ExpertLinear` is an `Fp8Linear` whose master weight is [E, N, K]: each expert is quantized
on its own in the recipe's scale layout (`ScaleLayout.expert_weight_quant`: the bits `weight_quant` gives that
expert's [N, K] alone), and its FProp / DGrad / WGrad run per expert with the layout's own casts and GEMMs
(`Fp8ExpertsFunction`), so expert e computes exactly what an `Fp8Linear` with W[e] computes for its rows (its
activation casts are taken over its own rows: per token for blockwise / rowwise, one scale per expert's rows for
tensorwise). The rollout runs the same forward on the same cached FP8 weight.

Where the rows go (`ExpertSplit`): the per-expert products read `split.host()` (one device -> host copy of the
counts per MoE layer, shared by its two linears); a layout with grouped GEMMs (`ScaleLayout.grouped_fprop` /
`grouped_dgrad`, CUDA) runs the FProp and the DGrad of all experts in one launch each, without it (the rollout: no
host sync, a capturable decode step); the WGrad (its operands grouped by 128 tokens within each expert) stays per
expert.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.precision import batch_invariant
from nemo_jetrl.precision.axis_gemm import aligned_16
from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.linear import (
    AUTO_GEMM,
    Fp8Linear,
    FpropKernel,
    FpropKernelSwitch,
    GemmChoice,
    linear_gemm,
    local_tensor,
    output_dtype,
)
from nemo_jetrl.precision.quantized import QuantizedWeight
from nemo_jetrl.precision.recipe import PrecisionRecipe

# torch's grouped GEMM (BF16, sm80+): F.grouped_mm, or torch._grouped_mm where torch has no public name for it
GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
# what a high-precision linear runs: its usual product or the exact mode's batch-invariant one (no cuBLAS pin)
HIGH_PRECISION_KERNELS = (FpropKernel.AUTO, FpropKernel.BATCH_INVARIANT)


@dataclass
class ExpertSplit:
    """How many of the sorted rows each expert takes: counts [E] int64 on the rows' device."""

    counts: torch.Tensor
    _host: tuple[int, ...] | None = field(default=None, repr=False)

    def host(self) -> tuple[int, ...]:
        """The counts on the host (one device -> host copy, then cached)."""
        if self._host is None:
            self._host = tuple(int(c) for c in self.counts.tolist())
        return self._host

    def segments(self) -> list[tuple[int, int, int]]:
        """(expert, first row, end row) of every expert that has rows, in expert order."""
        out, lo = [], 0
        for e, count in enumerate(self.host()):
            if count:
                out.append((e, lo, lo + count))
            lo += count
        return out

    def offsets(self) -> torch.Tensor:
        """End row of each expert's group, int32 [E] on the device (the grouped GEMMs' `offs`; no host sync)."""
        return self.counts.cumsum(0).to(torch.int32)


def _cat_rows(pieces: list[torch.Tensor], like: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The experts' outputs [M_e, N] in expert order -> [M, N] (M = 0: an empty [0, N])."""
    return torch.cat(pieces) if pieces else like.new_zeros(0, n, dtype=dtype)


class ExpertLinear(FpropKernelSwitch, nn.Module):
    """E bias-free linears in high precision: weight [E, N, K] (an HF 3D expert tensor, the Parameter itself).

    `fprop_kernel` BATCH_INVARIANT (the exact mode, `models.batch_invariant`): each expert's product is the
    batch-invariant linear, so a row's output does not depend on the other rows of its expert."""

    FPROP_KERNELS = HIGH_PRECISION_KERNELS

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        if weight.dim() != 3:
            raise ValueError(f"ExpertLinear: weight must be [E, N, K], got shape {tuple(weight.shape)}")
        self.num_experts, self.out_features, self.in_features = weight.shape
        self.weight = weight

    def forward(self, x2: torch.Tensor, split: ExpertSplit) -> torch.Tensor:
        return expert_linear(x2, local_tensor(self.weight), split, self.exact_fprop)

    def syncs_on_host(self, dtype: torch.dtype) -> bool:
        """Whether a no-grad CUDA forward in `dtype` reads the expert counts on the host (no CUDA-graph capture)."""
        return self.exact_fprop or dtype != torch.bfloat16 or GROUPED_MM is None

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, in_features={self.in_features}, out_features={self.out_features}"


def expert_linear(x2: torch.Tensor, w3: torch.Tensor, split: ExpertSplit, exact: bool) -> torch.Tensor:
    """x2 [M, K] -> [M, N] in x2's (autocast) dtype: per expert `F.linear` (or the batch-invariant linear); a BF16
    no-grad forward on CUDA in one `F.grouped_mm` (no host sync)."""
    dtype = output_dtype(x2)
    grouped = x2.is_cuda and dtype == torch.bfloat16 and GROUPED_MM is not None
    if grouped and not exact and not torch.is_grad_enabled():
        return GROUPED_MM(x2.to(dtype), w3.to(dtype).transpose(-2, -1), offs=split.offsets())
    linear = batch_invariant.linear if exact else F.linear
    pieces = [linear(x2[lo:hi], w3[e]) for e, lo, hi in split.segments()]  # [M_e, N] each
    return _cat_rows(pieces, x2, w3.shape[1], dtype)


def quantized_experts(qweight: QuantizedWeight) -> tuple[QuantizedWeight, ...]:
    """The per-expert views of an [E, N, K] FP8 weight (each a `QuantizedWeight` of data[e], scale[e]), cached on it:
    expert e's FP8 weight is exactly the one an `Fp8Linear` with W[e] holds. A scale view that does not start on a
    16-byte boundary (a tensorwise [E, 1, 1] scale: 4 bytes an expert) is copied once here, not at every GEMM
    (cuBLASLt refuses such scale pointers: `axis_gemm.aligned_16`)."""
    views = qweight._cache.get("experts")
    if views is None:
        views = tuple(
            QuantizedWeight(d, aligned_16(s), qweight.version, qweight.block, None, qweight.layout)
            for d, s in zip(qweight.data.unbind(0), qweight.scale.unbind(0))
        )
        qweight._cache["experts"] = views
    return views


class Fp8ExpertLinear(Fp8Linear):
    """`Fp8Linear` over E experts: master `weight` [E, N, K], FP8 weight [E, N, K] with scales [E, *layout's weight
    scale shape], cached until the weight changes; forward(x2, split) as `ExpertLinear`'s (module docstring)."""

    @classmethod
    def from_expert_linear(cls, module: ExpertLinear, recipe: PrecisionRecipe) -> Fp8ExpertLinear:
        """Wrap an `ExpertLinear`, moving its Parameter in (no copy). Flags: the recipe's."""
        fp8 = cls(module.in_features, module.out_features, bias=False, recipe=recipe, device="meta")
        fp8.weight = module.weight
        fp8.num_experts = module.num_experts
        fp8.train_fp8, fp8.rollout_fp8 = recipe.train_fp8, recipe.rollout_fp8
        return fp8

    def quantize_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.recipe.layout.expert_weight_quant(local_tensor(self.weight).detach(), self.recipe)

    def requantize_in_place(self) -> None:
        """A fresh cache (the per-expert views and their DGrad operands are re-made with it)."""
        self.invalidate_quantized_weight()
        self.quantized_weight()

    def forward(self, x2: torch.Tensor, split: ExpertSplit) -> torch.Tensor:  # type: ignore[override]
        if x2.dim() != 2 or x2.shape[1] != self.in_features:
            raise ValueError(f"Fp8ExpertLinear: expected x2 [M, {self.in_features}], got {tuple(x2.shape)}")
        use_fp8 = self.train_fp8 if self.mode == "train" else self.rollout_fp8
        weight = local_tensor(self.weight)
        if not use_fp8:
            return expert_linear(x2, weight, split, self.exact_fprop)
        qweight, gemm, out_dtype = self.quantized_weight(), linear_gemm(self), output_dtype(x2)
        if self.mode == "rollout":
            with torch.no_grad():
                return expert_fprop(x2, qweight, split, self.recipe, out_dtype, gemm)
        return Fp8ExpertsFunction.apply(x2, weight, qweight, split, self.recipe, out_dtype, gemm)

    def syncs_on_host(self, dtype: torch.dtype) -> bool:
        """Whether a no-grad rollout forward on CUDA reads the expert counts on the host (no CUDA-graph capture)."""
        if not self.rollout_fp8:
            return ExpertLinear.syncs_on_host(self, dtype)
        return not self.recipe.layout.features.grouped_experts

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, " + super().extra_repr().replace(", bias=False", "")


def expert_fprop(
    x2: torch.Tensor,
    qweight: QuantizedWeight,
    split: ExpertSplit,
    recipe: PrecisionRecipe,
    out_dtype: torch.dtype,
    gemm: GemmChoice = AUTO_GEMM,
) -> torch.Tensor:
    """The FP8 forward without autograd: x2 [M, K] -> [M, N]; the layout's grouped GEMM where it has one for this
    device and GEMM choice (no host sync), else expert by expert (`Fp8LinearFunction`'s casts and FProp)."""
    layout = recipe.layout
    with no_autocast(x2.device.type):
        grouped = layout.grouped_fprop(x2, qweight, split.counts, recipe, out_dtype, gemm.fprop)
        if grouped is not None:
            return grouped
        experts = quantized_experts(qweight)
        pieces = []
        for e, lo, hi in split.segments():
            x_fp8, x_scale = layout.input_quant(x2[lo:hi], recipe)  # [M_e, K], scale in the layout's shape
            pieces.append(layout.fprop(x_fp8, x_scale, experts[e], None, out_dtype, gemm.fprop))  # [M_e, N]
        return _cat_rows(pieces, x2, qweight.data.shape[1], out_dtype)


class Fp8ExpertsFunction(torch.autograd.Function):
    """Y = Q(X_e) Q(W_e)^T for every expert's rows, with FP8 DGrad and WGrad: `Fp8LinearFunction` expert by expert
    (the layout's casts and GEMMs, the same GEMM choice), gradients in the dtypes of x / weight."""

    @staticmethod
    def forward(ctx, x2, weight, qweight: QuantizedWeight, split: ExpertSplit, recipe, out_dtype, gemm=AUTO_GEMM):
        # x2: [M, K] rows sorted by expert; weight: [E, N, K] master (its FProp bits live in qweight)
        ctx.qweight, ctx.split, ctx.recipe, ctx.gemm, ctx.master = qweight, split, recipe, gemm, weight
        ctx.x_dtype, ctx.weight_dtype, ctx.k = x2.dtype, weight.dtype, x2.shape[1]
        if not ctx.needs_input_grad[1]:  # no WGrad operand to keep: the rollout's forward itself
            return expert_fprop(x2, qweight, split, recipe, out_dtype, gemm)
        layout, experts = recipe.layout, quantized_experts(qweight)
        with no_autocast(x2.device.type):
            y = layout.grouped_fprop(x2, qweight, split.counts, recipe, out_dtype, gemm.fprop)  # [M, N] | None
            pieces, saved = [], []
            for e, lo, hi in split.segments():
                # X_e: [M_e, K] (FProp) + X_e^T along its own tokens (WGrad), one read
                x_fp8, x_scale, xt_fp8, xt_scale = layout.input_quant_train(x2[lo:hi], recipe)
                saved += [xt_fp8, xt_scale]
                if y is None:
                    pieces.append(layout.fprop(x_fp8, x_scale, experts[e], None, out_dtype, gemm.fprop))  # [M_e, N]
        ctx.save_for_backward(*saved)
        return y if y is not None else _cat_rows(pieces, x2, qweight.data.shape[1], out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        recipe = ctx.recipe
        layout, experts = recipe.layout, quantized_experts(ctx.qweight)
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dy2 = grad_out.reshape(-1, grad_out.shape[-1])  # [M, N]
        saved = ctx.saved_tensors
        dx_pieces, grad_w = [], None
        if need_dw:
            grad_w = torch.zeros(ctx.master.shape, dtype=ctx.weight_dtype, device=grad_out.device)  # [E, N, K]
        with no_autocast(grad_out.device.type):
            # grad_input (DGrad): one grouped launch where the layout has one (CUDA), else per expert below
            grouped_dx = None
            if need_dx:
                grouped_dx = layout.grouped_dgrad(dy2, ctx.qweight, ctx.split.counts, recipe, ctx.x_dtype)  # [M, K]
            per_expert_dx = need_dx and grouped_dx is None
            for i, (e, lo, hi) in enumerate(ctx.split.segments()):
                dy_fp8, dy_scale, dyt_fp8, dyt_scale = layout.grad_quant(dy2[lo:hi], recipe, per_expert_dx, need_dw)
                # DGrad: dX_e [M_e, K] = Q(dY_e) @ Q(W_e^T)^T
                if per_expert_dx:
                    wt = layout.dgrad_weight(experts[e], ctx.master[e], recipe)  # W_e^T [K, N]
                    dx_pieces.append(layout.dgrad(dy_fp8, dy_scale, wt, ctx.x_dtype, recipe, ctx.gemm.dgrad))
                # grad_weight (WGrad): dW_e [N, K] = Q(dY_e^T) @ Q(X_e^T)^T, contraction over the expert's tokens
                if need_dw:
                    xt_fp8, xt_scale = saved[2 * i], saved[2 * i + 1]
                    grad_w[e] = layout.wgrad(dyt_fp8, dyt_scale, xt_fp8, xt_scale, ctx.weight_dtype, recipe)
        if grouped_dx is not None:
            return grouped_dx, grad_w, None, None, None, None, None
        grad_x = _cat_rows(dx_pieces, grad_out, ctx.k, ctx.x_dtype) if per_expert_dx else None
        return grad_x, grad_w, None, None, None, None, None


class RouterLinear(FpropKernelSwitch, nn.Linear):
    """A mixture-of-experts router's gate [E, H]: logits in FP32 on trainer and rollout alike (the layer map keeps
    it out of FP8, as it keeps BF16 first / last layers); `fprop_kernel` BATCH_INVARIANT (the exact mode and matched
    kernels): the batch-invariant FP32 product, so both sides compute the same logits bits for the same hidden
    state."""

    FPROP_KERNELS = HIGH_PRECISION_KERNELS

    @classmethod
    def from_weight(cls, weight: nn.Parameter) -> RouterLinear:
        """A router over an existing gate weight [E, H] (the Parameter itself, no copy)."""
        module = cls(weight.shape[1], weight.shape[0], bias=False, device="meta")
        module.weight = weight
        return module

    def forward(self, h2: torch.Tensor) -> torch.Tensor:  # h2: [T, H] -> logits [T, E] fp32
        weight = local_tensor(self.weight)
        with no_autocast(h2.device.type):
            if self.exact_fprop:
                return batch_invariant.linear(h2.float(), weight.float())
            return F.linear(h2.float(), weight.float())
