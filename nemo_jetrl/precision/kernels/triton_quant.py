"""Triton twins of the reference quantizers in `precision/quant.py`, bitwise equal on values and scales.

Parity rules (DESIGN §1): the amax is exact; `scale = max(amax, eps) * R` is one FP32 multiply by the exact
FP32 constant R = float32(1/448); the optional power-of-two rounding works on the exponent bits; the division is
`tl.math.div_rn` (IEEE round-to-nearest — Triton's plain `/` lowers to an approximate division); the clamp keeps
NaN explicitly (PTX min/max drop it); the e4m3 cast rounds to nearest even. CUDA only; imported lazily.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.e4m3 import FLT_MAX, INV_E4M3_MAX, SCALE_EPS
from nemo_jetrl.precision.kernels.device import on_device

_EPS = tl.constexpr(SCALE_EPS)
_INV_MAX = tl.constexpr(INV_E4M3_MAX)
_FLT_MAX = tl.constexpr(FLT_MAX)
_FP8_MAX = tl.constexpr(448.0)
DIVISIONS = ("plain", "reciprocal")  # how `quant_groups` divides by the scale (`division_for`): the same bits


@triton.jit
def _finite_abs(x):
    ax = tl.abs(x)
    return tl.where(ax != ax, 0.0, tl.minimum(ax, _FLT_MAX))  # NaN -> 0, inf -> FLT_MAX


@triton.jit
def _scale_from_amax(amax, POW2: tl.constexpr):
    scale = tl.maximum(amax, _EPS) * _INV_MAX
    if POW2:
        bits = scale.to(tl.int32, bitcast=True)
        up = ((bits & 0x7F800000) + 0x00800000).to(tl.float32, bitcast=True)
        scale = tl.where((bits & 0x007FFFFF) == 0, scale, up)
    return scale


@triton.jit
def _clamp_e4m3(q):
    return tl.where(q != q, q, tl.minimum(tl.maximum(q, -_FP8_MAX), _FP8_MAX))  # NaN kept


@triton.jit
def _to_e4m3(x, scale):
    return _clamp_e4m3(tl.math.div_rn(x, scale)).to(tl.float8e4nv)


@triton.jit
def _to_e4m3_by_reciprocal(x, scale):
    """The bits of `_to_e4m3(x, scale)` (x [R, G], scale [R, 1]) with one IEEE division per row, not per value:
    r = rn(1 / scale), q0 = rn(x * r), then the exact residual x - q0 * scale (an FMA) corrects q0 to rn(x / scale)
    (Markstein's division by a correctly rounded reciprocal; tests/unit/precision/test_quantizer_division.py checks
    it against the division). Zeros (both signs) and infinities take x * r. The division's slow path, which
    an all-zero group (a zero-advantage sequence's gradient) sends every lane down, is not used."""
    r = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)  # r: [R, 1]
    q0 = x * r
    q = tl.math.fma(tl.math.fma(-q0, scale, x), r, q0)
    q = tl.where((x == 0.0) | (tl.abs(x) == float("inf")), q0, q)
    return _clamp_e4m3(q).to(tl.float8e4nv)


@triton.jit
def _quant_rows(x, POW2: tl.constexpr, DIVISION: tl.constexpr):
    """x [R, G] fp32, one quantization group per row -> (e4m3 [R, G], fp32 scales [R]). DIVISION: one of
    `DIVISIONS` (the same bits)."""
    scale = _scale_from_amax(tl.max(_finite_abs(x), axis=1), POW2)  # scale: [R]
    if DIVISION == "reciprocal":
        return _to_e4m3_by_reciprocal(x, scale[:, None]), scale
    return _to_e4m3(x, scale[:, None]), scale


@triton.jit
def quant_vector_groups(x, N: tl.constexpr, BLOCK: tl.constexpr, POW2: tl.constexpr):
    """Inside a kernel: x [N] fp32 -> (e4m3 [N], fp32 scales [N // BLOCK]), the 1xBLOCK groups of
    `_quant_groups_kernel` through the same `_quant_rows` (so a fused producer writes the bits `act_quant` would)."""
    q, scale = _quant_rows(tl.reshape(x, (N // BLOCK, BLOCK)), POW2, "plain")
    return tl.reshape(q, (N,)), scale


@triton.jit
def _quant_groups_kernel(
    x_ptr, y_ptr, s_ptr, R, C, C_OUT, stride_r, stride_c, stride_sr, stride_sg,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, POW2: tl.constexpr, DIVISION: tl.constexpr,
):  # fmt: skip
    # One program: ROWS rows x one group of BLOCK columns of the logical [R, C_OUT] output: the [R, C] input (any
    # strides) with columns C..C_OUT-1 zero.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # rows: [ROWS]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # cols: [BLOCK]
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows64[:, None] * stride_r + cols64[None, :] * stride_c, mask=mask, other=0.0)
    q, scale = _quant_rows(x.to(tl.float32), POW2, DIVISION)  # q: [ROWS, BLOCK] e4m3, scale: [ROWS]
    tl.store(y_ptr + rows64[:, None] * C_OUT + cols[None, :], q, mask=(rows[:, None] < R) & (cols[None, :] < C_OUT))
    tl.store(s_ptr + rows64 * stride_sr + tl.program_id(1) * stride_sg, scale, mask=rows < R)


@triton.jit
def _quant_tiles_kernel(
    x_ptr, y_ptr, s_ptr, bad_ptr, R, C, stride_r, stride_c, n_tiles_c,
    BLOCK: tl.constexpr, POW2: tl.constexpr, COUNT: tl.constexpr,
):  # fmt: skip
    # One program: one BLOCK x BLOCK tile of the logical [R, C] input, one scale (COUNT: + its non-finite
    # values added to the int32 counter at bad_ptr).
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows64[:, None] * stride_r + cols64[None, :] * stride_c, mask=mask, other=0.0)
    x = x.to(tl.float32)  # x: [BLOCK, BLOCK]
    scale = _scale_from_amax(tl.max(tl.max(_finite_abs(x), axis=1), axis=0), POW2)  # scale: []
    q = _to_e4m3(x, scale)
    tl.store(y_ptr + rows64[:, None] * C + cols[None, :], q, mask=mask)
    tl.store(s_ptr + tl.program_id(0) * n_tiles_c + tl.program_id(1), scale)
    if COUNT:  # NaN (x != x) or +-inf (|x| > FLT_MAX); padding loads 0
        bad = tl.sum(tl.sum(((x != x) | (tl.abs(x) > _FLT_MAX)).to(tl.int32), axis=1), axis=0)
        tl.atomic_add(bad_ptr, bad, mask=bad > 0)


def _check(x: torch.Tensor) -> None:
    # CUDA, or any device under TRITON_INTERPRET=1 (tests); callers pick Triton only for CUDA tensors
    if x.dim() != 2 or not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise ValueError(f"triton quantizers take a 2-D CUDA tensor, got {tuple(x.shape)} on {x.device}")


def _transposed(x: torch.Tensor) -> bool:
    """x [R, C] is a transposed view (rows contiguous in memory: the WGrad operands along the tokens)."""
    return x.stride(0) == 1 and x.shape[1] > 1


def division_for(x: torch.Tensor, zero_rows: bool) -> str:
    """How `quant_groups` divides a 2-D view x [R, C] by its scales (`DIVISIONS`; the bits are the same either way):
    "plain" (`div_rn` on every value) where the rows are contiguous and the data has no all-zero rows (activations:
    the reciprocal form is ~10% slower there), "reciprocal" (one division per group, then products and FMAs) on the
    transposed view (as fast on random data) and where rows may be all zero (`zero_rows`: gradients, whose
    zero-advantage sequences' and prompt tokens' rows are zero; `div_rn` takes its slow path on a zero dividend,
    2x the time). Measured: docs/performance_history.md, "The quantizer's division"."""
    return "reciprocal" if zero_rows or _transposed(x) else "plain"


def quant_groups(
    x: torch.Tensor, block: int, pow2: bool, rows: int | None = None, num_warps: int = 4, division: str | None = None,
    zero_rows: bool = False, width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """1x`block` groups along dim 1 of a 2-D view x [R, C] (any strides) -> (e4m3 [R, W], fp32 [R, ceil(W/b)]).

    The scale is stored R-major (column-major, `stride(0) == 1`): the layout scaled_mm takes without a copy.
    `division`: one of `DIVISIONS` (the same bits), by default `division_for(x, zero_rows)`. `width` W >= C (default
    C): the output as if x were zero-padded to W columns (the WGrad operand's tokens padded to the block), with no
    padded copy of x made.
    """
    _check(x)
    division = division_for(x, zero_rows) if division is None else division
    if division not in DIVISIONS:
        raise ValueError(f"quant_groups: division must be one of {DIVISIONS}, got {division!r}")
    r, c = x.shape
    width = c if width is None else width
    if width < c:
        raise ValueError(f"quant_groups: width {width} < the input's {c} columns")
    n_groups = triton.cdiv(width, block)
    y = torch.empty((r, width), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((n_groups, r), dtype=torch.float32, device=x.device).t()  # s: [R, n_groups], R-major
    if y.numel() == 0:
        return y, s
    if rows is None:  # the transposed WGrad operand: taller tiles, longer reads
        rows = 64 if _transposed(x) else 32
    grid = (triton.cdiv(r, rows), n_groups)
    with on_device(x):
        _quant_groups_kernel[grid](
            x, y, s, r, c, width, x.stride(0), x.stride(1), s.stride(0), s.stride(1),
            BLOCK=block, ROWS=rows, POW2=pow2, DIVISION=division, num_warps=num_warps,
        )  # fmt: skip
    return y, s


def quant_tiles(
    x: torch.Tensor, block: int, pow2: bool, nonfinite: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`block`x`block` tiles of x [R, C] (any strides) -> (e4m3 [R, C], fp32 [ceil(R/b), ceil(C/b)]).

    nonfinite (int32, 1 element): the number of NaN / +-inf values of x is added to it in the same pass."""
    _check(x)
    r, c = x.shape
    grid = (triton.cdiv(r, block), triton.cdiv(c, block))
    y = torch.empty((r, c), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(grid, dtype=torch.float32, device=x.device)
    if y.numel() == 0:
        return y, s
    with on_device(x):
        _quant_tiles_kernel[grid](
            x, y, s, nonfinite if nonfinite is not None else s, r, c, x.stride(0), x.stride(1), grid[1],
            BLOCK=block, POW2=pow2, COUNT=nonfinite is not None, num_warps=8,
        )  # fmt: skip
    return y, s


@triton.jit
def _kv_round_trip_kernel(x_ptr, y_ptr, scale_ptr, N, BLOCK: tl.constexpr):
    # One program: BLOCK consecutive elements; the scale is one FP32 value read on the device (no host sync).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr)
    q = _to_e4m3(x, scale)  # `kv_quant`: IEEE division, saturating clamp (NaN kept), e4m3 round to nearest even
    tl.store(y_ptr + offs, (q.to(tl.float32) * scale).to(y_ptr.dtype.element_ty), mask=mask)


def kv_round_trip(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`kv_dequant(kv_quant(x, scale), scale, x.dtype)` (precision/kv.py) in one pass: x [N] contiguous, scale a
    one-element FP32 tensor on x's device -> `out` (or a new [N] tensor) in x's dtype, bitwise the torch round trip."""
    if x.dim() != 1 or not x.is_contiguous() or scale.numel() != 1 or scale.dtype != torch.float32:
        raise ValueError(f"kv_round_trip takes a contiguous [N] tensor and one FP32 scale, got {tuple(x.shape)}")
    _check(x.view(1, -1))
    y = torch.empty_like(x) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"kv_round_trip: out must be a contiguous {tuple(x.shape)} {x.dtype} tensor")
    if x.numel():
        with on_device(x):
            _kv_round_trip_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, scale, x.numel(), BLOCK=4096, num_warps=8)
    return y
