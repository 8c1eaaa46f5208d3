"""How a trainer is put together from `policy.*`: the optimizer, the forward's kernel switches, the device, the
dtypes. Used by the trainer (`policy/native.py`, every parallel plan).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_jetrl.config.typed import typed_section

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_optimizer(params, opt_cfg: Any) -> torch.optim.Optimizer:
    """`policy.optimizer` (an `OptimizerConfig`) -> AdamW / Adam. Plain CUDA parameters take the fused (one kernel
    per step) implementation, twice as fast as the multi-tensor one on an H200 (1B bf16 parameters: 5.2 vs 10.4 ms);
    others the default. `decay_1d_params: false` puts the 1-D parameters (biases, norm weights) in a group with
    `wd_mult` 0 (Megatron)."""
    opt_cfg = typed_section(opt_cfg, "OptimizerConfig", "build_optimizer")
    names = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}  # the section's Literal: one of them
    params = list(params)
    fused = bool(params) and all(p.is_cuda and type(p.data) is torch.Tensor for p in params)  # no DTensor shards
    groups: list = params
    if not opt_cfg.decay_1d_params:
        flat = [p for p in params if p.dim() == 1]
        groups = [{"params": [p for p in params if p.dim() != 1]}]
        groups += [{"params": flat, "weight_decay": 0.0, "wd_mult": 0.0}] if flat else []
    return names[opt_cfg.name](
        groups,
        lr=float(opt_cfg.lr),
        weight_decay=float(opt_cfg.weight_decay),
        betas=tuple(opt_cfg.betas),
        eps=float(opt_cfg.eps),
        fused=fused or None,
    )


def trainer_kernels(policy_cfg: Any) -> dict[str, Any]:
    """`sequence_logprobs` keywords of a `PolicyConfig`: `fused_train_kernels` (glue kernels; None = wherever they
    run, i.e. CUDA), `train_causal_attention` (opt-in: faster, not bit-exact with the rollout),
    `sequence_packing` (each micro-batch's real tokens as one packed row) and
    `dtensor_cfg.activation_checkpointing` (each decoder layer recomputed in the backward)."""
    packing = policy_cfg.sequence_packing
    return {
        "fused_train": None if policy_cfg.fused_train_kernels else False,
        "causal_attention": policy_cfg.train_causal_attention,
        "pack_round": packing.sequence_length_round if packing.enabled else None,
        "activation_checkpointing": policy_cfg.dtensor_cfg.activation_checkpointing,
    }


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("cluster.device: 'cuda' was asked for but no CUDA device is visible")
    return torch.device(name)
