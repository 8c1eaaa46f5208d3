"""A real Slurm job: the tiny GRPO config for 2 steps through `ray.sub` with 2 CPU Ray workers.

Needs the single-node cluster `.ci/slurm_setup.sh` starts (CI runs it before pytest); skipped, with the reason,
where `sinfo` is absent or the cluster is down. The job's metrics.jsonl must equal (tolerance as in
tests/functional/test_ray_workers.py) a single-process run of the same config in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jetrl_testkit.runs import metrics as _metrics
from jetrl_testkit.runs import slurm_down_reason as _slurm_down_reason

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
pytest.importorskip("ray", reason="the `ray` extra is not installed (uv sync --extra ray)")

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("ray_lock")]  # the job starts Ray
ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 540
OVERRIDES = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=16",
    "policy.train_micro_batch_size=64",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "cluster.num_cpu_threads=1",
    "cluster.rollout_seed_shards=2",
    "policy.prev_logprobs_source=logprob_forward",  # both sides score every row (auto picks it on Ray)
    "logger.tensorboard_enabled=false",
]


def test_tiny_grpo_through_ray_sub_matches_single_process(tmp_path):
    reason = _slurm_down_reason()
    if reason:
        pytest.skip(reason)
    logs = tmp_path / "slurm_logs"
    submit = [
        sys.executable, str(ROOT / "examples" / "submit_slurm.py"),
        "--config", str(ROOT / "examples" / "configs" / "grpo_tiny.yaml"),
        "--nodes", "1", "--gpus-per-node", "0", "--cpu-workers-per-node", "2",
        "--python", sys.executable, "--log-dir", str(logs), "--wait",
        f"--sbatch-arg=--output={tmp_path}/slurm-%j.out", f"--sbatch-arg=--time={JOB_TIMEOUT_S // 60 + 1}",
        "--", *OVERRIDES, f"logger.log_dir={tmp_path / 'ray_run'}",
    ]  # fmt: skip
    proc = subprocess.run(submit, cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT_S + 60)
    job_id = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"
    job_out = next(iter(tmp_path.glob("slurm-*.out")), None)
    detail = f"{proc.stderr[-2000:]}\n{job_out.read_text()[-4000:] if job_out else 'no job output'}"
    assert proc.returncode == 0, f"job {job_id} failed (status {proc.returncode}):\n{detail}"

    job_logs = logs / job_id
    assert (job_logs / "driver.log").is_file() and (job_logs / "ready").is_dir(), detail
    assert "GRPO done: 2 steps" in (job_logs / "driver.log").read_text()
    ray_run = _metrics(tmp_path / "ray_run" / "metrics.jsonl")
    assert sorted(ray_run) == [1, 2]
    for step in (1, 2):
        assert ray_run[step]["train/refit/num_fp8_weights"] == 28
        assert ray_run[step]["train/refit/fp8_vs_bf16_bytes"] == pytest.approx(0.5 + 1 / 8192)
        assert ray_run[step]["train/num_micro_batches"] >= 1

    from nemo_jetrl.algorithms.grpo import run_grpo
    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    cfg = load_config(
        ROOT / "examples" / "configs" / "grpo_tiny.yaml", [*OVERRIDES, f"logger.log_dir={tmp_path / 'local'}"]
    )
    run_grpo(validate_config(cfg))
    local = _metrics(tmp_path / "local" / "metrics.jsonl")
    for step in (1, 2):
        for key, value in local[step].items():
            if key.startswith("timing/") or key == "step":
                continue
            assert ray_run[step][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
        assert ray_run[step]["train/reward_mean"] == local[step]["train/reward_mean"]
