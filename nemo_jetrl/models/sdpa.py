"""`sdpa`: `F.scaled_dot_product_attention`, run on the CPU through torch's math backend.

Unified FP8 on the CPU is on-policy only if a rollout decode step gives a query row the bits the trainer's full
forward gives it. torch's CPU flash-attention kernel does not in its AVX2 build (measured on an AMD EPYC: the tiny
GRPO run's `token_mult_prob_error` 1.003 instead of 1.0; its AVX-512 build did on an Intel Xeon). The math backend
(QK^T, masked softmax, PV) does on both, so every CPU attention of the trainer and the rollouts goes through it.
CUDA calls pass straight through (the GPU kernels are chosen per path: decoder.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, **kwargs)`; on the CPU through the math backend (module docstring)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
