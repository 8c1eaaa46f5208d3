"""A deliberately non-row-invariant FP8 GEMM for the `matched_kernels: auto` self-check's tests (CPU and GPU):
`split_k_by_m(original)` runs products of more than `rows` rows as two half-K GEMMs summed in float32 (as a
library's split-K kernel chosen by M would), smaller ones whole; `patch_fp8_gemm` puts a GEMM in place of
`precision.gemm.fp8_blockwise_mm` in every nemo_jetrl module that imported it."""

from __future__ import annotations

import sys

import torch

from nemo_jetrl.precision import gemm


def split_k_by_m(original, rows: int = 64):
    """`fp8_blockwise_mm`'s signature; K must split into two halves of whole 128-channel blocks."""

    def fp8_gemm(x_fp8, x_scale, w_fp8, w_scale, out_dtype=torch.bfloat16, **kwargs):
        if x_fp8.shape[0] <= rows:
            return original(x_fp8, x_scale, w_fp8, w_scale, out_dtype, **kwargs)
        kwargs.pop("w_dequant", None)  # of the whole K
        bias = kwargs.pop("bias", None)
        half = x_fp8.shape[1] // 2
        blocks = half // 128
        low = original(x_fp8[:, :half].contiguous(), x_scale[:, :blocks].contiguous(), w_fp8[:, :half].contiguous(),
                       w_scale[:, :blocks].contiguous(), torch.float32, **kwargs)  # fmt: skip
        high = original(x_fp8[:, half:].contiguous(), x_scale[:, blocks:].contiguous(), w_fp8[:, half:].contiguous(),
                        w_scale[:, blocks:].contiguous(), torch.float32, **kwargs)  # fmt: skip
        out = low + high if bias is None else low + high + bias.float()
        return out.to(out_dtype)

    return fp8_gemm


def patch_fp8_gemm(monkeypatch, fake) -> int:
    """Replace `fp8_blockwise_mm` where nemo_jetrl modules hold it; returns how many modules were patched."""
    original, count = gemm.fp8_blockwise_mm, 0
    for name, module in list(sys.modules.items()):
        if name.startswith("nemo_jetrl") and getattr(module, "fp8_blockwise_mm", None) is original:
            monkeypatch.setattr(module, "fp8_blockwise_mm", fake)
            count += 1
    return count
