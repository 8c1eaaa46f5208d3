"""Triton transpose of 1-byte tensors (e4m3 moved as bytes): the DGrad weight W^T. CUDA only; imported lazily.

Twin: `t.t().contiguous()` (`precision/transpose.py`); a byte copy, so the parity is exact. Each program moves a
[64, 64] tile through registers (`tl.trans`) so that loads and stores both run along contiguous rows; torch's
generic strided copy reads 1-byte elements with a stride and writes them at a fraction of the HBM bandwidth.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TILE = 64


@triton.jit
def _transpose_kernel(x_ptr, y_ptr, R, C, stride_x, BR: tl.constexpr, BC: tl.constexpr):
    # x [R, C] (row stride stride_x, column stride 1) -> y [C, R] contiguous; program (i, j) owns tile [BR, BC]
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    inside = (rows[:, None] < R) & (cols[None, :] < C)  # [BR, BC]
    tile = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=inside)
    out = y_ptr + cols[:, None].to(tl.int64) * R + rows[None, :]  # [BC, BR]
    tl.store(out, tl.trans(tile), mask=tl.trans(inside))


def transpose_bytes(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [R, C] uint8 (last dim contiguous) -> x^T [C, R] contiguous, written into `out` when given."""
    r, c = x.shape
    y = torch.empty((c, r), dtype=x.dtype, device=x.device) if out is None else out
    if r and c:
        grid = (triton.cdiv(r, _TILE), triton.cdiv(c, _TILE))
        _transpose_kernel[grid](x, y, r, c, x.stride(0), BR=_TILE, BC=_TILE, num_warps=4)
    return y
