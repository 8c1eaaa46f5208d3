"""benchmarks/common.py builds the `policy` and `loss_fn` sections the benchmarks hand to the policies from the
section types themselves (policy/config.py, algorithms/config.py: one home for each default); it states only the
values the benchmarks change."""

from __future__ import annotations

import pytest

from nemo_jetrl.algorithms.config import LossConfig
from nemo_jetrl.policy.config import PolicyConfig

common = pytest.importorskip("benchmarks.common")


def test_benchmark_policy_section_is_typed_and_states_only_what_it_changes():
    cfg = common.policy_config()
    assert type(cfg) is PolicyConfig
    dumped, default = cfg.model_dump(), PolicyConfig().model_dump()
    changed = {key for key in dumped if dumped[key] != default[key]}
    # the tokenizer follows model_name (filled by the section's validator); every other change is stated once
    assert changed == set(common.BENCHMARK_POLICY) | {"tokenizer"}
    assert cfg.tokenizer.name == "benchmark-random" and cfg.optimizer.lr == 1e-6
    assert cfg.optimizer.model_dump() == {**default["optimizer"], "lr": 1e-6}  # the rest of the section: defaults
    assert cfg.generation.precision == "fp8" == cfg.precision  # null precision follows policy.precision


def test_benchmark_policy_overrides_merge_into_nested_sections_and_are_validated():
    cfg = common.policy_config(train_causal_attention=True, generation={"kv_cache_calibration_pass": "post_step"})
    assert cfg.train_causal_attention is True
    assert cfg.generation.kv_cache_calibration_pass == "post_step" and cfg.generation.max_new_tokens == 8
    with pytest.raises(ValueError, match="policy.generation.max_new_tokens"):
        common.policy_config(max_total_sequence_length=4, generation={"max_new_tokens": 8})


def test_benchmark_loss_is_the_default_loss_section():
    assert common.LOSS.cfg == LossConfig() and type(common.LOSS.cfg) is LossConfig
