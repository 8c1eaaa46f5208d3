"""`release_cached_memory(device)`: hand the caching allocator's unused blocks back to the driver between phases;
`graph_pool_free_bytes(device)`: what captured CUDA graphs' private pools hold beyond their live tensors.

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


def graph_pool_free_bytes(device: torch.device | str) -> int:
    """Bytes of `device` that private memory pools (CUDA graph captures: the rollout's decode graphs, the captured
    trainer's micro-batches) hold with no tensor in them: reserved, not allocated, and kept from `empty_cache` while
    their graphs live. Allocated + these is what a phase needs of the device (the memory preflight's estimate counts
    the captured pools); 0 off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sum(
        seg["total_size"] - seg["allocated_size"]
        for seg in torch.cuda.memory_snapshot()
        if seg.get("device") == index and tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0)
    )
