"""PrecisionRecipe: presets, derived flags, and building it from the validated policy section (PolicyConfig)."""

from pathlib import Path

import pytest

from nemo_jetrl.config import load_config
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.precision import KVCalibration, PrecisionRecipe
from nemo_jetrl.schema import validate_config

BASE_YAML = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_base.yaml"


def _policy_from_yaml() -> dict:
    """grpo_base.yaml's validated `policy` section, dumped to a dict to edit (then validated back: `_validated`)."""
    return validate_config(load_config(BASE_YAML)).policy.model_dump()


def _validated(policy: dict) -> PolicyConfig:
    """What the run hands to from_config: the validated section, typed."""
    return PolicyConfig.model_validate(policy)


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
    assert set(PrecisionRecipe.preset_names()) == {
        "bf16", "fp8_rollout_only", "jetrl", "jetrl_kv", "rowwise", "tensorwise"
    }  # fmt: skip
    assert (PrecisionRecipe.preset("rowwise").granularity, PrecisionRecipe.preset("jetrl").blockwise) == (
        "rowwise",
        True,
    )
    assert not PrecisionRecipe.preset("tensorwise").blockwise


def test_recipe_is_frozen():
    r = PrecisionRecipe()
    with pytest.raises(AttributeError):
        r.train = "bf16"


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_recipe_defaults_equal_the_section_defaults(precision):
    # the presets' base (dataclass defaults) and the config sections' defaults must not drift apart
    preset = PrecisionRecipe.preset("jetrl" if precision == "fp8" else "bf16")
    assert PrecisionRecipe.from_config(PolicyConfig(precision=precision)) == preset
    with pytest.raises(TypeError, match="from_config expects the validated config section PolicyConfig, got dict"):
        PrecisionRecipe.from_config(PolicyConfig(precision=precision).model_dump())


def test_from_config_reads_grpo_base_policy():
    r = PrecisionRecipe.from_config(_validated(_policy_from_yaml()))
    assert r == PrecisionRecipe.preset("jetrl")


def test_from_config_maps_every_key():
    policy = _policy_from_yaml()
    policy["precision"] = "bf16"
    policy["generation"].update(precision="fp8", kv_cache_dtype="fp8")
    policy["generation"]["kv_cache_calibration"] = {"percentile": 99.0, "margin": 1.2}
    policy["fp8_cfg"].update(
        fp8_recipe="tensorwise",
        num_first_layers_in_bf16=1,
        num_last_layers_in_bf16=2,
        pow2_weight_scaling_factors=True,
        pow2_activation_scaling_factors=True,
        wgrad_x_blocks="128x128",
        train_kv_fake_quant=True,
    )
    r = PrecisionRecipe.from_config(_validated(policy))
    assert r == PrecisionRecipe(
        train="bf16",
        rollout="fp8",
        kv_cache_dtype="fp8",
        granularity="tensorwise",
        num_first_layers_in_bf16=1,
        num_last_layers_in_bf16=2,
        pow2_weight_scales=True,
        pow2_activation_scales=True,
        wgrad_x_blocks="128x128",
        kv_calibration=KVCalibration(99.0, 1.2),
        train_kv_fake_quant=True,
    )
    assert not r.unified
