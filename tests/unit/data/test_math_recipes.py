"""The 8B math recipes validate (config load + schema) without touching the model or data paths, and each sets
the precision switches its name promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_jetrl.config import load_config
from nemo_jetrl.data.prompts import check_template
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
# recipe -> (train, rollout, kv_cache_dtype, IS correction type)
RECIPES = {
    "grpo_math_8B_fp8.yaml": ("fp8", "fp8", "auto", None),
    "grpo_math_8B_fp8_kv.yaml": ("fp8", "fp8", "fp8", None),
    "grpo_math_8B_bf16.yaml": ("bf16", "bf16", "auto", None),
    "grpo_math_8B_fp8_rollout_only.yaml": ("bf16", "fp8", "auto", None),
    "grpo_math_8B_fp8_rollout_only_tis.yaml": ("bf16", "fp8", "auto", "tis"),
    "grpo_math_8B_fp8_rollout_only_icepop.yaml": ("bf16", "fp8", "auto", "icepop"),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_validates_and_sets_its_switches(name):
    cfg = validate_config(load_config(CONFIGS / name))
    assert not Path(cfg.policy.model_name).exists()  # a placeholder: validation never opens it
    train, rollout, kv, is_type = RECIPES[name]
    recipe = PrecisionRecipe.from_config(cfg.policy)
    assert (recipe.train, recipe.rollout, recipe.kv_cache_dtype) == (train, rollout, kv)
    assert recipe.unified == (train == rollout)
    assert cfg.loss_fn.truncated_importance_sampling_type == is_type
    assert cfg.loss_fn.use_importance_sampling_correction == (is_type is not None)
    assert cfg.data.dataset_name.endswith(".jsonl") and cfg.env.math.answer_format == "boxed"
    assert check_template(cfg.data.prompt_template).format("1+1?").endswith("within \\boxed{}.")
    assert cfg.checkpointing.enabled and cfg.policy.master_dtype == "float32"


def test_recipes_never_share_log_or_checkpoint_dirs():
    """run_grpo resumes from checkpoint_dir automatically: two recipes sharing it would resume each other."""
    cfgs = [validate_config(load_config(CONFIGS / name)) for name in RECIPES]
    assert len({c.checkpointing.checkpoint_dir for c in cfgs}) == len(cfgs)
    assert len({c.logger.log_dir for c in cfgs}) == len(cfgs)


def test_icepop_lower_bound_defaults_to_the_reciprocal():
    cfg = validate_config(load_config(CONFIGS / "grpo_math_8B_fp8_rollout_only_icepop.yaml"))
    assert cfg.loss_fn.truncated_importance_sampling_ratio_min == 0.5
