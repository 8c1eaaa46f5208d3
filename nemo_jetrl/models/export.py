"""Export a trained policy as a HF safetensors directory (`AutoModelForCausalLM.from_pretrained` loads it).

`Fp8Linear` keeps `weight` / `bias` under the names of the `nn.Linear` it replaced, so the master weights go back
under the model's own HF names, cast to `dtype` (bf16 by default). Tied embeddings are written once.

`fp8=True` writes vLLM's / DeepSeek-V3's blockwise FP8 checkpoint layout instead, for the layers the layer map
puts in FP8: `<name>.weight` e4m3 [N, K] and `<name>.weight_scale_inv` fp32 [N/128, K/128] (the dequantization
multipliers, exactly the trainer's `Fp8Linear.quantized_weight()` bits), with config.json
`quantization_config: {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic, weight_block_size: [128, 128],
modules_to_not_convert: [the BF16 linears]}`. Everything else (embeddings, norms, lm_head, BF16-mapped layers) is
written in `dtype`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import save_torch_state_dict
from torch import nn

from nemo_jetrl.models.export_dir import check_shard_size, earlier_export_files, write_export
from nemo_jetrl.models.moe import split_expert_tensors
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, build_layer_map, weight_quant
from nemo_jetrl.precision.expert_linear import ExpertLinear, Fp8ExpertLinear

FP8_QUANT_METHOD = "fp8"
SCALE_SUFFIX = "weight_scale_inv"


def _tied_keys(model: nn.Module, state: Mapping[str, torch.Tensor]) -> set[str]:
    """Output-embedding keys to drop when the config ties them to the input embeddings."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return set()
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is None:
        return set()
    names = [n for n, m in model.named_modules() if m is out]
    return {f"{n}.weight" for n in names if f"{n}.weight" in state}


def hf_state_dict(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The model's tensors under HF names, floating ones cast to `dtype`, tied output embedding dropped; MoE experts
    one tensor per expert and projection, as HF checkpoints hold them (`models.moe.split_expert_tensors`)."""
    state = model.state_dict()
    drop = _tied_keys(model, state)
    state = split_expert_tensors({k: v for k, v in state.items() if k not in drop})
    return {k: _own((v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu()) for k, v in state.items()}


def _own(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous in storage of its own (an expert's slice of a 3D weight is a view: safetensors refuses it)."""
    t = t.contiguous()
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t


def _fp8_recipe(recipe: PrecisionRecipe) -> PrecisionRecipe:
    """The recipe whose layer map picks the FP8 layers (a BF16 recipe keeps its first/last BF16 layer settings)."""
    return recipe if recipe.linear_fp8 else dataclasses.replace(recipe, rollout="fp8")


def fp8_state_dict(
    model: nn.Module, recipe: PrecisionRecipe, dtype: torch.dtype = torch.bfloat16
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """vLLM blockwise-FP8 tensors (see the module docstring) and the names of the linears left in `dtype`."""
    recipe = _fp8_recipe(recipe)
    layer_map = build_layer_map(model, recipe)
    state = hf_state_dict(model, dtype)
    for name, kind in layer_map.items():
        if kind != "fp8":
            continue
        module = model.get_submodule(name)
        same_tiles = isinstance(module, Fp8Linear) and module.recipe.layout.features.vllm_weights
        if same_tiles and module.recipe.pow2_weight_scales == recipe.pow2_weight_scales:
            qweight = module.quantized_weight()  # the trainer's cached bits and scales
            data, scale = qweight.data, qweight.scale
        else:
            with torch.no_grad():
                weights = module.weight.detach()  # [N, K], or [E, N, K] (experts: each on its own)
                casts = [
                    weight_quant(w, recipe.block_size, recipe.pow2_weight_scales)
                    for w in weights.view(-1, *weights.shape[-2:])
                ]
                data, scale = (torch.stack(c).view(*weights.shape[:-2], *c[0].shape) for c in zip(*casts))
        if isinstance(module, Fp8ExpertLinear | ExpertLinear):  # [E, N, K]: one FP8 tensor per expert and projection
            state.update(_expert_fp8_tensors(name, data, scale, recipe.block_size))
            continue
        # own copies: a grouped layer's bits are views of its group's shared buffer (`precision.weight_group`)
        state[f"{name}.weight"] = data.to("cpu", copy=True)  # [N, K] e4m3
        state[f"{name}.{SCALE_SUFFIX}"] = scale.to("cpu", torch.float32, copy=True)  # [N/128, K/128] fp32
    not_converted = sorted({_vllm_module(name) for name, kind in layer_map.items() if kind != "fp8"})
    return state, not_converted


def _expert_fp8_tensors(name: str, data: torch.Tensor, scale: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    """An expert weight's FP8 bits [E, N, K] and tile scales [E, N/128, K/128] under HF's per-expert names (gate/up
    split at F: each half must be whole tiles)."""
    if name.endswith("gate_up_proj") and (data.shape[1] // 2) % block:
        raise ValueError(f"{name}: an expert FFN width of {data.shape[1] // 2} splits 128x128 tiles between gate and "
                         "up; export it in BF16 (fp8=False)")  # fmt: skip
    out = split_expert_tensors({name: data.cpu()})  # `.weight` e4m3 [N_i, K] each
    scales = split_expert_tensors({name: scale.to("cpu", torch.float32)})
    out.update({k.removesuffix("weight") + SCALE_SUFFIX: v for k, v in scales.items()})
    return {k: v.clone() for k, v in out.items()}


def _vllm_module(name: str) -> str:
    """The module vLLM's `modules_to_not_convert` names for a layer-map entry (an expert weight: its experts)."""
    return name.rpartition(".")[0] if name.endswith((".experts.gate_up_proj", ".experts.down_proj")) else name


def fp8_quantization_config(recipe: PrecisionRecipe, not_converted: list[str]) -> dict[str, Any]:
    """config.json `quantization_config` of the blockwise FP8 layout (vLLM `Fp8Config`, HF `FineGrainedFP8Config`)."""
    block = recipe.block_size
    return {
        "quant_method": FP8_QUANT_METHOD,
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
        "modules_to_not_convert": not_converted,
    }


def export_hf(
    model: nn.Module,
    tokenizer: Any | None,
    out_dir: str | Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    fp8: bool = False,
    recipe: PrecisionRecipe | None = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    protected: Iterable[str | Path] = (),
) -> Path:
    """Write `model` (+ `tokenizer`) to `out_dir` as safetensors shards + config.json (+ generation_config.json).

    `fp8=True` uses `recipe` (default: the `jetrl` preset) for the layer map and scale options. Every argument is
    checked before anything is written; see `export_dir` for what may be replaced in `out_dir` (`overwrite`) and
    the `protected` directories (the source model, the checkpoint) it never writes into.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export dtype must be a floating torch.dtype, got {dtype!r}")
    check_shard_size(max_shard_size)
    previous = earlier_export_files(out_dir, overwrite=overwrite, protected=protected)
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    if fp8:
        recipe = recipe if recipe is not None else PrecisionRecipe.preset("jetrl")
        state, not_converted = fp8_state_dict(model, recipe, dtype)
        config_dict["quantization_config"] = fp8_quantization_config(recipe, not_converted)
    else:
        state = hf_state_dict(model, dtype)
    config_dict["dtype"] = str(dtype).removeprefix("torch.")

    def write(staging: Path) -> None:
        save_torch_state_dict(state, staging, max_shard_size=max_shard_size, metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
        generation_config = getattr(model, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)

    return write_export(out_dir, previous, overwrite, write)


def load_policy_checkpoint(checkpoint: str | Path) -> tuple[dict[str, Any], Path]:
    """(state, directory) of a GRPO checkpoint: a `step_<N>` directory, or a checkpoint root (its newest valid one)."""
    from nemo_jetrl.utils.checkpoint import META_FILE, CheckpointManager

    path = Path(checkpoint)
    if (path / META_FILE).is_file() or path.name.startswith("step_"):
        return CheckpointManager(path.parent, keep_top_k=None).load(path, mmap=True), path
    manager = CheckpointManager(path, keep_top_k=None)
    latest = manager.latest_valid()
    if latest is None:
        raise ValueError(f"no valid checkpoint (step_<N> with meta.json) under {path}")
    return manager.load(latest, mmap=True), latest


def export_policy_weights(
    weights: Mapping[str, torch.Tensor],
    out_dir: str | Path,
    *,
    model_name: str,
    config_overrides: Mapping[str, Any] | None,
    recipe: PrecisionRecipe,
    protected: Iterable[str | Path] = (),
    fp8: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
) -> Path:
    """Export trained `weights` (a checkpoint's policy state) on the base model `model_name` (its architecture, with
    `config_overrides`, and its tokenizer; the directory must still exist); FP8 export uses `recipe` for the layer
    map. `protected` directories are never written to (`algorithms.grpo_checkpoint.export_checkpoint` reads a GRPO
    checkpoint's saved config and calls this)."""
    from nemo_jetrl.models.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_name, dtype=torch.float32, config_overrides=config_overrides)
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise ValueError(
            f"checkpoint weights do not fit {model_name}: {str(err).strip().splitlines()[-1].strip()}"
        ) from None
    missing = [k for k in missing if k not in _tied_keys(model, model.state_dict())]
    if missing or unexpected:
        raise ValueError(f"checkpoint weights do not fit {model_name}: missing {missing}, unexpected {unexpected}")
    return export_hf(
        model,
        tokenizer,
        out_dir,
        dtype=dtype,
        fp8=fp8,
        recipe=recipe,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        protected=list(protected),
    )
