"""examples/run_eval.py: pass@k (hand values), results of the tiny model agree with the GRPO loop's validate(),
checkpoints load, config errors are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from jetrl_testkit.cli import load_script, run_main, run_script

from nemo_jetrl.algorithms import grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.evals.eval import pass_at_k
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.checkpoint import CheckpointManager

ROOT = Path(__file__).resolve().parents[2]
EVAL_YAML = ROOT / "examples" / "configs" / "evals" / "eval_tiny.yaml"
run_eval = load_script(ROOT / "examples" / "run_eval.py", "run_eval")


def test_pass_at_k_unbiased_estimator():
    # n = 4: c = 1, k = 2 -> 1 - C(3,2)/C(4,2) = 1/2; c = 0 -> 0; c = 3, k = 2 -> 1 (n - c < k); k = 1 -> c / n.
    correct = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]).bool()
    assert pass_at_k(correct, 2) == pytest.approx((0.5 + 0 + 1) / 3)
    assert pass_at_k(correct, 1) == pytest.approx((0.25 + 0 + 0.75) / 3)
    assert pass_at_k(correct, 4) == pytest.approx((1 + 0 + 1) / 3)


def _eval(tmp_path: Path, *overrides: str) -> dict:
    out = tmp_path / "out"
    args = ["--config", str(EVAL_YAML), "eval.max_samples=32", f"eval.save_path={out}", f"logger.log_dir={tmp_path}"]
    assert run_eval.main([*args, *overrides]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_tiny_model_pass_at_k_and_greedy_accuracy_match_validate(tmp_path):
    results = _eval(tmp_path)
    assert results["num_prompts"] == 32 and results["num_tests_per_prompt"] == 4
    assert 0.0 < results["pass@1"] <= results["score"] <= 1.0  # pass@4 >= pass@1 on the same samples
    assert results["score"] > results["pass@1"]  # the warm-started model solves some prompts only sometimes
    cfg = load_config(
        EVAL_YAML.parent.parent / "grpo_tiny_bf16.yaml", ["grpo.max_val_samples=32", f"logger.log_dir={tmp_path / 'v'}"]
    )
    run = grpo.setup(validate_config(cfg))
    assert results["accuracy"] == grpo.validate(run, 0)["accuracy"]
    # A checkpoint whose weights are all zero answers nothing: the checkpoint, not model_name, was evaluated.
    state = run.policy.state_dict()
    state["model"] = {k: torch.zeros_like(v) for k, v in state["model"].items()}
    CheckpointManager(tmp_path / "ckpt").save(3, {"policy": state, "step": 3})
    zeroed = _eval(tmp_path, f"eval.checkpoint_dir={tmp_path / 'ckpt'}")
    assert zeroed["checkpoint_step"] == 3 and zeroed["accuracy"] == 0.0 and zeroed["score"] == 0.0


CONFIG_ERRORS = {
    "eval.k_value=8": "error: eval.k_value (8) must be <= eval.num_tests_per_prompt (4)",
    "eval.num_tests_per_prompt=0": "error: eval.num_tests_per_prompt: 0 is invalid",
}


@pytest.mark.parametrize("override", sorted(CONFIG_ERRORS))
def test_config_errors_are_one_line_exit_2(override):
    rc, out, err = run_main(run_eval.main, ["--config", str(EVAL_YAML), override])
    assert rc == 2 and out == "" and err.startswith(CONFIG_ERRORS[override]) and err.count("\n") == 1, err


def test_the_script_as_a_process_gives_what_main_gives_in_process():
    """`python run_eval.py ...` in a fresh interpreter (jetrl_testkit/cli.py): a config error's exit status, stdout
    and stderr are what main() gives in this process."""
    argv = ["--config", str(EVAL_YAML), "eval.k_value=8"]
    assert run_script(ROOT / "examples" / "run_eval.py", argv, timeout=120) == run_main(run_eval.main, argv)
