"""The one FP8 recipe shared by the trainer and the rollout engine (Jet-RL's unified precision flow)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Precision = Literal["bf16", "fp8"]
KVCacheDtype = Literal["auto", "fp8"]
WGradXBlocks = Literal["1x128", "128x128"]

_PRECISIONS = ("bf16", "fp8")
_KV_DTYPES = ("auto", "fp8")
_WGRAD_X_BLOCKS = ("1x128", "128x128")
_PRECISION_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "float8": "fp8", "e4m3": "fp8"}
_FP8_CFG_KEYS = {
    "block_size": "block_size",
    "num_first_layers_in_bf16": "num_first_layers_in_bf16",
    "num_last_layers_in_bf16": "num_last_layers_in_bf16",
    "pow2_weight_scaling_factors": "pow2_weight_scales",
    "pow2_activation_scaling_factors": "pow2_activation_scales",
    "wgrad_x_blocks": "wgrad_x_blocks",
    "train_kv_fake_quant": "train_kv_fake_quant",
}


@dataclass(frozen=True)
class KVCalibration:
    """How FP8 KV-cache scales are calibrated: `scale = percentile_over_microbatches(amax) * margin / 448`."""

    percentile: float = 99.9
    margin: float = 1.05

    def __post_init__(self) -> None:
        if not isinstance(self.percentile, int | float) or not 0.0 < float(self.percentile) <= 100.0:
            raise ValueError(f"kv_calibration.percentile must be in (0, 100], got {self.percentile!r}")
        if not isinstance(self.margin, int | float) or not float(self.margin) >= 1.0:
            raise ValueError(f"kv_calibration.margin must be >= 1.0 (a margin below 1 clips), got {self.margin!r}")


@dataclass(frozen=True)
class PrecisionRecipe:
    """Frozen FP8 recipe: which GEMMs run in FP8, block layout, scale options; one object for both sides.

    `train` covers FProp/DGrad/WGrad of the mapped linears, `rollout` the rollout engine's linears; with both
    "fp8" the rollout runs on the trainer's own FP8 weight bits and scales (`unified`).
    """

    train: Precision = "fp8"
    rollout: Precision = "fp8"
    kv_cache_dtype: KVCacheDtype = "auto"
    block_size: int = 128
    num_first_layers_in_bf16: int = 0
    num_last_layers_in_bf16: int = 0
    pow2_weight_scales: bool = False
    pow2_activation_scales: bool = False
    wgrad_x_blocks: WGradXBlocks = "1x128"
    kv_calibration: KVCalibration = field(default_factory=KVCalibration)
    train_kv_fake_quant: bool = False

    def __post_init__(self) -> None:
        for name in ("train", "rollout"):
            if getattr(self, name) not in _PRECISIONS:
                raise ValueError(f"precision.{name} must be one of {_PRECISIONS}, got {getattr(self, name)!r}")
        if self.kv_cache_dtype not in _KV_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {_KV_DTYPES}, got {self.kv_cache_dtype!r}")
        if isinstance(self.block_size, bool) or self.block_size != 128:
            raise ValueError(
                f"block_size must be 128 (DeepSeek/Jet-RL blocks, Hopper scaled_mm), got {self.block_size!r}"
            )
        for name in ("num_first_layers_in_bf16", "num_last_layers_in_bf16"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in ("pow2_weight_scales", "pow2_activation_scales", "train_kv_fake_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.wgrad_x_blocks not in _WGRAD_X_BLOCKS:
            raise ValueError(f"wgrad_x_blocks must be one of {_WGRAD_X_BLOCKS}, got {self.wgrad_x_blocks!r}")
        if not isinstance(self.kv_calibration, KVCalibration):
            raise ValueError(f"kv_calibration must be a KVCalibration, got {type(self.kv_calibration).__name__}")
        if self.train_kv_fake_quant and self.kv_cache_dtype != "fp8":
            raise ValueError("train_kv_fake_quant needs kv_cache_dtype='fp8' (there is no FP8 KV cache to mirror)")

    # --- derived views -------------------------------------------------------------------------------------
    @property
    def train_fp8(self) -> bool:
        return self.train == "fp8"

    @property
    def rollout_fp8(self) -> bool:
        return self.rollout == "fp8"

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
        """Trainer and rollout compute the same function (same linear precision; FP8 KV mirrored in training)."""
        return self.train == self.rollout and (not self.kv_fp8 or self.train_kv_fake_quant)

    # --- constructors --------------------------------------------------------------------------------------
    @classmethod
    def preset_names(cls) -> tuple[str, ...]:
        return tuple(_PRESETS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> PrecisionRecipe:
        """Named recipe (`bf16`, `fp8_rollout_only`, `jetrl`, `jetrl_kv`), optionally with field overrides."""
        if name not in _PRESETS:
            raise ValueError(f"unknown precision preset {name!r}; known: {sorted(_PRESETS)}")
        return dataclasses.replace(_PRESETS[name], **overrides)

    @classmethod
    def from_config(cls, policy: Mapping[str, Any]) -> PrecisionRecipe:
        """Build from the `policy` section of grpo_base.yaml given as a plain mapping (or DictConfig)."""
        policy = _as_mapping(policy, "policy")
        kwargs: dict[str, Any] = {}
        if policy.get("precision") is not None:
            kwargs["train"] = _precision(policy["precision"], "policy.precision")
        generation = _as_mapping(policy.get("generation") or {}, "policy.generation")
        if generation.get("precision") is not None:
            kwargs["rollout"] = _precision(generation["precision"], "policy.generation.precision")
        elif "train" in kwargs:  # the YAML default: rollout follows ${policy.precision}
            kwargs["rollout"] = kwargs["train"]
        if generation.get("kv_cache_dtype") is not None:
            kwargs["kv_cache_dtype"] = str(generation["kv_cache_dtype"])
        calib = _as_mapping(generation.get("kv_cache_calibration") or {}, "policy.generation.kv_cache_calibration")
        unknown = set(calib) - {"percentile", "margin"}
        if unknown:
            raise ValueError(f"unknown key(s) policy.generation.kv_cache_calibration.{sorted(unknown)}")
        kwargs["kv_calibration"] = KVCalibration(**{k: calib[k] for k in calib if calib[k] is not None})
        fp8_cfg = _as_mapping(policy.get("fp8_cfg") or {}, "policy.fp8_cfg")
        for key, value in fp8_cfg.items():
            if key not in _FP8_CFG_KEYS:
                raise ValueError(f"unknown key policy.fp8_cfg.{key}; known: {sorted(_FP8_CFG_KEYS)}")
            if value is not None:
                kwargs[_FP8_CFG_KEYS[key]] = value
        try:
            return cls(**kwargs)
        except ValueError as err:
            raise ValueError(f"invalid precision settings in policy config: {err}") from err

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _as_mapping(obj: Any, where: str) -> Mapping[str, Any]:
    if hasattr(obj, "model_dump"):  # a pydantic model
        obj = obj.model_dump()
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(obj).__name__}")
    return obj


def _precision(value: Any, where: str) -> str:
    key = str(value).lower()
    if key not in _PRECISION_ALIASES:
        raise ValueError(f"{where} must be one of {_PRECISIONS}, got {value!r}")
    return _PRECISION_ALIASES[key]


_PRESETS: dict[str, PrecisionRecipe] = {
    "bf16": PrecisionRecipe(train="bf16", rollout="bf16"),
    "fp8_rollout_only": PrecisionRecipe(train="bf16", rollout="fp8"),
    "jetrl": PrecisionRecipe(train="fp8", rollout="fp8"),
    "jetrl_kv": PrecisionRecipe(train="fp8", rollout="fp8", kv_cache_dtype="fp8", train_kv_fake_quant=True),
}
