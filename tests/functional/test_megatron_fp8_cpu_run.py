"""A NeMo-RL Megatron FP8 recipe (tests/unit/config/nemo_rl_yaml/grpo_megatron_fp8.yaml), with tiny-model overrides
only, runs 3 GRPO steps through run_grpo.py on the CPU: the lr each step trains with is what its Megatron scheduler
(warm-up 1 step from 2e-8, cosine decay to 2e-7 by step 3) gives, and `grpo.val_at_end` validates after step 3."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "unit" / "config" / "nemo_rl_yaml" / "grpo_megatron_fp8.yaml"
TINY = [  # the tiny model on one CPU process: no tensor / pipeline parallel ranks to run
    "policy.model_name=tiny-arith",
    "policy.megatron_cfg.tensor_model_parallel_size=1",
    "policy.megatron_cfg.pipeline_model_parallel_size=1",
    "policy.generation.vllm_cfg.tensor_parallel_size=1",
    "policy.generation.backend=native",
    "cluster.num_nodes=1",
    "cluster.gpus_per_node=0",
    "++cluster.num_cpu_threads=2",
]


@pytest.mark.slow
def test_megatron_fp8_recipe_runs_three_steps_with_its_megatron_lr(tmp_path, monkeypatch):
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0")  # restored after the run sets the recipe's "1"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "unset")  # recorded, then absent: the run derives it
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    main = load_script(ROOT / "examples" / "run_grpo.py", "run_grpo_megatron_cpu").main
    rc, out, err = run_main(main, ["--config", str(CONFIG), *TINY, f"logger.log_dir={tmp_path}"])
    assert rc == 0, err
    assert out.count("megatron_cfg: trained by nemo-jetrl's FSDP2 trainer: TP 1 -> DTensor TP 1") == 1
    # megatron_cfg.env_vars: the trainer's environment, one line
    assert out.count("policy.dtensor_cfg.env_vars: the trainer runs with NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1") == 1
    # its recompute -> activation checkpointing -> the allocator on expandable segments (the user set none)
    assert out.count("derived PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (activation checkpointing") == 1
    assert "precision: train=fp8 rollout=fp8 kv=fp8" in out
    rows: dict[int, dict] = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    lrs = [rows[step]["train/lr"] for step in (1, 2, 3)]
    # megatron-core after n = 0, 1, 2 scheduler steps: init_lr, max_lr, min + (max - min) (cos(pi / 2) + 1) / 2
    assert lrs == pytest.approx([2.0e-8, 2.0e-6, 2.0e-7 + 1.8e-6 * (math.cos(math.pi / 2) + 1) / 2], rel=1e-12)
    assert [k for k in rows[3] if k.startswith("validation/")] and not any(
        k.startswith("validation/") for s in (1, 2) for k in rows[s]
    )  # val_period -1: only val_at_end's validation, after the last step
