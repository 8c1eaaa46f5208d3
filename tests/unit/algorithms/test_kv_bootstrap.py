"""The first FP8 KV scales come from a prefill of the step's prompts through the trainer (rollout_io.
bootstrap_kv_scales), not from a second, high-precision rollout: step 1 generates once, and the scales are finite
and within a few percent of (never above) what the old full-rollout bootstrap gave on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jetrl_testkit.grpo_harness import SMALL_TINY_RUN

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.algorithms.rollout_io import bootstrap_kv_scales, encode_prompts, step_generator
from nemo_jetrl.config import load_config
from nemo_jetrl.generation.interfaces import rollout_phase
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"  # unified FP8 + FP8 KV


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = validate_config(load_config(CONFIG, [*SMALL_TINY_RUN, f"logger.log_dir={tmp_path_factory.mktemp('logs')}"]))
    run = grpo.setup(cfg)
    yield run
    run.logger.close()


def _full_rollout_bootstrap(run) -> object:
    """The old bootstrap: a BF16-KV rollout of the step's prompts, then the trainer's calibration over it."""
    problems = run.task.train_batch(0, int(run.cfg.grpo.num_prompts_per_step))
    prompt_ids = encode_prompts(run.policy.tokenizer, [p.prompt for p in problems])
    with rollout_phase(run.engine.replace(kv_cache_dtype=None)) as engine:
        out = engine.generate(prompt_ids, generator=step_generator(run.cfg.grpo.seed + 13, 0, run.device))
    batch = TrainBatch(out.input_ids, out.attention_mask, out.response_mask, torch.zeros(len(out)),
                       out.generation_logprobs.float())  # fmt: skip
    return run.policy.calibrate_kv_scales(batch)


def test_prefill_scales_are_close_to_a_full_rollouts(run):
    bootstrap_kv_scales(run, 0)
    prefill = run.policy.kv_scales
    assert torch.equal(run.engine.kv_scales[0], prefill.k) and torch.equal(run.engine.kv_scales[1], prefill.v)
    full = _full_rollout_bootstrap(run)
    for part in ("q", "k", "v"):
        a, b = getattr(prefill, part), getattr(full, part)
        assert a.shape == (4,) and bool(torch.isfinite(a).all()) and bool((a > 0).all()), part
        ratio = a / b  # the prompts are a prefix of the rolled-out sequences: their amax can only be lower
        assert bool((ratio <= 1).all()) and bool((ratio >= 0.8).all()), (part, ratio)  # measured: 0.885 at least
    run.policy.kv_scales = None  # back to "no scales yet" for the next test


def test_the_first_step_rolls_out_once(run, monkeypatch):
    calls = {"generate": 0, "replace": 0}
    generate, replace = run.engine.generate, run.engine.replace

    def counted_generate(*args, **kwargs):
        calls["generate"] += 1
        return generate(*args, **kwargs)

    def counted_replace(*args, **kwargs):
        calls["replace"] += 1
        return replace(*args, **kwargs)

    monkeypatch.setattr(run.engine, "generate", counted_generate)
    monkeypatch.setattr(run.engine, "replace", counted_replace)
    assert run.policy.kv_scales is None
    timer = Timer()
    with RunProgress(1) as progress:
        metrics = grpo.grpo_step(run, 0, timer, progress)
    assert calls == {"generate": 1, "replace": 0}  # the step's own rollout only; no BF16-KV engine made
    assert "timing/kv_bootstrap" in timer.get_timing_metrics() and metrics["refit/kv_k_scale_max"] > 0
    assert metrics["token_mult_prob_error"] == 1.0  # the trainer's K/V fake-quant uses the rollout's scales
