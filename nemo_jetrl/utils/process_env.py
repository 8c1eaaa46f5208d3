"""`policy.dtensor_cfg.env_vars` (NeMo-RL's key; `megatron_cfg.env_vars` maps onto it): the environment the trainer
runs with. NeMo-RL sets it on its policy workers; here the trainer's process is the driver itself (local), every
torchrun rank, or each Ray worker (its actor's `runtime_env`), and the colocated rollout shares it.

The variables are set before the trainer's first CUDA allocation. `PYTORCH_CUDA_ALLOC_CONF` is read once, when
torch starts CUDA: where CUDA has started already (a memory preflight asked for the device's capacity, a Ray
worker pinned its GPU) the allocator takes the new settings through `torch.cuda.memory._set_allocator_settings`,
so e.g. `expandable_segments:True` holds either way (docs/long_responses.md measures what it saves)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def apply_trainer_env(env_vars: Mapping[str, str] | None) -> list[str]:
    """Set `env_vars` in this process (values as given); returns one start-up line, or none when there is nothing
    to set or every variable already holds its value."""
    changed = {k: str(v) for k, v in (env_vars or {}).items() if os.environ.get(k) != str(v)}
    if not changed:
        return []
    os.environ.update(changed)
    if ALLOC_CONF in changed and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(changed[ALLOC_CONF])
    listed = " ".join(f"{k}={v}" for k, v in changed.items())
    return [f"policy.dtensor_cfg.env_vars: the trainer runs with {listed}"]
