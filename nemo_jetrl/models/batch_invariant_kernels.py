"""Triton kernels of the exact mode's attention (twin and contract: `batch_invariant_attention.py`; the per-row
log-sum-exp: `batch_invariant_lse_kernel.py`). Imported on CUDA only (or under Triton's interpreter in tests)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from nemo_jetrl.models.fused_ops import _TL_DTYPES, _mul_rn, _round
from nemo_jetrl.precision.kernels.device import on_device

# The keys are the MMA's rows: per block of ATTN_BLOCK_N keys a program computes scores transposed, [keys, query
# rows] = K . Q^T, and the output transposed, [D, query rows] += V^T . P^T, so Hopper's wgmma (64 rows a warp group)
# is filled by keys and a program may take as few query rows as a decode step has (the N_REP query heads of one KV
# head). Each score and output element is one chain of 16-wide MMA steps in the same order at every tile width, and
# every variant feeds its dots the same operand encodings (tests/unit/models/test_batch_invariant_compiled.py), so
# decode, prefill and training give the same bits (tests/gpu).
ATTN_BLOCK_N = 64  # keys per block: the fixed unit of the online softmax, the MMA's rows
# Keys per chunk: the online softmax starts afresh at every chunk (from the row's first valid key) and the chunks
# are merged in order (`_merge_weights` / `_merged`), so a decode step may run its chunks in parallel programs and
# merge them after (flash decoding) with the bits the trainer's program gets by merging as it goes.
ATTN_SPLIT_KEYS = 1024
# (query rows per program, warps, pipeline stages); a query row is a query position x a head of one KV group
TRAIN_CONFIG = (64, 4, 3)  # prefill and training
# A decode step: one position's N_REP heads, padded to 16 rows. The pipeline depth (which does not change a query's
# reductions: tests/gpu) is the faster one on an H200 at every shape timed (docs/mismatch.md, 2026-12-01): over the
# static batch's contiguous cache 3 stages (one chunk or parallel chunks alike), over a paged pool (continuous
# batching) 2.
DECODE_CONFIG = (16, 4, 3)
PAGED_DECODE_CONFIG = (16, 4, 2)
# Registers a thread of a decode step (16-bit) may use: 128 keeps four programs an SM (4 warps; the shared memory of
# 3 stages, or 2 over a paged pool, fits four). Left to ptxas the kernel took 168 on the H200, three programs an SM,
# and the decode ran 5-18% slower (docs/mismatch.md). A register budget changes the schedule, not one rounding.
DECODE_MAXNREG = 128


def decode_config(dtype: torch.dtype, paged: bool = False) -> tuple[int, int, int]:
    """(query rows, warps, stages) of a decode step in `dtype` on tensor cores (16-bit): PAGED_DECODE_CONFIG over a
    paged pool, else DECODE_CONFIG. float32's dots run on CUDA cores in a register layout that follows the tile's
    shape, so there a decode step takes the trainer's tile (the same reduction trees as prefill and training)."""
    if dtype == torch.float32:
        return TRAIN_CONFIG
    return PAGED_DECODE_CONFIG if paged else DECODE_CONFIG


def decode_maxnreg(dtype: torch.dtype) -> int | None:
    """The register budget of a decode step's launch: DECODE_MAXNREG on tensor cores (16-bit), none for float32
    (the trainer's tile)."""
    return None if dtype == torch.float32 else DECODE_MAXNREG


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
def _merge_weights(m_run, m):
    """(new max, weight of the running state, weight of the chunk) of merging a chunk's max `m` into the running
    max `m_run`: a chunk a query saw no key of (m -1e30) leaves the running state bit for bit unchanged, and the
    first chunk it sees becomes the running state exactly."""
    m_new = tl.maximum(m_run, m)
    return m_new, tl.where(m_new == m_run, 1.0, tl.exp(m_run - m_new)), tl.where(m_new == m, 1.0, tl.exp(m - m_new))


@triton.jit
def _merged(x_run, a, x, b, HW: tl.constexpr):
    """x_run * a + x * b, each product rounded on its own (no FMA contraction), so that the trainer's program and
    the decode's merge kernel give the same bits."""
    return _mul_rn(x_run, a, HW) + _mul_rn(x, b, HW)


@triton.jit
def _chunk(
    c0, hi, qt, qcol, valid_row, table_row, k_base, v_base, skb, sks, svb, svs, k_scale, v_scale, dims, sm_scale,
    SPLIT_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, KV_FP8: tl.constexpr,
    DT: tl.constexpr, HW_CAST: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    """The online softmax over the key blocks of one chunk, columns [c0, min(c0 + SPLIT_N, hi)), from a fresh state:
    (max [BM], sum [BM], output transposed [D, BM]). A block whose keys a query may not see leaves its state bit for
    bit unchanged. The sums stay per key slot of the block until the chunk ends, then one reduction over the slots:
    a reduction across the warps (the keys are spread over them) once a chunk instead of once a block."""
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_slots = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # sum of exp(score - max) of key slot j, per query
    acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)
    for start in range(c0, tl.minimum(c0 + SPLIT_N, hi), BLOCK_N):
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
        l_slots = l_slots * alpha[None, :] + p
        v_offs = _key_offsets(cols, in_range, table_row, svb, svs, PAGE, PAGED)  # [BN]
        v = _load_kv(v_base, v_offs, in_range, dims, v_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        acc = acc * alpha[None, :] + _dot(tl.trans(v), p.to(DT), DT)  # [D, BN] @ [BN, BM]
        m_i = m_new
    return m_i, tl.sum(l_slots, axis=0), acc


# The lengths are not specialized on their alignment (S_q == 1 still is): otherwise every prompt length whose width
# enters another divisible-by-16 class compiles new variants in the middle of a run (seconds in a GRPO step's prefill,
# docs/mismatch.md). Alignment decides how wide a load is, not one rounding (tests/gpu).
@triton.jit(do_not_specialize_on_alignment=["S_q", "S_k", "svalb"])
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, valid_ptr, start_ptr, ks_ptr, vs_ptr, out_ptr, table_ptr, lse_ptr, cu_ptr,
    S_q, S_k, kv_heads, sm_scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, svalb, sstart, sob, soh, sos, stable, slse, part_ptr,
    N_REP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_N: tl.constexpr,
    KV_FP8: tl.constexpr, DT: tl.constexpr, HW_CAST: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    VARLEN: tl.constexpr = False, WRITE_LSE: tl.constexpr = False, SPLIT_OUT: tl.constexpr = False,
    LEAD_SCAN: tl.constexpr = 1024,
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
    # The keys come in chunks of SPLIT_N from `lead`, merged in order as they end (grid axis 2: one program). With
    # SPLIT_OUT (a decode step; grid axis 2: one program a chunk) the program's chunk state goes to part_ptr, float32
    # [splits, B * S_q * H, D] outputs then [splits, B * S_q * H, 2] (max, sum), which `_merge_splits_kernel`
    # merges in the same order.
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
    qt = tl.trans(q)  # [D, BM]
    if SPLIT_OUT:  # this program's chunk only
        m_i, l_i, acc = _chunk(
            lead + tl.program_id(2) * SPLIT_N, hi, qt, qcol, valid_row, table_row, k_base, v_base, skb, sks, svb, svs,
            k_scale, v_scale, dims, sm_scale, SPLIT_N, BLOCK_M, BLOCK_N, D, KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN,
        )  # fmt: skip
        entries = tl.num_programs(0) * N_REP * S_q  # (row, query, head) entries of one chunk: B * S_q * H
        entry = tl.program_id(2) * entries + (b64 * S_q + s_idx) * (kv_heads * N_REP) + head  # [BM]
        tl.store(part_ptr + entry[:, None] * D + dims[None, :], tl.trans(acc), mask=row_ok[:, None])
        ml_ptr = part_ptr + tl.num_programs(2) * entries.to(tl.int64) * D  # then [splits, entries, 2]: max, sum
        tl.store(ml_ptr + 2 * entry, m_i, mask=row_ok)
        tl.store(ml_ptr + 2 * entry + 1, l_i, mask=row_ok)
    else:
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # the merged chunks' max, sum and output [D, BM]
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)
        for c0 in range(lead, hi, SPLIT_N):
            m_c, l_c, acc_c = _chunk(
                c0, hi, qt, qcol, valid_row, table_row, k_base, v_base, skb, sks, svb, svs, k_scale, v_scale, dims,
                sm_scale, SPLIT_N, BLOCK_M, BLOCK_N, D, KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN,
            )  # fmt: skip
            m_i, a, w = _merge_weights(m_i, m_c)
            l_i = _merged(l_i, a, l_c, w, HW_CAST)
            a, w = tl.broadcast_to(a[None, :], (D, BLOCK_M)), tl.broadcast_to(w[None, :], (D, BLOCK_M))
            acc = _merged(acc, a, acc_c, w, HW_CAST)
        out = tl.trans(acc / tl.maximum(l_i, 1e-30)[None, :])  # [BM, D]; a row that may see no key gives 0
        o_ptrs = out_ptr + b64 * sob + head[:, None].to(tl.int64) * soh + s_idx[:, None].to(tl.int64) * sos
        tl.store(o_ptrs + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        if WRITE_LSE:
            lse = tl.where(l_i > 0, m_i + tl.log(tl.maximum(l_i, 1e-30)), float("inf"))  # [BM]
            tl.store(lse_ptr + head.to(tl.int64) * slse + row0 + s_idx, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(part_ptr, out_ptr, splits, S_q, heads, sob, soh, sos, D: tl.constexpr, HW: tl.constexpr):
    # grid (B * S_q * H,): entry (b * S_q + s) * H + head; its chunk states merged in order as the trainer's program
    # merges them, the output written to out [B, S_q, H, D] (strides sob / sos / soh)
    entry = tl.program_id(0).to(tl.int64)
    entries = tl.num_programs(0).to(tl.int64)
    dims = tl.arange(0, D)
    ml_ptr = part_ptr + splits * entries * D
    m_i = tl.full([D], -1.0e30, dtype=tl.float32)  # the max and the sum broadcast over the head dim
    l_i = tl.zeros([D], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    for j in range(0, splits):
        at = j * entries + entry
        m_c = tl.load(ml_ptr + 2 * at + dims * 0)
        l_c = tl.load(ml_ptr + 2 * at + 1 + dims * 0)
        m_i, a, w = _merge_weights(m_i, m_c)
        l_i = _merged(l_i, a, l_c, w, HW)
        acc = _merged(acc, a, tl.load(part_ptr + at * D + dims), w, HW)
    b = entry // (S_q * heads)
    s = entry // heads % S_q
    o_ptrs = out_ptr + b * sob + s * sos + (entry % heads) * soh + dims
    tl.store(o_ptrs, (acc / tl.maximum(l_i, 1e-30)).to(out_ptr.dtype.element_ty))


def attention(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale=None, v_scale=None,
              config: tuple[int, int, int] | None = None, lse: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """See `batch_invariant_attention.attention`; q_start: an int64 tensor, 0-dim or [B]. config: (query rows per
    program, warps, pipeline stages), default `decode_config` for one query per row, else TRAIN_CONFIG;
    the GPU tests check which configs give the default's bits. lse: a float32 [H, B * S_q] the kernel fills with
    each query's log-sum-exp (row b * S_q + s; the trainer's forward, `batch_invariant_train`). A decode step
    (one query per row, no lse) runs its keys' chunks in parallel programs (`_run_chunks`)."""
    bsz, heads, s_q, dim = q.shape
    _, kv_heads, s_k, _ = k_buf.shape
    keys = s_k if s_q == 1 and lse is None else 0  # a decode step's keys, which `_run_chunks` splits into chunks
    block_m, warps, stages = config or (decode_config(q.dtype) if s_q == 1 else TRAIN_CONFIG)
    maxnreg = decode_maxnreg(q.dtype) if s_q == 1 else None
    is_fp8 = k_buf.dtype == torch.float8_e4m3fn
    out = torch.empty((bsz, s_q, heads, dim), dtype=q.dtype, device=q.device)  # [B, S_q, H, D]
    ones = q_start  # any pointer fills the scale slots of a high-precision cache (never read)

    def launch(grid, part, split_out):
        _attention_kernel[grid](
            q, k_buf, v_buf, key_valid, q_start, k_scale if is_fp8 else ones, v_scale if is_fp8 else ones, out,
            ones, ones if lse is None else lse, ones, s_q, s_k, kv_heads, float(sm_scale),
            *q.stride()[:3], *k_buf.stride()[:3], *v_buf.stride()[:3], key_valid.stride(0),
            0 if q_start.dim() == 0 else q_start.stride(0), out.stride(0), out.stride(2), out.stride(1), 0,
            0 if lse is None else lse.stride(0), part,
            N_REP=heads // kv_heads, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, SPLIT_N=ATTN_SPLIT_KEYS,
            KV_FP8=is_fp8, DT=_TL_DTYPES[q.dtype], HW_CAST=_on_hardware(), PAGE=1, PAGED=False,
            WRITE_LSE=lse is not None, SPLIT_OUT=split_out, num_warps=warps, num_stages=stages, maxnreg=maxnreg,
        )  # fmt: skip

    with on_device(q):
        _run_chunks(launch, out, kv_heads, block_m, keys)
    return out.transpose(1, 2)  # [B, H, S_q, D]


def padded_train_attention(q, k, v, key_valid, sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's forward over padded rows, q [B, H, S, D] over its own keys k / v [B, H_kv, S, D] and key_valid:
    `attention` with every query at its own column. Returns (out [B, H, S, D], lse float32 [H, B * S])."""
    bsz, heads, seq, _ = q.shape
    lse = torch.empty((heads, bsz * seq), dtype=torch.float32, device=q.device)  # [H, B * S]
    zero = torch.zeros((), dtype=torch.int64, device=q.device)  # no host -> device copy (capturable)
    return attention(q, k, v, key_valid, zero, sm_scale, lse=lse), lse


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
            lse.stride(0), zero,
            N_REP=n_rep, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, SPLIT_N=ATTN_SPLIT_KEYS, KV_FP8=False,
            DT=_TL_DTYPES[q.dtype], HW_CAST=_on_hardware(), PAGE=1, PAGED=False, VARLEN=True, WRITE_LSE=True,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return out.transpose(1, 2), lse  # [1, H, T, D], [H, T]


def paged_attention(q, k_pool, v_pool, block_table, kv_len, sm_scale, k_scale=None, v_scale=None,
                    config: tuple[int, int, int] | None = None) -> torch.Tensor:  # fmt: skip
    """See `batch_invariant_attention.paged_attention`: the decode step of `attention` (same kernel, same
    query tile, same key-block order and chunks; its own pipeline depth) with K/V read in place through block_table int32
    [B, max_blocks] from one layer's pools [num_blocks, H_kv, page, D]; kv_len int64 [B]. config: as `attention`'s
    (default `decode_config(q.dtype, paged=True)`)."""
    bsz, heads, s_q, dim = q.shape
    _, kv_heads, page, _ = k_pool.shape
    block_m, warps, stages = config or decode_config(q.dtype, paged=True)
    is_fp8 = k_pool.dtype == torch.float8_e4m3fn
    out = torch.empty((bsz, s_q, heads, dim), dtype=q.dtype, device=q.device)  # [B, 1, H, D]
    q_start = kv_len - 1  # [B] the query's column: the row's last key
    width = block_table.shape[1] * page  # the most keys a row may hold

    def launch(grid, part, split_out):
        _attention_kernel[grid](
            q, k_pool, v_pool, block_table, q_start, k_scale if is_fp8 else kv_len, v_scale if is_fp8 else kv_len,
            out, block_table, kv_len, kv_len, s_q, width, kv_heads, float(sm_scale),
            *q.stride()[:3], *k_pool.stride()[:3], *v_pool.stride()[:3], 0,
            q_start.stride(0), out.stride(0), out.stride(2), out.stride(1), block_table.stride(0), 0, part,
            N_REP=heads // kv_heads, D=dim, BLOCK_M=block_m, BLOCK_N=ATTN_BLOCK_N, SPLIT_N=ATTN_SPLIT_KEYS,
            KV_FP8=is_fp8, DT=_TL_DTYPES[q.dtype], HW_CAST=_on_hardware(), PAGE=page, PAGED=True,
            SPLIT_OUT=split_out, num_warps=warps, num_stages=stages, maxnreg=decode_maxnreg(q.dtype),
        )  # fmt: skip

    with on_device(q):
        _run_chunks(launch, out, kv_heads, block_m, width)
    return out.transpose(1, 2)  # [B, H, 1, D]


def _on_hardware() -> bool:
    """The kernels run compiled (not in Triton's CPU interpreter, which has no inline assembly)."""
    return os.environ.get("TRITON_INTERPRET") != "1"


def _run_chunks(launch, out: torch.Tensor, kv_heads: int, block_m: int, keys: int) -> None:
    """Run `launch(grid, part, split_out)` for out [B, S_q, H, D]: with `keys` > ATTN_SPLIT_KEYS (a decode step's
    widest row) one program a chunk of ATTN_SPLIT_KEYS keys, their states in `part` merged by
    `_merge_splits_kernel` (flash decoding, the trainer's bits); else (keys 0: prefill and training) one program
    over all chunks of its rows."""
    bsz, s_q, heads, dim = out.shape
    tiles = (bsz * kv_heads, triton.cdiv(s_q * (heads // kv_heads), block_m))
    splits = triton.cdiv(keys, ATTN_SPLIT_KEYS)
    if splits <= 1:
        launch((*tiles, 1), out, False)  # part unused
        return
    part = torch.empty(splits * bsz * s_q * heads * (dim + 2), dtype=torch.float32, device=out.device)
    launch((*tiles, splits), part, True)
    merge_chunks(part, out, splits)


def merge_chunks(part: torch.Tensor, out: torch.Tensor, splits: int) -> None:
    """`_merge_splits_kernel` over the chunk states part (float32 [splits, B * S_q * H, D] outputs, then
    [splits, B * S_q * H, 2] max and sum) into out [B, S_q, H, D]."""
    bsz, s_q, heads, dim = out.shape
    _merge_splits_kernel[(bsz * s_q * heads,)](
        part, out, splits, s_q, heads, out.stride(0), out.stride(2), out.stride(1), D=dim, HW=_on_hardware(),
        num_warps=1,
    )  # fmt: skip
