"""The CLI on 2 GPUs under torchrun (NCCL, NVLink multicast off) against one GPU, the tiny FP8 config, 2 steps.

Run (2 GPUs, about 2 minutes): `python3 -m pytest -q -n 0 -m gpu tests/gpu/test_torchrun_gpu.py`; skipped
with fewer than 2 GPUs. Needs the CLI's imports (pydantic, omegaconf, hydra: the carried wheels).

What it checks on NCCL what the gloo tests check on CPU (tests/functional/test_torchrun_matrix.py): the run
starts on 2 ranks (rank 0 says so), each step's rollout metrics equal the one-GPU run's with the ranks' 2 rollout
seed shards (the same shards on the same GPU kernels), the loss and the gradient norm agree to 1e-3 relative
(the GEMMs of one micro-batch per rank are the one-process micro-batches'; the bound allows for kernels that
differ with the device), and the step's all-gathers are one FP8 refit (0.50012 of the linears' BF16 bytes) plus
FSDP2's root gathers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jetrl_testkit.runs import TINY_TWO_STEPS, metrics

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "grpo_tiny.yaml"
PHASES = ("train", "logprob", "rollout")
EXACT = ("reward_mean", "accuracy", "mean_response_length", "truncated_fraction", "kept_fraction")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpu_ranks_match_one_gpu(tmp_path):
    common = [*TINY_TWO_STEPS, "cluster.device=cuda", "policy.prev_logprobs_source=logprob_forward"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    ranks = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cli = [str(ROOT / "examples" / "run_grpo.py"), "--config", str(CONFIG), *common]
    proc = subprocess.run([*ranks, *cli, f"logger.log_dir={tmp_path / 'ranks'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cluster: torchrun, 2 rank(s) (2 data-parallel) on cuda, nccl" in proc.stderr.replace("\n", " ")
    one = [sys.executable, *cli, "cluster.rollout_seed_shards=2", f"logger.log_dir={tmp_path / 'one'}"]
    proc = subprocess.run(one, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, single = metrics(tmp_path / "ranks"), metrics(tmp_path / "one")
    # both log their memory preflight's estimates at step 0 (data-parallel ranks are estimated per rank)
    assert sorted(two) == sorted(single) == [0, 1, 2]
    estimates = {f"memory/estimate_{p}_peak_gib" for p in PHASES} | {"memory/estimate_optimizer_state_gib"}
    for run in (two, single):
        assert {k for k in run.pop(0) if k != "step"} == estimates
    for step in (1, 2):
        got, want = two[step], single[step]
        for key in EXACT:
            assert got[f"train/{key}"] == want[f"train/{key}"], (step, key)
        for key in ("train/loss", "train/grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-3), (step, key)
        assert got["train/refit/fp8_vs_bf16_bytes"] == 0.5 + 4 / (2 * 128 * 128)
        if "train/refit/allgather_bytes" in got:  # FSDP2's gathers are counted where this torch lets us
            refit = got["train/refit/fp8_weight_bytes"] + got["train/refit/other_bytes"]
            assert got["train/refit/allgather_bytes"] == refit + got["train/refit/fsdp_allgather_bytes"]
