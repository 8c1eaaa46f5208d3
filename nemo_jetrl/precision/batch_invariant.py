"""Batch-invariant linears for the exact mode: a row's output does not depend on the other rows of the product.

    fp8_mm(x_fp8 [M, K], x_scale [M, K/128], w_fp8 [N, K], w_scale [N/128, K/128], out_dtype) -> [M, N]
    linear(x [..., K], weight [N, K], bias) -> [..., N]                (BF16 / FP16 / FP32 linears, differentiable)

CUDA runs the Triton kernels of `kernels/triton_batch_invariant.py` (fixed K order, no shape-dependent split-K).
Elsewhere the twins run, batch-invariant by construction:
- FP8 (`fp8_mm_ref`): e4m3 values have 4 significant bits and lie in [2^-9, 448], so every product of two is a
  multiple of 2^-18 below 2^18 and any sum of 128 of them is exact in float64: each 128-wide block product is
  exact whatever order the BLAS takes; blocks are scaled by the two FP32 scales and summed in K order in float64,
  then rounded once to FP32.
- BF16 / FP32 (`mm_ref`): float64 products (exact), rows computed in blocks of one fixed shape (`ROW_BLOCK`) so the
  BLAS takes the same path for every row, rounded once.
The twins and the kernels agree to FP32 accumulation order (tests: relative error); each is batch-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_BLOCK = 128
ROW_BLOCK = 16  # rows per float64 product in `mm_ref` (every row goes through one product shape)


def _on_triton(t: torch.Tensor) -> bool:
    return t.is_cuda


def fp8_mm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Y [M, N] = dequant(x_fp8, x_scale) @ dequant(w_fp8, w_scale)^T (+ bias), batch-invariant (128x128 weight
    tiles; K a multiple of 128)."""
    if x_fp8.shape[1] % FP8_BLOCK:
        raise ValueError(f"batch-invariant fp8_mm: K={x_fp8.shape[1]} must be a multiple of {FP8_BLOCK}")
    if _on_triton(x_fp8):
        from nemo_jetrl.precision.kernels import triton_batch_invariant

        return triton_batch_invariant.fp8_gemm(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias)
    return fp8_mm_ref(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias)


def fp8_mm_ref(x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias=None) -> torch.Tensor:
    """The block-exact float64 twin of `fp8_mm` (module docstring)."""
    (m, k), n = x_fp8.shape, w_fp8.shape[0]
    xd, wd = x_fp8.double(), w_fp8.double()  # xd: [M, K], wd: [N, K] raw e4m3 values
    sa = x_scale.double()  # [M, K/128]
    sb = w_scale.double().repeat_interleave(FP8_BLOCK, dim=0)[:n]  # [N, K/128]
    acc = torch.zeros((m, n), dtype=torch.float64, device=x_fp8.device)
    for kb in range(k // FP8_BLOCK):
        cols = slice(kb * FP8_BLOCK, (kb + 1) * FP8_BLOCK)
        block = xd[:, cols] @ wd[:, cols].t()  # [M, N], exact
        acc = acc + block * (sa[:, kb, None] * sb[None, :, kb])
    out = acc.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def mm_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias) in x's dtype: float64 products of ROW_BLOCK-row blocks, rounded once."""
    m = x.shape[0]
    pad = -m % ROW_BLOCK
    xd = F.pad(x.double(), (0, 0, 0, pad))  # [Mp, K]
    wt = w.double().t()  # [K, N]
    out = torch.cat([xd[i : i + ROW_BLOCK] @ wt for i in range(0, xd.shape[0], ROW_BLOCK)])[:m].float()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Batch-invariant x [M, K] @ w [N, K]^T (+ bias) in x's dtype (no autograd)."""
    if _on_triton(x):
        from nemo_jetrl.precision.kernels import triton_batch_invariant

        return triton_batch_invariant.mm(x.contiguous(), w.contiguous(), bias)
    return mm_ref(x, w, bias)


class _Matmul(torch.autograd.Function):
    """Forward: the batch-invariant product; backward: the usual GEMMs (gradients need no batch invariance)."""

    @staticmethod
    def forward(ctx, x2, w, bias):
        # x2: [M, K], w: [N, K], bias: [N] or None, one dtype
        ctx.save_for_backward(x2, w)
        ctx.has_bias = bias is not None
        return mm(x2, w, bias)

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        dx = dy @ w if ctx.needs_input_grad[0] else None  # [M, K]
        dw = dy.t() @ x2 if ctx.needs_input_grad[1] else None  # [N, K]
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with a batch-invariant forward: [..., K] -> [..., N]. Under autocast the
    operands are cast to the autocast dtype first (as F.linear's autocast does), else to x's dtype."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = x.dtype
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    w = weight.to(dtype)
    b = bias.to(dtype) if bias is not None else None
    with torch.autocast(device_type, enabled=False):
        y2 = _Matmul.apply(x2, w, b)  # [M, N]
    return y2.reshape(*x.shape[:-1], weight.shape[0])
