"""GRPO learns: the tiny task's reward rises over a short seeded CPU run (grpo_tiny_bf16's recipe, no FP8).

Overrides set everything the outcome depends on (lr, batch, steps, compute dtype), so tuning grpo_tiny*.yaml does not
move it. The run computes in FP32: what is asserted is that the loop learns, not a precision (BF16 compute is run
end to end by test_grpo_tiny.py), and on AVX2-only CPUs (the AMD CI host) torch's BF16 GEMMs fall back to a
single-threaded kernel 7-75x slower than FP32: this run took 390 s in BF16 there, 31 s in FP32.
Measured on the AMD CI host (seed 42, FP32): reward 0.159 over steps 1-10 -> 0.247 over steps 21-30 (+0.088; BF16
on an AVX-512 host: 0.159 -> 0.210). Threshold: +0.025, under half the smaller measured rise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny_bf16.yaml"


@pytest.mark.slow
def test_reward_rises_over_a_short_run(tmp_path):
    overrides = [
        "grpo.num_prompts_per_step=32",
        "grpo.num_generations_per_prompt=8",
        "grpo.max_num_steps=30",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "grpo.seed=42",
        "policy.optimizer.lr=2e-4",
        "policy.train_micro_batch_size=256",
        "policy.logprob_batch_size=256",
        f"logger.log_dir={tmp_path}",
        "logger.tensorboard_enabled=false",
        "logger.plot_period=0",
        "cluster.num_cpu_threads=2",
        "policy.compute_dtype=float32",  # see the module doc
    ]
    result = grpo.run_grpo(validate_config(load_config(CONFIG, overrides)))
    rewards = [m["reward_mean"] for m in result["history"]]
    assert len(rewards) == 30
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.025, (first, last, rewards)
