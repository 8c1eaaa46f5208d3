"""Triton kernels of the exact mode's attention and log-softmax (twins and contracts: `batch_invariant_attention.py`,
`batch_invariant.py`). Imported on CUDA only (or under Triton's interpreter in tests)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nemo_jetrl.models.fused_ops import _TL_DTYPES, _round
from nemo_jetrl.precision.kernels.device import on_device

# The keys are the MMA's rows: per block of ATTN_BLOCK_N keys a program computes scores transposed, [keys, query
# rows] = K . Q^T, and the output transposed, [D, query rows] += V^T . P^T, so Hopper's wgmma (64 rows a warp group)
# is filled by keys and a program may take as few query rows as a decode step has (the N_REP query heads of one KV
# head). Each score and output element is one chain of 16-wide MMA steps in the same order at every tile width, and
# every variant feeds its dots the same operand encodings (tests/unit/models/test_batch_invariant_compiled.py), so
# decode, prefill and training give the same bits (tests/gpu).
ATTN_BLOCK_N = 64  # keys per block: the fixed unit of the online softmax, the MMA's rows
# (query rows per program, warps, pipeline stages); a query row is a query position x a head of one KV group
TRAIN_CONFIG = (64, 4, 3)  # prefill and training
DECODE_CONFIG = (16, 4, 3)  # a decode step: one position's N_REP heads, padded to 16


def decode_config(dtype: torch.dtype) -> tuple[int, int, int]:
    """(query rows, warps, stages) of a decode step in `dtype`: DECODE_CONFIG on tensor cores (16-bit); float32's
    dots run on CUDA cores in a register layout that follows the tile's shape, so there a decode step takes the
    trainer's tile (the same reduction trees as prefill and training)."""
    return TRAIN_CONFIG if dtype == torch.float32 else DECODE_CONFIG


LSE_BLOCK = 4096  # vocabulary entries per step of the per-row log-sum-exp


@triton.jit
def _dot(a, b, DT: tl.constexpr):
    if DT == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _pin(x):
    """x unchanged through an opaque register move (bf16 pairs): the compiler cannot trace it back to a load, so
    every variant (bf16 or e4m3 cache, paged or not) feeds its dot the same register operand."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)


@triton.jit
def _key_offsets(cols, in_range, table_row, stride_blk, stride_s, PAGE: tl.constexpr, PAGED: tl.constexpr):
    """Element offsets [BLOCK_N] (int64) of cache columns `cols` from a (row, KV head)'s base: `cols * stride_s`, or
    PAGED (a block pool read through the row's block table `table_row`) block `table_row[col // PAGE]` at slot
    `col % PAGE`. Columns out of range read block 0 (never used: their loads are masked)."""
    if PAGED:
        block = tl.load(table_row + cols // PAGE, mask=in_range, other=0).to(tl.int64)
        return block * stride_blk + (cols % PAGE).to(tl.int64) * stride_s
    return cols.to(tl.int64) * stride_s


@triton.jit
def _load_kv(base, offsets, in_range, dims, scale, FP8: tl.constexpr, DT: tl.constexpr, HW_CAST: tl.constexpr):
    """[BLOCK_N, D] keys or values at element `offsets` [BLOCK_N] from `base` in DT; an e4m3 cache is dequantized as
    `kv_dequant` does (`(float32(q) * scale).to(DT)`), so it equals the trainer's fake-quantized K/V bit for bit.
    HW_CAST (a GPU): the narrowing cast is the hardware's round-to-nearest-even conversion, one instruction per
    element pair; the CPU interpreter truncates there, so it rounds on the bits (`_round`, several integer
    operations per element: the decode's main cost over an FP8 cache)."""
    x = tl.load(base + offsets[:, None] + dims[None, :], mask=in_range[:, None], other=0.0)
    if FP8:
        x = x.to(tl.float32) * scale
        if not HW_CAST:
            x = _round(x, DT)
    x = x.to(DT)
    if HW_CAST and DT != tl.float32:
        x = _pin(x)
    return x


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, valid_ptr, start_ptr, ks_ptr, vs_ptr, out_ptr, table_ptr, lse_ptr, cu_ptr,
    S_q, S_k, kv_heads, sm_scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, svalb, sstart, sob, soh, sos, stable, slse,
    N_REP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr, DT: tl.constexpr, HW_CAST: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    VARLEN: tl.constexpr = False, WRITE_LSE: tl.constexpr = False, LEAD_SCAN: tl.constexpr = 1024,
):  # fmt: skip
    # grid (B * H_kv, cdiv(S_q * N_REP, BLOCK_M)); tile query row r (the MMA's column): query s = r // N_REP of head
    # hk * N_REP + r % N_REP.
    # Keys are visited in blocks of BLOCK_N aligned to the row's first valid key column `lead`, up to the tile's
    # last query; a block whose keys a row may not see leaves that row's state bit for bit unchanged.
    # PAGED: k/v are one layer's block pools [blocks, H_kv, PAGE, D] (skb / svb: the block stride) read through the
    # row's block table; the row's keys are columns [0, S_k) with no padding, so `lead` is 0 and every key is valid.
    # VARLEN: one packed row; "row" b is the segment [cu[b], cu[b+1]) of it, its queries and keys its own tokens
    # (S_q = S_k = its length, no padding: `lead` 0, every key valid), so a token's key blocks start at its
    # sequence's first token as in the padded layout (same blocks, same bits).
    # WRITE_LSE: also the natural-log sum of exp(scores) per query, to lse [H, rows] at lse_ptr + head * slse + the
    # query's row (b * S_q + s; VARLEN: cu[b] + s); +inf where a query sees no key (flash attention's convention).
    pid_bh, pid_m = tl.program_id(0), tl.program_id(1)
    b = pid_bh // kv_heads
    hk = pid_bh % kv_heads
    b64 = b.to(tl.int64)
    row0 = b64 * S_q  # the query row of (b, s = 0) in lse
    if VARLEN:
        row0 = tl.load(cu_ptr + b).to(tl.int64)
        S_q = tl.load(cu_ptr + b + 1) - row0.to(tl.int32)
        S_k = S_q
        q_ptr += row0 * sqs
        k_ptr += row0 * sks
        v_ptr += row0 * svs
        out_ptr += row0 * sos
        b64 = b64 * 0
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    s_idx = rows // N_REP
    head = hk * N_REP + rows % N_REP
    row_ok = s_idx < S_q
    dims = tl.arange(0, D)
    q_ptrs = q_ptr + b64 * sqb + head[:, None].to(tl.int64) * sqh + s_idx[:, None].to(tl.int64) * sqs + dims[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(DT)  # q: [BM, D]
    q0 = tl.load(start_ptr + b * sstart).to(tl.int32)  # cache column of query 0
    qcol = q0 + s_idx  # [BM]
    last_s = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // N_REP, S_q - 1)
    hi = tl.minimum(q0 + last_s + 1, S_k)  # one past the tile's last query column
    valid_row = valid_ptr + b64 * svalb
    table_row = table_ptr + b64 * stable
    if VARLEN:  # a tile past the segment's last query visits no key
        hi = tl.where(pid_m * BLOCK_M < S_q * N_REP, hi, 0)
    if PAGED or VARLEN:  # PAGED: skb / svb step blocks, not rows; VARLEN: k_ptr / v_ptr start at the segment
        lead = 0
        k_base = k_ptr + hk * skh
        v_base = v_ptr + hk * svh
    else:
        lead = hi
        for c0 in range(0, hi, LEAD_SCAN):  # wide steps: one program scans its row's mask up to the tile's end
            cols = c0 + tl.arange(0, LEAD_SCAN)
            ok = tl.load(valid_row + cols, mask=cols < hi, other=0) != 0
            lead = tl.minimum(lead, tl.min(tl.where(ok, cols, hi), axis=0))
        k_base = k_ptr + b64 * skb + hk * skh
        v_base = v_ptr + b64 * svb + hk * svh
    k_scale = tl.load(ks_ptr)  # read by _load_kv only for an e4m3 cache
    v_scale = tl.load(vs_ptr)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)  # the output transposed: [D, BM]
    qt = tl.trans(q)  # [D, BM]
    for start in range(lead, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_range = cols < hi
        if PAGED or VARLEN:
            valid = in_range
        else:
            valid = tl.load(valid_row + cols, mask=in_range, other=0) != 0
        k_offs = _key_offsets(cols, in_range, table_row, skb, sks, PAGE, PAGED)  # [BN]
        k = _load_kv(k_base, k_offs, in_range, dims, k_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        s = _dot(k, qt, DT) * sm_scale  # scores transposed: [BN, BM]
        allowed = valid[:, None] & (cols[:, None] <= qcol[None, :])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.where(m_new == m_i, 1.0, tl.exp(m_i - m_new))
        p = tl.where(allowed, tl.exp(s - m_new[None, :]), 0.0)  # [BN, BM]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v_offs = _key_offsets(cols, in_range, table_row, svb, svs, PAGE, PAGED)  # [BN]
        v = _load_kv(v_base, v_offs, in_range, dims, v_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        acc = acc * alpha[None, :] + _dot(tl.trans(v), p.to(DT), DT)  # [D, BN] @ [BN, BM]
        m_i = m_new
    out = tl.trans(acc / tl.maximum(l_i, 1e-30)[None, :])  # [BM, D]; a row that may see no key gives 0
    o_ptrs = out_ptr + b64 * sob + head[:, None].to(tl.int64) * soh + s_idx[:, None].to(tl.int64) * sos + dims[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = tl.where(l_i > 0, m_i + tl.log(tl.maximum(l_i, 1e-30)), float("inf"))  # [BM]
        tl.store(lse_ptr + head.to(tl.int64) * slse + row0 + s_idx, lse, mask=row_ok)


def attention(
    q,
    k_buf,
    v_buf,
    key_valid,
    q_start,
    sm_scale,
    k_scale=None,
    v_scale=None,
    config: tuple[int, int, int] | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `batch_invariant_attention.attention`; q_start: an int64 tensor, 0-dim or [B]. config: (query rows per
    program, warps, pipeline stages), default `decode_config(q.dtype)` for one query per row, else TRAIN_CONFIG;
    the GPU tests check which configs give the default's bits. lse: a float32 [H, B * S_q] the kernel fills with each query's log-sum-exp
    (row b * S_q + s; the trainer's forward, `batch_invariant_train`)."""
    bsz, heads, s_q, dim = q.shape
    block_m, warps, stages = config or (decode_config(q.dtype) if s_q == 1 else TRAIN_CONFIG)
    _, kv_heads, s_k, _ = k_buf.shape
    is_fp8 = k_buf.dtype == torch.float8_e4m3fn
    out = torch.empty((bsz, s_q, heads, dim), dtype=q.dtype, device=q.device)  # [B, S_q, H, D]
    n_rep = heads // kv_heads
    grid = (bsz * kv_heads, triton.cdiv(s_q * n_rep, block_m))
    ones = q_start  # any pointer fills the scale slots of a high-precision cache (never read)
    with on_device(q):
        _attention_kernel[grid](
            q, k_buf, v_buf, key_valid, q_start, k_scale if is_fp8 else ones, v_scale if is_fp8 else ones, out,
            ones, ones if lse is None else lse, ones, s_q, s_k, kv_heads, float(sm_scale),
            *q.stride()[:3], *k_buf.stride()[:3], *v_buf.stride()[:3], key_valid.stride(0),
            0 if q_start.dim() == 0 else q_start.stride(0), out.stride(0), out.stride(2), out.stride(1), 0,
            0 if lse is None else lse.stride(0),
            N_REP=n_rep, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, KV_FP8=is_fp8, DT=_TL_DTYPES[q.dtype],
            HW_CAST=os.environ.get("TRITON_INTERPRET") != "1", PAGE=1, PAGED=False, WRITE_LSE=lse is not None,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out.transpose(1, 2)  # [B, H, S_q, D]


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment causal attention over one packed row, q [1, H, T, D], k / v [1, H_kv, T, D] (bf16 / fp16 / fp32,
    head dim contiguous), segments cu_seqlens int32 [n + 1] of at most max_seqlen tokens: each query the kernel
    of `attention` over its own sequence's keys (the training configuration). Returns (out [1, H, T, D],
    lse float32 [H, T])."""
    _, heads, total, dim = q.shape
    kv_heads = k.shape[1]
    n_rep = heads // kv_heads
    out = torch.empty((1, total, heads, dim), dtype=q.dtype, device=q.device)  # [1, T, H, D]
    lse = torch.empty((heads, total), dtype=torch.float32, device=q.device)  # [H, T]
    zero = torch.zeros((), dtype=torch.int64, device=q.device)  # every query's column is its index in its segment
    segments = cu_seqlens.numel() - 1
    block_m, warps, stages = TRAIN_CONFIG
    grid = (segments * kv_heads, triton.cdiv(max(max_seqlen, 1) * n_rep, block_m))
    with on_device(q):
        _attention_kernel[grid](
            q, k, v, zero, zero, zero, zero, out, zero, lse, cu_seqlens, 0, 0, kv_heads, float(sm_scale),
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], 0, 0, out.stride(0), out.stride(2), out.stride(1), 0,
            lse.stride(0),
            N_REP=n_rep, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, KV_FP8=False, DT=_TL_DTYPES[q.dtype],
            HW_CAST=True, PAGE=1, PAGED=False, VARLEN=True, WRITE_LSE=True, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out.transpose(1, 2), lse  # [1, H, T, D], [H, T]


def paged_attention(q, k_pool, v_pool, block_table, kv_len, sm_scale, k_scale=None, v_scale=None) -> torch.Tensor:
    """See `batch_invariant_attention.paged_attention`: the decode step of `attention` (same kernel, same
    configuration, same key-block order) with K/V read in place through block_table int32 [B, max_blocks] from
    one layer's pools [num_blocks, H_kv, page, D]; kv_len int64 [B]."""
    bsz, heads, s_q, dim = q.shape
    _, kv_heads, page, _ = k_pool.shape
    block_m, warps, stages = decode_config(q.dtype)
    is_fp8 = k_pool.dtype == torch.float8_e4m3fn
    out = torch.empty((bsz, s_q, heads, dim), dtype=q.dtype, device=q.device)  # [B, 1, H, D]
    n_rep = heads // kv_heads
    q_start = kv_len - 1  # [B] the query's column: the row's last key
    grid = (bsz * kv_heads, triton.cdiv(s_q * n_rep, block_m))
    with on_device(q):
        _attention_kernel[grid](
            q, k_pool, v_pool, block_table, q_start, k_scale if is_fp8 else kv_len, v_scale if is_fp8 else kv_len,
            out, block_table, kv_len, kv_len, s_q, block_table.shape[1] * page, kv_heads, float(sm_scale),
            *q.stride()[:3], *k_pool.stride()[:3], *v_pool.stride()[:3], 0,
            q_start.stride(0), out.stride(0), out.stride(2), out.stride(1), block_table.stride(0), 0,
            N_REP=n_rep, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, KV_FP8=is_fp8, DT=_TL_DTYPES[q.dtype],
            HW_CAST=os.environ.get("TRITON_INTERPRET") != "1", PAGE=page, PAGED=True, num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
    return out.transpose(1, 2)  # [B, H, 1, D]


@triton.jit
def _row_logsumexp_kernel(x_ptr, out_ptr, V, stride_r, BLOCK: tl.constexpr):
    # one program per row: m = max (exact in any order), then sum of exp(x - m) per lane over BLOCK-wide steps in
    # order, lanes summed once: log-sum-exp [R] fp32
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_r
    lanes = tl.arange(0, BLOCK)
    mvec = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(base + c0 + lanes, mask=c0 + lanes < V, other=float("-inf"))
        mvec = tl.maximum(mvec, x)
    m = tl.max(mvec, axis=0)
    svec = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(0, V, BLOCK):
        x = tl.load(base + c0 + lanes, mask=c0 + lanes < V, other=float("-inf"))
        svec += tl.exp(x - m)
    tl.store(out_ptr + row, m + tl.log(tl.sum(svec, axis=0)))


def row_logsumexp(x2: torch.Tensor) -> torch.Tensor:
    """x2 [R, V] fp32 (V contiguous) -> [R] fp32 log-sum-exp, one program per row."""
    out = torch.empty(x2.shape[0], dtype=torch.float32, device=x2.device)
    if x2.shape[0]:
        with on_device(x2):
            _row_logsumexp_kernel[(x2.shape[0],)](x2, out, x2.shape[1], x2.stride(0), BLOCK=LSE_BLOCK, num_warps=8)
    return out
