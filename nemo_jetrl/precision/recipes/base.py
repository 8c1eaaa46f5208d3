"""`ScaleLayout`: what one FP8 scale layout hands the rest of the code, and the registry of layouts by name.

A layout owns every decision that depends on where the scales sit: the casts of each GEMM operand (the weight,
the FProp input, the output gradient, the DGrad and WGrad operands), the three GEMMs, the dequantization that the
CPU emulation multiplies, and the features beyond those (`LayoutFeatures`) that other modules ask about instead of
comparing recipe names. `PrecisionRecipe.granularity` names one registered layout; `PrecisionRecipe.layout` is it.

The defaults here run any layout whose every operand dequantizes with one `operand_dequant(q, scale)`: the GEMMs
multiply the dequantized operands in FP32 (exact emulation on any device). A layout with a hardware GEMM overrides
`fprop` / `dgrad` / `wgrad`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nemo_jetrl.precision.gemm import gemm_backend, no_autocast

if TYPE_CHECKING:
    from nemo_jetrl.precision.quantized import QuantizedWeight
    from nemo_jetrl.precision.recipe import PrecisionRecipe

# (e4m3 values, fp32 scale): one quantized GEMM operand
Operand = tuple[torch.Tensor, torch.Tensor]
# (e4m3 W^T [K, N], fp32 scale, fp32 dequantized W^T or None where a hardware GEMM runs): the DGrad weight
DGradWeight = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
# GEMM choices a layout may refuse (`gemm_choice.FpropBackend`): the exact mode's and the matched kernels' forward
PINNED_FPROP = ("batch_invariant", "scaled_mm_padded")


@dataclass(frozen=True)
class LayoutFeatures:
    """What a layout supports beyond the trainer's three GEMMs and the rollout forward (which every layout runs)."""

    vllm_weights: bool = False  # weights in vLLM's block-FP8 checkpoint layout: export / the vLLM adapter take them
    exact_gemm: bool = False  # a batch-invariant forward GEMM (the exact mode) and cuBLAS at every M (matched kernels)
    sharded_refit: bool = False  # the Ray refit all-gathers FP8 weights quantized per shard
    deep_gemm: bool = False  # DeepGEMM runs its FProp / DGrad (`use_deep_gemm`)
    fused_input_cast: bool = False  # the fused norm / SiLU*up kernels write its activation cast
    grouped_training: bool = False  # the CUDA trainer runs sibling linears as one GEMM per pass
    grouped_experts: bool = False  # `grouped_fprop`: MoE experts' FProp in one launch on CUDA (no host sync)


@dataclass(frozen=True)
class ScaleLayout:
    """One scale layout: casts, GEMMs, features. Subclasses are frozen dataclasses (hashable, compared by value)."""

    name: str
    features: LayoutFeatures = LayoutFeatures()

    def __deepcopy__(self, memo) -> ScaleLayout:
        return self  # immutable and shared: a copied model's recipe keeps the registered object

    # --- weight --------------------------------------------------------------------------------------------
    def weight_quant(self, w: torch.Tensor, recipe: PrecisionRecipe) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The FProp cast of the master w [N, K]: (e4m3 [N, K], fp32 scale, int32 0-dim count of NaN / inf)."""
        raise NotImplementedError

    def expert_weight_quant(
        self, w3: torch.Tensor, recipe: PrecisionRecipe
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The FProp casts of E expert weights w3 [E, N, K], each expert on its own (the bits `weight_quant` gives
        w3[e]): (e4m3 [E, N, K], fp32 scale [E, *scale shape], int32 0-dim count of NaN / inf values)."""
        casts = [self.weight_quant(w, recipe) for w in w3.unbind(0)]
        return (
            torch.stack([c[0] for c in casts]),
            torch.stack([c[1] for c in casts]),
            torch.stack([c[2] for c in casts]).sum().to(torch.int32),
        )

    def weight_scale_shape(self, n: int, k: int, block: int) -> tuple[int, int]:
        """The shape of the FP8 weight's scale for a [N, K] weight (what a rollout-only layer allocates)."""
        raise NotImplementedError

    def weight_dequant(self, q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
        """fp32 dequant of the FP8 weight (e4m3 [N, K], its scale): the emulated GEMM's cached operand."""
        return self.operand_dequant(q, scale)

    def dgrad_weight(self, qweight: QuantizedWeight, master: torch.Tensor, recipe: PrecisionRecipe) -> DGradWeight:
        """The DGrad operand W^T, cached on `qweight` with the recipe's `cache_dgrad_weight` (re-made at every weight
        change, `refill_dgrad_weight`), else made for this backward only."""
        if "dgrad" in qweight._cache:
            return qweight._cache["dgrad"]
        dgrad = self._dgrad_weight_with_dequant(qweight, master, recipe)
        if recipe.cache_dgrad_weight:
            qweight._cache["dgrad"] = dgrad
        return dgrad

    def refill_dgrad_weight(self, qweight: QuantizedWeight, master: torch.Tensor, recipe: PrecisionRecipe) -> None:
        """Re-make the cached DGrad operand (if any) in its own tensors after an in-place re-quantization
        (`Fp8Linear.requantize_in_place`): a captured training step reads W^T where it lies."""
        if "dgrad" not in qweight._cache:
            return
        with torch.no_grad():
            for mine, fresh in zip(qweight._cache["dgrad"], self._dgrad_weight_with_dequant(qweight, master, recipe)):
                if mine is not None and mine is not fresh:
                    mine.copy_(fresh)

    def make_dgrad_weight(self, qweight: QuantizedWeight, master: torch.Tensor, recipe: PrecisionRecipe) -> Operand:
        """W^T for DGrad: (e4m3 [K, N], fp32 scale), from the FProp bits or a second cast of the master."""
        raise NotImplementedError

    def group_buffer_scale(self, scales: list[torch.Tensor], splits: tuple[int, ...]) -> torch.Tensor | None:
        """The scale of sibling weights stacked in one buffer [sum N_i, K] when it is not their scales stacked
        along the rows (None: stacked, each member's scale a row view of the buffer's)."""
        return None

    # --- activations and gradients -------------------------------------------------------------------------
    def input_quant(self, x2: torch.Tensor, recipe: PrecisionRecipe) -> Operand:
        """The FProp cast of x2 [M, K] (trainer without WGrad, rollout)."""
        raise NotImplementedError

    def input_quant_train(self, x2: torch.Tensor, recipe: PrecisionRecipe) -> tuple[torch.Tensor, ...]:
        """The FProp cast of x2 [M, K] and the WGrad operand X^T (saved for backward): (x, x_scale, xt, xt_scale)."""
        raise NotImplementedError

    def grad_quant(self, dy2: torch.Tensor, recipe: PrecisionRecipe, need_dx: bool, need_dw: bool) -> tuple:
        """The casts of dy2 [M, N]: (dy, dy_scale) for DGrad and (dyt, dyt_scale) for WGrad, None where not needed."""
        raise NotImplementedError

    def operand_dequant(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """fp32 values of any of the layout's GEMM operands (the default GEMMs' emulation)."""
        raise NotImplementedError

    # --- GEMMs ---------------------------------------------------------------------------------------------
    def fprop(self, x: torch.Tensor, x_scale: torch.Tensor, qweight: QuantizedWeight, bias, out_dtype,
              backend: str = "auto") -> torch.Tensor:  # fmt: skip
        """Y [M, N] = Q(X) [M, K] @ Q(W)^T (+ bias) in `out_dtype`; `backend`: a `GemmChoice.fprop`."""
        self.check_fprop_backend(backend)
        return self.emulated_mm(x, x_scale, qweight.data, qweight.scale, out_dtype, bias, qweight.dequantized())

    def dgrad(self, dy: torch.Tensor, dy_scale: torch.Tensor, wt: DGradWeight, out_dtype, recipe: PrecisionRecipe,
              backend: str = "auto") -> torch.Tensor:  # fmt: skip
        """dX [M, K] = Q(dY) [M, N] @ Q(W^T) [K, N]^T; `wt`: `dgrad_weight`'s operand."""
        return self.emulated_mm(dy, dy_scale, wt[0], wt[1], out_dtype, None, wt[2])

    def wgrad(self, dyt: torch.Tensor, dyt_scale: torch.Tensor, xt: torch.Tensor, xt_scale: torch.Tensor, out_dtype,
              recipe: PrecisionRecipe) -> torch.Tensor:  # fmt: skip
        """dW [N, K] = Q(dY^T) [N, M'] @ Q(X^T) [K, M']^T, contraction over the (padded) tokens."""
        return self.emulated_mm(dyt, dyt_scale, xt, xt_scale, out_dtype)

    def grouped_fprop(self, x2: torch.Tensor, qweight: QuantizedWeight, counts: torch.Tensor, recipe: PrecisionRecipe,
                      out_dtype, backend: str = "auto") -> torch.Tensor | None:  # fmt: skip
        """The experts' FProp in one grouped GEMM without a host sync: x2 [M, K] rows sorted by expert, qweight
        [E, N, K], counts [E] (rows per expert) -> [M, N]; None where the layout has none on this device (the caller
        then runs `fprop` expert by expert, reading the counts on the host)."""
        return None

    def grouped_dgrad(self, dy2: torch.Tensor, qweight: QuantizedWeight, counts: torch.Tensor, recipe: PrecisionRecipe,
                      out_dtype) -> torch.Tensor | None:  # fmt: skip
        """The experts' DGrad in one grouped GEMM: dy2 [M, N] rows sorted by expert -> dX [M, K]; None where the
        layout has none on this device (the caller runs `dgrad` expert by expert)."""
        return None

    def emulated_mm(self, a, a_scale, b, b_scale, out_dtype, bias=None, b_dequant=None) -> torch.Tensor:
        """dequant(a [M, K]) @ dequant(b [N, K])^T (+ bias) in FP32, then `out_dtype`."""
        with no_autocast(a.device.type):
            bd = b_dequant if b_dequant is not None else self.operand_dequant(b, b_scale)  # bd: [N, K] fp32
            out = self.operand_dequant(a, a_scale) @ bd.t()  # out: [M, N] fp32
            if bias is not None:
                out = out + bias.float()
            return out.to(out_dtype)

    def check_fprop_backend(self, backend: str) -> None:
        """Refuse the exact mode's / matched kernels' forward GEMM on a layout that has none."""
        if backend in PINNED_FPROP and not self.features.exact_gemm:
            raise ValueError(
                f"the exact mode's FP8 GEMM is {layouts_with('exact_gemm')}; the {self.name} recipe has none"
            )

    # --- what other modules ask ----------------------------------------------------------------------------
    def input_key(self, recipe: PrecisionRecipe) -> tuple:
        """What an activation cast depends on: linears with equal keys compute the same bits for the same input."""
        return self.name, recipe.block_size, recipe.pow2_activation_scales

    def fused_input_cast(self, recipe: PrecisionRecipe) -> tuple[int, bool] | None:
        """(block, pow2) of the activation cast the fused producers write (`features.fused_input_cast`), else None."""
        return None

    def describe(self, wgrad_x_blocks: str) -> str:
        """The scale layout in the run's `precision:` line."""
        return self.name

    def _dgrad_weight_with_dequant(self, qweight, master, recipe) -> DGradWeight:
        data_t, scale_t = self.make_dgrad_weight(qweight, master, recipe)
        emulated = gemm_backend(data_t.device) == "emulated"
        return data_t, scale_t, self.weight_dequant(data_t, scale_t, recipe.block_size) if emulated else None


# ---------------------------------------------------------------------------------------------------------------
# registry: layout name (`policy.fp8_cfg.fp8_recipe`, `PrecisionRecipe.granularity`) -> layout
# ---------------------------------------------------------------------------------------------------------------
_LAYOUTS: dict[str, ScaleLayout] = {}


def register_layout(layout: ScaleLayout) -> ScaleLayout:
    """Make `layout` reachable by its name; a name already taken by another layout is refused."""
    held = _LAYOUTS.get(layout.name)
    if held is not None and held != layout:
        raise ValueError(f"an FP8 scale layout named {layout.name!r} is already registered")
    _LAYOUTS[layout.name] = layout
    return layout


def unregister_layout(name: str) -> None:
    """Forget the layout `name` (tests that register a toy layout)."""
    _LAYOUTS.pop(name, None)


def scale_layout(name: str) -> ScaleLayout:
    """The layout registered as `name`."""
    try:
        return _LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown FP8 scale layout {name!r}; registered: {', '.join(_LAYOUTS)}") from None


def layout_names() -> tuple[str, ...]:
    return tuple(_LAYOUTS)


def layouts_with(feature: str) -> str:
    """The names of the layouts that support `feature` (a `LayoutFeatures` field), as "a or b" for messages."""
    if feature not in {f.name for f in dataclasses.fields(LayoutFeatures)}:
        raise ValueError(f"unknown layout feature {feature!r}")
    return " or ".join(n for n, layout in _LAYOUTS.items() if getattr(layout.features, feature)) or "none"


def feature_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(LayoutFeatures))
