"""Rowwise and tensorwise E4M3 quantizers (the `rowwise` / `tensorwise` recipes) and their inverse.

The same arithmetic as the blockwise quantizers (`quant.py`: exact amax with NaN ignored and inf counted as
FLT_MAX, `scale = max(amax, 1e-10) * float32(1/448)`, optional power-of-two rounding, IEEE division, clamp, RNE
cast), over a different group: one row of a 2-D operand (`row_quant`, scale [R, 1]), one column emitted as a row
of the transposed operand (`col_quant_t`, scale [C, 1]), or the whole tensor (`tensor_quant`, scale [1, 1]).
Scales are FP32 dequantization multipliers shaped to broadcast against the e4m3 values; on CUDA the Triton twins
in `kernels/triton_axis_quant.py` give the same bits.
"""

from __future__ import annotations

import torch

from nemo_jetrl.precision.quant import (
    FP8_DTYPE,
    QuantBackend,
    _block_amax,
    _check_input,
    _to_e4m3,
    _use_triton,
    e4m3_to_float,
    scale_from_amax,
)


def row_quant(
    x: torch.Tensor, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row. x: [R, C] (any strides) -> (e4m3 [R, C] row-major, fp32 scale [R, 1])."""
    _check_2d(x, "row_quant")
    if _use_triton(x, 128, backend):
        from nemo_jetrl.precision.kernels import triton_axis_quant

        return triton_axis_quant.quant_rows(x, pow2)
    return _row_quant_ref(x, pow2)


def col_quant_t(
    x: torch.Tensor, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per column, written transposed. x: [M, K] -> (e4m3 [K, M], fp32 scale [K, 1]), bitwise
    `row_quant(x.t())`: the WGrad operand of the rowwise recipe (each channel's scale taken over the tokens)."""
    _check_2d(x, "col_quant_t")
    return row_quant(x.t(), pow2, backend)


def tensor_quant(
    x: torch.Tensor, pow2: bool = False, backend: QuantBackend = "auto", count_nonfinite: bool = False
) -> tuple[torch.Tensor, ...]:
    """One scale for the tensor. x: [R, C] -> (e4m3 [R, C] row-major, fp32 scale [1, 1]) (+ int32 0-dim count of
    x's NaN / inf values with `count_nonfinite`)."""
    _check_2d(x, "tensor_quant")
    if _use_triton(x, 128, backend):
        from nemo_jetrl.precision.kernels import triton_axis_quant

        out = triton_axis_quant.quant_tensor(x, pow2, count_nonfinite)
    else:
        out = _tensor_quant_ref(x, pow2)
        if count_nonfinite:
            out = (*out, _nonfinite(x))
    return out


def tensor_quant_dual(
    x: torch.Tensor, pow2: bool = False, pad: int = 16, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both training layouts of the tensorwise cast of x [M, N]: (e4m3 [M, N], e4m3 [N, MP], fp32 scale [1, 1]),
    the second bitwise the first transposed with M zero-padded to MP = round_up(M, pad) (the WGrad operand)."""
    _check_2d(x, "tensor_quant_dual")
    if _use_triton(x, 128, backend):
        from nemo_jetrl.precision.kernels import triton_axis_quant

        return triton_axis_quant.quant_tensor_dual(x, pow2, pad)
    q, scale = _tensor_quant_ref(x, pow2)
    return q, _padded_transpose(q, pad), scale


def row_quant_checked(
    x: torch.Tensor, pow2: bool = False, backend: QuantBackend = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`row_quant(x)` and the int32 0-dim count of x's NaN / inf values (same pass on CUDA)."""
    _check_2d(x, "row_quant")
    if _use_triton(x, 128, backend):
        from nemo_jetrl.precision.kernels import triton_axis_quant

        return triton_axis_quant.quant_rows(x, pow2, count_nonfinite=True)
    return (*_row_quant_ref(x, pow2), _nonfinite(x))


def axis_dequant(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of `row_quant` / `tensor_quant`: e4m3 [R, C] * scale [R, 1] or [1, 1] -> `dtype` (math in FP32)."""
    if q.dim() != 2 or scale.dim() != 2 or scale.shape[1] != 1 or scale.shape[0] not in (1, q.shape[0]):
        raise ValueError(
            f"axis_dequant: scale {tuple(scale.shape)} must be [R, 1] or [1, 1] for values {tuple(q.shape)}"
        )
    return (e4m3_to_float(q) * scale.float()).to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# reference implementation (pure torch, any device)
# ----------------------------------------------------------------------------------------------------------------
def _row_quant_ref(x: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()  # xf: [R, C]
    if xf.shape[1] == 0:
        return torch.empty(xf.shape, dtype=FP8_DTYPE, device=x.device), scale_from_amax(xf.new_zeros(len(xf), 1), pow2)
    scale = scale_from_amax(_block_amax(xf, (1,)), pow2).unsqueeze(1)  # scale: [R, 1]
    return _to_e4m3(xf, scale).contiguous(), scale


def _tensor_quant_ref(x: torch.Tensor, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()  # xf: [R, C]
    amax = _block_amax(xf.reshape(1, -1), (1,)) if xf.numel() else xf.new_zeros(1)  # amax: [1]
    scale = scale_from_amax(amax, pow2).view(1, 1)  # scale: [1, 1]
    return _to_e4m3(xf, scale).contiguous(), scale


def _padded_transpose(q: torch.Tensor, pad: int) -> torch.Tensor:
    """e4m3 q [M, N] -> [N, MP] row-major (bytes moved), M zero-padded to a multiple of `pad`."""
    qb = q.view(torch.uint8)
    rows = -qb.shape[0] % pad
    if rows:
        qb = torch.cat([qb, qb.new_zeros(rows, qb.shape[1])])
    return qb.t().contiguous().view(FP8_DTYPE)


def _nonfinite(x: torch.Tensor) -> torch.Tensor:
    return (~torch.isfinite(x)).sum().to(torch.int32)


def _check_2d(x: torch.Tensor, name: str) -> None:
    _check_input(x, 128, name, min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"{name} expects a 2-D tensor, got shape {tuple(x.shape)}")
