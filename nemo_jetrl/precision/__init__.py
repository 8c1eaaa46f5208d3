"""FP8 precision core: one E4M3 recipe (blockwise, rowwise or tensorwise) for the trainer's GEMMs and the rollout."""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {
    "convert_to_fp8": "convert",
    "fp8_layers": "convert",
    "invalidate_fp8_caches": "convert",
    "is_fp8_layer": "convert",
    "fp8_blockwise_mm": "gemm",
    "fp8_wgrad_mm": "gemm",
    "gemm_backend": "gemm",
    "build_layer_map": "layer_map",
    "decoder_layer_index": "layer_map",
    "Fp8Linear": "linear",
    "Fp8LinearFunction": "linear",
    "QuantizedInput": "quantized",
    "QuantizedWeight": "quantized",
    "quantize_shared_input": "shared_input",
    "rollout_mode": "linear",
    "act_dequant": "quant",
    "act_quant": "quant",
    "act_quant_dual": "quant",
    "act_quant_t": "quant",
    "weight_dequant": "quant",
    "weight_quant": "quant",
    "weight_quant_checked": "quant",
    "KVCalibration": "recipe",
    "PrecisionRecipe": "recipe",
    "GemmChoice": "recipes",
    "LayoutFeatures": "recipes",
    "ScaleLayout": "recipes",
    "choose_gemm": "recipes",
    "register_layout": "recipes",
    "scale_layout": "recipes",
    "Fp8RolloutGroup": "rollout_layers",
    "Fp8RolloutLinear": "rollout_layers",
    "build_rollout_replica": "rollout_layers",
    "Fp8WeightGroup": "weight_group",
    "group_sibling_linears": "weight_group",
    "project_shared_input": "weight_group",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
