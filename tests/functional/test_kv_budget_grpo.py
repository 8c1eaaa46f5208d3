"""grpo_tiny with a KV budget smaller than the batch (continuous batching) against the unbudgeted run, on CPU:
the same responses and rewards at every step (per-sequence sampling streams), the same training metrics to within
the last-bit differences of the other decode batch shapes."""

from __future__ import annotations

import pytest

from .test_grpo_tiny import _merged_by_step, _run

STEPS = ["grpo.max_num_steps=3", "grpo.val_period=0"]
EXACT = ["train/reward_mean", "train/accuracy", "train/mean_response_length", "train/num_valid_samples"]
CLOSE = ["train/loss", "train/token_mult_prob_error", "train/gen_kl_error", "train/grad_norm"]


def test_budgeted_rollout_gives_the_unbudgeted_run(tmp_path):
    _, whole = _run("grpo_tiny.yaml", tmp_path / "whole", *STEPS)
    _, budgeted = _run("grpo_tiny.yaml", tmp_path / "budget", *STEPS, "policy.generation.max_num_seqs=5")
    a, b = _merged_by_step(whole), _merged_by_step(budgeted)
    assert sorted(a) == sorted(b) and len(a) == 3
    for step in a:
        for key in EXACT:
            if key in a[step]:
                assert b[step][key] == a[step][key], (step, key)
        for key in CLOSE:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-3, abs=1e-5), (step, key)
    assert any(a[s]["train/reward_mean"] != a[1]["train/reward_mean"] for s in a)  # the rewards are not constant
    for step in b:  # the continuous rollout's admissions (its prefills) inside the generation phase; no graphs on CPU
        admission = b[step]["timing/generation/admission"]
        assert 0 < admission < b[step]["timing/generation"] and b[step]["timing/generation/cuda_graph_capture"] == 0
        assert "timing/generation/admission" not in a[step]  # the whole-batch rollout has no admissions


def test_exact_mode_with_a_kv_budget_stays_bitwise_on_policy(tmp_path):
    """The exact mode (grpo_tiny: FP8 + FP8 KV) through the driver with 5 sequences decoded at once: every
    generated token's rollout logprob equals the trainer's, and the run is the unbudgeted exact run's."""
    exact = [*STEPS, "policy.generation.deterministic=true", "policy.logprob_batch_size=8"]
    _, whole = _run("grpo_tiny.yaml", tmp_path / "whole", *exact)
    _, budgeted = _run("grpo_tiny.yaml", tmp_path / "budget", *exact, "policy.generation.max_num_seqs=5")
    a, b = _merged_by_step(whole), _merged_by_step(budgeted)
    assert sorted(a) == sorted(b) and len(a) == 3
    for step in a:
        assert b[step]["train/exact_token_fraction"] == 1.0 and a[step]["train/exact_token_fraction"] == 1.0, step
        assert b[step]["train/token_mult_prob_error"] == 1.0 and b[step]["train/num_valid_tokens"] >= 40, step
        for key in [*EXACT, *CLOSE]:
            if key in a[step]:
                assert b[step][key] == a[step][key], (step, key)
