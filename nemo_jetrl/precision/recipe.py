"""The one FP8 recipe shared by the trainer and the rollout engine (Jet-RL's unified precision flow).

Built from the validated `policy` section (`from_config`; its rules, error messages and defaults live in
precision/config.py, generation/config.py and policy/config.py only) or from a named preset (benchmarks, studies).
Nothing here re-checks the values: this module imports without pydantic (the GPU box and the Ray workers).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.precision import recipe_defaults as D
from nemo_jetrl.precision.recipes import BLOCKWISE, ScaleLayout, scale_layout

Precision = Literal["bf16", "fp8"]
KVCacheDtype = Literal["auto", "fp8"]
WGradXBlocks = Literal["1x128", "128x128"]
# Scale layout of every FP8 cast: the name of a registered `recipes.ScaleLayout` (docs/precision.md, "which recipe
# when"): blockwise (Jet-RL / DeepSeek-V3: 1x128 groups, 128x128 weight tiles), rowwise (one scale per row along the
# dim each GEMM contracts), tensorwise (one scale per tensor, from its own amax)
Granularity = str

# policy.fp8_cfg key -> PrecisionRecipe field
_FP8_CFG_FIELDS = {
    "fp8_recipe": "granularity",
    "block_size": "block_size",
    "num_first_layers_in_bf16": "num_first_layers_in_bf16",
    "num_last_layers_in_bf16": "num_last_layers_in_bf16",
    "pow2_weight_scaling_factors": "pow2_weight_scales",
    "pow2_activation_scaling_factors": "pow2_activation_scales",
    "wgrad_x_blocks": "wgrad_x_blocks",
    "train_kv_fake_quant": "train_kv_fake_quant",
    "use_deep_gemm": "use_deep_gemm",
    "cache_dgrad_weight": "cache_dgrad_weight",
}


@dataclass(frozen=True)
class KVCalibration:
    """How FP8 KV-cache scales are calibrated: `scale = percentile_over_microbatches(amax) * margin / 448`."""

    percentile: float = D.KV_PERCENTILE
    margin: float = D.KV_MARGIN


@dataclass(frozen=True)
class PrecisionRecipe:
    """Frozen FP8 recipe: which GEMMs run in FP8, block layout, scale options; one object for both sides.

    `train` covers FProp/DGrad/WGrad of the mapped linears, `rollout` the rollout engine's linears; with both
    "fp8" the rollout runs on the trainer's own FP8 weight bits and scales (`unified`). The field defaults
    (`recipe_defaults`, which the config sections read too) are the presets' base.
    """

    train: Precision = "fp8"
    rollout: Precision = "fp8"
    kv_cache_dtype: KVCacheDtype = "auto"
    granularity: Granularity = D.GRANULARITY
    block_size: int = D.BLOCK_SIZE
    num_first_layers_in_bf16: int = D.NUM_FIRST_LAYERS_IN_BF16
    num_last_layers_in_bf16: int = D.NUM_LAST_LAYERS_IN_BF16
    pow2_weight_scales: bool = D.POW2_WEIGHT_SCALES
    pow2_activation_scales: bool = D.POW2_ACTIVATION_SCALES
    wgrad_x_blocks: WGradXBlocks = D.WGRAD_X_BLOCKS  # type: ignore[assignment]
    kv_calibration: KVCalibration = field(default_factory=KVCalibration)
    train_kv_fake_quant: bool = D.TRAIN_KV_FAKE_QUANT
    use_deep_gemm: bool = D.USE_DEEP_GEMM  # blockwise FProp / DGrad on DeepGEMM where it runs (deep_gemm_adapter)
    cache_dgrad_weight: bool = D.CACHE_DGRAD_WEIGHT  # DGrad's FP8 W^T kept between backwards (else made in each, then freed)

    # --- derived views -------------------------------------------------------------------------------------
    @property
    def train_fp8(self) -> bool:
        return self.train == "fp8"

    @property
    def rollout_fp8(self) -> bool:
        return self.rollout == "fp8"

    @functools.cached_property
    def layout(self) -> ScaleLayout:
        """The scale layout object (`precision/recipes/`): its casts, GEMMs and features; what the code asks."""
        return scale_layout(self.granularity)

    @property
    def blockwise(self) -> bool:
        """The Jet-RL layout (1x128 / 128x128 blocks); the code asks `layout.features` instead."""
        return self.layout == BLOCKWISE

    @property
    def kv_fp8(self) -> bool:
        return self.kv_cache_dtype == "fp8"

    @property
    def linear_fp8(self) -> bool:
        """Some linear layer runs an FP8 GEMM (trainer or rollout)."""
        return self.train_fp8 or self.rollout_fp8

    @property
    def any_fp8(self) -> bool:
        """Anything at all is FP8: linears (either side) or the KV cache."""
        return self.linear_fp8 or self.kv_fp8

    @property
    def unified(self) -> bool:
        """Trainer and rollout compute the same function (same linear precision; FP8 KV mirrored in training).
        tensorwise: the same rule, but an activation scale spans its whole tensor, so a decode step's bits are not
        the full-batch forward's (docs/precision.md, "which recipe when")."""
        return self.train == self.rollout and (not self.kv_fp8 or self.train_kv_fake_quant)

    # --- constructors --------------------------------------------------------------------------------------
    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        return tuple(_PRESETS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> PrecisionRecipe:
        """Named recipe (`bf16`, `fp8_rollout_only`, `jetrl`, `jetrl_kv`, `rowwise`, `tensorwise`), optionally
        with field overrides."""
        if name not in _PRESETS:
            raise ValueError(f"unknown precision preset {name!r}; known: {sorted(_PRESETS)}")
        return dataclasses.replace(_PRESETS[name], **overrides)

    @classmethod
    def from_config(cls, policy: Any) -> PrecisionRecipe:
        """From the validated `policy` section (a `PolicyConfig`; a dict is refused): its values read as is."""
        policy = typed_section(policy, "PolicyConfig", "PrecisionRecipe.from_config")
        generation, fp8_cfg = policy.generation, policy.fp8_cfg
        return cls(
            train=policy.precision,
            rollout=generation.precision,
            kv_cache_dtype=generation.kv_cache_dtype,
            kv_calibration=KVCalibration(
                percentile=generation.kv_cache_calibration.percentile, margin=generation.kv_cache_calibration.margin
            ),
            **{recipe_field: getattr(fp8_cfg, key) for key, recipe_field in _FP8_CFG_FIELDS.items()},
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_PRESETS: dict[str, PrecisionRecipe] = {
    "bf16": PrecisionRecipe(train="bf16", rollout="bf16"),
    "fp8_rollout_only": PrecisionRecipe(train="bf16", rollout="fp8"),
    "jetrl": PrecisionRecipe(train="fp8", rollout="fp8"),
    "jetrl_kv": PrecisionRecipe(train="fp8", rollout="fp8", kv_cache_dtype="fp8", train_kv_fake_quant=True),
    "rowwise": PrecisionRecipe(train="fp8", rollout="fp8", granularity="rowwise"),
    "tensorwise": PrecisionRecipe(train="fp8", rollout="fp8", granularity="tensorwise"),
}
