"""`grpo.val_reference`: validation through a BF16 referee of the run's own weights. On the tiny model (CPU) the
referee of a unified-FP8 run decodes, greedy, the very tokens a BF16 run of the same weights decodes, where the FP8
rollout itself decodes others; a BF16 run reports its own accuracy again; where no referee can run it is refused by
name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nemo_jetrl.algorithms import grpo, validation
from nemo_jetrl.algorithms.rollout_io import bootstrap_kv_scales, encode_prompts
from nemo_jetrl.config import load_config
from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


def _setup(config: str, tmp_path: Path, *overrides: str) -> grpo.GrpoSetup:
    resolved = load_config(CONFIGS / config, [f"logger.log_dir={tmp_path / config}", "checkpointing.enabled=false",
                                              "grpo.max_val_samples=32", *overrides])  # fmt: skip
    return grpo.setup(validate_config(resolved))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    fp8 = _setup("grpo_tiny.yaml", tmp, "grpo.val_reference=true", "policy.generation.kv_cache_dtype=fp8")
    bf16 = _setup("grpo_tiny_bf16.yaml", tmp, "grpo.val_reference=true")
    return fp8, bf16


def test_the_referee_of_an_fp8_run_decodes_what_a_bf16_run_of_the_same_weights_decodes(runs):
    fp8, bf16 = runs
    a, b = dict(fp8.policy.model.named_parameters()), dict(bf16.policy.model.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # one start
    problems = fp8.task.validation(32)
    prompts = encode_prompts(fp8.policy.tokenizer, [p.prompt for p in problems])
    referee = validation.reference_engine(fp8)
    assert referee.linear_mode == "reference" and referee.kv_cache_dtype.itemsize == 2
    assert fp8.engine.linear_mode == "rollout" and fp8.engine.kv_cache_dtype.itemsize == 1
    ref = referee.generate(prompts, greedy=True).input_ids
    plain = bf16.engine.generate(prompts, greedy=True).input_ids
    bootstrap_kv_scales(fp8, 0)  # the FP8 rollout's first K/V scales, as its first validation takes them
    own = fp8.engine.generate(prompts, greedy=True).input_ids
    assert torch.equal(ref, plain)
    assert not torch.equal(own, plain)  # the FP8 rollout decodes other tokens: the comparison can fail
    assert validation.reference_engine(fp8) is referee  # made once


def test_validation_reports_the_referees_accuracy_and_a_bf16_run_its_own(runs):
    fp8, bf16 = runs
    got, plain = grpo.validate(fp8, 0), grpo.validate(bf16, 0)
    assert got["reference_accuracy"] == plain["accuracy"] == plain["reference_accuracy"]
    assert validation.reference_engine(bf16) is None  # its rollout is the referee: not run twice


def test_no_referee_where_the_rollout_holds_no_master_weights_or_is_not_native(runs, monkeypatch):
    fp8, _ = runs
    with pytest.raises(ConfigError, match="grpo.val_reference: true needs the native rollout engine"):
        validation.check_reference(SimpleNamespace(engine=object()))
    replica = Fp8RolloutLinear(128, 128, PrecisionRecipe.preset("jetrl"), None)
    monkeypatch.setattr(validation, "_native", lambda engine: SimpleNamespace(model=nn.Sequential(replica)))
    with pytest.raises(ConfigError, match="rollout replica holds only FP8 weights"):
        validation.check_reference(fp8)
