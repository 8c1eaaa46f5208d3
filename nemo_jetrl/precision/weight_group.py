"""FP8 weights of sibling linears (q/k/v, gate/up) in one buffer, and the projections that read one input.

Linears that read the same activation can share one FP8 weight buffer: `Fp8WeightGroup` quantizes its members
together into e4m3 [sum N_i, K] (+ fp32 scales [sum N_i / 128, K / 128]) and gives each member a row-slice view
as its `QuantizedWeight`. Every 128x128 tile (or row, rowwise) lies inside one member (each N_i is a multiple of
128), so the bits are exactly those each member would quantize alone (tensorwise: each member's own scale, given
to its rows of the buffer: `ScaleLayout.group_buffer_scale`); the per-linear paths read the views, while the rollout's fast path
(`project_shared_input(..., grouped=True)`) and the CUDA trainer (`grouped_linear.py`: FProp, DGrad and WGrad)
read the whole buffer in ONE GEMM: no copy of any weight, one launch instead of three (q/k/v) or two (gate/up).
At decode sizes (M = 64-256 rows) a launch streams the weights well below HBM speed, so one wide GEMM beats
several narrow ones.

Grouping is decided once, at conversion (`group_sibling_linears`): members must be FP8 `Fp8Linear`s of one
recipe and flags, one input width, all with or all without bias, and each N a multiple of the 128 block.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.grouped_linear import grouped_train_projections, trains_grouped
from nemo_jetrl.precision.linear import (
    Fp8Linear,
    QuantizedInput,
    QuantizedWeight,
    linear_gemm,
    quantized_input_forward,
)
from nemo_jetrl.precision.shared_input import quantize_shared_input

# Sibling projections of HF Llama / Qwen2 / Qwen3 (attention and gated MLP), grouped in this order.
SIBLING_NAMES: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Fp8WeightGroup:
    """Sibling `Fp8Linear`s (in output order) whose FP8 weights live in one buffer; see the module docstring."""

    def __init__(self, members: Sequence[Fp8Linear]) -> None:
        members = tuple(members)
        problem = grouping_problem(members)
        if problem:
            raise ValueError(f"Fp8WeightGroup: {problem}")
        self.members = members
        self.splits = tuple(m.out_features for m in members)  # N_i
        self.train_grouped = True  # the CUDA trainer runs the members as one GEMM per pass (False: per linear)
        self._keys: tuple | None = None
        self._qweight: QuantizedWeight | None = None  # the whole buffer; None while members hold their own
        self._bias: torch.Tensor | None = None
        self._bias_key: tuple | None = None
        for m in members:
            m.weight_group = self

    def refresh(self) -> None:
        """Re-quantize every member into a fresh shared buffer when any master weight changed."""
        keys = tuple(m.weight_key() for m in self.members)
        if keys == self._keys:
            return
        pieces = [m.quantize_weight() for m in self.members]  # [(e4m3 [N_i, K], fp32 [N_i/128, K/128], count)]
        counts = [c for _, _, c in pieces]
        if not any(hasattr(m.weight, "to_local") for m in self.members):  # no member sharded (DTensor) now
            recipe = self.members[0].recipe
            data, data_views = stack_rows([d for d, _, _ in pieces])  # [sum N_i, K]
            scales = [s for _, s, _ in pieces]
            scale = recipe.layout.group_buffer_scale(scales, self.splits)  # tensorwise: [sum N_i, 1], a copy
            if scale is None:  # [sum N_i / 128, K / 128] | [sum N_i, 1], each member's scale a row view of it
                scale, scale_views = stack_rows(scales)
            else:  # each member keeps its own scale
                scale_views = scales
            self._qweight = QuantizedWeight(
                data, scale, version=0, block=recipe.block_size, nonfinite=sum(counts), layout=recipe.layout
            )
            for m, d, s, key, c in zip(self.members, data_views, scale_views, keys, counts):
                m.set_quantized_weight(d, s, key, c)
        else:  # e.g. sharded (DTensor) master weights: each member keeps its own tensors, no grouped GEMM
            self._qweight = None
            for m, (d, s, c), key in zip(self.members, pieces, keys):
                m.set_quantized_weight(d, s, key, c)
        self._keys = keys

    def requantize_in_place(self) -> None:
        """`refresh` into the buffers already held (`Fp8Linear.requantize_in_place`): each member's rows of the
        shared buffer (or its own tensors) are rewritten in place; a fresh `refresh` when nothing is held or a
        member's master weight changed storage, shape or dtype."""
        self._bias_key = None  # the rollout's grouped GEMM re-reads the biases too
        keys = tuple(m.weight_key() for m in self.members)
        held = self._keys is not None and all(m._qweight is not None for m in self.members)
        if not held or any(k[1:] != old[1:] for k, old in zip(keys, self._keys)):
            self.invalidate()
            self.refresh()
            return
        pieces = [m.quantize_weight() for m in self.members]  # [(e4m3 [N_i, K], fp32 scale, count)]
        for m, (data, scale, count), key in zip(self.members, pieces, keys):
            m._qweight.refill(data, scale, count)  # a member's data / scale: row views of the shared buffer
            m._qweight_key = key
            m.refill_dgrad_weight()
        if self._qweight is not None:  # a buffer scale of its own (tensorwise) is rewritten; row views already are
            scale = self._qweight.layout.group_buffer_scale([s for _, s, _ in pieces], self.splits)
            self._qweight.refill(None, scale, sum(c for *_, c in pieces))
        self._keys = keys

    def invalidate(self) -> None:
        """Drop the shared buffer and the cached bias (an optimizer that bumps no version counter wrote them)."""
        self._keys, self._qweight, self._bias_key = None, None, None
        for m in self.members:
            m._qweight, m._qweight_key = None, None

    @property
    def cached_quantized_weight(self) -> QuantizedWeight | None:
        """The shared FP8 buffer held now, as it is (None while the members hold their own); no refresh."""
        return self._qweight

    def quantized_weight(self) -> QuantizedWeight | None:
        """The shared FP8 buffer e4m3 [sum N_i, K] + scales, up to date; None when the members could not share."""
        self.refresh()
        return self._qweight

    def bias(self) -> torch.Tensor | None:
        """The members' biases concatenated [sum N_i] (cached until one changes), or None without biases."""
        biases = [m.bias for m in self.members]
        if biases[0] is None:
            return None
        key = tuple((b._version, b.data_ptr()) for b in biases)
        if key != self._bias_key:
            self._bias = stack_rows([b.detach() for b in biases])[0]
            self._bias_key = key
        return self._bias


def stack_rows(parts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One new buffer holding `parts` stacked along dim 0 (e4m3 copied as bytes), and each part's row view of it."""
    dtype = parts[0].dtype
    fp8 = dtype == torch.float8_e4m3fn
    with torch.no_grad(), no_autocast(parts[0].device.type):  # autocast rejects e4m3 in cat
        buffer = torch.cat([p.view(torch.uint8) if fp8 else p for p in parts])
    buffer = buffer.view(dtype) if fp8 else buffer
    return buffer, list(buffer.split([p.shape[0] for p in parts]))


def sibling_sets(model: nn.Module, names: tuple[tuple[str, ...], ...] = SIBLING_NAMES):
    """Each block's sibling projections (q/k/v, gate/up) as a tuple, for every block of `model` that has them."""
    for parent in model.modules():
        for group_names in names:
            members = tuple(getattr(parent, name, None) for name in group_names)
            if all(m is not None for m in members):
                yield members


def layout_problem(members: Sequence[nn.Module], same: tuple[str, ...] = ("in_features", "recipe")) -> str | None:
    """Why FP8 linears `members` (with in_features / out_features / recipe / bias / weight_group) cannot stack their
    FP8 weights into one buffer, or None when they can."""
    if len(members) < 2:
        return "needs at least two members"
    first = members[0]
    if any(getattr(m, a) != getattr(first, a) for m in members for a in same):
        return f"members differ in one of {same}"
    if len({m.bias is None for m in members}) > 1:
        return "members must all have a bias or all have none"
    if any(m.out_features % first.recipe.block_size for m in members):
        return f"every out_features must be a multiple of {first.recipe.block_size}"
    if any(m.weight_group is not None for m in members):
        return "a member already belongs to a group"
    return None


def grouping_problem(members: Sequence[nn.Module]) -> str | None:
    """Why `members` cannot form an `Fp8WeightGroup`, or None when they can."""
    if len(members) < 2:
        return "needs at least two members"
    if not all(isinstance(m, Fp8Linear) for m in members):
        return "every member must be an Fp8Linear"
    if not (members[0].train_fp8 or members[0].rollout_fp8):
        return "members are not FP8"
    problem = layout_problem(members, same=("in_features", "recipe", "train_fp8", "rollout_fp8"))
    if problem is None and len({(m.weight.device, m.weight.dtype) for m in members}) > 1:
        return "members' master weights differ in device or dtype"
    return problem


def group_sibling_linears(model: nn.Module) -> int:
    """(Re)group the FP8 sibling projections of every attention / MLP block of `model`: existing groups are
    dissolved first (a re-conversion may have changed recipes or flags). Returns the number of groups made."""
    for m in model.modules():
        if isinstance(m, Fp8Linear) and m.weight_group is not None:
            m.invalidate_quantized_weight()
            m.weight_group = None
    made = 0
    for members in sibling_sets(model):
        if grouping_problem(members) is None:
            Fp8WeightGroup(members)
            made += 1
    return made


def project_shared_input(
    x: torch.Tensor | QuantizedInput, linears: Sequence[nn.Module], *, grouped: bool = False
) -> list[torch.Tensor]:
    """[m(x) for m in linears] for linears that read one input x [*lead, K] (or its `QuantizedInput`).

    FP8 rollout linears quantize x once (`quantize_shared_input`, bitwise each one's own `act_quant`). With
    `grouped` (the rollout's fast path) and `linears` exactly the members of one weight group (`Fp8WeightGroup`,
    or a rollout replica's `Fp8RolloutGroup`: anything with `members`, `splits`, `quantized_weight()`, `bias()`),
    the projections are ONE GEMM over the shared buffer, returned as column views [*lead, N_i] of its
    [*lead, sum N_i] output (same products per output element; the accumulation order may differ from separate
    GEMMs in the last bits). The CUDA trainer's blockwise FP8 members run grouped too, forward and backward
    (`grouped_linear.trains_grouped`).
    """
    linears = tuple(linears)
    group = getattr(linears[0], "weight_group", None)
    if isinstance(x, torch.Tensor) and trains_grouped(x, linears, group):  # the trainer: one GEMM per pass
        ys = grouped_train_projections(x, group)
        if ys is not None:
            return ys
    xin = x if isinstance(x, QuantizedInput) else quantize_shared_input(x, linears)
    if grouped and isinstance(xin, QuantizedInput) and group is not None and group.members == linears:
        qweight = group.quantized_weight()
        if qweight is not None:
            backend = linear_gemm(linears[0]).fprop  # the members share the exact mode (`enable_batch_invariant`)
            y = quantized_input_forward(xin, qweight, group.bias(), sum(group.splits), backend)  # [*lead, sum N_i]
            return list(y.split(group.splits, dim=-1))
    return [m(xin) for m in linears]
