"""Rollout-only FP8 layers: `Fp8RolloutLinear` (received FP8 bits + scales, no master weight), `Fp8RolloutGroup`
(sibling projections in one buffer) and `build_rollout_replica` (a rollout copy of a converted policy).

A refit (`policy/parallel/weight_sync.py`) loads the trainer's FP8 bits into these layers; their forward is the one the
trainer's `Fp8Linear` runs in rollout mode, so equal bits give equal outputs.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from nemo_jetrl.precision.linear import (
    Fp8Linear,
    FpropKernelSwitch,
    QuantizedInput,
    QuantizedWeight,
    fp8_linear_forward,
    fprop_backend,
    output_dtype,
    quantized_input_forward,
)
from nemo_jetrl.precision.quant import FP8_DTYPE
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.weight_group import layout_problem, sibling_sets, stack_rows


class Fp8RolloutLinear(FpropKernelSwitch, nn.Module):
    """Rollout-only linear on received FP8 bits: `weight_fp8` e4m3 [N, K], `weight_scale` fp32 in the recipe's
    weight layout ([N/128, K/128] blockwise).

    Its forward is `fp8_linear_forward`, the same function `Fp8Linear` runs in rollout mode, so equal bits give
    equal outputs. Holds no master weight and no autograd state. `fprop_kernel`: the trainer's `Fp8Linear`'s.
    """

    def __init__(self, in_features: int, out_features: int, recipe: PrecisionRecipe, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features, self.recipe = in_features, out_features, recipe
        b = recipe.block_size
        device = bias.device if bias is not None else None
        self.register_buffer("weight_fp8", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        scale_shape = recipe.layout.weight_scale_shape(out_features, in_features, b)
        self.register_buffer("weight_scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.num_loads = 0
        self._qweight: QuantizedWeight | None = None
        self.weight_group: Fp8RolloutGroup | None = None
        self.partial_dtype: torch.dtype | None = None  # row-parallel: GEMM output dtype before the TP all-reduce

    @classmethod
    def from_fp8_linear(cls, module: Fp8Linear) -> Fp8RolloutLinear:
        """Same shapes and recipe; starts on `module`'s current quantized weight."""
        bias = module.bias.detach() if module.bias is not None else None
        new = cls(module.in_features, module.out_features, module.recipe, bias)
        new.fprop_kernel = module.fprop_kernel
        qweight = module.quantized_weight()
        new.weight_fp8 = new.weight_fp8.to(qweight.data.device)
        new.weight_scale = new.weight_scale.to(qweight.data.device)
        new.load(qweight.data, qweight.scale)
        return new

    def load(self, data: torch.Tensor, scale: torch.Tensor) -> None:
        """Take new FP8 bits [N, K] and scales (copied into the buffers)."""
        if data.shape != self.weight_fp8.shape or data.dtype != FP8_DTYPE:
            raise ValueError(
                f"Fp8RolloutLinear.load: expected e4m3 {tuple(self.weight_fp8.shape)}, got {data.dtype} "
                f"{tuple(data.shape)}"
            )
        if scale.shape != self.weight_scale.shape:
            raise ValueError(
                f"Fp8RolloutLinear.load: expected scale {tuple(self.weight_scale.shape)}, got {tuple(scale.shape)}"
            )
        self.weight_fp8.copy_(data)
        self.weight_scale.copy_(scale)
        self.num_loads += 1
        self._qweight = QuantizedWeight(
            self.weight_fp8, self.weight_scale, self.num_loads, self.recipe.block_size, layout=self.recipe.layout
        )

    def quantized_weight(self) -> QuantizedWeight:
        return self._qweight

    def forward(self, x: torch.Tensor | QuantizedInput) -> torch.Tensor:
        # x: [..., K] (or the same quantized once for several linears) -> [..., N]
        if isinstance(x, QuantizedInput):
            if self.partial_dtype is not None:
                x = dataclasses.replace(x, out_dtype=self.partial_dtype)
            return quantized_input_forward(x, self._qweight, self.bias, self.out_features, fprop_backend(self))
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Fp8RolloutLinear: expected input [..., {self.in_features}], got {tuple(x.shape)}")
        with torch.no_grad():
            out_dtype = self.partial_dtype or output_dtype(x)
            x2 = x.reshape(-1, self.in_features)
            y2 = fp8_linear_forward(x2, self._qweight, self.bias, self.recipe, out_dtype, fprop_backend(self))
        return y2.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Fp8RolloutGroup:
    """Sibling `Fp8RolloutLinear`s (q/k/v, gate/up) whose FP8 bits, scales and biases live in one buffer each.

    The members' `weight_fp8` / `weight_scale` / `bias` buffers become row views of the group's, so every `load`
    and refit copy lands in the shared buffer and the fused decode runs one GEMM over it (`project_shared_input`),
    as the trainer-side `Fp8WeightGroup` does.
    """

    def __init__(self, members: tuple[Fp8RolloutLinear, ...]) -> None:
        self.members, self.splits = tuple(members), tuple(m.out_features for m in members)
        block, layout = members[0].recipe.block_size, members[0].recipe.layout
        data, data_views = stack_rows([m.weight_fp8 for m in members])  # [sum N, K]
        scale, scale_views = stack_rows([m.weight_scale for m in members])  # [sum N / 128, K / 128]
        self._bias, bias_views = stack_rows([m.bias for m in members]) if members[0].bias is not None else (None, None)
        for i, m in enumerate(members):
            m.weight_fp8, m.weight_scale = data_views[i], scale_views[i]
            if bias_views is not None:
                m.bias = bias_views[i]
            m._qweight = QuantizedWeight(m.weight_fp8, m.weight_scale, m.num_loads, block, layout=layout)
            m.weight_group = self
        self._qweight = QuantizedWeight(data, scale, 0, block, layout=layout)

    @staticmethod
    def compatible(members: tuple[nn.Module, ...]) -> bool:
        return (
            all(isinstance(m, Fp8RolloutLinear) for m in members)
            and layout_problem(members) is None
            and len({m.weight_fp8.device for m in members}) == 1
            and stacked_scales(members)
        )

    def quantized_weight(self) -> QuantizedWeight:
        return self._qweight

    def bias(self) -> torch.Tensor | None:
        return self._bias


def stacked_scales(members: tuple[Fp8RolloutLinear, ...]) -> bool:
    """Whether the members' scales stacked along the rows are their buffer's scale (each a row view of it; not so for
    tensorwise, whose buffer repeats each member's one scale over its rows: `ScaleLayout.group_buffer_scale`)."""
    scales, splits = [m.weight_scale for m in members], tuple(m.out_features for m in members)
    return members[0].recipe.layout.group_buffer_scale(scales, splits) is None


def build_rollout_replica(model: nn.Module) -> nn.Module:
    """A rollout copy of an (unsharded) policy: FP8-rollout linears become `Fp8RolloutLinear`, the rest is copied.
    Sibling FP8 projections (q/k/v, gate/up) share one buffer per block (`Fp8RolloutGroup`).

    Call before FSDP sharding. The replica has no trainable parameters (requires_grad off) and is in eval mode.
    """
    replica = copy.deepcopy(model)
    swaps = [(n, m) for n, m in replica.named_modules() if isinstance(m, Fp8Linear) and m.rollout_fp8]
    for name, module in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = replica.get_submodule(parent_name) if parent_name else replica
        setattr(parent, child, Fp8RolloutLinear.from_fp8_linear(module))
    for members in sibling_sets(replica):
        if Fp8RolloutGroup.compatible(members):
            Fp8RolloutGroup(members)
    return replica.requires_grad_(False).eval()
