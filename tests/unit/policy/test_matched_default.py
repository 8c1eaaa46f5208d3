"""`policy.generation.matched_kernels: null`, the default: the run config makes it `auto` (bitwise on-policy where
the start-up self-check passes) for FP8 weights and an FP8 KV cache on both sides on a GPU up to 4,608 tokens a
sequence, where the matched step costs at most 5% more than the fast path's (docs/mismatch.md), and false everywhere
else; a value the user gives stays."""

from pathlib import Path

import pytest
import torch

from nemo_jetrl.config import load_config
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"


def matched(config: str, *overrides: str, cuda: bool = True, monkeypatch) -> bool | str:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    return validate_config(load_config(CONFIGS / config, list(overrides))).policy.generation.matched_kernels


@pytest.mark.parametrize(
    ("config", "overrides", "cuda", "expected"),
    [
        ("grpo_math_8B_fp8_kv.yaml", (), True, "auto"),  # the shipped Jet-RL recipes
        ("grpo_math_random_1p7B_fp8_kv.yaml", (), True, "auto"),
        ("grpo_tiny.yaml", (), True, "auto"),  # FP8 + FP8 KV, cluster.device auto, a GPU visible
        ("grpo_tiny.yaml", (), False, False),  # ... none visible: the README's CPU job stays on the fast path
        ("grpo_tiny.yaml", ("cluster.device=cpu",), True, False),
        ("grpo_math_8B_fp8.yaml", (), True, False),  # a bf16 KV cache: the matched cost is not measured there
        ("grpo_math_8B_bf16.yaml", (), True, False),
        ("grpo_math_8B_fp8_rollout_only.yaml", (), True, False),  # BF16 trainer, FP8 rollout
        ("accuracy_fp8_kv.yaml", (), True, False),  # the study's arms say which path they run
        ("accuracy_long_fp8_kv_matched.yaml", (), True, True),
        ("grpo_math_8B_fp8_kv.yaml", ("policy.generation.matched_kernels=false",), True, False),
        ("grpo_math_8B_fp8_kv.yaml", ("policy.generation.matched_kernels=true",), True, True),
        ("grpo_math_8B_fp8_kv.yaml", ("policy.generation.backend=vllm",), True, False),
        ("grpo_math_8B_fp8_kv.yaml", ("policy.generation.deterministic=true",), True, False),
        ("grpo_math_8B_fp8_kv.yaml", ("policy.fp8_cfg.train_kv_fake_quant=false",), True, False),
        # long responses: the exact decode attention costs more there than the 5% (opt in with auto or true)
        ("grpo_math_8B_fp8_kv.yaml", ("policy.max_total_sequence_length=8704",
                                      "policy.generation.max_new_tokens=8192"), True, False),  # fmt: skip
        ("grpo_math_8B_fp8_kv.yaml", ("policy.max_total_sequence_length=8704", "policy.generation.max_new_tokens=8192",
                                      "policy.generation.matched_kernels=auto"), True, "auto"),  # fmt: skip
    ],
)
def test_the_default_follows_the_recipe_and_the_device(config, overrides, cuda, expected, monkeypatch):
    assert matched(config, *overrides, cuda=cuda, monkeypatch=monkeypatch) == expected


def test_a_policy_config_built_directly_leaves_it_unresolved_and_off():
    """Benchmarks and tests that build a `PolicyConfig` themselves get None, which the start-up reads as off."""
    from nemo_jetrl.policy.auto_switches import apply_matched_kernels

    cfg = PolicyConfig()
    assert cfg.generation.matched_kernels is None
    on, line = apply_matched_kernels(torch.nn.Linear(2, 2), cfg, None, torch.device("cpu"), None)
    assert (on, line) == (False, None)
