"""The FProp casts of each FP8 recipe, picked by `PrecisionRecipe.granularity` (one place for trainer and rollout).

| recipe     | activation X [M, K]          | weight W [N, K]                       |
|------------|------------------------------|---------------------------------------|
| blockwise  | 1x128 groups, scale [M, K/b] | 128x128 tiles, scale [N/b, K/b]        |
| rowwise    | per token row, scale [M, 1]  | per output channel, scale [N, 1]       |
| tensorwise | one scale, [1, 1]            | one scale, [1, 1]                      |

The backward casts (DGrad / WGrad operands) live with each recipe's autograd function (`linear.py` for blockwise,
`axis_linear.py` for rowwise / tensorwise).
"""

from __future__ import annotations

import torch

from nemo_jetrl.precision.axis_quant import row_quant, row_quant_checked, tensor_quant
from nemo_jetrl.precision.quant import act_quant, weight_quant_checked
from nemo_jetrl.precision.recipe import PrecisionRecipe


def input_quant(x2: torch.Tensor, recipe: PrecisionRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """The FProp activation cast: x2 [M, K] -> (e4m3 [M, K], fp32 scale) in the recipe's layout (table above)."""
    pow2 = recipe.pow2_activation_scales
    if recipe.granularity == "blockwise":
        return act_quant(x2, recipe.block_size, pow2)
    if recipe.granularity == "rowwise":
        return row_quant(x2, pow2)
    return tensor_quant(x2, pow2)


def master_weight_quant(w: torch.Tensor, recipe: PrecisionRecipe) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FProp weight cast of the master w [N, K] (one pass): (e4m3 [N, K], fp32 scale, int32 0-dim count of
    w's NaN / inf values)."""
    pow2 = recipe.pow2_weight_scales
    if recipe.granularity == "blockwise":
        return weight_quant_checked(w, recipe.block_size, pow2)
    if recipe.granularity == "rowwise":
        return row_quant_checked(w, pow2)
    return tensor_quant(w, pow2, count_nonfinite=True)


def input_quant_key(recipe: PrecisionRecipe) -> tuple:
    """What an activation cast depends on: linears with equal keys compute the same bits for the same input."""
    return recipe.granularity, recipe.block_size, recipe.pow2_activation_scales
