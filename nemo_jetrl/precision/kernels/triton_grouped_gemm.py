"""Grouped blockwise FP8 GEMM for MoE experts (Triton): every expert's rows times its own weight in one launch.

    grouped_fp8_gemm(x_fp8 [M, K], x_scale [M, K/128], w_fp8 [E, N, K], w_scale [E, N/128, K/128], counts [E],
                     out_dtype) -> [M, N],  y[rows of e] = dequant(x[rows of e]) @ dequant(w[e])^T

The rows are sorted by expert (expert e's `counts[e]` rows follow expert e-1's). Row tiles are assigned to experts on
the device (`tile_map`: at most cdiv(M, BLOCK_M) + E tile slots, the unused ones return at once), so a launch needs
no host sync and the rollout's decode step captures in a CUDA graph. Each output tile runs the K loop of
`triton_batch_invariant.fp8_gemm` (`_fp8_chunk`: one tensor-core dot per 128-wide K block scaled by both scales,
blocks summed in chunks, in order), so expert e's rows come out bit for bit as that kernel gives them for x[rows of e]
and w[e], whatever the other experts' rows and however many there are: batch-invariant, the trainer's FProp and the
rollout's compute the same bits. Twins: the per-expert emulation and `precision.batch_invariant.fp8_mm_ref` (CPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels.device import on_device
from nemo_jetrl.precision.kernels.triton_batch_invariant import CHUNK_BLOCKS, FP8_BLOCK, FP8_CONFIGS, _fp8_chunk
from nemo_jetrl.precision.kernels.triton_batch_invariant import pick_config as _pick_config

Config = tuple[int, int, int, int]


def transposed_experts(w_fp8: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's W^T for the grouped DGrad: e4m3 [E, N, K] -> [E, K, N] and its 128x128 tile scales [E, N/128,
    K/128] -> [E, K/128, N/128] (the forward's tiles transposed, no re-cast)."""
    wt = w_fp8.view(torch.uint8).transpose(1, 2).contiguous().view(w_fp8.dtype)
    return wt, w_scale.transpose(1, 2).contiguous()


def tile_map(counts: torch.Tensor, block_m: int, slots: int) -> torch.Tensor:
    """int32 [3, slots]: each tile slot's expert, first row and end row (end <= first: an unused slot), computed on
    the device from counts [E] (no host sync)."""
    counts = counts.to(torch.int64)
    tiles = (counts + block_m - 1) // block_m  # [E] row tiles per expert
    tile_end = tiles.cumsum(0)  # [E]
    seg_end = counts.cumsum(0)  # [E] end row of each expert's rows
    slot = torch.arange(slots, device=counts.device)
    expert = torch.searchsorted(tile_end, slot, right=True)  # [slots], E past the last tile
    used = expert < counts.numel()
    e = expert.clamp(max=counts.numel() - 1)
    first = seg_end[e] - counts[e] + (slot - (tile_end[e] - tiles[e])) * block_m
    zero = torch.zeros_like(first)
    return torch.stack([e, torch.where(used, first, zero), torch.where(used, seg_end[e], zero)]).to(torch.int32)


@triton.jit
def _grouped_fp8_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, map_ptr, K, SLOTS,
    stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_wse, stride_wsn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    # grid (N / BN, slots): the tile slot's expert e, rows [first, end) of it; out = x_rows @ w[e]^T, K in order
    pid_n, pid_t = tl.program_id(0), tl.program_id(1)
    e = tl.load(map_ptr + pid_t).to(tl.int64)
    first = tl.load(map_ptr + SLOTS + pid_t)
    end = tl.load(map_ptr + 2 * SLOTS + pid_t)
    if first < end:
        n_kb = K // 128
        rm = first + tl.arange(0, BLOCK_M)  # rm: [BM]
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rn: [BN]
        rk = tl.arange(0, 128)
        m_ok = rm < end
        rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
        x_ptrs = x_ptr + rm64[:, None] * stride_xm + rk[None, :]  # [BM, 128]
        w_ptrs = w_ptr + e * stride_we + rn64[:, None] * stride_wn + rk[None, :]  # [BN, 128]
        xs_ptrs = xs_ptr + rm64 * stride_xsm  # [BM]
        ws_ptrs = ws_ptr + e * stride_wse + (rn // 128) * stride_wsn  # [BN]
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for lo in range(0, n_kb, CHUNK):
            part = _fp8_chunk(x_ptrs, w_ptrs, xs_ptrs, ws_ptrs, m_ok, stride_xsk, lo, tl.minimum(lo + CHUNK, n_kb),
                              BLOCK_M, BLOCK_N)  # fmt: skip
            total += part
        out_ptrs = out_ptr + rm64[:, None] * stride_om + rn64[None, :]
        tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


def grouped_fp8_gemm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    counts: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    config: Config | None = None,
) -> torch.Tensor:
    """See the module docstring. x_fp8 [M, K] e4m3 (K contiguous), x_scale [M, K/128] fp32 (any strides), w_fp8
    [E, N, K] e4m3 (K contiguous), w_scale [E, N/128, K/128] fp32, counts [E] summing to M; K and N multiples of 128.
    config (BLOCK_M, BLOCK_N, warps, stages): None = by the mean rows per expert; any choice gives the same bits."""
    (m, k), (experts, n, k_w) = x_fp8.shape, w_fp8.shape
    if k != k_w or k % FP8_BLOCK or n % FP8_BLOCK or x_fp8.stride(1) != 1 or w_fp8.stride(2) != 1:
        raise ValueError(f"grouped_fp8_gemm: unsupported operands x {tuple(x_fp8.shape)}, w {tuple(w_fp8.shape)}")
    w_scale = w_scale.contiguous()
    y = torch.empty((m, n), dtype=out_dtype, device=x_fp8.device)
    if m == 0:
        return y
    block_m, block_n, warps, stages = config or _pick_config(FP8_CONFIGS, max(1, m // experts))
    slots = triton.cdiv(m, block_m) + experts  # every expert's partial last tile at most adds one
    tiles = tile_map(counts, block_m, slots)
    with on_device(x_fp8):
        _grouped_fp8_kernel[(n // block_n, slots)](
            x_fp8, x_scale, w_fp8, w_scale, y, tiles, k, slots,
            x_fp8.stride(0), x_scale.stride(0), x_scale.stride(1), w_fp8.stride(0), w_fp8.stride(1),
            w_scale.stride(0), w_scale.stride(1), n,
            BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=CHUNK_BLOCKS, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return y
