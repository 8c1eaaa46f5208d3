"""Inputs that corner a 1x128 quantizer's rounding (CPU tensors; tests move them where they run)."""

from __future__ import annotations

import torch


def e4m3_midpoints() -> torch.Tensor:
    """The midpoints between adjacent non-negative finite e4m3 values, ascending (fp32)."""
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])
    return (grid[1:] + grid[:-1]) / 2


def wide_values(rows: int = 64, cols: int = 384, seed: int = 3) -> torch.Tensor:
    """fp32 [rows, cols]: values over 60 decades, zero rows of both signs, NaN, inf and denormals in one row, and
    scattered zeros in the last half."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.logspace(-30, 30, cols)
    x[:16] = 0.0
    x[8:16] = -0.0
    x[20, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40, -1e-44])
    x[rows // 2 :] *= (torch.rand(rows - rows // 2, cols, generator=gen) > 0.3).float()
    return x


def scaled_midpoints() -> torch.Tensor:
    """fp32 [R, 128], one group per row: its amax first (so its scale is amax / 448, not a power of two), then the
    e4m3 midpoints times that scale and their fp32 neighbours (+-3 ulps): x / scale rounded and x * (1 / scale)
    rounded pick different e4m3 bytes on a few percent of them."""
    mids = e4m3_midpoints()
    vals = torch.cat([mids, -mids])[None, :] * (1 + torch.arange(-3, 4, dtype=torch.float32)[:, None] * 2.0**-23)
    rows = []
    for amax in torch.logspace(-3, 3, 16).float():
        scale = torch.clamp(amax, min=1e-10) * torch.tensor(1.0 / 448.0, dtype=torch.float32)
        v = (vals.flatten() * scale).float()
        v = v[: v.numel() // 127 * 127].reshape(-1, 127)
        rows.append(torch.cat([amax.expand(v.shape[0], 1), v], dim=1))
    return torch.cat(rows)
