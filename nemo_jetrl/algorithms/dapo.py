"""DAPO pieces of a GRPO step, NeMo-RL semantics: reward scaling and overlong shaping, dynamic sampling, overlong
filtering.

- Reward scaling (`grpo.reward_scaling`, NeMo-RL's `scale_rewards`, applied first): each reward clamped to
  [source_min, source_max] and mapped linearly onto [target_min, target_max].

- Reward shaping (`grpo.reward_shaping`, NeMo-RL's `apply_reward_shaping`): a response of L tokens (stop token
  included) gets `min(0, -(L - (max_response_length - overlong_buffer_length)) / overlong_buffer_length *
  overlong_buffer_penalty)` added; with `stop_properly_penalty_coef` set, truncated responses' rewards are instead
  multiplied by it. The unshaped rewards are kept: dynamic sampling filters on them.
- Dynamic sampling (`grpo.use_dynamic_sampling`): generation batches of `num_prompts_per_step * batch_multiplier`
  prompts are drawn until `num_prompts_per_step` whole groups with varying (unshaped) rewards are collected, at
  most `dynamic_sampling_max_gen_batches` batches; the first groups in generation order are kept, the surplus is
  discarded. NeMo-RL tests the per-sample std (with a leave-one-out baseline a group can be split); here a group is
  kept or dropped whole. Still short after the last batch: a ValueError naming the keys.
- Overlong filtering (`grpo.overlong_filtering`): truncated responses keep their reward and their place in the
  group's baseline but leave the loss (their response mask is cleared in the training batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from nemo_jetrl.algorithms.advantages import zero_std_groups
from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.generation.seed_shards import merge_generation_outputs

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.config import RewardScalingConfig, RewardShapingConfig


def scale_rewards(rewards: torch.Tensor, cfg: RewardScalingConfig) -> torch.Tensor:
    """Scaled rewards [B] from rewards [B] (see module docstring)."""
    if not cfg.enabled:
        return rewards
    lo, hi, t_lo, t_hi = cfg.source_min, cfg.source_max, cfg.target_min, cfg.target_max
    return t_lo + (rewards.clamp(lo, hi) - lo) / (hi - lo) * (t_hi - t_lo)


def shape_rewards(
    rewards: torch.Tensor, response_lengths: torch.Tensor, finished: torch.Tensor, cfg: RewardShapingConfig
) -> torch.Tensor:
    """Shaped rewards [B] from rewards [B], response lengths [B] (tokens) and finished [B] (see module docstring)."""
    if not cfg.enabled:
        return rewards
    if cfg.stop_properly_penalty_coef is not None:
        return torch.where(finished.bool(), rewards, rewards * float(cfg.stop_properly_penalty_coef))
    buffer, penalty = float(cfg.overlong_buffer_length), float(cfg.overlong_buffer_penalty)
    expected = float(cfg.max_response_length) - buffer
    exceed = response_lengths.to(rewards.dtype) - expected  # [B]
    return rewards + torch.clamp(-exceed / buffer * penalty, max=0.0)


@dataclass
class Rollout:
    """Generated rows in groups of G adjacent samples (prompt-major), with their rewards."""

    out: GenerationOutput
    rewards: torch.Tensor  # [B] shaped (what advantages use)
    raw_rewards: torch.Tensor  # [B] before shaping (what dynamic sampling tests)

    def __len__(self) -> int:
        return len(self.rewards)

    def select(self, rows: torch.Tensor) -> Rollout:
        """Rows `rows` (1-D long) of every per-row tensor; the padded layout stays."""
        out = {f.name: getattr(self.out, f.name) for f in fields(self.out)}
        out = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        return Rollout(GenerationOutput(**out), self.rewards[rows], self.raw_rewards[rows])

    @staticmethod
    def cat(parts: list[Rollout], pad_token_id: int) -> Rollout:
        out = merge_generation_outputs([p.out for p in parts], pad_token_id)
        return Rollout(out, torch.cat([p.rewards for p in parts]), torch.cat([p.raw_rewards for p in parts]))


def _group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """Row indices [len(groups) * G] of the given group indices, groups kept whole and in order."""
    return (groups.view(-1, 1) * group_size + torch.arange(group_size)).view(-1)


def dynamic_sampling(
    generate_batch: Callable[[], Rollout],
    num_groups: int,
    group_size: int,
    max_gen_batches: int,
    pad_token_id: int,
) -> tuple[Rollout, list[Rollout], dict[str, float]]:
    """Call `generate_batch` until `num_groups` groups with varying raw rewards are collected.

    Returns (the training rollout: exactly `num_groups` groups, every generated batch, NeMo-RL's metrics)."""
    kept: list[Rollout] = []
    generated: list[Rollout] = []
    found = 0
    for _ in range(max_gen_batches):
        batch = generate_batch()
        generated.append(batch)
        varied = ~zero_std_groups(batch.raw_rewards, group_size).view(-1, group_size)[:, 0]  # [N]
        groups = varied.nonzero().view(-1)
        if len(groups):
            kept.append(batch.select(_group_rows(groups, group_size)))
        found += len(groups)
        if found >= num_groups:
            break
    if found < num_groups:
        raise ValueError(
            f"grpo.use_dynamic_sampling: {found} of the {num_groups} groups with varying rewards after "
            f"grpo.dynamic_sampling_max_gen_batches={max_gen_batches} generation batches; raise it, "
            "grpo.batch_multiplier or grpo.num_generations_per_prompt"
        )
    train = Rollout.cat(kept, pad_token_id)
    train = train.select(torch.arange(num_groups * group_size))
    metrics = {
        "dynamic_sampling_num_gen_batches": float(len(generated)),
        "dynamic_sampling_num_discarded_valid_samples": float((found - num_groups) * group_size),
    }
    return train, generated, metrics


def overlong_filter(response_mask: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
    """response_mask [B, S] with the rows of truncated responses (finished [B] False) cleared."""
    return response_mask * finished.view(-1, 1).to(response_mask.dtype)
