"""Small-M blockwise FP8 GEMM (Triton, Hopper): the rollout's decode-time linears, weight-bandwidth bound.

    Y [M, N] = dequant(x_fp8 [M, K], x_scale [M, K/128]) @ dequant(w_fp8 [N, K], w_scale [N/128, K/128])^T (+ bias)

cuBLAS's blockwise `scaled_mm` streams weights at well under half of HBM speed when M is a decode batch (64-256
rows), barely faster than the BF16 GEMM (`benchmarks/bench_decode_gemm.py`; docs/performance_history.md, "Decode
GEMMs"). Here each program owns one
BLOCK_M x BLOCK_N output tile and one contiguous range of the K blocks (split-K, so that a 4096-wide N still
keeps every SM streaming), and per 128-wide K block does one FP8 tensor-core dot, promoted to FP32 with the two
scales (DeepSeek-V3 `fp8_gemm` accumulation: `acc += dot(a, b) * (sa * sb)`). Split-K partials go to an FP32
workspace [SPLIT_K, M, N] that a second kernel sums in a fixed order (deterministic for a fixed shape), adding
the bias and casting. The pure-torch twin is `gemm._emulated_mm` (same FP8 bits, FP32 math); the two agree to
FP32 accumulation order (tests: relative error, GPU).

Configurations are timed once per (M bucket, N, K) on first use, and `fp8_blockwise_mm` keeps cuBLAS where it is
faster; the pick is shared by every process of a machine through `tune_cache` (the candidates sum in different
orders: one pick per machine keeps its processes' rollouts alike). A CUDA-graph capture must be preceded by an
eager call with the same shapes (the engine's `CapturedStep` warm-up does this).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from nemo_jetrl.precision.kernels import tune_cache
from nemo_jetrl.precision.kernels.device import cold_copies, on_device, time_in_graph

BLOCK_K = 128
_BK = tl.constexpr(BLOCK_K)


# (BLOCK_N, SPLIT_K, num_warps, num_stages) candidates (BLOCK_N 256, 4 warps and a swapped-operand W @ X^T tile
# never won on an H200 for M in 64..256 and were dropped).
CANDIDATES = tuple(
    (block_n, split_k, 8, stages) for block_n in (64, 128) for split_k in (1, 2, 4, 8) for stages in (3, 4)
)
Config = tuple[int, int, int, int]
_CANDIDATES_ID = hashlib.sha1(repr(CANDIDATES).encode()).hexdigest()[:10]  # another list: shared picks timed afresh
# The library GEMM a shape's Triton candidates are timed against (cuBLAS or DeepGEMM, handed in by the dispatcher
# `precision.gemm`, which this module does not import): (x_fp8, x_scale, w_fp8, w_scale, out_dtype, bias) -> [M, N]
LibraryGemm = Callable[..., torch.Tensor]


@triton.jit
def _fp8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, bias_ptr, M, N, K,
    stride_xm, stride_xsm, stride_xsk, stride_wn, stride_wsn, stride_om, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    # grid: (N / BLOCK_N, cdiv(M, BLOCK_M), SPLIT_K); program (n, m, s) owns out[m-tile, n-tile] over K-split s
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_kb = K // _BK
    per_split = tl.cdiv(n_kb, SPLIT_K)
    kb_start = pid_k * per_split
    kb_end = tl.minimum(kb_start + per_split, n_kb)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rm: [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rn: [BN]
    rk = tl.arange(0, _BK)  # rk: [128]
    m_ok = rm < M
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    x_ptrs = x_ptr + rm64[:, None] * stride_xm + rk[None, :]  # [BM, 128]
    w_ptrs = w_ptr + rn64[:, None] * stride_wn + rk[None, :]  # [BN, 128]
    xs_ptrs = xs_ptr + rm64 * stride_xsm  # [BM]
    ws_ptrs = ws_ptr + (rn // _BK) * stride_wsn  # [BN]: the weight-scale row of each output column
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        a = tl.load(x_ptrs + kb * _BK, mask=m_ok[:, None], other=0.0)  # a: [BM, 128] e4m3
        b = tl.load(w_ptrs + kb * _BK)  # b: [BN, 128] e4m3
        sa = tl.load(xs_ptrs + kb * stride_xsk, mask=m_ok, other=0.0)  # sa: [BM] fp32
        sb = tl.load(ws_ptrs + kb)  # sb: [BN] fp32
        acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])  # [BM, BN]
    if HAS_BIAS and SPLIT_K == 1:
        acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    out_ptrs = out_ptr + pid_k * stride_split + rm64[:, None] * stride_om + rn64[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _split_k_reduce_kernel(
    part_ptr, y_ptr, bias_ptr, MN, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    # part: fp32 [SPLIT_K, M, N] contiguous -> y [M, N] = sum over splits in order (+ bias), cast
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def _block_m(m: int) -> int:
    return min(128, max(16, triton.next_power_of_2(m)))


def fp8_gemm_small_m(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    config: Config | None = None,
) -> torch.Tensor:
    """x_fp8 [M, K] e4m3 (K contiguous), x_scale [M, K/128] fp32 (any strides), w_fp8 [N, K] e4m3 (K contiguous),
    w_scale [N/128, K/128] fp32; K and N multiples of 128. Returns [M, N] in `out_dtype`.

    `config` = (BLOCK_N, SPLIT_K, num_warps, num_stages); None = the fastest Triton candidate for this shape.
    """
    (m, k), n = x_fp8.shape, w_fp8.shape[0]
    if k % BLOCK_K or n % BLOCK_K or x_fp8.stride(1) != 1 or w_fp8.stride(1) != 1:
        raise ValueError(f"fp8_gemm_small_m: unsupported operands x {tuple(x_fp8.shape)}, w {tuple(w_fp8.shape)}")
    w_scale = w_scale.contiguous()  # [N/128, K/128], a few KB
    y = torch.empty((m, n), dtype=out_dtype, device=x_fp8.device)
    if m == 0:
        return y
    if config is None:
        config = best_config(x_fp8, w_fp8, out_dtype, bias is not None, library=None)
    block_n, split_k, warps, stages = config
    split_k = min(split_k, k // BLOCK_K)
    block_m = _block_m(m)
    has_bias = bias is not None
    bias_arg = bias if has_bias else y
    # SPLIT_K == 1 writes y directly; otherwise FP32 partials [SPLIT_K, M, N], summed in order by a second kernel.
    out = y if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x_fp8.device)
    grid = (n // block_n, triton.cdiv(m, block_m), split_k)
    with on_device(x_fp8):
        _fp8_gemm_kernel[grid](
            x_fp8, x_scale, w_fp8, w_scale, out, bias_arg, m, n, k,
            x_fp8.stride(0), x_scale.stride(0), x_scale.stride(1), w_fp8.stride(0), w_scale.stride(0), n, m * n,
            BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_K=split_k, HAS_BIAS=has_bias, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        if split_k > 1:
            block = 1024
            _split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
                out, y, bias_arg, m * n, n, SPLIT_K=split_k, HAS_BIAS=has_bias, BLOCK=block
            )
    return y


def best_config(
    x_fp8: torch.Tensor, w_fp8: torch.Tensor, out_dtype: torch.dtype, has_bias: bool, library: LibraryGemm | None
) -> Config | None:
    """The fastest way to run this product shape: a Triton config, or None where the `library` GEMM (cuBLAS
    `scaled_mm` or DeepGEMM, timed too when one is given: `gemm.small_m_config`) is faster. Decided once per (M
    rounded up to a power of two, N, K, dtype, device, library)."""
    index = x_fp8.device.index if x_fp8.device.index is not None else torch.cuda.current_device()
    m_bucket = triton.next_power_of_2(x_fp8.shape[0])
    return tuned_config(m_bucket, w_fp8.shape[0], x_fp8.shape[1], out_dtype, has_bias, index, library)


@functools.cache
def tuned_config(
    m_bucket: int,
    n: int,
    k: int,
    out_dtype: torch.dtype,
    has_bias: bool,
    device_index: int,
    library: LibraryGemm | None,
) -> Config | None:
    """The pick of the machine's first process for this shape (`tune_cache.shared_pick`), else timed here:
    `time_candidates`. Must not run inside a CUDA-graph capture: the first call of a shape happens in the eager
    warm-up."""
    name = getattr(library, "__name__", "none") if library is not None else "none"
    key = (f"fp8_gemm_small_m|{torch.cuda.get_device_name(device_index)}|torch {torch.__version__}|triton "
           f"{triton.__version__}|m {m_bucket}|n {n}|k {k}|{out_dtype}|bias {has_bias}|vs {name}"
           f"|candidates {_CANDIDATES_ID}")  # fmt: skip
    pick = tune_cache.shared_pick(
        key, lambda: time_candidates(m_bucket, n, k, out_dtype, has_bias, device_index, library)
    )
    return None if pick is None else tuple(pick)


def time_candidates(
    m_bucket: int,
    n: int,
    k: int,
    out_dtype: torch.dtype,
    has_bias: bool,
    device_index: int,
    library: LibraryGemm | None,
) -> Config | None:
    """Times every candidate (and the `library` GEMM when one is named) once on random operands of the shape,
    as the rollout runs them: inside a CUDA graph (no launch overhead) with weights cold in L2 (`time_in_graph`)."""
    device = torch.device("cuda", device_index)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m_bucket, k, device=device, generator=gen).to(torch.float8_e4m3fn)
    xs = torch.rand(k // BLOCK_K, m_bucket, device=device, generator=gen).t()  # R-major, as act_quant writes it
    copies = cold_copies(n * k, device)
    ws = [torch.randn(n, k, device=device, generator=gen).to(torch.float8_e4m3fn) for _ in range(copies)]
    wss = [torch.rand(n // BLOCK_K, k // BLOCK_K, device=device, generator=gen) for _ in range(copies)]
    bias = torch.zeros(n, device=device, dtype=out_dtype) if has_bias else None
    operands = list(zip(ws, wss))

    timings: dict[Config | None, float] = {}
    for config in CANDIDATES:
        if config[1] <= k // BLOCK_K:
            calls = [lambda w=w, s=s, c=config: fp8_gemm_small_m(x, xs, w, s, out_dtype, bias, c) for w, s in operands]
            timings[config] = time_in_graph(calls)
    if library is not None:
        timings[None] = time_in_graph([lambda w=w, s=s: library(x, xs, w, s, out_dtype, bias) for w, s in operands])
    return min(timings, key=timings.get)
