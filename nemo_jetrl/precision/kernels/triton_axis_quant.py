"""Triton twins of the rowwise / tensorwise quantizers in `precision/axis_quant.py`, bitwise equal on values and
scales (the parity rules of `triton_quant.py`: exact amax, one FP32 multiply for the scale, `div_rn`, NaN kept by
the clamp, RNE cast). CUDA only; imported lazily.

Two passes over the input: `_amax_kernel` reduces tiles and combines them with an atomic max (exact: the maximum
of non-negative floats does not depend on the order), `_quant_kernel` scales, casts and writes the e4m3 values
row-major (the transposed operands of WGrad / DGrad come from a transposed view of the input).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.e4m3 import scale_from_amax
from nemo_jetrl.precision.kernels.device import on_device
from nemo_jetrl.precision.kernels.triton_quant import (
    _FLT_MAX,
    _check,
    _finite_abs,
    _scale_from_amax,
    _to_e4m3,
)


@triton.jit
def _amax_kernel(
    x_ptr, amax_ptr, bad_ptr, R, C, stride_r, stride_c,
    PER_ROW: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, COUNT: tl.constexpr,
):  # fmt: skip
    # One program: a [BR, BC] tile of the logical [R, C] input (any strides); its finite |x| max per row (PER_ROW)
    # or over the tile is folded into amax_ptr by an atomic max (COUNT: + its NaN / inf values into bad_ptr).
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows64[:, None] * stride_r + cols64[None, :] * stride_c, mask=mask, other=0.0)
    x = x.to(tl.float32)  # x: [BR, BC]
    row_max = tl.max(_finite_abs(x), axis=1)  # row_max: [BR]
    if PER_ROW:
        tl.atomic_max(amax_ptr + rows, row_max, mask=rows < R)
    else:
        tl.atomic_max(amax_ptr, tl.max(row_max, axis=0))
    if COUNT:
        bad = tl.sum(tl.sum(((x != x) | (tl.abs(x) > _FLT_MAX)).to(tl.int32), axis=1), axis=0)
        tl.atomic_add(bad_ptr, bad, mask=bad > 0)


@triton.jit
def _quant_kernel(
    x_ptr, y_ptr, amax_ptr, s_ptr, R, C, stride_r, stride_c, stride_y,
    PER_ROW: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, POW2: tl.constexpr,
):  # fmt: skip
    # One program: the same [BR, BC] tile, scaled by its row's (or the tensor's) scale, written to y [R, >= C]
    # (row stride stride_y); the first column of programs also stores the scales.
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows64[:, None] * stride_r + cols64[None, :] * stride_c, mask=mask, other=0.0)
    x = x.to(tl.float32)  # x: [BR, BC]
    if PER_ROW:
        scale = _scale_from_amax(tl.load(amax_ptr + rows, mask=rows < R, other=0.0), POW2)  # scale: [BR]
        q = _to_e4m3(x, scale[:, None])
        if tl.program_id(1) == 0:
            tl.store(s_ptr + rows, scale, mask=rows < R)
    else:
        scale = _scale_from_amax(tl.load(amax_ptr), POW2)  # scale: []
        q = _to_e4m3(x, scale)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(s_ptr, scale)
    tl.store(y_ptr + rows64[:, None] * stride_y + cols64[None, :], q, mask=mask)


@triton.jit
def _row_cast_kernel(x_ptr, y_ptr, s_ptr, C, stride_r, BC: tl.constexpr, POW2: tl.constexpr):
    # One program: one whole row of a row-major [R, C] input held in registers (C <= BC): one read, one write.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BC)
    x = tl.load(x_ptr + row * stride_r + cols, mask=cols < C, other=0.0).to(tl.float32)  # x: [BC]
    scale = _scale_from_amax(tl.max(_finite_abs(x), axis=0), POW2)
    tl.store(y_ptr + row * C + cols, _to_e4m3(x, scale), mask=cols < C)
    tl.store(s_ptr + row, scale)


# Widest row the one-pass kernel takes; wider rows take the two-pass path, which was faster at 12288 on an H100
# (docs/precision.md, "which recipe when").
ROW_CAST_MAX = 8192


def _row_cast(x: torch.Tensor, pow2: bool):
    r, c = x.shape
    y = torch.empty((r, c), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((r, 1), dtype=torch.float32, device=x.device)
    bc = triton.next_power_of_2(c)
    with on_device(x):
        _row_cast_kernel[(r,)](x, y, scale, c, x.stride(0), BC=bc, POW2=pow2, num_warps=min(16, max(4, bc // 1024)))
    return y, scale


def _quant(x: torch.Tensor, per_row: bool, pow2: bool, count_nonfinite: bool, t_pad: int | None = None):
    _check(x)
    r, c = x.shape
    y = torch.empty((r, c), dtype=torch.float8_e4m3fn, device=x.device)
    n_scales = r if per_row else 1
    amax = torch.zeros(n_scales, dtype=torch.float32, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    scale = torch.empty((n_scales, 1), dtype=torch.float32, device=x.device)
    if r == 0 or c == 0:
        scale.copy_(_scale_host(amax, pow2).view(-1, 1))
        if t_pad is not None:
            rp = -(-r // t_pad) * t_pad
            return y, torch.zeros((c, rp), dtype=torch.float8_e4m3fn, device=x.device), scale
        return (y, scale, bad[0]) if count_nonfinite else (y, scale)
    # rows contiguous in memory (a transposed view): square tiles; else wide ones along the contiguous dim
    br, bc = (64, 64) if x.stride(0) == 1 and c > 1 else (8, 512)
    grid = (triton.cdiv(r, br), triton.cdiv(c, bc))
    args = (r, c, x.stride(0), x.stride(1))
    with on_device(x):
        _amax_kernel[grid](x, amax, bad, *args, PER_ROW=per_row, BR=br, BC=bc, COUNT=count_nonfinite, num_warps=4)
        _quant_kernel[grid](x, y, amax, scale, *args, c, PER_ROW=per_row, BR=br, BC=bc, POW2=pow2, num_warps=4)
        if t_pad is not None:  # the same values written transposed, [C, R] in a zero-padded [C, RP] buffer
            rp = -(-r // t_pad) * t_pad
            yt = (torch.zeros if rp != r else torch.empty)((c, rp), dtype=torch.float8_e4m3fn, device=x.device)
            t_args = (c, r, x.stride(1), x.stride(0), rp)
            grid_t = (triton.cdiv(c, 64), triton.cdiv(r, 64))
            _quant_kernel[grid_t](x, yt, amax, scale, *t_args, PER_ROW=False, BR=64, BC=64, POW2=pow2, num_warps=4)
            return y, yt, scale
    return (y, scale, bad[0]) if count_nonfinite else (y, scale)


def _scale_host(amax: torch.Tensor, pow2: bool) -> torch.Tensor:
    return scale_from_amax(amax, pow2)


def quant_rows(x: torch.Tensor, pow2: bool, count_nonfinite: bool = False):
    """One scale per row of x [R, C] (any strides) -> (e4m3 [R, C], fp32 [R, 1]) (+ int32 non-finite count).
    Row-major rows of at most ROW_CAST_MAX elements take the one-pass kernel, the rest amax tiles + cast."""
    _check(x)
    if not count_nonfinite and x.stride(1) == 1 and 0 < x.shape[1] <= ROW_CAST_MAX and x.shape[0] > 0:
        return _row_cast(x, pow2)
    return _quant(x, True, pow2, count_nonfinite)


def quant_tensor(x: torch.Tensor, pow2: bool, count_nonfinite: bool = False):
    """One scale for x [R, C] (any strides) -> (e4m3 [R, C], fp32 [1, 1]) (+ int32 non-finite count)."""
    return _quant(x, False, pow2, count_nonfinite)


def quant_tensor_dual(x: torch.Tensor, pow2: bool, pad: int):
    """One scale for x [R, C] -> (e4m3 [R, C], e4m3 [C, RP] = the same values transposed with R zero-padded to a
    multiple of `pad`, fp32 [1, 1]): one amax pass, two writes (no transpose copy)."""
    return _quant(x, False, pow2, False, t_pad=pad)
