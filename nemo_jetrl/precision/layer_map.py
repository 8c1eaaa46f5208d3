"""One layer map, name -> "fp8" | "bf16", deciding precision for the trainer and the rollout alike."""

from __future__ import annotations

import re
from typing import Literal

from torch import nn

from nemo_jetrl.precision.expert_linear import ExpertLinear, RouterLinear
from nemo_jetrl.precision.linear import Fp8Linear
from nemo_jetrl.precision.recipe import PrecisionRecipe

LayerPrecision = Literal["fp8", "bf16"]

# `layers.{i}.` with the trailing dot: `layers.2.` never matches `layers.20.`.
_DECODER_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def decoder_layer_index(name: str) -> int | None:
    """Index i of the decoder layer a module name lives in (`...layers.{i}.`), or None outside the layers."""
    match = _DECODER_LAYER.search(name)
    return int(match.group(1)) if match else None


def build_layer_map(model: nn.Module, recipe: PrecisionRecipe) -> dict[str, LayerPrecision]:
    """Map every linear of an HF Llama / Qwen2 / Qwen3 / Qwen3-MoE causal LM to "fp8" or "bf16".

    Linears inside decoder layers (MoE experts included: each `ExpertLinear` [E, N, K] is one entry) are "fp8"
    unless in the first `num_first_layers_in_bf16` or the last `num_last_layers_in_bf16` layers; MoE routers
    (`RouterLinear`), lm_head, embeddings and everything else stay "bf16". A recipe without FP8
    linears gives an all-"bf16" map. Raises ValueError for an FP8 layer whose dims are not multiples of the block
    size, and for an FP8 recipe whose map converts nothing.
    """
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear | Fp8Linear | ExpertLinear)]
    routers = {n for n, m in model.named_modules() if isinstance(m, RouterLinear)}
    indices = [i for i in map(decoder_layer_index, linears) if i is not None]
    num_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if num_layers is None:
        num_layers = max(indices) + 1 if indices else 0
    first, last = recipe.num_first_layers_in_bf16, recipe.num_last_layers_in_bf16

    def precision(name: str) -> LayerPrecision:
        index = decoder_layer_index(name)
        if not recipe.linear_fp8 or index is None or name in routers:
            return "bf16"
        return "fp8" if first <= index < num_layers - last else "bf16"

    layer_map = {name: precision(name) for name in linears}
    if not recipe.linear_fp8:
        return layer_map
    block = recipe.block_size
    for name, kind in layer_map.items():
        module = model.get_submodule(name)
        if kind == "fp8" and (module.in_features % block or module.out_features % block):
            raise ValueError(
                f"layer {name!r} ({module.out_features}x{module.in_features}) is mapped to fp8 but its dims are not "
                f"multiples of the block size {block}; keep it in bf16 (num_first/last_layers_in_bf16) or pad the model"
            )
    if "fp8" not in layer_map.values():
        raise ValueError(
            f"FP8 recipe (train={recipe.train}, rollout={recipe.rollout}) converts no layer: {len(linears)} linears, "
            f"{num_layers} decoder layers, first {first} and last {last} kept in bf16"
        )
    return layer_map
