"""How a trainer is put together from `policy.*`: the optimizer, the forward's kernel switches, the device, the
dtypes. Used by the trainer (`policy/native.py`, every parallel plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_optimizer(params, opt_cfg: Mapping[str, Any]) -> torch.optim.Optimizer:
    """`policy.optimizer` -> AdamW / Adam. Plain CUDA parameters take the fused (one kernel per step) implementation,
    twice as fast as the multi-tensor one on an H200 (1B bf16 parameters: 5.2 vs 10.4 ms); others the default.
    `decay_1d_params: false` puts the 1-D parameters (biases, norm weights) in a group with `wd_mult` 0 (Megatron)."""
    names = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}
    if opt_cfg["name"] not in names:
        raise ValueError(f"policy.optimizer.name: {opt_cfg['name']!r} is not one of {', '.join(names)}")
    params = list(params)
    fused = bool(params) and all(p.is_cuda and type(p.data) is torch.Tensor for p in params)  # no DTensor shards
    groups: list = params
    if not opt_cfg.get("decay_1d_params", True):
        flat = [p for p in params if p.dim() == 1]
        groups = [{"params": [p for p in params if p.dim() != 1]}]
        groups += [{"params": flat, "weight_decay": 0.0, "wd_mult": 0.0}] if flat else []
    return names[opt_cfg["name"]](
        groups,
        lr=float(opt_cfg["lr"]),
        weight_decay=float(opt_cfg["weight_decay"]),
        betas=tuple(opt_cfg["betas"]),
        eps=float(opt_cfg["eps"]),
        fused=fused or None,
    )


def trainer_kernels(policy_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`sequence_logprobs` keywords from `policy.fused_train_kernels` (glue kernels; None = wherever they run, i.e.
    CUDA), `policy.train_causal_attention` (opt-in: faster, not bit-exact with the rollout) and
    `policy.sequence_packing` (each micro-batch's real tokens as one packed row) and
    `policy.dtensor_cfg.activation_checkpointing` (each decoder layer recomputed in the backward)."""
    packing = policy_cfg.get("sequence_packing") or {}
    return {
        "fused_train": None if policy_cfg["fused_train_kernels"] else False,
        "causal_attention": policy_cfg["train_causal_attention"],
        "pack_round": int(packing["sequence_length_round"]) if packing.get("enabled") else None,
        "activation_checkpointing": bool((policy_cfg.get("dtensor_cfg") or {}).get("activation_checkpointing")),
    }


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("cluster.device: 'cuda' was asked for but no CUDA device is visible")
    return torch.device(name)
