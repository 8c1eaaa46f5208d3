"""`transpose_fp8`: a row-major copy of an e4m3 tensor's transpose (DGrad's W^T), Triton on CUDA, torch elsewhere."""

from __future__ import annotations

import torch


def transpose_fp8(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """e4m3 t [R, C] -> [C, R] contiguous (moved as bytes; into `out` [C, R] when given). On CUDA the tiled Triton
    kernel (`kernels/triton_transpose.py`), elsewhere its twin `t.t().contiguous()`."""
    src = t.view(torch.uint8) if t.stride(-1) == 1 else t.contiguous().view(torch.uint8)  # [R, C]
    dst = out.view(torch.uint8) if out is not None else None
    if t.is_cuda:
        from nemo_jetrl.precision.kernels.triton_transpose import transpose_bytes

        y = transpose_bytes(src, dst)  # [C, R] uint8
    elif dst is None:
        y = src.t().contiguous()
    else:
        y = dst.copy_(src.t())
    return out if out is not None else y.view(t.dtype)
