"""The rollout benchmarks' engines: BF16, FP8 and FP8 + FP8 KV over two resident models (the BF16 one and a copy
converted to FP8), and the wrappers that run the FP8 + KV engine with DeepGEMM or with the torch sampler.

Both `bench_rollout.py` (one static batch) and `bench_rollout_queue.py` (a queue, continuous batching) time these
engines side by side in one process, the variants alternating round by round (`common.alternating_timings`).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, rollout_mode
from nemo_jetrl.precision.kv import QKVCalibrator

VARIANTS = ("bf16", "fp8", "fp8+kv")


@torch.no_grad()
def calibrate(model, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer (k, v) FP8 scales from one forward over `prompts` [B, S] (the trainer's calibration hook)."""
    calib = QKVCalibrator(model.config.num_hidden_layers)
    mask = torch.ones_like(prompts)
    with rollout_mode(model):
        decoder_forward(
            model,
            prompts,
            position_ids_from_mask(mask),
            mask,
            ForwardPlan.rollout(model, None, fused=False).with_hook(calib),
        )
    return calib.scales().kv


def build_engines(
    bf16_model: torch.nn.Module, calib_prompts: torch.Tensor, *, deep_gemm: bool = False, torch_sampler: bool = False,
    **engine_kwargs,
) -> dict[str, NativeGenerationEngine]:  # fmt: skip
    """bf16 / fp8 / fp8+kv engines: `bf16_model` as it is and a copy of its modules converted to FP8 (recipe
    `jetrl`) over the very same Parameters (the FP8 copy adds only its FP8 weights: a 30B MoE's two variants fit one
    GPU), the FP8 KV scales calibrated on `calib_prompts` [B, S]. With `deep_gemm` / `torch_sampler`,
    'fp8+kv+deep_gemm' / 'fp8+kv torch sampler' name the fp8+kv engine again: wrap their rollouts in `on_deep_gemm`
    / `on_torch_sampler`."""
    fp8_model = copy.deepcopy(bf16_model, memo={id(p): p for p in bf16_model.parameters()})
    convert_to_fp8(fp8_model, PrecisionRecipe.preset("jetrl"))
    engines = {
        "bf16": NativeGenerationEngine(bf16_model, **engine_kwargs),
        "fp8": NativeGenerationEngine(fp8_model, **engine_kwargs),
        "fp8+kv": NativeGenerationEngine(fp8_model, kv_cache_dtype="fp8", **engine_kwargs),
    }
    engines["fp8+kv"].update_weights(kv_scales=calibrate(fp8_model, calib_prompts.to(engines["fp8"].device)))
    if deep_gemm:
        engines["fp8+kv+deep_gemm"] = engines["fp8+kv"]
    if torch_sampler:
        engines["fp8+kv torch sampler"] = engines["fp8+kv"]
    return engines


def wrap_variant(name: str, fn, engine: NativeGenerationEngine):
    """`fn` as variant `name` runs it: with DeepGEMM or the torch sampler where the name says so."""
    if name.endswith("deep_gemm"):
        return on_deep_gemm(fn, engine.model)
    if name.endswith("torch sampler"):
        return on_torch_sampler(fn, engine)
    return fn


def on_deep_gemm(fn, model: torch.nn.Module):
    """`fn` run with `use_deep_gemm` in the recipe of `model`'s FP8 linears (the same FP8 weights; restored after), so
    one resident model serves the cuBLAS and the DeepGEMM variant; each rollout captures its own CUDA graphs."""

    def run():
        layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
        recipes = [m.recipe for m in layers]
        for m in layers:
            m.recipe = dataclasses.replace(m.recipe, use_deep_gemm=True)
        try:
            return fn()
        finally:
            for m, recipe in zip(layers, recipes):
                m.recipe = recipe

    return run


def on_torch_sampler(fn, engine: NativeGenerationEngine):
    """`fn` run with the engine drawing through the torch sampler: top_k = the vocabulary filters nothing but keeps
    the fused sampling kernel (`sample_kernel.py`) out (the same distribution, the previous per-step cost)."""

    def run():
        sampling = engine.sampling
        engine.sampling = dataclasses.replace(sampling, top_k=engine.model.config.vocab_size)
        try:
            return fn()
        finally:
            engine.sampling = sampling

    return run
