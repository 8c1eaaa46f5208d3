"""`sdpa`: `F.scaled_dot_product_attention`, on the CPU through torch's math backend, and with an explicit mask on
CUDA through the flash / memory-efficient kernels, never cuDNN's.

Unified FP8 on the CPU is on-policy only if a rollout decode step gives a query row the bits the trainer's full
forward gives it. torch's CPU flash-attention kernel does not in its AVX2 build (measured on an AMD EPYC: the tiny
GRPO run's `token_mult_prob_error` 1.003 instead of 1.0; its AVX-512 build did on an Intel Xeon). The math backend
(QK^T, masked softmax, PV) does on both, so every CPU attention of the trainer and the rollouts goes through it.

On an H200 (torch 2.11) torch sends a masked call to cuDNN's attention, which builds an execution plan (and compiles
its kernel) for every new shape. The rollout's prefill is such a call, with a new prompt width at most steps, and the
plans took many times the prefill's own time (docs/gpu_cli_run.md). So a masked CUDA call takes the memory-efficient
kernel (no per-shape plan). Calls without a mask are left to torch (the GPU kernels are chosen per path: decoder.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# a masked CUDA call: any of these (flash takes no mask, so the memory-efficient kernel runs), cuDNN's never
MASKED_CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def backends(device_type: str, masked: bool) -> list[SDPBackend] | None:
    """The SDPA backends a call on `device_type` may take (None: torch's choice): MATH on the CPU,
    MASKED_CUDA_BACKENDS for a masked CUDA call (module docstring)."""
    if device_type == "cpu":
        return [SDPBackend.MATH]
    return MASKED_CUDA_BACKENDS if masked and device_type == "cuda" else None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, **kwargs)` through `backends(q's device, masked)`."""
    allowed = backends(q.device.type, kwargs.get("attn_mask") is not None)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel(allowed):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
