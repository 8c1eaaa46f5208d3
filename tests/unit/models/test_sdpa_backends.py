"""`models.sdpa`: which SDPA backends a call may take (the CPU's math backend; no cuDNN for a masked CUDA call)."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from nemo_jetrl.models import sdpa as sdpa_module


def test_cpu_calls_take_the_math_backend_and_masked_cuda_calls_never_cudnn():
    assert sdpa_module.backends("cpu", masked=False) == [SDPBackend.MATH]
    assert sdpa_module.backends("cpu", masked=True) == [SDPBackend.MATH]
    masked_cuda = sdpa_module.backends("cuda", masked=True)
    assert SDPBackend.CUDNN_ATTENTION not in masked_cuda and SDPBackend.EFFICIENT_ATTENTION in masked_cuda
    assert sdpa_module.backends("cuda", masked=False) is None  # torch's choice (on an H200 it may be cuDNN: docs/gpu_cli_run.md)


def test_masked_cpu_call_equals_the_math_reference():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=gen) for _ in range(3))  # [B, H, S, D]
    mask = torch.rand(2, 1, 5, 5, generator=gen) > 0.3
    mask[..., 0] = True  # every query sees a key
    scores = (q @ k.transpose(-1, -2)) * 0.25  # [B, H, S, S]
    want = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    got = sdpa_module.sdpa(q, k, v, attn_mask=mask, scale=0.25)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    assert torch.equal(got, sdpa_module.sdpa(q, k, v, attn_mask=mask, scale=0.25))
