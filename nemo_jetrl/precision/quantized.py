"""The FP8 tensors both sides share: a linear's cached FP8 weight and an activation cast once for several linears."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nemo_jetrl.precision.gemm import gemm_backend
from nemo_jetrl.precision.recipes import BLOCKWISE, ScaleLayout
from nemo_jetrl.precision.transpose import transpose_fp8


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """FP8 weight shared by the trainer's FProp/DGrad and the rollout engine.

    data: e4m3 [N, K]; scale: fp32 dequant multipliers, [ceil(N/128), ceil(K/128)] (blockwise), [N, 1] (rowwise)
    or [1, 1] (tensorwise; a weight group's buffer holds its members' scales as [N, 1]); version: the master
    weight's `_version` when it was quantized; nonfinite: int32 0-dim count of the master weight's NaN / inf
    values then (None where unknown); layout: the recipe's scale layout (`PrecisionRecipe.layout`), which reads it.
    """

    data: torch.Tensor
    scale: torch.Tensor
    version: int
    block: int = 128
    nonfinite: torch.Tensor | None = None
    layout: ScaleLayout = BLOCKWISE
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def granularity(self) -> str:
        """The name of its scale layout (`PrecisionRecipe.granularity`)."""
        return self.layout.name

    def transposed(self, keep: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """W^T for DGrad: e4m3 [K, N] and the same 128x128 tiles transposed, scale [K/128, N/128]. Cached with
        `keep` (one more byte per weight, held until the weight changes); else a fresh copy the caller frees
        (`PrecisionRecipe.cache_dgrad_weight`)."""
        if "data_t" in self._cache:
            return self._cache["data_t"], self._cache["scale_t"]
        data_t, scale_t = transpose_fp8(self.data), self.scale.t().contiguous()
        if keep:
            self._cache["data_t"], self._cache["scale_t"] = data_t, scale_t
        return data_t, scale_t

    def refill(
        self, data: torch.Tensor | None = None, scale: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None
    ) -> None:
        """Write a fresh quantization of the same weight into these very tensors, and refresh the cached transpose /
        dequantized copy from them in place: whatever baked their addresses (a captured training step,
        `policy/train_graphs.py`) reads the new bits. None leaves that part as it is (a weight group's members
        write their rows of the shared buffer themselves)."""
        with torch.no_grad():
            for mine, fresh in ((self.data, data), (self.scale, scale), (self.nonfinite, nonfinite)):
                if fresh is not None and mine is not None:
                    mine.copy_(fresh)
            if "data_t" in self._cache:
                transpose_fp8(self.data, out=self._cache["data_t"])
                self._cache["scale_t"].copy_(self.scale.t())
            if "dequant" in self._cache:
                wd = self._cache.pop("dequant")
                wd.copy_(self.dequantized())  # recomputed, then written where the old copy lives
                self._cache["dequant"] = wd

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor it holds: data, scale and the copies cached from them (DGrad transpose, dequantized W)."""
        cached = [t for v in self._cache.values() for t in (v if isinstance(v, tuple) else [v])]
        return [self.data, self.scale, *cached]

    def dequantized(self, transposed: bool = False) -> torch.Tensor | None:
        """fp32 dequant(W) [N, K] (or W^T [K, N]) for the emulated GEMM; None where scaled_mm runs. Cached."""
        if gemm_backend(self.data.device) != "emulated":
            return None
        if "dequant" not in self._cache:
            self._cache["dequant"] = self.layout.weight_dequant(self.data, self.scale, self.block)
        wd = self._cache["dequant"]
        return wd.t() if transposed else wd


def save_with_weight(ctx, inputs: tuple[torch.Tensor, ...], qweight: QuantizedWeight, transient: bool) -> None:
    """`ctx.save_for_backward(*inputs)` and keep `qweight` for the backward: the object on `ctx` (its cached W^T with
    it), or, where `transient` (the trainer's layers quantized as they run: `Fp8Linear.transient_weight`), only its
    data and scale as saved tensors too: under activation checkpointing saved tensors are recomputed with the layer
    in the backward instead of held from the forward, so one layer's FP8 weights are alive, not every one's."""
    ctx.n_inputs_saved = len(inputs)
    if transient:
        ctx.qweight, ctx.qweight_fields = None, (qweight.version, qweight.block, qweight.nonfinite, qweight.layout)
        ctx.save_for_backward(*inputs, qweight.data, qweight.scale)
    else:
        ctx.qweight = qweight
        ctx.save_for_backward(*inputs)


def saved_with_weight(ctx) -> tuple[tuple[torch.Tensor, ...], QuantizedWeight]:
    """What `save_with_weight` kept: (the saved inputs, the `QuantizedWeight`)."""
    saved = ctx.saved_tensors
    inputs = saved[: ctx.n_inputs_saved]
    if ctx.qweight is not None:
        return inputs, ctx.qweight
    data, scale = saved[ctx.n_inputs_saved :]
    return inputs, QuantizedWeight(data, scale, *ctx.qweight_fields)


@dataclass(frozen=True, eq=False)
class QuantizedInput:
    """An activation quantized once for several rollout-mode FP8 linears that read it (q/k/v, gate/up).

    data: e4m3 [M, K] and scale: fp32 (the recipe's activation layout: [M, K/128], [M, 1] or [1, 1]), bitwise the
    linears' own cast of x [*lead, K] (`ScaleLayout.input_quant`); out_dtype: the dtype the linears return (what
    they would have returned for x).
    """

    data: torch.Tensor
    scale: torch.Tensor
    lead_shape: tuple[int, ...]
    out_dtype: torch.dtype
