"""benchmarks/common.py spells out the `policy` and `loss_fn` sections the benchmarks hand to the policies (the GPU
box has no pydantic to fill them in). They must be complete and valid: exactly what the section types produce."""

from __future__ import annotations

import pytest

from nemo_jetrl.algorithms.config import LossConfig
from nemo_jetrl.policy.config import PolicyConfig

common = pytest.importorskip("benchmarks.common")


@pytest.mark.parametrize(
    "overrides", [{}, {"train_causal_attention": True, "generation": {"kv_cache_calibration_pass": "post_step"}}]
)
def test_benchmark_policy_section_is_complete_and_valid(overrides):
    section = common.policy_config(**overrides)
    assert PolicyConfig.model_validate(section).to_dict() == section


def test_benchmark_loss_section_is_complete_and_valid():
    assert LossConfig.model_validate(common.LOSS_FN).to_dict() == common.LOSS_FN
