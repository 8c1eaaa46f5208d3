"""benchmarks/gpu_cli_report.py: medians over the steps after warm-up, first-step-only phases, rollout tokens/s from
config.yaml, peak memory from the nvidia-smi samples, the per-step mismatch metrics, and a missing run reported
without stopping the others."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks import gpu_cli_report as report


def _write_run(log_dir: Path) -> Path:
    log_dir.mkdir(parents=True)
    lines = []
    for step, gen in zip((1, 2, 3, 4), (9.0, 2.0, 4.0, 3.0)):
        lines.append({"step": step, "train/mean_gen_tokens_per_sample": 512.0, "train/loss": 0.0,
                      "train/total_num_tokens": 1000.0 * step, "train/refit/allgather_bytes": 2.5e6 * step,
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
    assert s["useful_tokens_per_s"] == pytest.approx(2000 / 3.0)  # steps 2..4: 2000/3, 3000/5, 4000/4
    assert s["allgather_bytes"] == 7.5e6 and s["refit_gather_s"] is None  # never logged: no row value
    assert s["per_step"] == {"token_mult_prob_error": [1.0, 1.000001, 1.0, 1.0], "exact_token_fraction": [1.0] * 4}


def test_cli_table_and_missing_run(tmp_path, capsys):
    _write_run(tmp_path / "fp8_kv")
    out_json = tmp_path / "summary.json"
    rc = report.main([f"bf16={tmp_path / 'absent'}", f"fp8_kv={tmp_path / 'fp8_kv'}", "--json", str(out_json)])
    captured = capsys.readouterr()
    assert rc == 0 and "bf16" in captured.err and "metrics.jsonl not found" in captured.err
    assert "| generation | 3.00 s (1st 9.00) |" in captured.out
    assert "| kv_bootstrap | — (1st 0.50) |" in captured.out and "| peak GPU memory | 40.0 GiB |" in captured.out
    assert "| useful tokens/s | 667 |" in captured.out and "| all-gather MB/step | 7.5 |" in captured.out
    assert "| token_mult_prob_error by step | 1.0000000 1.0000010 1.0000000 1.0000000 |" in captured.out
    assert "| exact_token_fraction by step | 1.0000 1.0000 1.0000 1.0000 |" in captured.out
    assert list(json.loads(out_json.read_text())) == ["fp8_kv"]
    assert report.main([f"bf16={tmp_path / 'absent'}"]) == 1
    assert report.main(["no-equals-sign"]) == 2


def test_memory_against_the_estimate_and_mismatch_by_position(tmp_path, capsys):
    log_dir = _write_run(tmp_path / "fp8_kv")
    extra = [{"step": 0, "memory/estimate_train_peak_gib": 44.0, "memory/estimate_rollout_peak_gib": 30.0}]
    for step in (1, 2, 3, 4):
        extra.append({"step": step, "memory/training_peak_gib": 38.0 + step, "memory/generation_peak_gib": 31.0,
                      "memory/training_reserved_peak_gib": 45.0 - step, "memory/training_graph_pool_gib": 1.0,
                      "memory/generation_graph_pool_gib": 0.0, "memory/total_step_time_alloc_retries": step % 2,
                      "train/mismatch_pos/00000": 1.0, "train/mismatch_pos/08192": 1.0 + 0.01 * step})  # fmt: skip
    with open(log_dir / "metrics.jsonl", "a") as f:
        f.write("\n" + "\n".join(json.dumps(line) for line in extra) + "\n")
    s = report.summarize(log_dir, skip=1)
    assert s["allocated_peak_gib"] == {"generation": 31.0, "training": 42.0}  # the largest over steps 2-4
    assert s["estimated_peak_gib"] == {"generation": 30.0, "training": 44.0}
    assert s["reserved_peak_gib"] == {"training": 43.0}  # the largest over steps 2-4 (step 1's 44 skipped)
    assert s["mismatch_by_position"] == {"0": 1.0, "8192": pytest.approx(1.03)}  # steps 2-4
    assert report.main([f"fp8_kv={log_dir}"]) == 0
    out = capsys.readouterr().out
    assert "| training peak allocated (estimate) | 42.0 GiB (44.0, +5%) |" in out
    assert "| generation peak allocated (estimate) | 31.0 GiB (30.0, -3%) |" in out
    assert "| training peak reserved | 43.0 GiB |" in out and "generation peak reserved" not in out
    assert s["graph_pool_gib"] == {"generation": 0.0, "training": 1.0}
    assert "| training peak allocated + graph pools (estimate) | 43.0 GiB (44.0, +2%) |" in out  # 42 + 1
    assert "generation peak allocated + graph pools" not in out  # no pool held in any run
    assert "| mismatch at position 8192+ | 1.0300 |" in out
    assert s["alloc_retries"] == 2 and "| allocator retries, all steps | 2 |" in out  # steps 1 and 3 retried once
    assert "| first step / median step | 2.50x |" in out  # 10 s against the median 4 s of steps 2-4


def test_a_one_step_run_is_compared_without_the_optimizer_state(tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    lines = [{"step": 0, "memory/estimate_train_peak_gib": 121.7, "memory/estimate_logprob_peak_gib": 66.8,
              "memory/estimate_optimizer_state_gib": 30.5},
             {"step": 1, "memory/training_peak_gib": 79.3, "memory/logprobs_peak_gib": 81.8}]  # fmt: skip
    (log_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured, estimated = report.read_memory(log_dir)  # AdamW's state is allocated only at step 1's optimizer step
    assert measured == {"training": 79.3, "logprobs": 81.8}
    assert estimated == {"training": pytest.approx(91.2), "logprobs": pytest.approx(36.3)}
    lines.append({"step": 2, "memory/training_peak_gib": 109.0, "memory/logprobs_peak_gib": 112.0})
    (log_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    steady = ({"training": 109.0, "logprobs": 112.0}, {"training": 121.7, "logprobs": 66.8})  # steps 2+: as estimated
    assert report.read_memory(log_dir) == steady


def test_a_position_plot_of_a_one_step_run_needs_skip_0(tmp_path, capsys):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    line = {"step": 1, "timing/total_step_time": 5.0, "train/mismatch_pos/00000": 1.01,
            "train/mismatch_pos/02048": 1.02}  # fmt: skip
    (log_dir / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    png = tmp_path / "position.png"
    assert report.main([f"one={log_dir}", "--position-plot", str(png)]) == 0
    none = "position plot: none (no train/mismatch_pos/* after step 1; a one-step run needs --skip 0)"
    assert none in capsys.readouterr().out
    assert report.main([f"one={log_dir}", "--position-plot", str(png), "--skip", "0"]) == 0
    assert f"position plot: {png}" in capsys.readouterr().out and png.stat().st_size > 0


def test_a_profiled_step_is_left_out_of_the_medians(tmp_path, capsys):
    """A step with `LOG_DIR/profile/step<N>_<phase>.json` (NEMO_JETRL_PROFILE) is not a timed step: steps 2-4 have
    generation 2, 4, 3 s; with step 3 profiled the median is that of 2 and 3 s."""
    log_dir = _write_run(tmp_path / "fp8_kv")
    (log_dir / "profile").mkdir()
    (log_dir / "profile" / "step3_training.json").write_text("{}")
    (log_dir / "profile" / "notes.json").write_text("{}")  # not a profile record: ignored
    s = report.summarize(log_dir, skip=1)
    assert s["median_s"]["generation"] == 2.5 and s["profiled_steps"] == [3]
    assert s["useful_tokens_per_s"] == pytest.approx(statistics.median([2000 / 3.0, 4000 / 4.0]))
    assert report.main([f"fp8_kv={log_dir}"]) == 0
    assert "| profiled steps (not in the medians) | 3 |" in capsys.readouterr().out


def test_speedup_over_a_baseline_per_phase_and_step_by_step(tmp_path, capsys):
    """bf16 steps 2-4: generation 2, 4, 3 s, total 3, 5, 4 s; fp8_kv the same run with generation halved (1, 2,
    1.5 s; total 2, 3, 2.5 s): generation 2.00x, total 1.600x on the medians (4 / 2.5), 1.500 1.667 1.600 by step."""
    base = _write_run(tmp_path / "bf16")
    fast = tmp_path / "fp8_kv"
    fast.mkdir()
    rows = [json.loads(line) for line in (base / "metrics.jsonl").read_text().splitlines()[:-1]]
    for row in rows:
        if "timing/generation" in row:
            row["timing/generation"] /= 2
            row["timing/total_step_time"] = row["timing/generation"] + 1
    (fast / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert report.main([f"bf16={base}", f"fp8_kv={fast}", "--baseline", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "| generation: x bf16 | 1.00x | 2.00x |" in out and "| training: x bf16 | 1.00x | 1.00x |" in out
    assert "| total_step_time: x bf16 | 1.000x | 1.600x |" in out  # the whole step to three decimals
    assert "| total_step_time by step: x bf16 | 1.000x 1.000x 1.000x | 1.500x 1.667x 1.600x |" in out
    assert "| timed steps (s) | 3.00 5.00 4.00 | 2.00 3.00 2.50 |" in out
    assert "kv_bootstrap: x" not in out  # no median in either run
    assert report.main([f"bf16={base}", "--baseline", "fp8"]) == 2
    assert "--baseline fp8: no run has that label (labels: bf16)" in capsys.readouterr().err


def test_phase_split_adds_up_to_the_median_step_and_the_plot_is_drawn(tmp_path, capsys):
    summary = {"median_s": {"generation": 5.0, "generation/decode": 4.25, "logprobs": 1.2, "training": 3.7,
                            "refit": 0.1, "kv_bootstrap": None, "total_step_time": 10.1}}  # fmt: skip
    parts = report.phase_split(summary)
    assert parts == pytest.approx({"decode (device)": 4.25, "rest of generation": 0.75, "logprobs": 1.2,
                                   "training": 3.7, "other": 0.2})  # fmt: skip
    assert sum(parts.values()) == pytest.approx(10.1)
    base = _write_run(tmp_path / "bf16")  # no decode timing logged: the whole generation phase is "rest"
    assert report.phase_split(report.summarize(base))["rest of generation"] == 3.0
    png = tmp_path / "plots" / "phases.png"
    assert report.main([f"bf16={base}", "--baseline", "bf16", "--phase-plot", str(png)]) == 0
    assert f"phase plot: {png}" in capsys.readouterr().out and png.stat().st_size > 10_000
