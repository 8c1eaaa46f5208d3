"""One rank of `test_tensor_parallel_gloo.py`'s KV-scale check (torchrun-style ranks, gloo): the FP8 KV scales of a
calibrating pass of the sharded `NativePolicy` (TP x DP plan) and those of the one-process `NativePolicy` over the
same batch, computed on this rank. Writes rank<r>.pt.

argv: dp tp out_dir
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tp_rank_check import SHAPE, batch

from nemo_jetrl.config import load_config
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.micro_batches import plan_micro_batches
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.parallel.plan import ParallelPlan
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_tiny.yaml"


def policy_config(tp: int) -> PolicyConfig:
    overrides = [
        "policy.logprob_batch_size=3",  # tp_rank_check's 8 rows: [0, 3) [3, 6) [6, 8); under DP 2 rank 1 runs one
        "policy.compute_dtype=float32",
        "policy.fp8_cfg.train_kv_fake_quant=false",
    ]
    cfg = validate_config(load_config(CONFIG, overrides)).policy
    cfg.dtensor_cfg.tensor_parallel_size = tp  # as a Ray worker gets it (the local backend refuses TP)
    return cfg


def main() -> None:
    dp, tp, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cfg = policy_config(tp)
    recipe = PrecisionRecipe.from_config(cfg)
    assert recipe.kv_fp8 and recipe.linear_fp8
    base = random_tiny_qwen3(0, **SHAPE)
    ids, mask, response, _ = batch()
    rows = TrainBatch(ids, mask, response, torch.zeros(len(ids)), torch.zeros(ids.shape))
    single = NativePolicy(cfg, recipe, torch.device("cpu"), model=copy.deepcopy(base)).calibrate_kv_scales(rows)
    plan = ParallelPlan.from_process_group(torch.device("cpu"), tp)
    assert plan.num_dp_groups == dp
    policy = NativePolicy(cfg, recipe, torch.device("cpu"), plan=plan, model=copy.deepcopy(base))
    scales = policy.calibrate_kv_scales(rows)
    chunks, _ = plan.share(plan_micro_batches(rows.attention_mask, cfg, "logprob"))
    torch.save(
        {
            "single": {n: getattr(single, n).cpu() for n in ("q", "k", "v")},
            "ranks": {n: getattr(scales, n).cpu() for n in ("q", "k", "v")},
            "num_chunks": len(chunks),
            "tp_rank": plan.tp_rank,
        },
        f"{out_dir}/rank{dist.get_rank()}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
