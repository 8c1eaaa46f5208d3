"""Swap `nn.Linear` -> `Fp8Linear` in place, following the one layer map; switch the FP8 forward to cuBLAS."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from nemo_jetrl.precision.expert_linear import ExpertLinear, Fp8ExpertLinear
from nemo_jetrl.precision.gemm import gemm_backend
from nemo_jetrl.precision.layer_map import LayerPrecision, build_layer_map
from nemo_jetrl.precision.linear import Fp8Linear
from nemo_jetrl.precision.recipe import PrecisionRecipe
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear
from nemo_jetrl.precision.weight_group import group_sibling_linears


def convert_to_fp8(
    model: nn.Module, recipe: PrecisionRecipe, layer_map: Mapping[str, LayerPrecision] | None = None
) -> dict[str, LayerPrecision]:
    """Convert the layers mapped "fp8" (train_fp8 = recipe.train == "fp8", rollout_fp8 = recipe.rollout == "fp8").

    The Parameter objects move into the new modules (no copy). Layers that already are `Fp8Linear` get the
    recipe and flags updated; MoE expert weights (`ExpertLinear` [E, N, K]) become `Fp8ExpertLinear`s. Sibling FP8
    projections (q/k/v, gate/up) are then grouped to keep their FP8 weights in one buffer (`weight_group.py`).
    Returns the map used.
    """
    layer_map = dict(build_layer_map(model, recipe) if layer_map is None else layer_map)
    for name, kind in layer_map.items():
        if kind not in ("fp8", "bf16"):
            raise ValueError(f"layer map value for {name!r} must be 'fp8' or 'bf16', got {kind!r}")
        try:
            module = model.get_submodule(name)
        except AttributeError as err:
            raise ValueError(f"layer map names {name!r}, which the model does not have") from err
        if kind == "bf16":
            continue
        if isinstance(module, Fp8Linear):
            module.recipe, module.train_fp8, module.rollout_fp8 = recipe, recipe.train_fp8, recipe.rollout_fp8
            module.invalidate_quantized_weight()
            continue
        if isinstance(module, ExpertLinear):
            fp8 = Fp8ExpertLinear.from_expert_linear(module, recipe)
        elif isinstance(module, nn.Linear):
            fp8 = Fp8Linear.from_linear(module, recipe)
        else:
            raise ValueError(f"layer {name!r} is mapped to fp8 but is a {type(module).__name__}, not an nn.Linear")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, fp8)
    group_sibling_linears(model)
    return layer_map


def use_cublas_fprop(model: nn.Module) -> int:
    """Run every FP8 linear's forward GEMM of `model` on cuBLAS (`scaled_mm`) at every M, decode batches included
    (no split-K Triton kernel; fewer rows than `gemm.PADDED_MIN_ROWS` padded to it), trainer and rollout alike,
    except where the exact mode's GEMM runs (it wins: `FpropKernel.with_cublas`); returns the number of FP8
    linears. sm90 only."""
    modules = [m for m in model.modules() if isinstance(m, (Fp8Linear, Fp8RolloutLinear))]
    if not modules or any(gemm_backend(m.quantized_weight().data.device) != "scaled_mm" for m in modules):
        raise ValueError("use_cublas_fprop: needs FP8 linears on a GPU where scaled_mm runs the blockwise recipe")
    for m in modules:
        m.fprop_kernel = m.fprop_kernel.with_cublas(True)
    return len(modules)


def is_fp8_layer(module: nn.Module) -> bool:
    """An `Fp8Linear` that runs FP8 on either side (trainer or rollout)."""
    return isinstance(module, Fp8Linear) and (module.train_fp8 or module.rollout_fp8)


def fp8_layers(model: nn.Module) -> list[tuple[str, Fp8Linear]]:
    """The model's FP8 layers (`is_fp8_layer`), named, in module order."""
    return [(name, m) for name, m in model.named_modules() if is_fp8_layer(m)]


def invalidate_fp8_caches(model: nn.Module) -> int:
    """Drop every `Fp8Linear`'s cached FP8 weight after an optimizer step (a fused AdamW writes the master weights
    without bumping their version counters, and FSDP2 refills unsharded weights without either, so the version key
    alone would keep serving the pre-step bits); returns how many layers were dropped."""
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    for module in layers:
        module.invalidate_quantized_weight()
    return len(layers)


def use_transient_fp8_weights(model: nn.Module, on: bool = True) -> int:
    """The trainer's FP8 linears quantize their weight as their layer runs and drop it after (`release_fp8_weights`,
    called by activation checkpointing after each layer's forward and its recomputation), instead of holding every
    layer's FP8 copy through the step: one byte per FP8 weight less at the training pass's peak. Quantization is
    deterministic, so the bits are the cached ones. Not for sharded layers (their bits come from a `weight_source`);
    `on=False` switches back (the cache kept through the step). Returns how many layers were switched."""
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear) and m.train_fp8 and m.weight_source is None]
    for module in layers:
        module.transient_weight = on
    return len(layers)


def release_fp8_weights(module: nn.Module) -> None:
    """Drop the FP8 weights `module`'s transient linears (`use_transient_fp8_weights`) hold; no-op for others."""
    for m in module.modules():
        if isinstance(m, Fp8Linear) and m.transient_weight:
            m.invalidate_quantized_weight()
