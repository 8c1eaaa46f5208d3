"""FP8 precision core: one blockwise E4M3 recipe for the trainer's GEMMs and the rollout engine."""

from nemo_jetrl.precision.convert import convert_to_fp8
from nemo_jetrl.precision.gemm import fp8_blockwise_mm, fp8_wgrad_mm, gemm_backend
from nemo_jetrl.precision.layer_map import build_layer_map, decoder_layer_index
from nemo_jetrl.precision.linear import (
    Fp8Linear,
    Fp8LinearFunction,
    QuantizedInput,
    QuantizedWeight,
    quantize_shared_input,
    rollout_mode,
)
from nemo_jetrl.precision.quant import (
    act_dequant,
    act_quant,
    act_quant_dual,
    act_quant_t,
    weight_dequant,
    weight_quant,
)
from nemo_jetrl.precision.recipe import KVCalibration, PrecisionRecipe
from nemo_jetrl.precision.rollout_layers import Fp8RolloutGroup, Fp8RolloutLinear, build_rollout_replica
from nemo_jetrl.precision.weight_group import Fp8WeightGroup, group_sibling_linears, project_shared_input

__all__ = [
    "Fp8Linear",
    "Fp8LinearFunction",
    "Fp8RolloutGroup",
    "Fp8RolloutLinear",
    "Fp8WeightGroup",
    "KVCalibration",
    "PrecisionRecipe",
    "QuantizedInput",
    "QuantizedWeight",
    "act_dequant",
    "act_quant",
    "act_quant_dual",
    "act_quant_t",
    "build_layer_map",
    "build_rollout_replica",
    "convert_to_fp8",
    "decoder_layer_index",
    "fp8_blockwise_mm",
    "fp8_wgrad_mm",
    "gemm_backend",
    "group_sibling_linears",
    "project_shared_input",
    "quantize_shared_input",
    "rollout_mode",
    "weight_dequant",
    "weight_quant",
]
