"""Per-step QKV recalibration for the FP8 KV cache: the trainer's scales, their refresh, and GRPO end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jetrl_testkit.grpo_harness import SMALL_TINY_RUN

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
SMALL = SMALL_TINY_RUN
KV = ["policy.generation.kv_cache_dtype=fp8", "policy.fp8_cfg.train_kv_fake_quant=true"]


def _policy(pass_: str = "fused") -> tuple[NativePolicy, ClippedPGLossFn]:
    cfg = load_config(CONFIGS / "grpo_tiny.yaml", [*SMALL, *KV, f"policy.generation.kv_cache_calibration_pass={pass_}"])
    validated = validate_config(cfg)
    policy_cfg = validated.policy
    policy = NativePolicy(policy_cfg, PrecisionRecipe.from_config(policy_cfg), torch.device("cpu"))
    return policy, ClippedPGLossFn(validated.loss_fn)


def _batch(policy: NativePolicy, n: int = 16) -> TrainBatch:
    prompts = [f"{a:02d}+{b:02d}={a + b}" for a, b in zip(range(10, 10 + n), range(50, 50 + n))]
    enc = policy.tokenizer(prompts, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    response = torch.zeros_like(mask)
    response[:, -3:] = 1
    zeros = torch.zeros(ids.shape)
    return TrainBatch(ids, mask, response, torch.linspace(-1, 1, n), zeros, prev_logprobs=zeros.clone())


def test_recalibration_follows_a_weight_update():
    """Fused pass: scales come from the step's logprob forward; doubling layer 0's v_proj doubles its V scale
    exactly (power-of-two weight change: same e4m3 bits, doubled block scales) and leaves its Q/K scales alone."""
    policy, _ = _policy("fused")
    batch = _batch(policy)
    policy.calibrate_kv_scales(batch)  # bootstrap: the fake-quant needs the rollout's current scales
    policy.get_logprobs(batch)
    assert policy.kv_calibrator.num_micro_batches == 1
    first = policy.prepare_refit()
    s1 = policy.kv_scales
    assert first["kv_v_scale_max"] == s1.v.max().item() and first["kv_k_scale_mean"] == s1.k.mean().item()
    with torch.no_grad():
        policy.model.model.layers[0].self_attn.v_proj.weight.mul_(2.0)
    policy.get_logprobs(batch)
    policy.prepare_refit()
    s2 = policy.kv_scales
    assert s2.v[0].item() == 2 * s1.v[0].item()
    assert s2.q[0].item() == s1.q[0].item() and s2.k[0].item() == s1.k[0].item()
    assert not torch.equal(s2.v[1:], s1.v[1:])  # downstream layers see a different residual stream


def test_post_step_pass_calibrates_on_the_updated_weights():
    policy, loss_fn = _policy("post_step")
    batch = _batch(policy)
    before = policy.calibrate_kv_scales(batch)
    policy.get_logprobs(batch)
    assert policy.kv_calibrator.num_micro_batches == 1  # get_logprobs does not observe in post_step mode
    policy.optimizer.param_groups[0]["lr"] = 1e-2  # a visible update
    policy.train(batch, loss_fn)
    policy.prepare_refit()
    after = policy.kv_scales
    assert not torch.equal(after.k, before.k)
    fresh, _ = _policy("post_step")
    fresh.model.load_state_dict(policy.model.state_dict())
    fresh.set_kv_scales(before)  # the fake-quant of the pass uses the scales the step ran with
    assert torch.equal(fresh.calibrate_kv_scales(batch).k, after.k)


def _equal_parts(a, b) -> list[str]:
    """Which of the q / k / v scales of two KVScales are bitwise equal."""
    return [n for n in ("q", "k", "v") if torch.equal(getattr(a, n), getattr(b, n))]


def test_post_step_pass_calibrates_on_every_optimizer_steps_rows():
    """train_global_batch_size < samples: two optimizer steps in one GRPO step; the post-step pass runs over both
    steps' rows (one micro-batch of 24), not the last step's 8, which alone give other scales."""
    policy, loss_fn = _policy("post_step")
    rows = _batch(policy, 24)
    first, last = rows.select(slice(0, 16)), rows.select(slice(16, 24))
    before = policy.calibrate_kv_scales(first)
    policy.optimizer.param_groups[0]["lr"] = 1e-2
    metrics = policy.train([first, last], loss_fn)
    assert metrics["num_optimizer_steps"] == 2.0
    policy.prepare_refit()
    after = policy.kv_scales
    fresh, _ = _policy("post_step")
    fresh.model.load_state_dict(policy.model.state_dict())
    fresh.set_kv_scales(before)
    both = fresh.calibrate_kv_scales(TrainBatch.cat([first, last]))
    assert _equal_parts(after, both) == ["q", "k", "v"]
    fresh.set_kv_scales(before)
    assert _equal_parts(after, fresh.calibrate_kv_scales(last)) != ["q", "k", "v"]  # (seen: q and v differ)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused", "deterministic"])
def test_grpo_steps_with_fp8_kv_stay_on_policy(deterministic, tmp_path):
    """jetrl_kv end to end: bootstrap scales, rollout on the FP8 cache, trainer fake-quant with the same scales,
    recalibration handed to the engine at refit; the rollout's logprobs and the trainer's agree exactly."""
    overrides = [*SMALL, *KV, f"logger.log_dir={tmp_path}", "grpo.max_num_steps=2"]
    overrides.append(f"policy.generation.deterministic={str(deterministic).lower()}")
    if deterministic:
        overrides.append("policy.logprob_batch_size=8")  # trainer micro-batches unlike the rollout's batch
    resolved = load_config(CONFIGS / "grpo_tiny.yaml", overrides)
    run = grpo.setup(validate_config(resolved))
    run.engine.score = None  # prev_logprobs come from the trainer's forward, never from a replay of the rollout
    assert run.engine.kv_cache_dtype == torch.float8_e4m3fn and run.policy.kv_scales is None
    assert grpo.validate(run, 0)["accuracy"] > 0  # validation first (val_at_start): bootstraps the scales
    run.policy.kv_scales = None
    assert run.policy.kv_calibration_pass == ("post_step" if deterministic else "fused")
    with RunProgress(2) as progress:
        for step in range(2):
            timer = Timer()
            metrics = grpo.grpo_step(run, step, timer, progress)
            assert metrics["token_mult_prob_error"] == 1.0 and metrics["gen_kl_error"] == 0.0
            assert metrics["exact_token_fraction"] == 1.0 and metrics["num_valid_tokens"] >= 40
            assert metrics["refit/kv_k_scale_max"] == run.policy.kv_scales.k.max().item()  # this step's scales
            assert torch.equal(run.engine.kv_scales[0], run.policy.kv_scales.k.cpu())
            assert ("timing/kv_bootstrap" in timer.get_timing_metrics()) == (step == 0)
    run.logger.close()
