"""One rank of test_fsdp_checkpointing_gloo.py (2 CPU ranks, gloo, launched by jetrl_testkit.forkrun). Not collected
by pytest.

The FSDP2 trainer's root (`shard_policy`) over a tiny FP8 model, once without and once with activation
checkpointing (`kernels["activation_checkpointing"]`, as `trainer_kernels` passes it): each rank's loss, logprobs
and gradient shards after the reduce-scatter, written to `<out>/rank<r>.pt`.

    python -m torch.distributed.run --nproc-per-node 2 fsdp_checkpointing_rank_check.py OUT_DIR
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.parallel.fsdp import shard_policy
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.linear import local_tensor


def step(rank: int, checkpointing: bool) -> dict:
    model = random_tiny_qwen3(0, num_layers=2).train()
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    kernels = {"fused_train": None, "causal_attention": False, "pack_round": None,
               "activation_checkpointing": checkpointing}  # fmt: skip
    root = shard_policy(model, temperature=1.0, compute_dtype=torch.bfloat16, kernels=kernels)
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, 32, (3, 10), generator=gen)  # this rank's rows
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    logp = root(ids, mask)  # [3, 10]
    loss = (logp * torch.linspace(-1.0, 1.0, 3)[:, None]).sum()
    loss.backward()
    return {
        "loss": loss.detach(),
        "logp": logp.detach(),
        "grads": {n: local_tensor(p.grad).detach().clone() for n, p in model.named_parameters()},
    }


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    result = {flag: step(rank, flag) for flag in (False, True)}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
