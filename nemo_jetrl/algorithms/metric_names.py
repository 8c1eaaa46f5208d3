"""Metrics under the names NeMo-RL's GRPO loop logs (read off nemo_rl/algorithms/grpo.py), beside our own.

Every name here is logged under `train/` (timings under `timing/train/`); the project's own names stay as they are
(docs/metrics.md has the table).
"""

from __future__ import annotations

import torch

from nemo_jetrl.algorithms.dapo import Rollout

# our timer name -> NeMo-RL's (logged as timing/train/<name>)
TIMING_NAMES = {
    "total_step_time": "total_step_time",
    "generation": "generation",
    "reward": "reward_calculation",
    "logprobs": "policy_and_reference_logprobs",
    "training": "policy_training",
    "refit": "prepare_for_generation/total",
}


def nemo_rl_timing(timing: dict[str, float]) -> dict[str, float]:
    """`timing/<ours>` -> `timing/train/<NeMo-RL's>` for the phases NeMo-RL times too."""
    out = {}
    for ours, theirs in TIMING_NAMES.items():
        if f"timing/{ours}" in timing:
            out[f"timing/train/{theirs}"] = timing[f"timing/{ours}"]
    return out


def nemo_rl_rollout_metrics(
    generated: list[Rollout], train: Rollout, advantages: torch.Tensor, dynamic_sampling: bool
) -> dict[str, float]:
    """NeMo-RL's rollout / reward / batch metrics of one step.

    `generated`: every generation batch of the step; `train`: the rows the step trains on; advantages [B_train].
    reward = mean over every generated sample (with dynamic sampling: filtered_reward = over the trained ones).
    """
    rewards = torch.cat([g.rewards for g in generated])  # [all generated]
    lengths = torch.cat([g.out.response_lengths for g in generated]).float()
    finished = torch.cat([g.out.finished for g in generated]).float()
    out = train.out
    prompt_lengths = out.attention_mask[:, : out.prompt_length].sum(-1).float()  # [B]
    resp = out.response_mask.bool().cpu()  # [B, S] (the engine may return CUDA tensors; advantages are on CPU)
    token_adv = advantages.float().cpu().view(-1, 1).expand_as(resp)[resp]  # advantages of response tokens
    metrics = {
        "reward": float(rewards.mean()),
        "mean_prompt_length": float(prompt_lengths.mean()),
        "total_num_tokens": float(out.attention_mask.sum()),
        "mean_gen_tokens_per_sample": float(lengths.mean()),
        "max_gen_tokens_per_sample": float(lengths.max()),
        "mean_total_tokens_per_sample": float(out.attention_mask.sum(-1).float().mean()),
        "natural_termination_rate": float(finished.mean()),
        "truncation_rate": float(1.0 - finished.mean()),
        "advantages/mean": float(token_adv.mean()) if token_adv.numel() else 0.0,
        "advantages/max": float(token_adv.max()) if token_adv.numel() else 0.0,
        "advantages/min": float(token_adv.min()) if token_adv.numel() else 0.0,
    }
    if dynamic_sampling:
        metrics["filtered_reward"] = float(train.rewards.mean())
    return metrics
