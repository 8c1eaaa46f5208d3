"""`policy.fp8_cfg:` — the one FP8 recipe shared by trainer and rollout (E4M3, 1x128 activations, 128x128 weights).

Not imported by `nemo_jetrl.precision` itself (the torch-only modules import without pydantic).
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from nemo_jetrl.config.section import NonNegativeInt, Section, StrictInt

Precision = Literal["bf16", "fp8"]
SUPPORTED_BLOCK_SIZE = 128


class Fp8Config(Section):
    block_size: StrictInt = SUPPORTED_BLOCK_SIZE
    num_first_layers_in_bf16: NonNegativeInt = 0  # one layer map: trainer AND rollout keep these layers BF16
    num_last_layers_in_bf16: NonNegativeInt = 0
    pow2_weight_scaling_factors: bool = False
    pow2_activation_scaling_factors: bool = False
    wgrad_x_blocks: Literal["1x128", "128x128"] = "1x128"  # 1x128 (exact Jet-RL layout) | 128x128 (faster WGrad)
    train_kv_fake_quant: bool = False  # the trainer's attention sees the rollout's FP8 Q/K/V

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
        pow2 = "+pow2w" * fp8.pow2_weight_scaling_factors + "+pow2a" * fp8.pow2_activation_scaling_factors
        recipe = f"blockwise-e4m3(w128x128,a1x128,wgrad_x={fp8.wgrad_x_blocks}{pow2})"
    else:
        recipe = "none"
    kv = gen.kv_cache_dtype if gen.kv_cache_dtype == "fp8" else policy.compute_dtype
    return (
        f"precision: train={policy.precision if policy.precision == 'fp8' else policy.compute_dtype} "
        f"rollout={gen.precision if gen.precision == 'fp8' else policy.compute_dtype} kv={kv} "
        f"bf16_first={fp8.num_first_layers_in_bf16} bf16_last={fp8.num_last_layers_in_bf16} recipe={recipe}"
    )
