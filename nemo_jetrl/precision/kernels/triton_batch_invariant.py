"""Batch-invariant GEMMs (Triton): a row's output does not depend on how many rows are computed with it.

    fp8_gemm:  Y [M, N] = dequant(x_fp8 [M, K], x_scale [M, K/128]) @ dequant(w_fp8 [N, K], w_scale [N/128, K/128])^T
    mm:        Y [M, N] = x [M, K] @ w [N, K]^T                                       (bf16 / fp16 / fp32)

cuBLAS picks its algorithm (tiling, split-K) by shape, and the rollout's decode GEMMs are split over K for
bandwidth, so the same row could round differently in a decode step (M = batch), a prefill (M = batch x prompt) and
the trainer's forward (M = micro-batch x sequence). Here the summation order over K is fixed by K alone:

- FP8: per 128-wide K block one tensor-core dot, promoted to FP32 with the two scales (`part += dot * (sa * sb)`),
  blocks summed in order within chunks of CHUNK_BLOCKS blocks, chunk partials summed in order from zero. A small M
  may run the chunks in parallel programs (split-K over exactly those chunks, FP32 partials summed in order by a
  second kernel): the same additions in the same order, so the split is free to depend on M.
- BF16/FP32: `acc = dot(x_tile, w_tile, acc)` over BLOCK_K-wide K tiles in order, no split-K.

Tile sizes (BLOCK_M, BLOCK_N, warps, stages) may depend on M: each output element is one accumulator fed the same
K-ordered tensor-core instructions whatever tile holds it (tests/gpu/test_batch_invariant_gpu.py checks every
configuration against every other bitwise). So decode-sized FP8 products (M <= SPLIT_M_MAX) take the fastest of
`DECODE_CANDIDATES` (tile, warps, stages, chunks split or not) per shape, timed once as the rollout runs them (CUDA
graph, weights cold in L2: `kernels.device.time_in_graph`). Twins: `precision.batch_invariant` (float64, CPU).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels.device import cold_copies, on_device, time_in_graph

FP8_BLOCK = 128
CHUNK_BLOCKS = 8  # K blocks per chunk (1024 channels): the fixed summation unit of the FP8 GEMM
MM_BLOCK_K = 64
SPLIT_M_MAX = 256  # FP8: at most this many rows run the chunks in parallel programs (decode batches) ...
SPLIT_TILES_MAX = 256  # ... and only when fewer output tiles than this would leave SMs idle
# (BLOCK_M, BLOCK_N, num_warps, num_stages) by M: decode-sized products take narrow tiles (more programs)
FP8_CONFIGS = ((SPLIT_M_MAX, (64, 64, 4, 3)), (None, (128, 128, 8, 3)))
# (config, split) candidates for decode-sized FP8 products, all bitwise equal (see the module docstring)
DECODE_CANDIDATES = tuple(((64, bn, w, 3), split) for bn in (64, 128) for w in (4, 8) for split in (False, True))
MM_CONFIGS = ((SPLIT_M_MAX, (64, 128, 4, 4)), (None, (128, 128, 8, 3)))
Config = tuple[int, int, int, int]
_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def pick_config(table, m: int) -> Config:
    return next(cfg for most, cfg in table if most is None or m <= most)


@triton.jit
def _fp8_chunk(x_ptrs, w_ptrs, xs_ptrs, ws_ptrs, m_ok, stride_xsk, kb_lo, kb_hi,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """sum over K blocks kb_lo..kb_hi-1 (in order) of dot(x_kb, w_kb^T) * (sa * sb): [BLOCK_M, BLOCK_N] fp32."""
    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_lo, kb_hi):
        a = tl.load(x_ptrs + kb * 128, mask=m_ok[:, None], other=0.0)  # a: [BM, 128] e4m3
        b = tl.load(w_ptrs + kb * 128)  # b: [BN, 128] e4m3
        sa = tl.load(xs_ptrs + kb * stride_xsk, mask=m_ok, other=0.0)  # sa: [BM] fp32
        sb = tl.load(ws_ptrs + kb)  # sb: [BN] fp32
        part += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
    return part


@triton.jit
def _fp8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, bias_ptr, M, N, K,
    stride_xm, stride_xsm, stride_xsk, stride_wn, stride_wsn, stride_om, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    # grid (N / BN, cdiv(M, BM), chunks if SPLIT else 1): out[m-tile, n-tile] = sum over chunks (in order) of the
    # chunk sums; SPLIT: program c writes chunk c's sum (0 + part) to the FP32 workspace [chunks, M, N]
    pid_n, pid_m, pid_c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_kb = K // 128
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rm: [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rn: [BN]
    rk = tl.arange(0, 128)
    m_ok = rm < M
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    x_ptrs = x_ptr + rm64[:, None] * stride_xm + rk[None, :]  # [BM, 128]
    w_ptrs = w_ptr + rn64[:, None] * stride_wn + rk[None, :]  # [BN, 128]
    xs_ptrs = xs_ptr + rm64 * stride_xsm  # [BM]
    ws_ptrs = ws_ptr + (rn // 128) * stride_wsn  # [BN]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT:
        lo = pid_c * CHUNK
        part = _fp8_chunk(x_ptrs, w_ptrs, xs_ptrs, ws_ptrs, m_ok, stride_xsk, lo, tl.minimum(lo + CHUNK, n_kb),
                          BLOCK_M, BLOCK_N)  # fmt: skip
        total += part
        out_ptrs = out_ptr + pid_c * stride_split + rm64[:, None] * stride_om + rn64[None, :]
        tl.store(out_ptrs, total, mask=m_ok[:, None])
    else:
        for lo in range(0, n_kb, CHUNK):
            part = _fp8_chunk(x_ptrs, w_ptrs, xs_ptrs, ws_ptrs, m_ok, stride_xsk, lo, tl.minimum(lo + CHUNK, n_kb),
                              BLOCK_M, BLOCK_N)  # fmt: skip
            total += part
        if HAS_BIAS:
            total += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
        out_ptrs = out_ptr + rm64[:, None] * stride_om + rn64[None, :]
        tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _chunk_sum_kernel(part_ptr, y_ptr, bias_ptr, MN, N, CHUNKS, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # part: fp32 [CHUNKS, M, N] -> y [M, N] = ((0 + part_0) + part_1) + ... (+ bias), the non-split order
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(0, CHUNKS):
        total += tl.load(part_ptr + c * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=ok)


def fp8_gemm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    *,
    config: Config | None = None,
    split: bool | None = None,
) -> torch.Tensor:
    """x_fp8 [M, K] e4m3 (K contiguous), x_scale [M, K/128] fp32 (any strides), w_fp8 [N, K] e4m3 (K contiguous),
    w_scale [N/128, K/128] fp32; K and N multiples of 128. Returns [M, N] in `out_dtype`.

    config / split: None = by M (`FP8_CONFIGS`; split for M <= SPLIT_M_MAX when the output tiles alone are fewer
    than SPLIT_TILES_MAX); any choice gives the same bits."""
    (m, k), n = x_fp8.shape, w_fp8.shape[0]
    if k % FP8_BLOCK or n % FP8_BLOCK or x_fp8.stride(1) != 1 or w_fp8.stride(1) != 1:
        raise ValueError(
            f"batch-invariant fp8_gemm: unsupported operands x {tuple(x_fp8.shape)}, w {tuple(w_fp8.shape)}"
        )
    w_scale = w_scale.contiguous()
    y = torch.empty((m, n), dtype=out_dtype, device=x_fp8.device)
    if m == 0:
        return y
    chunks = triton.cdiv(k // FP8_BLOCK, CHUNK_BLOCKS)
    if config is None and split is None and m <= SPLIT_M_MAX and x_fp8.is_cuda:
        index = x_fp8.device.index if x_fp8.device.index is not None else torch.cuda.current_device()
        config, split = decode_config(triton.next_power_of_2(m), n, k, out_dtype, bias is not None, index)
    block_m, block_n, warps, stages = config or pick_config(FP8_CONFIGS, m)
    tiles = (n // block_n) * triton.cdiv(m, block_m)
    split = (m <= SPLIT_M_MAX and chunks > 1 and tiles < SPLIT_TILES_MAX) if split is None else split
    has_bias = bias is not None
    bias_arg = bias if has_bias else y
    out = torch.empty((chunks, m, n), dtype=torch.float32, device=x_fp8.device) if split else y
    grid = (n // block_n, triton.cdiv(m, block_m), chunks if split else 1)
    with on_device(x_fp8):
        _fp8_gemm_kernel[grid](
            x_fp8, x_scale, w_fp8, w_scale, out, bias_arg, m, n, k,
            x_fp8.stride(0), x_scale.stride(0), x_scale.stride(1), w_fp8.stride(0), w_scale.stride(0), n, m * n,
            BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=CHUNK_BLOCKS, SPLIT=split, HAS_BIAS=has_bias,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        if split:
            block = 1024
            _chunk_sum_kernel[(triton.cdiv(m * n, block),)](
                out, y, bias_arg, m * n, n, chunks, HAS_BIAS=has_bias, BLOCK=block
            )
    return y


@functools.cache
def decode_config(m_bucket: int, n: int, k: int, out_dtype, has_bias: bool, device_index: int):
    """The fastest (config, split) of DECODE_CANDIDATES for this shape, timed once on random operands inside a CUDA
    graph with the weights cold in L2. Must not run inside a CUDA-graph capture (the rollout's eager warm-up calls
    each shape first)."""
    device = torch.device("cuda", device_index)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m_bucket, k, device=device, generator=gen).to(torch.float8_e4m3fn)
    xs = torch.rand(k // FP8_BLOCK, m_bucket, device=device, generator=gen).t()
    copies = cold_copies(n * k, device)
    ws = [torch.randn(n, k, device=device, generator=gen).to(torch.float8_e4m3fn) for _ in range(copies)]
    wss = [torch.rand(n // FP8_BLOCK, k // FP8_BLOCK, device=device, generator=gen) for _ in range(copies)]
    bias = torch.zeros(n, device=device, dtype=out_dtype) if has_bias else None
    chunks = triton.cdiv(k // FP8_BLOCK, CHUNK_BLOCKS)
    timings = {}
    for config, split in DECODE_CANDIDATES:
        if split and chunks == 1:
            continue
        calls = [
            lambda w=w, s=s, c=config, sp=split: fp8_gemm(x, xs, w, s, out_dtype, bias, config=c, split=sp)
            for w, s in zip(ws, wss)
        ]
        timings[(config, split)] = time_in_graph(calls)
    return min(timings, key=timings.get)


@triton.jit
def _mm_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    # grid (cdiv(N, BN), cdiv(M, BM)): out[m-tile, n-tile] = sum over K tiles in order, one accumulator
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]  # [BM, BK]
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :]  # [BN, BK]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn.to(tl.int64)[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def mm(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, config: Config | None = None
) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias [N]) in x's dtype (bf16, fp16 or fp32: FP32 accumulation; fp32 inputs in
    IEEE FP32, no TF32); K contiguous in both. config None = by M (`MM_CONFIGS`)."""
    (m, k), n = x.shape, w.shape[0]
    if w.shape[1] != k or x.dtype != w.dtype or x.dtype not in _TL or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"batch-invariant mm: unsupported x {x.dtype} {tuple(x.shape)}, w {w.dtype} {tuple(w.shape)}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    block_m, block_n, warps, stages = config or pick_config(MM_CONFIGS, m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    with on_device(x):
        _mm_kernel[grid](
            x, w, y, bias if bias is not None else y, m, n, k, x.stride(0), w.stride(0), n,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=MM_BLOCK_K, HAS_BIAS=bias is not None,
            IEEE=x.dtype == torch.float32, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return y
