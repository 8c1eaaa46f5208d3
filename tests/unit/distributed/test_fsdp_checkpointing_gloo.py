"""The FSDP2 trainer honours activation checkpointing (`policy.dtensor_cfg.activation_checkpointing` reaches its root
through `trainer_kernels`): on 2 CPU ranks (gloo) with the FP8 recipe, each rank's loss, logprobs and reduce-scattered
gradient shards are bitwise those without it (the recomputed forwards all-gather the same shards and read the same
FP8 weights)."""

from __future__ import annotations

from pathlib import Path

import torch
from jetrl_testkit.forkrun import run_ranks

HERE = Path(__file__).resolve().parent


def test_checkpointed_fsdp_step_equals_the_plain_one(tmp_path):
    proc = run_ranks(HERE / "fsdp_checkpointing_rank_check.py", 2, str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        plain, ckpt = out[False], out[True]
        assert torch.equal(plain["loss"], ckpt["loss"]) and plain["loss"].abs() > 0
        assert torch.equal(plain["logp"], ckpt["logp"])
        assert plain["grads"].keys() == ckpt["grads"].keys() and len(plain["grads"]) == 24
        for name, grad in plain["grads"].items():
            assert torch.equal(grad, ckpt["grads"][name]), (rank, name)
        assert float(sum(g.abs().sum() for g in plain["grads"].values())) > 0
