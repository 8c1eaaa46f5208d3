"""The long-response accuracy study on CUDA: its stage as separate processes and the 104M model's SFT step.

Run (one or two GPUs, about 2-3 minutes): `python3 -m pytest -q -n 0 -m gpu tests/gpu/test_accuracy_long_gpu.py`
from the repo root with the CLI's imports (the carried wheels, docs/gpu_cli_run.md).

- The quick stage (tiny model, 2-digit problems) with `--device cuda`: the two seeds' SFTs and three arms per seed
  as processes over every visible GPU (`CUDA_VISIBLE_DEVICES` per process), one GRPO step each, packed; the matched
  arm is bitwise on-policy on the GPU too, the FP8-rollout-only arm is not.
- The study's own SFT settings at 4k (104M parameters, 16 rows of 3,632 tokens in two micro-batches) for 12 steps:
  the loss falls and the printed seconds per step and TFLOP/s calibrate docs/accuracy_long.md's estimate.
- `deterministic`: the 2k SFT twice from one seed, 6 steps each, gives the same weights bit for bit (the same start
  in another call or session), and prints its seconds per step beside a plain run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))


def test_quick_stage_runs_its_processes_on_the_gpus(tmp_path):
    arms = ("bf16", "fp8_rollout_only", "fp8_kv_matched")
    cmd = [sys.executable, str(ROOT / "examples" / "accuracy_study.py"), "stage", "--study", "long", "--quick",
           "--device", "cuda", "--seeds", "0,1", "--arms", ",".join(arms), "--out", str(tmp_path / "q"),
           "--pack", str(tmp_path / "q.tar.gz"), "--time-limit-s", "400"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    jobs = json.loads((tmp_path / "q" / "quick" / "stage.json").read_text())["jobs"]
    for seed in (0, 1):
        for arm in arms:
            assert jobs[f"seed{seed}/{arm}"]["reason"] == "finished" and jobs[f"seed{seed}/{arm}"]["steps"] == 1
    first = {}
    for arm in arms:
        rows = (tmp_path / "q" / "quick" / "seed0" / "arms" / arm / "metrics.jsonl").read_text().splitlines()
        first[arm] = next(r for r in map(json.loads, rows) if "train/reward_mean" in r)
    assert first["fp8_kv_matched"]["train/exact_token_fraction"] == 1.0
    assert first["fp8_rollout_only"]["train/token_mult_prob_error"] > 1.001
    assert (tmp_path / "q.tar.gz").stat().st_size > 0


def test_long_shape_sft_learns_on_the_gpu_and_reports_its_speed(tmp_path):
    import accuracy_sft
    import accuracy_study

    settings = accuracy_study.sft_settings(accuracy_study.build_parser().parse_args(
        ["sft", "--study", "long", "--length", "4k"]))  # fmt: skip
    settings.update(max_steps=12, eval_every=12, warmup=4, max_time_s=300.0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    meta = accuracy_sft.run_sft(tmp_path / "sft", seed=0, data_seed=1234, device=torch.device("cuda"), **settings)
    wall = time.perf_counter() - start
    curve = [json.loads(x) for x in (tmp_path / "sft" / "sft_curve.jsonl").read_text().splitlines()]
    assert meta["steps"] == 12 and meta["num_parameters"] == 103_929_600 and meta["micro_batch_size"] == 8
    assert curve[-1]["loss"] < 4.0  # from ~ln(128) = 4.85 at the start
    per_step = meta["wall_time_s"] / 12  # includes one gate check
    print(
        f"\nlong SFT at 4k on {meta['device']}: {per_step:.3f} s/step (gate check included), "
        f"{meta['train_flops_estimate'] / meta['wall_time_s'] / 1e12:.0f} TFLOP/s by the estimate; {wall:.0f} s"
    )


def test_a_deterministic_sft_gives_the_same_weights_twice_on_the_gpu(tmp_path):
    import accuracy_sft
    import accuracy_study
    from safetensors.torch import load_file

    settings = accuracy_study.sft_settings(accuracy_study.build_parser().parse_args(
        ["sft", "--study", "long", "--length", "2k"]))  # fmt: skip
    settings.update(max_steps=6, eval_every=6, warmup=2, gate=2.0, max_time_s=300.0)  # a gate no model passes
    runs, walls = [], {}
    for name, flag in (("a", True), ("b", True), ("plain", False)):
        meta = accuracy_sft.run_sft(tmp_path / name, seed=3, data_seed=1234, device=torch.device("cuda"),
                                    deterministic=flag, **settings)  # fmt: skip
        assert meta["steps"] == 6 and meta["deterministic"] is flag
        runs.append(load_file(tmp_path / name / "model.safetensors"))
        walls[name] = meta["wall_time_s"] / 6
    a, b, plain = runs
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.are_deterministic_algorithms_enabled()
    same = all(torch.equal(a[k], plain[k]) for k in a)
    print(f"\ndeterministic 2k SFT: {walls['a']:.3f} / {walls['b']:.3f} s/step against {walls['plain']:.3f} plain "
          f"(gate check included); plain run's weights {'equal' if same else 'differ'}")
