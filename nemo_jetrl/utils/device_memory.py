"""`release_cached_memory(device)`: hand the caching allocator's unused blocks back to the driver between phases.

A GRPO step's phases free large buffers of their own sizes: the rollout its paged KV pool and its decode graphs'
memory pool, the logprob pass its packed activations. PyTorch keeps them cached; blocks of a dead graph pool are
only reusable after an `empty_cache`, and cached blocks of other sizes split into fragments. The device's footprint
(what nvidia-smi shows, what another process on the GPU can have) would then carry one phase's cache into the
next. NeMo-RL's workers do the same between generation and training."""

from __future__ import annotations

import torch


def release_cached_memory(device: torch.device | str) -> bool:
    """`torch.cuda.empty_cache()` where `device` is a CUDA device; True when it ran (elsewhere nothing to do)."""
    if torch.device(device).type != "cuda":
        return False
    torch.cuda.empty_cache()
    return True
