"""Triton kernel of the exact mode's per-row log-sum-exp (twin and contract: `batch_invariant.logsumexp_ref` /
`logsumexp_rows`). Imported on CUDA only (or under Triton's interpreter in tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels.device import on_device

LSE_BLOCK = 4096  # vocabulary entries per step of the per-row log-sum-exp


@triton.jit
def _row_logsumexp_kernel(x_ptr, out_ptr, V, stride_r, BLOCK: tl.constexpr):
    # one program per row: m = max (exact in any order), then sum of exp(x - m) per lane over BLOCK-wide steps in
    # order, lanes summed once: log-sum-exp [R] fp32
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_r
    lanes = tl.arange(0, BLOCK)
    mvec = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(base + c0 + lanes, mask=c0 + lanes < V, other=float("-inf"))
        mvec = tl.maximum(mvec, x)
    m = tl.max(mvec, axis=0)
    svec = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(base + c0 + lanes, mask=c0 + lanes < V, other=float("-inf"))
        svec += tl.exp(x - m)
    tl.store(out_ptr + row, m + tl.log(tl.sum(svec, axis=0)))


def row_logsumexp(x2: torch.Tensor) -> torch.Tensor:
    """x2 [R, V] fp32 (V contiguous) -> [R] fp32 log-sum-exp, one program per row."""
    out = torch.empty(x2.shape[0], dtype=torch.float32, device=x2.device)
    if x2.shape[0]:
        with on_device(x2):
            _row_logsumexp_kernel[(x2.shape[0],)](x2, out, x2.shape[1], x2.stride(0), BLOCK=LSE_BLOCK, num_warps=8)
    return out
