"""Reference-policy KL end to end (loss_fn.reference_policy_kl_penalty > 0), unified FP8 tiny config, one process.

Design (NativePolicy / DataParallelPolicy): the reference is a deep copy of the loaded model taken BEFORE the FP8
module swap, so it stays a plain HF model in the master dtype (FP32 here) with the loaded weights, runs its
forward in compute_dtype, and never enters the optimizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jetrl_testkit.grpo_harness import record_train
from jetrl_testkit.reference_step import hf_logprobs

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.precision import Fp8Linear
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_tiny.yaml"
BETA = 0.5


def kl_overrides(tmp: Path) -> list[str]:
    return [
        f"logger.log_dir={tmp}",
        "logger.tensorboard_enabled=false",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.drop_zero_advantage_groups=false",  # every step trains, so the KL always reaches a loss
        "policy.train_micro_batch_size=16",  # one micro-batch: metrics are this batch's token means
        "policy.logprob_batch_size=16",
        "policy.optimizer.lr=1e-3",  # the policy moves visibly away from the reference in one step
        f"loss_fn.reference_policy_kl_penalty={BETA}",
        "policy.generation.temperature=1.0",  # logprobs at T=1, comparable with a plain HF forward
        "cluster.num_cpu_threads=1",
    ]


def expected_loss_and_kl(batch) -> tuple[float, float]:
    """By hand: one micro-batch, cur == prev_logprobs at the forward (ratio 1, so pg = -A), k3 KL token mean with
    NeMo-RL's default clamps (log-ratio to +-20, per-token KL to +-10)."""
    m = batch.response_mask.bool()
    cur, ref = batch.prev_logprobs.double(), batch.reference_logprobs.double()
    d = (ref - cur)[m].clamp(-20.0, 20.0)
    kl = float((d.exp() - d - 1).clamp(-10.0, 10.0).mean())
    adv = batch.advantages.double()[:, None].expand_as(cur)[m]
    return float(-adv.mean()) + BETA * kl, kl


@pytest.fixture(scope="module")
def kl_run(tmp_path_factory):
    cfg = validate_config(load_config(CONFIG, kl_overrides(tmp_path_factory.mktemp("kl"))))
    run = grpo.setup(cfg)
    initial = {n: p.detach().clone() for n, p in run.policy.reference_model.named_parameters()}
    calls = record_train(run)
    metrics = [grpo.grpo_step(run, step, Timer(), RunProgress(1, enabled=False)) for step in range(2)]
    return run, initial, calls, metrics


def test_reference_is_the_loaded_model_before_fp8_and_stays_frozen(kl_run):
    run, initial, calls, _ = kl_run
    reference = run.policy.reference_model
    loaded, _ = load_model_and_tokenizer("tiny-arith", device=torch.device("cpu"), dtype=torch.float32)
    assert not any(isinstance(m, Fp8Linear) for m in reference.modules())
    assert sum(isinstance(m, Fp8Linear) for m in run.policy.model.modules()) == 28
    for name, p in reference.named_parameters():
        assert p.dtype == torch.float32 and not p.requires_grad, name
        assert torch.equal(p, loaded.get_parameter(name)), f"{name}: not the loaded weights"
        assert torch.equal(p, initial[name]), f"{name}: the reference moved during training"
    moved = sum(not torch.equal(p, reference.get_parameter(n)) for n, p in run.policy.model.named_parameters())
    assert moved == len(initial), "the policy should have moved away from the reference in every tensor"
    # the step-1 batch scored again after step 2: the same reference logprobs, bit for bit
    assert torch.equal(run.policy.get_reference_policy_logprobs(calls[0]), calls[0].reference_logprobs)
    # and they are the loaded model's (independent FP32 HF forward; the reference computes in BF16)
    m = calls[0].response_mask.bool()
    with torch.no_grad():
        want = hf_logprobs(loaded.float(), calls[0])
    assert float((want - calls[0].reference_logprobs).abs()[m].max()) < 0.1


def test_kl_reaches_the_loss_with_the_hand_computed_value(kl_run):
    _, _, calls, metrics = kl_run
    assert len(calls) == 2
    for step, (batch, row) in enumerate(zip(calls, metrics)):
        loss, kl = expected_loss_and_kl(batch)
        assert kl > 1e-4, "no KL to check: the policy equals the reference"
        assert row["kl_penalty"] == pytest.approx(kl, rel=1e-3), step
        assert row["loss"] == pytest.approx(loss, rel=1e-3, abs=1e-5), step
    assert metrics[1]["kl_penalty"] > 2 * metrics[0]["kl_penalty"]  # the step moved the policy off the reference
