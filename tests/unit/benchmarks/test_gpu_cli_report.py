"""benchmarks/gpu_cli_report.py: medians over the steps after warm-up, first-step-only phases, rollout tokens/s from
config.yaml, peak memory from the nvidia-smi samples, the per-step mismatch metrics, and a missing run reported
without stopping the others."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "gpu_cli_report", Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_cli_report.py"
)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _write_run(log_dir: Path) -> Path:
    log_dir.mkdir(parents=True)
    lines = []
    for step, gen in zip((1, 2, 3, 4), (9.0, 2.0, 4.0, 3.0)):
        lines.append({"step": step, "train/mean_gen_tokens_per_sample": 512.0, "train/loss": 0.0,
                      "train/token_mult_prob_error": 1.0 + (step == 2) * 1e-6, "train/exact_token_fraction": 1.0})  # fmt: skip
        timing = {"step": step, "timing/generation": gen, "timing/training": 1.0, "timing/total_step_time": gen + 1}
        if step == 1:
            timing["timing/kv_bootstrap"] = 0.5
        lines.append(timing)
    text = "\n".join(json.dumps(line) for line in lines) + '\n{"step": 5, "timing/gen'  # a half-written last line
    (log_dir / "metrics.jsonl").write_text(text)
    (log_dir / "config.yaml").write_text("grpo:\n  num_prompts_per_step: 16\n  num_generations_per_prompt: 8\n")
    (log_dir / "gpu_memory.csv").write_text("2026/11/24 10:00:00.000, 1024\n2026/11/24 10:00:00.500, 40960\nx\n")
    return log_dir


def test_summary_numbers(tmp_path):
    s = report.summarize(_write_run(tmp_path / "fp8_kv"), skip=1)
    assert s["steps"] == 4
    assert s["median_s"]["generation"] == 3.0 and s["first_step_s"]["generation"] == 9.0
    assert s["median_s"]["kv_bootstrap"] is None and s["first_step_s"]["kv_bootstrap"] == 0.5
    assert s["rollout_tokens_per_s"] == pytest.approx(16 * 8 * 512 / 3.0)
    assert s["peak_gpu_memory_mib"] == 40960.0
    assert s["per_step"] == {"token_mult_prob_error": [1.0, 1.000001, 1.0, 1.0], "exact_token_fraction": [1.0] * 4}


def test_cli_table_and_missing_run(tmp_path, capsys):
    _write_run(tmp_path / "fp8_kv")
    out_json = tmp_path / "summary.json"
    rc = report.main([f"bf16={tmp_path / 'absent'}", f"fp8_kv={tmp_path / 'fp8_kv'}", "--json", str(out_json)])
    captured = capsys.readouterr()
    assert rc == 0 and "bf16" in captured.err and "metrics.jsonl not found" in captured.err
    assert "| generation | 3.00 s (1st 9.00) |" in captured.out
    assert "| kv_bootstrap | — (1st 0.50) |" in captured.out and "| peak GPU memory | 40.0 GiB |" in captured.out
    assert "| token_mult_prob_error by step | 1.0000000 1.0000010 1.0000000 1.0000000 |" in captured.out
    assert "| exact_token_fraction by step | 1.0000 1.0000 1.0000 1.0000 |" in captured.out
    assert list(json.loads(out_json.read_text())) == ["fp8_kv"]
    assert report.main([f"bf16={tmp_path / 'absent'}"]) == 1
    assert report.main(["no-equals-sign"]) == 2
