"""End to end: a few GRPO steps of the tiny config in each precision, and the unified-flow weight sharing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.precision import Fp8Linear
from nemo_jetrl.precision import linear as fp8_linear
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
SMALL = [
    "grpo.num_prompts_per_step=8",
    "grpo.num_generations_per_prompt=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=32",
    "grpo.max_val_samples=64",
]
REQUIRED_TRAIN_KEYS = [
    "train/reward_mean",
    "train/loss",
    "train/grad_norm",
    "train/token_mult_prob_error",
    "train/gen_kl_error",
    "train/policy_kl_error",
    "train/js_divergence_error",
    "train/sampling_importance_ratio",
    "train/is_oob_ratio",
]
TIMING_KEYS = ["timing/generation", "timing/reward", "timing/logprobs", "timing/training", "timing/total_step_time"]


def _run(config: str, tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    resolved = load_config(CONFIGS / config, [*SMALL, f"logger.log_dir={tmp_path}", *overrides])
    result = grpo.run_grpo(validate_config(resolved), resolved)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return result, lines


def _merged_by_step(lines: list[dict]) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    for line in lines:
        steps.setdefault(line["step"], {}).update(line)
    return steps


@pytest.mark.parametrize(
    ("config", "max_tmpe", "min_tmpe", "recipe"),
    [
        # Same forward, same weights: rollout and trainer agree to float32 rounding.
        ("grpo_tiny_bf16.yaml", 1.001, 1.0, "blockwise"),
        # Unified FP8: the rollout runs on the trainer's FP8 bits, so it stays on-policy.
        ("grpo_tiny.yaml", 1.001, 1.0, "blockwise"),
        ("grpo_tiny.yaml", 1.001, 1.0, "rowwise"),  # per-token scales: the same bits too (measured 1.0)
        # tensorwise: one activation scale per tensor, a decode step's vs the trainer's whole batch: measured
        # 1.013 and 1.032 (docs/precision.md, "which recipe when")
        ("grpo_tiny.yaml", 1.2, 1.005, "tensorwise"),
        # BF16 training + FP8 rollout: off-policy by construction (measured ~1.02 on this task).
        ("grpo_tiny_fp8_rollout_only.yaml", 1.2, 1.005, "blockwise"),
    ],
)
def test_two_grpo_steps_write_finite_metrics(config, max_tmpe, min_tmpe, recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_JETRL_PROFILE", "training@2")  # a kernel profile of step 2's training phase
    overrides = ("grpo.max_num_steps=2", "grpo.val_period=2", f"policy.fp8_cfg.fp8_recipe={recipe}")
    result, lines = _run(config, tmp_path, *overrides)
    steps = _merged_by_step(lines)
    assert sorted(steps) == [0, 1, 2]
    for step in (1, 2):
        row = steps[step]
        for key in REQUIRED_TRAIN_KEYS + TIMING_KEYS:
            assert key in row, f"step {step} lacks {key}"
            assert math.isfinite(float(row[key])), f"{key}={row[key]}"
        assert min_tmpe <= row["train/token_mult_prob_error"] <= max_tmpe
        # 0/1 rewards over 8 x 4 samples: the mean is a count / 32, and accuracy (reward > 0.5) is the same number
        correct = row["train/reward_mean"] * 32
        assert correct == round(correct) and row["train/accuracy"] == row["train/reward_mean"]
    # 64 held-out problems; the warm-started tiny model solves ~15% greedily (none solved = a broken rollout)
    val_correct = steps[2]["validation/accuracy"] * 64
    assert val_correct == round(val_correct) and 0 < val_correct < 64
    assert len(result["history"]) == 2
    profile = json.loads((tmp_path / "profile" / "step2_training.json").read_text())
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["step2_training.json"]
    assert profile["wall_ms"] == pytest.approx(steps[2]["timing/training"] * 1e3)  # the logged phase, profiled
    assert (tmp_path / "config.yaml").is_file()
    assert list((tmp_path / "tensorboard").iterdir())
    assert (tmp_path / "plots" / "reward_accuracy.png").stat().st_size > 10_000


@pytest.mark.parametrize("recipe", ["blockwise", "rowwise", "tensorwise"])
def test_unified_rollout_runs_on_the_trainers_fp8_tensors(tmp_path, monkeypatch, recipe):
    """One quantization per step: rollout, logprobs and the training forward all use the refit's QuantizedWeights,
    in every FP8 recipe (`policy.fp8_cfg.fp8_recipe`)."""
    overrides = [*SMALL, f"logger.log_dir={tmp_path}", f"policy.fp8_cfg.fp8_recipe={recipe}"]
    resolved = load_config(CONFIGS / "grpo_tiny.yaml", overrides)
    run = grpo.setup(validate_config(resolved))
    fp8_modules = {n: m for n, m in run.policy.model.named_modules() if isinstance(m, Fp8Linear)}
    assert len(fp8_modules) == 28  # 4 layers x 7 projections; lm_head stays BF16
    assert {m.recipe.granularity for m in fp8_modules.values()} == {recipe} and run.policy.recipe.granularity == recipe
    run.policy.prepare_refit()
    refit = {n: m.quantized_weight() for n, m in fp8_modules.items()}

    calls = []
    real_weight_quant = fp8_linear.master_weight_quant
    monkeypatch.setattr(
        fp8_linear, "master_weight_quant", lambda *a, **k: calls.append(1) or real_weight_quant(*a, **k)
    )
    seen: dict[str, list] = {n: [] for n in fp8_modules}
    hooks = [
        m.register_forward_pre_hook(lambda mod, args, n=n: seen[n].append((mod.mode, mod.quantized_weight())))
        for n, m in fp8_modules.items()
    ]
    from nemo_jetrl.utils.progress import RunProgress
    from nemo_jetrl.utils.timers import Timer

    # Stop right before the optimizer step: generation, reward, logprobs and the training forward/backward.
    # (the trainer drops its FP8 weights after the optimizer step; count only the quantizations before it)
    stepped = []
    monkeypatch.setattr(run.policy.optimizer, "step", lambda *a, **k: stepped.append(len(calls)))
    grpo.grpo_step(run, 0, Timer(), RunProgress(1, enabled=False))
    for h in hooks:
        h.remove()
    assert stepped == [0], "the rollout or the trainer re-quantized a weight before the optimizer step"
    for name, uses in seen.items():
        modes = {mode for mode, _ in uses}
        assert modes == {"rollout", "train"}, (name, modes)
        assert all(qw is refit[name] for _, qw in uses), name


def test_fp8_refit_requantizes_after_an_optimizer_step(tmp_path):
    resolved = load_config(CONFIGS / "grpo_tiny.yaml", [*SMALL, f"logger.log_dir={tmp_path}"])
    run = grpo.setup(validate_config(resolved))
    module = next(m for m in run.policy.model.modules() if isinstance(m, Fp8Linear))
    before = module.quantized_weight()
    with torch.no_grad():
        module.weight.add_(0.01)
    run.policy.prepare_refit()
    after = module.quantized_weight()
    assert after is not before
    assert not torch.equal(after.scale, before.scale)
