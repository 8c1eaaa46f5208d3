"""examples/accuracy_study.py: the arms' configs resolve to the intended precision settings and differ in nothing
else; the --quick form runs every stage (SFT, five GRPO arms through run_grpo.py, report) on the CPU with sane
numbers."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from jetrl_testkit.accuracy import outside_arm_keys

from nemo_jetrl.config import load_config
from nemo_jetrl.environments import LongAdditionTask
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
_spec = importlib.util.spec_from_file_location("accuracy_study", REPO / "examples" / "accuracy_study.py")
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)

# arm -> (precision preset, IS truncation type)
EXPECTED = {
    "bf16": ("bf16", None),
    "fp8_rollout_only": ("fp8_rollout_only", None),
    "fp8_rollout_only_tis": ("fp8_rollout_only", "tis"),
    "fp8": ("jetrl", None),
    "fp8_kv": ("jetrl_kv", None),
}


def test_arm_configs_resolve_to_their_precision_and_nothing_else_differs():
    assert set(EXPECTED) == set(study.ARMS)
    flat = {}
    for arm, (preset, truncation) in EXPECTED.items():
        cfg = validate_config(load_config(CONFIGS / f"accuracy_{arm}.yaml"))
        assert PrecisionRecipe.from_config(cfg.policy) == PrecisionRecipe.preset(preset), arm
        assert cfg.loss_fn.use_importance_sampling_correction is (truncation is not None)
        assert cfg.loss_fn.truncated_importance_sampling_type == truncation
        assert cfg.data.dataset_name == "long_addition" and cfg.grpo.max_num_steps >= 200
        assert cfg.grpo.mismatch_position_bin > 0 and cfg.policy.prev_logprobs_source == "train_forward"
        flat[arm] = outside_arm_keys(cfg.model_dump())
    assert all(flat[arm] == flat["bf16"] for arm in EXPECTED)


def test_longest_worked_solution_fits_the_study_config():
    cfg = validate_config(load_config(CONFIGS / "accuracy_base.yaml"))
    task = LongAdditionTask(num_digits=cfg.data.num_digits, val_size=4)
    assert task.max_response_chars + 1 <= cfg.policy.generation.max_new_tokens  # + eos
    prompt_tokens = 1 + len(task.validation(1)[0].prompt)  # <bos> + one token per character
    assert prompt_tokens + cfg.policy.generation.max_new_tokens <= cfg.policy.max_total_sequence_length


@pytest.mark.slow
def test_quick_study_runs_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "study"
    assert study.main(["all", "--quick", "--out", str(out), "--assets", str(tmp_path / "assets")]) == 0

    meta = json.loads((out / "sft" / "sft_meta.json").read_text())
    assert meta["steps"] == study.SFT_SETTINGS["quick"]["max_steps"] and 0.0 <= meta["gate_greedy_accuracy"] <= 1.0
    task = LongAdditionTask(num_digits=meta["num_digits"], val_size=16, seed=meta["data_seed"])
    rows = [json.loads(line) for line in (out / "sft" / "sft_corpus_sample.jsonl").read_text().splitlines()]
    assert task.score([r["solution"] for r in rows], [r["answer"] for r in rows]).min() == 1.0  # corpus verifies
    assert {r["prompt"] for r in rows}.isdisjoint(p.prompt for p in task.validation())

    summary = json.loads((out / "report" / "summary.json").read_text())
    arms = summary["runs"][0]["arms"]
    assert list(arms) == list(study.ARMS)
    for arm, s in arms.items():
        assert s["steps"] == 2, arm
        for key in ("reward_first", "reward_last", "heldout_accuracy_final", "heldout_sampled_accuracy_final"):
            assert 0.0 <= s[key] <= 1.0, (arm, key)
        assert s["token_mult_prob_error_mean"] >= 1.0 and 0.0 <= s["exact_token_fraction_mean"] <= 1.0
        assert s["mismatch_by_position"] and all(v >= 1.0 for v in s["mismatch_by_position"].values())
        assert s["response_length_last"] > 0 and s["timing_median_s"]["total_step_time"] > 0
    # BF16 training with an FP8 rollout scores tokens the trainer computes differently: more mismatch than unified
    assert arms["fp8_rollout_only"]["token_mult_prob_error_mean"] > arms["fp8"]["token_mult_prob_error_mean"]
    tis_metrics = (out / "arms" / "fp8_rollout_only_tis" / "metrics.jsonl").read_text().splitlines()
    oob = [row["train/is_oob_ratio"] for row in map(json.loads, tis_metrics) if "train/is_oob_ratio" in row]
    assert len(oob) == 2 and arms["fp8_rollout_only_tis"]["is_oob_ratio_mean"] == pytest.approx(sum(oob) / 2)
    assert summary["mean"]["bf16"]["reward_last"] == arms["bf16"]["reward_last"]  # one run: the mean is that run

    for name in ("reward.png", "heldout.png", "mismatch_position.png", "mismatch_steps.png", "summary.json"):
        assert (tmp_path / "assets" / name).stat().st_size > 0
    raw = gzip.decompress((tmp_path / "assets" / "seed0_fp8_kv_metrics.jsonl.gz").read_bytes()).decode()
    assert raw == (out / "arms" / "fp8_kv" / "metrics.jsonl").read_text()
    assert not math.isnan(arms["fp8_kv"]["gen_kl_error_mean"])
    assert "| unified FP8 + FP8 KV |" in study.accuracy_report.format_table(summary)


def test_cli_errors_name_the_problem(tmp_path, capsys):
    assert study.main(["grpo", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "--arm" in capsys.readouterr().err
    assert study.main(["grpo", "--arm", "bf16", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "no SFT checkpoint" in capsys.readouterr().err
    assert study.main(["arms", "--arms", "bf16,fp16", "--out", str(tmp_path)]) == study.USER_ERROR
    assert "fp16" in capsys.readouterr().err
    sys.stdout.flush()
