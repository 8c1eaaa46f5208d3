"""Rowwise / tensorwise FP8 GEMMs: `torch._scaled_mm` on Hopper, exact emulation elsewhere.

`fp8_axis_mm(a, sa, b, sb)` computes Y [M, N] = dequant(a [M, K], sa) @ dequant(b [N, K], sb)^T: both operands
row-major with K contiguous, scales [M, 1] / [N, 1] (rowwise: one per row along the contracted K) or [1, 1]
(tensorwise). On an sm90 GPU (where `gemm.gemm_backend` says "scaled_mm") it is cuBLAS through `torch._scaled_mm`
(rowwise: per-row x per-column scales; tensorwise: scalar scales); elsewhere the same FP8 bits are dequantized with
the same scales and multiplied in FP32, as the blockwise emulation does.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from nemo_jetrl.precision.axis_quant import axis_dequant
from nemo_jetrl.precision.gemm import gemm_backend, no_autocast

_FP8 = torch.float8_e4m3fn


def fp8_axis_mm(
    a_fp8: torch.Tensor,
    a_scale: torch.Tensor,
    b_fp8: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    bias: torch.Tensor | None = None,
    b_dequant: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Y [M, N] = dequant(a_fp8 [M, K], a_scale) @ dequant(b_fp8 [N, K], b_scale)^T (+ bias [N]), in `out_dtype`.

    Scales: a [M, 1] and b [N, 1] (rowwise) or both [1, 1] (tensorwise). `b_dequant` ([N, K] fp32, optional): a
    cached dequant(b) the emulation reuses. backend: "auto" (scaled_mm on sm90, else emulated) | "emulated".
    """
    _check(a_fp8, a_scale, b_fp8, b_scale)
    if backend not in ("auto", "emulated"):
        raise ValueError(f"fp8_axis_mm: backend must be auto|emulated, got {backend!r}")
    with no_autocast(a_fp8.device.type):
        if backend == "auto" and gemm_backend(a_fp8.device) == "scaled_mm" and _fits(a_fp8, b_fp8):
            return _scaled_mm(a_fp8, a_scale, b_fp8, b_scale, out_dtype, bias)
        bd = b_dequant if b_dequant is not None else axis_dequant(b_fp8, b_scale)  # bd: [N, K] fp32
        out = axis_dequant(a_fp8, a_scale) @ bd.t()  # out: [M, N] fp32
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype)


def pad_rows(t: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """t [M, ...] with zero rows appended up to a multiple of `multiple` (e4m3 padded as bytes); t itself if none."""
    pad = -t.shape[0] % multiple
    if not pad:
        return t
    if t.dtype == _FP8:
        return F.pad(t.view(torch.uint8), (0, 0, 0, pad)).view(_FP8)
    return F.pad(t, (0, 0, 0, pad))


def _fits(a_fp8: torch.Tensor, b_fp8: torch.Tensor) -> bool:
    k, n = a_fp8.shape[1], b_fp8.shape[0]
    return k % 16 == 0 and n % 16 == 0 and a_fp8.shape[0] > 0 and a_fp8.stride(1) == 1 and b_fp8.stride(1) == 1


def aligned_16(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it where its storage does not start on a 16-byte boundary: cuBLASLt refuses
    (CUBLAS_STATUS_NOT_SUPPORTED) scale pointers that are not, e.g. expert e's tensorwise scale, a view at e x 4 bytes
    into the [E, 1, 1] scales."""
    return t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def _scaled_mm(a_fp8, a_scale, b_fp8, b_scale, out_dtype, bias) -> torch.Tensor:
    m = a_fp8.shape[0]
    rowwise = a_scale.shape[0] != 1 or b_scale.shape[0] != 1
    if m % 16:  # cuBLASLt wants 16-aligned dims; padded rows are sliced off
        a_fp8 = pad_rows(a_fp8)
        a_scale = F.pad(a_scale, (0, 0, 0, a_fp8.shape[0] - m), value=1.0) if a_scale.shape[0] != 1 else a_scale
    if rowwise and a_scale.shape[0] == 1:  # mixed: broadcast the tensor scale to the rowwise layout
        a_scale = a_scale.expand(a_fp8.shape[0], 1).contiguous()
    scale_b = b_scale.reshape(1, -1).expand(1, b_fp8.shape[0]).contiguous() if rowwise else b_scale.reshape(())
    scale_a, scale_b = aligned_16(a_scale if rowwise else a_scale.reshape(())), aligned_16(scale_b)
    # bf16 out as asked; any other dtype through an FP32 GEMM output where scaled_mm gives one
    fp32_ok = out_dtype != torch.bfloat16 and _fp32_out_ok(a_fp8.device, rowwise)
    gemm_dtype = torch.float32 if fp32_ok else torch.bfloat16
    fused_bias = bias is not None and gemm_dtype == torch.bfloat16
    out = torch._scaled_mm(
        a_fp8,
        b_fp8.t(),  # [K, N] column-major view of the row-major [N, K]
        scale_a=scale_a,
        scale_b=scale_b,
        bias=bias.to(torch.bfloat16) if fused_bias else None,
        out_dtype=gemm_dtype,
    )[:m]
    if bias is not None and not fused_bias:
        out = out.float() + bias.float()
    return out.to(out_dtype)


@functools.cache
def _fp32_out_ok(device: torch.device, rowwise: bool) -> bool:
    """Whether scaled_mm gives an FP32 output for this scaling on `device` (probed once)."""
    a = torch.ones(16, 32, device=device).to(_FP8)
    scale = torch.ones(16, 1, device=device) if rowwise else torch.ones((), device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=scale, scale_b=scale.reshape(1, -1), out_dtype=torch.float32)
        return True
    except (RuntimeError, ValueError):
        return False


def _check(a_fp8, a_scale, b_fp8, b_scale) -> None:
    if a_fp8.dtype != _FP8 or b_fp8.dtype != _FP8:
        raise ValueError(f"fp8_axis_mm: operands must be float8_e4m3fn, got {a_fp8.dtype} and {b_fp8.dtype}")
    if a_fp8.dim() != 2 or b_fp8.dim() != 2 or a_fp8.shape[1] != b_fp8.shape[1]:
        raise ValueError(
            f"fp8_axis_mm: expected a [M, K] and b [N, K], got {tuple(a_fp8.shape)} and {tuple(b_fp8.shape)}"
        )
    for name, t, rows in (("a_scale", a_scale, a_fp8.shape[0]), ("b_scale", b_scale, b_fp8.shape[0])):
        if t.dtype != torch.float32 or t.dim() != 2 or t.shape[1] != 1 or t.shape[0] not in (1, rows):
            raise ValueError(f"fp8_axis_mm: {name} must be float32 [{rows}, 1] or [1, 1], got {tuple(t.shape)}")
