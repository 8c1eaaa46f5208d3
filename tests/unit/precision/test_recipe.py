"""PrecisionRecipe: presets, validation, derived flags, and reading the policy section of grpo_base.yaml."""

from pathlib import Path

import pytest
import yaml

from nemo_jetrl.precision import KVCalibration, PrecisionRecipe

BASE_YAML = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_base.yaml"


def _policy_from_yaml() -> dict:
    policy = yaml.safe_load(BASE_YAML.read_text())["policy"]
    # the YAML interpolates generation.precision from policy.precision; resolve it by hand (plain dict input)
    policy["generation"]["precision"] = policy["precision"]
    return policy


@pytest.mark.parametrize(
    ("name", "train", "rollout", "kv", "fake_quant", "unified", "any_fp8"),
    [
        ("bf16", "bf16", "bf16", "auto", False, True, False),
        ("fp8_rollout_only", "bf16", "fp8", "auto", False, False, True),
        ("jetrl", "fp8", "fp8", "auto", False, True, True),
        ("jetrl_kv", "fp8", "fp8", "fp8", True, True, True),
    ],
)
def test_presets(name, train, rollout, kv, fake_quant, unified, any_fp8):
    r = PrecisionRecipe.preset(name)
    assert (r.train, r.rollout, r.kv_cache_dtype, r.train_kv_fake_quant) == (train, rollout, kv, fake_quant)
    assert (r.unified, r.any_fp8) == (unified, any_fp8)
    assert r.linear_fp8 == (train == "fp8" or rollout == "fp8")
    assert r.block_size == 128 and r.kv_calibration == KVCalibration(99.9, 1.05)


def test_preset_overrides_and_unknown_name():
    r = PrecisionRecipe.preset("jetrl", num_last_layers_in_bf16=2, wgrad_x_blocks="128x128")
    assert (r.num_last_layers_in_bf16, r.wgrad_x_blocks, r.train) == (2, "128x128", "fp8")
    with pytest.raises(ValueError, match="unknown precision preset 'fp9'"):
        PrecisionRecipe.preset("fp9")
    assert set(PrecisionRecipe.preset_names()) == {"bf16", "fp8_rollout_only", "jetrl", "jetrl_kv"}


def test_recipe_is_frozen():
    r = PrecisionRecipe()
    with pytest.raises(AttributeError):
        r.train = "bf16"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"train": "fp16"}, "precision.train"),
        ({"rollout": "int8"}, "precision.rollout"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype"),
        ({"block_size": 64}, "block_size must be 128"),
        ({"num_first_layers_in_bf16": -1}, "num_first_layers_in_bf16"),
        ({"num_last_layers_in_bf16": 1.5}, "num_last_layers_in_bf16"),
        ({"wgrad_x_blocks": "128x1"}, "wgrad_x_blocks"),
        ({"pow2_weight_scales": "yes"}, "pow2_weight_scales"),
        ({"train_kv_fake_quant": True}, "train_kv_fake_quant needs kv_cache_dtype='fp8'"),
        ({"kv_calibration": {"percentile": 99.9}}, "kv_calibration must be a KVCalibration"),
    ],
)
def test_validation_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrecisionRecipe(**kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [({"percentile": 0.0}, "percentile"), ({"margin": 0.9}, "margin")])
def test_kv_calibration_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVCalibration(**kwargs)


def test_from_config_reads_grpo_base_policy():
    r = PrecisionRecipe.from_config(_policy_from_yaml())
    assert r == PrecisionRecipe.preset("jetrl")


def test_from_config_maps_every_key():
    policy = _policy_from_yaml()
    policy["precision"] = "bf16"
    policy["generation"].update(precision="fp8", kv_cache_dtype="fp8")
    policy["generation"]["kv_cache_calibration"] = {"percentile": 99.0, "margin": 1.2}
    policy["fp8_cfg"].update(
        num_first_layers_in_bf16=1,
        num_last_layers_in_bf16=2,
        pow2_weight_scaling_factors=True,
        pow2_activation_scaling_factors=True,
        wgrad_x_blocks="128x128",
        train_kv_fake_quant=True,
    )
    r = PrecisionRecipe.from_config(policy)
    assert r == PrecisionRecipe(
        train="bf16",
        rollout="fp8",
        kv_cache_dtype="fp8",
        num_first_layers_in_bf16=1,
        num_last_layers_in_bf16=2,
        pow2_weight_scales=True,
        pow2_activation_scales=True,
        wgrad_x_blocks="128x128",
        kv_calibration=KVCalibration(99.0, 1.2),
        train_kv_fake_quant=True,
    )
    assert not r.unified


def test_from_config_rollout_follows_train_when_absent():
    r = PrecisionRecipe.from_config({"precision": "bf16", "generation": {}})
    assert (r.train, r.rollout) == ("bf16", "bf16")


def test_from_config_errors_name_the_key():
    with pytest.raises(ValueError, match="policy.fp8_cfg.fp8_recipe"):
        PrecisionRecipe.from_config({"precision": "fp8", "fp8_cfg": {"fp8_recipe": "blockwise"}})
    with pytest.raises(ValueError, match="policy.generation.precision"):
        PrecisionRecipe.from_config({"precision": "fp8", "generation": {"precision": "fp4"}})
    with pytest.raises(ValueError, match="block_size must be 128"):
        PrecisionRecipe.from_config({"fp8_cfg": {"block_size": 256}})
    with pytest.raises(ValueError, match="policy must be a mapping"):
        PrecisionRecipe.from_config(["precision", "fp8"])


def test_from_config_accepts_omegaconf():
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(BASE_YAML)
    cfg.policy.precision = "bf16"  # generation.precision follows through ${policy.precision}
    r = PrecisionRecipe.from_config(cfg.policy)  # a DictConfig is a Mapping; interpolations resolve on access
    assert r == PrecisionRecipe.preset("bf16")
