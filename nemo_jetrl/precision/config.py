"""`policy.fp8_cfg:` — the one FP8 recipe shared by trainer and rollout (E4M3 in a registered scale layout).

Not imported by `nemo_jetrl.precision` itself (the torch-only modules import without pydantic).
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from nemo_jetrl.config.section import NonNegativeInt, Section, StrictInt
from nemo_jetrl.precision import recipe_defaults as D

Precision = Literal["bf16", "fp8"]
SUPPORTED_BLOCK_SIZE = D.BLOCK_SIZE


class Fp8Config(Section):
    # blockwise (Jet-RL: 1x128 activations / gradients, 128x128 weights) | rowwise (one scale per row along each
    # GEMM's contraction dim) | tensorwise (one scale per tensor, current scaling); NeMo-RL's
    # megatron_cfg.fp8_cfg.fp8_recipe maps here. The registered scale layouts (precision/recipes/), one name each:
    fp8_recipe: Literal["blockwise", "rowwise", "tensorwise"] = D.GRANULARITY
    block_size: StrictInt = D.BLOCK_SIZE
    num_first_layers_in_bf16: NonNegativeInt = D.NUM_FIRST_LAYERS_IN_BF16  # one layer map: trainer AND rollout keep these layers BF16
    num_last_layers_in_bf16: NonNegativeInt = D.NUM_LAST_LAYERS_IN_BF16
    pow2_weight_scaling_factors: bool = D.POW2_WEIGHT_SCALES
    pow2_activation_scaling_factors: bool = D.POW2_ACTIVATION_SCALES
    wgrad_x_blocks: Literal["1x128", "128x128"] = D.WGRAD_X_BLOCKS  # 1x128 (exact Jet-RL layout) | 128x128 (faster WGrad)
    train_kv_fake_quant: bool = D.TRAIN_KV_FAKE_QUANT  # the trainer's attention sees the rollout's FP8 Q/K/V
    # blockwise FProp / DGrad GEMMs of trainer AND rollout on DeepGEMM where it imports on an sm90 GPU (in cuBLAS's
    # place; otherwise said at start and left on cuBLAS / Triton); NeMo-RL's generation.vllm_cfg.use_deep_gemm maps here
    use_deep_gemm: bool = D.USE_DEEP_GEMM
    # false: each backward makes the DGrad copy W^T of an FP8 weight (its bytes transposed) and frees it after its
    # GEMM; true: kept until the weight changes (1 byte per weight more for the whole run; docs/performance_history.md, "FP8 trainer memory")
    cache_dgrad_weight: bool = D.CACHE_DGRAD_WEIGHT
    # true: with activation checkpointing and an eager trainer, each FP8 weight is quantized when its layer runs and
    # released after it (one layer's alive in training, not the whole cache; the same bits); on by default since its
    # H200 measurement (docs/long_responses.md), false keeps the cache
    transient_train_weights: bool = D.TRANSIENT_TRAIN_WEIGHTS

    @field_validator("block_size")
    @classmethod
    def _only_supported_block(cls, value: int) -> int:
        if value != SUPPORTED_BLOCK_SIZE:
            raise ValueError(f"{value} is not supported; the FP8 recipe supports only {SUPPORTED_BLOCK_SIZE}")
        return value


def precision_line(policy) -> str:
    """`precision: train=fp8 rollout=fp8 kv=fp8 bf16_first=0 bf16_last=0 recipe=...` for a validated PolicyConfig."""
    fp8 = policy.fp8_cfg
    gen = policy.generation
    if policy.precision == "fp8" or gen.precision == "fp8":
        from nemo_jetrl.precision.recipes import scale_layout  # torch: imported where used, not with the section

        pow2 = "+pow2w" * fp8.pow2_weight_scaling_factors + "+pow2a" * fp8.pow2_activation_scaling_factors
        layout = scale_layout(fp8.fp8_recipe).describe(fp8.wgrad_x_blocks)
        recipe = f"{fp8.fp8_recipe}-e4m3({layout}{pow2})"
    else:
        recipe = "none"
    kv = gen.kv_cache_dtype if gen.kv_cache_dtype == "fp8" else policy.compute_dtype
    return (
        f"precision: train={policy.precision if policy.precision == 'fp8' else policy.compute_dtype} "
        f"rollout={gen.precision if gen.precision == 'fp8' else policy.compute_dtype} kv={kv} "
        f"bf16_first={fp8.num_first_layers_in_bf16} bf16_last={fp8.num_last_layers_in_bf16} recipe={recipe}"
    )


def recipe_problems(policy, cluster_backend: str) -> list[str]:
    """What the scale layout of `policy.fp8_cfg.fp8_recipe` cannot run with (its `LayoutFeatures`; refused by name),
    for a PolicyConfig."""
    from nemo_jetrl.precision.recipes import layouts_with, scale_layout  # torch: imported where used

    name = policy.fp8_cfg.fp8_recipe
    if not (policy.precision == "fp8" or policy.generation.precision == "fp8"):
        return []
    features = scale_layout(name).features
    key = f"policy.fp8_cfg.fp8_recipe: {name}"
    problems = []
    if policy.generation.backend == "vllm" and policy.generation.precision == "fp8" and not features.vllm_weights:
        problems.append(
            f"{key} with policy.generation.backend: vllm is not supported: the vLLM adapter exports the trainer's "
            "128x128 FP8 weights only (its per-tensor / per-channel loaders quantize activations with their own "
            f"kernels, not the trainer's bits); use backend: native or fp8_recipe: {layouts_with('vllm_weights')}"
        )
    exact = layouts_with("exact_gemm")
    if policy.generation.deterministic and not features.exact_gemm:
        problems.append(
            f"{key} with policy.generation.deterministic: true is not supported: the batch-invariant FP8 GEMM is "
            f"{exact}; use fp8_recipe: {exact}"
        )
    if policy.generation.matched_kernels is True and not features.exact_gemm:  # auto: off with this recipe
        problems.append(
            f"{key} with policy.generation.matched_kernels: true is not supported: its FP8 forward GEMM is cuBLAS's "
            f"{exact} one; use fp8_recipe: {exact}"
        )
    if cluster_backend in ("ray", "torchrun") and not features.sharded_refit:
        problems.append(
            f"{key} with cluster.backend: {cluster_backend} is not supported: the FP8 refit all-gathers 128x128 "
            f"weight tiles quantized per shard; use cluster.backend: local or fp8_recipe: "
            f"{layouts_with('sharded_refit')}"
        )
    return problems
