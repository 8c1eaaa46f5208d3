"""The E4M3 format and its scale rule: the constants and the two FP32 operations every quantizer shares.

The bottom of the precision package: the pure-torch quantizers (`quant.py`, `axis_quant.py`), their Triton twins
(`kernels/`) and the KV cache (`kv.py`) read these, so a kernel never imports the module that dispatches to it.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
# Exact FP32 values (as Python floats), so every backend rounds nothing further.
SCALE_EPS = float(torch.tensor(1e-10, dtype=torch.float32))
INV_E4M3_MAX = float(torch.tensor(1.0 / 448.0, dtype=torch.float32))
FLT_MAX = float(torch.finfo(torch.float32).max)


def scale_from_amax(amax: torch.Tensor, pow2: bool = False) -> torch.Tensor:
    """FP32 dequantization scale from a finite, non-negative FP32 block amax."""
    scale = amax.clamp_min(SCALE_EPS) * INV_E4M3_MAX
    return pow2_ceil(scale) if pow2 else scale


def pow2_ceil(scale: torch.Tensor) -> torch.Tensor:
    """Exact 2**ceil(log2(s)) for positive normal FP32 s, on the bits (no log2 rounding)."""
    bits = scale.contiguous().view(torch.int32)
    rounded_up = (bits & 0x7F800000) + 0x00800000  # next power of two: exponent + 1, mantissa 0
    return torch.where((bits & 0x007FFFFF) == 0, bits, rounded_up).view(torch.float32)
