"""`policy.dtensor_cfg.env_vars` (NeMo-RL's key; `megatron_cfg.env_vars` maps onto it): the environment the trainer
runs with. NeMo-RL sets it on its policy workers; here the trainer's process is the driver itself (local), every
torchrun rank, or each Ray worker (its actor's `runtime_env`), and the colocated rollout shares it.

The variables are set before the trainer's first CUDA allocation. `PYTORCH_CUDA_ALLOC_CONF` is read once, when
torch starts CUDA: where CUDA has started already (a memory preflight asked for the device's capacity, a Ray
worker pinned its GPU) the allocator takes the new settings through `torch.cuda.memory._set_allocator_settings`.

Derived where the user sets nothing: with activation checkpointing (long sequences) the allocator runs on
expandable segments. A checkpointed FP8 training pass allocates and frees each layer's FP8 weights and the
backward's quantized copies between its large activation buffers, and fixed-size cached blocks fragment around them
(docs/long_responses.md measures the footprint with and without). The user's own `PYTORCH_CUDA_ALLOC_CONF`, in
`env_vars` or exported, always wins."""

from __future__ import annotations

import os
from typing import Any

import torch

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def trainer_env(dtensor_cfg: Any) -> tuple[dict[str, str], bool]:
    """(the variables the trainer runs with, whether PYTORCH_CUDA_ALLOC_CONF among them was derived) from the
    validated `policy.dtensor_cfg` section. This process's own PYTORCH_CUDA_ALLOC_CONF (exported, or derived here
    before) is among them, so Ray workers run on the driver's allocator settings."""
    env = dict(dtensor_cfg.env_vars or {})
    if ALLOC_CONF not in env and ALLOC_CONF in os.environ:
        env[ALLOC_CONF] = os.environ[ALLOC_CONF]
    derived = bool(dtensor_cfg.activation_checkpointing) and ALLOC_CONF not in env
    if derived:
        env[ALLOC_CONF] = EXPANDABLE
    return env, derived


def apply_trainer_env(dtensor_cfg: Any) -> list[str]:
    """Set the trainer's variables (`trainer_env`) in this process; returns its start-up lines, none when every
    variable already holds its value."""
    env, derived = trainer_env(dtensor_cfg)
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if not changed:
        return []
    os.environ.update(changed)
    if ALLOC_CONF in changed and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(changed[ALLOC_CONF])
    given = {k: v for k, v in changed.items() if not (derived and k == ALLOC_CONF)}
    listed = " ".join(f"{k}={v}" for k, v in given.items())
    lines = [f"policy.dtensor_cfg.env_vars: the trainer runs with {listed}"] if given else []
    if derived and ALLOC_CONF in changed:
        lines.append(
            f"derived {ALLOC_CONF}={EXPANDABLE} (activation checkpointing: long passes fragment the allocator's "
            f"blocks); set policy.dtensor_cfg.env_vars.{ALLOC_CONF} to choose"
        )
    return lines
