"""A tiny Qwen3-MoE GRPO run through examples/run_grpo.py (examples/configs/grpo_tiny_moe.yaml) on a random tiny-moe
checkpoint: three unified-FP8 steps with the routing agreement and the load-balancing loss logged at every step, and
in the exact mode the rollout's experts and logprobs the trainer's bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main

from nemo_jetrl.models.random_checkpoint import build_random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
cli = load_script(ROOT / "examples" / "run_grpo.py", "run_grpo_moe")


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_moe")
    build_random_checkpoint(out, "tiny-moe", num_train=8, num_val=4)
    return out / "model"


def _run(model: Path, log_dir: Path, *overrides: str) -> dict[int, dict]:
    argv = [
        "--config", str(ROOT / "examples" / "configs" / "grpo_tiny_moe.yaml"), f"policy.model_name={model}",
        "grpo.max_num_steps=3", "grpo.num_prompts_per_step=4", f"logger.log_dir={log_dir}",
        "logger.tensorboard_enabled=false", *overrides,
    ]  # fmt: skip
    status, out, err = run_main(cli.main, argv)
    assert status == 0, err[-2000:]
    assert "fp8 layers: 12/15" in err  # per layer: q, k, v, o and the two expert weights; routers and lm_head BF16
    steps: dict[int, dict] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(record)
    return steps


def test_tiny_moe_grpo_logs_routing_agreement_and_load_balancing(tiny_moe, tmp_path):
    steps = _run(tiny_moe, tmp_path)
    assert sorted(steps) == [1, 2, 3]
    for m in steps.values():
        assert 0.9 <= m["train/routing_agreement"] <= 1.0  # the fast path on CPU
        assert 1.0 < m["train/moe/load_balancing_loss"] < 8.0  # HF's loss over 2 layers: 2 at a perfect balance
        assert m["train/token_mult_prob_error"] < 1.01


def test_exact_mode_routes_and_scores_like_the_trainer(tiny_moe, tmp_path):
    steps = _run(tiny_moe, tmp_path, "policy.generation.deterministic=true")
    for m in steps.values():
        assert m["train/routing_agreement"] == 1.0
        assert m["train/token_mult_prob_error"] == 1.0 and m["train/gen_kl_error"] == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.generation.backend=vllm", "error: policy.generation.backend: vllm does not run MoE models here"),
        ("cluster.backend=ray", "error: cluster.backend: ray does not train MoE models yet"),
    ],
)
def test_engines_and_backends_without_moe_are_refused_in_one_line(tiny_moe, tmp_path, override, message):
    argv = ["--config", str(ROOT / "examples" / "configs" / "grpo_tiny_moe.yaml"), f"policy.model_name={tiny_moe}",
            f"logger.log_dir={tmp_path}", override]  # fmt: skip
    status, _, err = run_main(cli.main, argv)
    assert status == 1 and message in err and "Traceback" not in err  # a run-time refusal: one line, exit 1
