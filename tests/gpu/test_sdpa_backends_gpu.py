"""`models.sdpa` on CUDA: a masked call (the rollout's prefill) runs no cuDNN kernel (no per-shape plan), and its
output is the math backend's within bf16 rounding."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from nemo_jetrl.models.sdpa import sdpa

pytestmark = pytest.mark.gpu


def masked_case(batch: int, width: int, gen: torch.Generator):
    """q/k/v [B, 16, width, 128] bf16 and a left-padded causal mask [B, 1, width, width] as the prefill builds it."""
    q, k, v = (torch.randn(batch, 16, width, 128, device="cuda", generator=gen).bfloat16() for _ in range(3))
    pad = torch.randint(0, width // 2, (batch,), device="cuda", generator=gen)  # [B] left pads
    cols = torch.arange(width, device="cuda")
    real = cols[None, :] >= pad[:, None]  # [B, S]
    mask = (cols[None, :, None] >= cols[None, None, :]) & real[:, None, :]  # [B, S_q, S_k]
    mask = mask | (cols[:, None] == cols[None, :])  # a pad query sees itself
    return q, k, v, mask[:, None]


def test_masked_cuda_sdpa_runs_no_cudnn_kernel_and_matches_the_math_backend():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, mask = masked_case(8, 190, gen)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = sdpa(q, k, v, attn_mask=mask, scale=0.088)
        torch.cuda.synchronize()
    kernels = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels and not any("cudnn" in name.lower() for name in kernels), kernels
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, scale=0.088
        )
    assert (out.float() - ref).abs().max() < 2e-2
