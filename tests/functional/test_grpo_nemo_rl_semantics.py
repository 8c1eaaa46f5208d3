"""A NeMo-RL-spelled tiny config (LR warm-up, 2 optimizer steps per GRPO step, dynamic sampling) runs 4 steps and
logs NeMo-RL's metric names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.environments import make_task
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny_dapo.yaml"
NEMO_RL_TRAIN = [
    "reward",
    "filtered_reward",
    "loss",
    "grad_norm",
    "lr",
    "mean_prompt_length",
    "total_num_tokens",
    "num_valid_samples",
    "mean_gen_tokens_per_sample",
    "truncation_rate",
    "advantages/mean",
    "dynamic_sampling_num_gen_batches",
    "token_mult_prob_error",
    "gen_kl_error",
]
NEMO_RL_TIMING = [
    "total_step_time",
    "generation",
    "reward_calculation",
    "policy_and_reference_logprobs",
    "policy_training",
]


class RecordingTask:
    """The config's task, recording the raw rewards of every generation batch it scores."""

    def __init__(self, inner) -> None:
        self.inner, self.raw_rewards = inner, []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def score(self, responses, answers) -> torch.Tensor:
        rewards = self.inner.score(responses, answers)
        self.raw_rewards.append(rewards.clone())
        return rewards


def _expected_dynamic_sampling(batches: list[torch.Tensor], groups: int, group_size: int) -> tuple[int, int]:
    """(generation batches drawn, valid samples discarded): batches are drawn until `groups` groups with varying raw
    rewards are found."""
    found = 0
    for drawn, rewards in enumerate(batches, start=1):
        grouped = rewards.view(-1, group_size)
        found += int((grouped.amax(-1) != grouped.amin(-1)).sum())
        if found >= groups:
            return drawn, (found - groups) * group_size
    raise AssertionError(f"only {found} varying groups in {len(batches)} batches")


@pytest.mark.slow
def test_nemo_rl_spelled_dapo_config_runs_four_steps(tmp_path):
    resolved = load_config(CONFIG, [f"logger.log_dir={tmp_path}", "cluster.num_cpu_threads=2"])
    cfg = validate_config(resolved)
    task = RecordingTask(make_task(cfg.data, cfg.env))
    grpo.run_grpo(cfg, resolved, task=task)
    rows: dict[int, dict] = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    assert sorted(rows) == [1, 2, 3, 4]
    scored = iter(task.raw_rewards)  # 8 prompts x 4 samples per generation batch, in generation order
    for step, row in rows.items():
        for key in [f"train/{k}" for k in NEMO_RL_TRAIN] + [f"timing/train/{k}" for k in NEMO_RL_TIMING]:
            assert key in row and math.isfinite(float(row[key])), f"step {step}: {key}={row.get(key)}"
        assert row["train/num_optimizer_steps"] == 2.0  # 16 samples / train_global_batch_size 8
        drawn = int(row["train/dynamic_sampling_num_gen_batches"])
        batches = [next(scored) for _ in range(drawn)]
        assert all(b.shape == (32,) for b in batches)
        assert _expected_dynamic_sampling(batches, 4, 4) == (
            drawn,
            row["train/dynamic_sampling_num_discarded_valid_samples"],
        ), step
        assert row["train/mean_prompt_length"] == 7.0  # "<bos>ab+cd=" on the tiny tokenizer
        assert row["train/reward_mean"] == row["train/reward"]  # our own names keep working
        assert row["timing/generation"] == row["timing/train/generation"]
    # LinearLR warm-up 0.1 -> 1.0 of 1e-4 over 3 GRPO steps, logged at the lr each step trained with.
    assert next(scored, None) is None  # no batch scored beyond the logged ones
    lrs = [rows[s]["train/lr"] for s in (1, 2, 3, 4)]
    assert lrs == pytest.approx([1e-5, 4e-5, 7e-5, 1e-4], rel=1e-9)
