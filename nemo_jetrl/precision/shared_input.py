"""One FP8 activation cast for sibling linears that read the same input (q/k/v, gate/up) in the rollout.

When every linear of a group runs the FP8 rollout forward with the same input quantization, x is cast once and
handed to all of them as a `QuantizedInput` (bitwise each linear's own cast); the fused producers (norm, SiLU*up)
write that input quantized themselves where the recipe's layout lets them (`shared_input_quant`).
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_jetrl.precision.gemm import no_autocast
from nemo_jetrl.precision.linear import output_dtype
from nemo_jetrl.precision.quantized import QuantizedInput
from nemo_jetrl.precision.recipe import PrecisionRecipe


def shared_input_recipe(in_features: int, linears: tuple[nn.Module, ...]) -> PrecisionRecipe | None:
    """The recipe of the activation cast when every module in `linears` runs the FP8 rollout forward now
    (`fp8_rollout_active`: an `Fp8Linear` in rollout mode, or a rollout replica's `Fp8RolloutLinear`) on
    `in_features` inputs with one activation cast (each would compute the same bits for x); else None."""
    if not linears:
        return None
    first = linears[0]
    shared = all(
        getattr(m, "fp8_rollout_active", False)
        and m.in_features == in_features
        and m.recipe.layout.input_key(m.recipe) == first.recipe.layout.input_key(first.recipe)
        for m in linears
    )
    return first.recipe if shared else None


def shared_input_quant(in_features: int, linears: tuple[nn.Module, ...]) -> tuple[int, bool] | None:
    """(block, pow2) for the fused producers that write 1x128 groups (`fused_ops.*_fp8`) when the layout of the
    `shared_input_recipe` lets them (`ScaleLayout.fused_input_cast`); None otherwise (`quantize_shared_input` casts)."""
    recipe = shared_input_recipe(in_features, linears)
    return None if recipe is None else recipe.layout.fused_input_cast(recipe)


def quantize_shared_input(x: torch.Tensor, linears: tuple[nn.Module, ...]) -> torch.Tensor | QuantizedInput:
    """x cast once when every module in `linears` runs the FP8 rollout forward now with one activation cast
    (`shared_input_recipe`); otherwise x itself, for the modules' own forwards."""
    recipe = shared_input_recipe(x.shape[-1], linears)
    if recipe is None:
        return x
    with torch.no_grad(), no_autocast(x.device.type):
        data, scale = recipe.layout.input_quant(x.reshape(-1, x.shape[-1]), recipe)
    return QuantizedInput(data, scale, tuple(x.shape[:-1]), output_dtype(x))
