"""`grpo.val_reference` on CUDA (CUDA-graph decode, fused glue kernels): the BF16 referee of a unified FP8 + FP8 KV
run decodes, greedy, what a BF16 run of the same weights decodes, and the FP8 rollout itself does not.

Run (one GPU, ~1 min): `python -m pytest -q -m gpu tests/gpu/test_validation_reference_gpu.py`. On the CPU the
same comparison is bitwise (tests/functional/test_validation_reference.py); here the bound leaves room for a kernel
that differs between the two engines, and the measured agreement is printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


def test_the_referee_decodes_what_a_bf16_run_decodes_on_cuda(tmp_path):
    for module in ("omegaconf", "rich", "pydantic"):
        pytest.importorskip(module, reason="grpo.py and the config schema need it")
    from nemo_jetrl.algorithms import grpo, validation
    from nemo_jetrl.algorithms.rollout_io import bootstrap_kv_scales, encode_prompts
    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    def setup(config: str, *extra: str):
        overrides = [f"logger.log_dir={tmp_path / config}", "logger.tensorboard_enabled=false",
                     "checkpointing.enabled=false", "cluster.device=cuda", "grpo.val_reference=true", *extra]  # fmt: skip
        return grpo.setup(validate_config(load_config(CONFIGS / config, overrides)))

    fp8 = setup("grpo_tiny.yaml", "policy.generation.kv_cache_dtype=fp8")
    bf16 = setup("grpo_tiny_bf16.yaml")
    assert fp8.device.type == "cuda"
    prompts = encode_prompts(fp8.policy.tokenizer, [p.prompt for p in fp8.task.validation(256)])
    referee = validation.reference_engine(fp8)
    assert referee.linear_mode == "reference" and referee.kv_cache_dtype == torch.bfloat16
    ref = referee.generate(prompts, greedy=True).input_ids
    plain = bf16.engine.generate(prompts, greedy=True).input_ids
    bootstrap_kv_scales(fp8, 0)
    own = fp8.engine.generate(prompts, greedy=True).input_ids
    width = min(ref.shape[1], plain.shape[1], own.shape[1])
    agree_ref = (ref[:, :width] == plain[:, :width]).float().mean().item()
    agree_own = (own[:, :width] == plain[:, :width]).float().mean().item()
    print(f"tokens equal to the BF16 run's: referee {agree_ref:.4f}, FP8 rollout {agree_own:.4f}")
    assert agree_ref >= 0.99 and agree_ref > agree_own
    assert validation.reference_engine(bf16) is None  # a BF16 rollout is its own referee
