"""Decode attention that reads the KV cache as stored (bf16, or e4m3 + per-layer scale): one query token per sequence.

`decode_attention(q, k_buf, v_buf, key_valid, kv_len, ...)` is a flash-decoding kernel (Triton, CUDA): each program
takes one (sequence, KV head) pair and one split of the keys, loads K/V tiles straight from the cache (FP8 tiles are
widened to fp16 in registers, exactly; the per-layer scales multiply the scores and the output), runs an online
softmax, and a second kernel merges the splits. No dequantized copy of the cache is ever written, so an FP8 cache
moves half the bytes of a bf16 one. GQA: the n_rep query heads of a KV head share its K/V loads. Where it fits
(e4m3 cache, bf16 queries, head_dim 128, sm_89+), the e4m3 cache is read by the hand-written CUDA kernel in
`fp8_decode_cuda.py` instead (same math and contract, faster: docs/performance_history.md, "Decode attention").

The number of keys `kv_len` is read from device memory, so a CUDA graph captured once over the whole buffer still
only reads the written prefix at every step. `decode_attention_ref` is the plain-torch reference (any device).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from nemo_jetrl.generation.native import fp8_decode_cuda
from nemo_jetrl.precision.kv import kv_dequant

FP8 = torch.float8_e4m3fn
DOT_FP32, DOT_BF16, DOT_FP16 = 0, 1, 2


@functools.cache
def triton_decode_available() -> bool:
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def decode_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    key_valid: torch.Tensor,
    kv_len: int,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference: q [B, H, D]; k_buf/v_buf [B, H_kv, S, D]; key_valid [B, S] bool. Returns [B, H, D] in q.dtype."""
    k = k_buf[:, :, :kv_len]
    v = v_buf[:, :, :kv_len]
    if k.dtype == FP8:
        k, v = kv_dequant(k, k_scale, torch.float32), kv_dequant(v, v_scale, torch.float32)
    n_rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(n_rep, dim=1)  # [B, H, S, D]
    v = v.float().repeat_interleave(n_rep, dim=1)
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), k) * sm_scale  # [B, H, S]
    scores = scores.masked_fill(~key_valid[:, None, :kv_len], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v).to(q.dtype)


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    key_valid: torch.Tensor,
    kv_len: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
    impl: str = "auto",
    cuda_config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Decode attention on the GPU. q [B, H, D]; k_buf/v_buf [B, H_kv, S_max, D] (strided views of the cache are
    fine, last dim contiguous); key_valid [B, >= S_max] bool (1 = attend); kv_len: int64 device tensor, 0-dim (all
    rows) or [B] (per row, continuous batching), keys [0, kv_len) are read; FP8 buffers need k_scale/v_scale (0-dim fp32). Returns [B, H, D] in q.dtype.

    Paged (`block_table` int32 [B, max_blocks]): k_buf/v_buf are one layer's block pool [num_blocks, H_kv, page, D]
    and row b's key j lies in block block_table[b, j // page] at offset j % page, read in place; key_valid may be
    None (every key below kv_len is attended), S_max = max_blocks * page.

    impl: "triton" (any cache), "cuda" (the hand-written e4m3-cache kernel, `fp8_decode_cuda.py`), or "auto": the
    CUDA kernel wherever it fits, Triton elsewhere. cuda_config: the CUDA kernel's (warps per CTA, CTAs per
    multiprocessor its registers must allow), which also sets its default split count; None:
    `fp8_decode_cuda.default_config(S_max)`."""
    import triton

    bsz, heads, dim = q.shape
    _, kv_heads, s_max, _ = k_buf.shape
    page = 0
    if block_table is not None:
        page, s_max = s_max, block_table.shape[1] * s_max
        check_block_table(block_table, bsz)
    if heads % kv_heads or k_buf.shape != v_buf.shape or k_buf.shape[-1] != dim or (not page and k_buf.shape[0] != bsz):
        raise ValueError(f"decode_attention: q {tuple(q.shape)} does not fit k/v {tuple(k_buf.shape)}")
    if key_valid is None and not page:
        raise ValueError("decode_attention: key_valid may be None only with a block_table")
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"decode_attention: head_dim must be a power of two >= 16, got {dim}")
    if k_buf.stride(-1) != 1 or v_buf.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode_attention: the head dim of q, k and v must be contiguous")
    is_fp8 = k_buf.dtype == FP8
    if is_fp8 and (k_scale is None or v_scale is None):
        raise ValueError("decode_attention: an FP8 cache needs k_scale and v_scale")
    slen = kv_len_stride(kv_len, bsz)
    n_rep = heads // kv_heads
    if impl not in ("auto", "triton", "cuda"):
        raise ValueError(f"decode_attention: impl must be auto, triton or cuda, got {impl!r}")
    on_cuda_kernel = False
    if impl != "triton":
        problem = fp8_decode_cuda.cuda_kernel_problem(q, k_buf, v_buf, key_valid, n_rep, page)
        if impl == "cuda" and problem is not None:
            raise ValueError(f"decode_attention: the CUDA kernel {problem}")
        on_cuda_kernel = problem is None
    if on_cuda_kernel and cuda_config is None:
        cuda_config = fp8_decode_cuda.default_config(s_max)
    if num_splits is None and on_cuda_kernel:
        num_splits = fp8_decode_cuda.default_splits(q, kv_heads, s_max, min_blocks=cuda_config[1])
    elif num_splits is None:  # enough programs to fill the GPU, at least 256 keys per split
        num_splits = max(1, min(triton.cdiv(s_max, 256), triton.cdiv(4 * 132, bsz * kv_heads)))
    out = torch.empty_like(q)
    part_out = part_lse = None  # the CUDA kernel writes `out` itself when it runs one split
    if num_splits > 1 or not on_cuda_kernel:
        part_out = torch.empty(bsz, heads, num_splits, dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(bsz, heads, num_splits, dtype=torch.float32, device=q.device)
    if on_cuda_kernel:
        fp8_decode_cuda.launch(
            q, k_buf, v_buf, key_valid, kv_len, sm_scale, k_scale, v_scale, out, part_out, part_lse, slen=slen,
            block_table=block_table, s_max=s_max, num_warps=cuda_config[0], min_blocks=cuda_config[1],
        )  # fmt: skip
        if part_out is None:
            return out
    else:
        # Tensor-core dots in bf16 (bf16 cache) or fp16 (FP8 cache: e4m3 -> fp16 is one exact cvt); exact fp32
        # dots for fp32 queries and in the Triton CPU interpreter (which has no 16-bit dot).
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        dot = DOT_FP32 if q.dtype == torch.float32 or interpret else (DOT_FP16 if is_fp8 else DOT_BF16)
        tuning = {"BLOCK_N": 64} if interpret else {}  # on a GPU the kernel autotunes BLOCK_N / warps / stages
        ones = torch.ones((), dtype=torch.float32, device=q.device)
        table = block_table if page else kv_len  # any pointer fills the unused slots
        _decode_kernel[(bsz * kv_heads, num_splits)](
            q, k_buf, v_buf, kv_len if key_valid is None else key_valid, kv_len, k_scale if is_fp8 else ones,
            v_scale if is_fp8 else ones, part_out, part_lse, table, float(sm_scale), kv_heads, s_max,
            *q.stride()[:2], *k_buf.stride()[:3], *v_buf.stride()[:3], 0 if key_valid is None else key_valid.stride(0),
            slen, table.stride(0) if page else 0,
            N_REP=n_rep, R_PAD=max(16, triton.next_power_of_2(n_rep)), D=dim, NUM_SPLITS=num_splits, DOT=dot,
            PAGE=page, HAS_VALID=key_valid is not None, **tuning,
        )  # fmt: skip
    merge_splits(part_out, part_lse, out)
    return out


def kv_len_stride(kv_len: torch.Tensor, batch: int) -> int:
    """Element stride between rows' key counts: 0 for one 0-dim count shared by all rows, else that of kv_len [B]."""
    if kv_len.dtype != torch.int64 or kv_len.shape not in ((), (batch,)):
        raise ValueError(
            f"kv_len must be an int64 tensor of shape () or [B={batch}], got {kv_len.dtype} {kv_len.shape}"
        )
    return 0 if kv_len.dim() == 0 else kv_len.stride(0)


def check_block_table(block_table: torch.Tensor, batch: int) -> None:
    """A paged kernel's block table: int32 [B, max_blocks], unit stride along the blocks."""
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(
            f"block_table must be int32 [B={batch}, max_blocks], got {block_table.dtype} {tuple(block_table.shape)}"
        )
    if block_table.stride(1) != 1:
        raise ValueError("block_table must have unit stride along the blocks")


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Merge flash-decoding partials: part_out [B, H, splits, D] fp32, part_lse [B, H, splits] -> out [B, H, D]."""
    import triton

    bsz, heads, num_splits, dim = part_out.shape
    _merge_kernel[(bsz * heads,)](
        part_out, part_lse, out, heads, *out.stride()[:2], NUM_SPLITS=num_splits,
        S_PAD=max(2, triton.next_power_of_2(num_splits)), D=dim,
    )  # fmt: skip


def write_decode_kv(
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_len: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    *,
    block_table: torch.Tensor | None = None,
) -> None:
    """Store one new token per sequence at cache position kv_len - 1, K and V in one launch (Triton).
    Paged (`block_table` int32 [B, max_blocks]): k_buf/v_buf are a layer's block pool [num_blocks, H_kv, page, D]
    and position j of row b lies in block block_table[b, j // page] at offset j % page.

    k_buf/v_buf [B, H_kv, S_max, D] (one layer of the cache, last dim contiguous); k/v [B, H_kv, 1, D]; kv_len an
    int64 device tensor, 0-dim (one position for all rows) or [B] (each row's own). FP8 buffers get `clamp(x / scale, -448, 448)` rounded to e4m3 (bitwise
    `precision.kv.kv_quant`), other buffers `x.to(buffer dtype)`: what `KVCache.update` writes, in one kernel
    instead of ~10 small ones."""
    bsz, kv_heads, page, dim = k_buf.shape
    if block_table is not None:
        bsz = k.shape[0]
        check_block_table(block_table, bsz)
    else:
        page = 0
    if k.shape != (bsz, kv_heads, 1, dim) or v.shape != k.shape or v_buf.shape != k_buf.shape:
        raise ValueError(f"write_decode_kv: k/v {tuple(k.shape)} do not fit the cache {tuple(k_buf.shape)}")
    if dim & (dim - 1) or k.stride(-1) != 1 or v.stride(-1) != 1 or k_buf.stride() != v_buf.stride():
        raise ValueError("write_decode_kv: needs a power-of-two head dim, contiguous last dims, equal buffer strides")
    is_fp8 = k_buf.dtype == FP8
    if is_fp8 and (k_scale is None or v_scale is None):
        raise ValueError("write_decode_kv: an FP8 cache needs k_scale and v_scale")
    slen = kv_len_stride(kv_len, bsz)
    # the kernel reads the scales only for FP8 buffers: otherwise any pointer fills their slots
    table = kv_len if block_table is None else block_table
    _write_kernel[(bsz * kv_heads,)](
        k, v, k_buf, v_buf, kv_len, k_scale if is_fp8 else kv_len, v_scale if is_fp8 else kv_len, table, kv_heads,
        *k.stride()[:2], *v.stride()[:2], *k_buf.stride()[:3], slen, 0 if block_table is None else table.stride(0),
        D=dim, FP8=is_fp8, PAGE=page,
    )  # fmt: skip


def _define_kernels():
    import triton
    import triton.language as tl

    def autotuned(kernel):
        if os.environ.get("TRITON_INTERPRET") == "1":
            return kernel
        configs = [
            triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn in (64, 128)
            for w in (4, 8)
            for st in (2, 3)
        ]
        return triton.autotune(configs, key=["D", "N_REP", "NUM_SPLITS", "DOT"])(kernel)

    # s_max and the key mask's row stride (= s_max in the static path) follow each batch's longest prompt: left to
    # Triton's divisibility-by-16 specialization they recompiled the kernel in the steps where that class changed
    # (a 0.6 s graph-capture spike, BF16, docs/gpu_cli_run.md); they only bound and offset the mask's byte loads
    @autotuned
    @triton.jit(do_not_specialize=["s_max", "svalb"])
    def decode_kernel(
        q_ptr, k_ptr, v_ptr, valid_ptr, kv_len_ptr, k_scale_ptr, v_scale_ptr, out_ptr, lse_ptr, table_ptr,
        sm_scale, kv_heads, s_max,
        sqb, sqh, skb, skh, sks, svb, svh, svs, svalb, slen, stab,
        N_REP: tl.constexpr, R_PAD: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT: tl.constexpr,
        PAGE: tl.constexpr, HAS_VALID: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # PAGE > 0: k/v are block pools [blocks, H_kv, PAGE, D]; key j of row b in block table[b, j // PAGE]
        pid_bh = tl.program_id(0)
        split = tl.program_id(1)
        b = pid_bh // kv_heads
        hk = pid_bh % kv_heads
        rows = tl.arange(0, R_PAD)  # query heads hk*N_REP + rows
        dims = tl.arange(0, D)
        row_ok = rows < N_REP
        q = tl.load(q_ptr + b * sqb + (hk * N_REP + rows)[:, None] * sqh + dims[None, :], mask=row_ok[:, None])
        if DOT == 0:
            q = q.to(tl.float32)  # [R_PAD, D]
        elif DOT == 1:
            q = q.to(tl.bfloat16)
        else:
            q = q.to(tl.float16)
        kv_len = tl.minimum(tl.load(kv_len_ptr + b * slen).to(tl.int32), s_max)
        per_split = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(lo + per_split, kv_len)
        qk_scale = sm_scale * tl.load(k_scale_ptr)
        m_i = tl.full([R_PAD], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([R_PAD], dtype=tl.float32)
        acc = tl.zeros([R_PAD, D], dtype=tl.float32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            in_range = cols < hi
            if HAS_VALID:
                valid = (tl.load(valid_ptr + b * svalb + cols, mask=in_range, other=0) != 0) & in_range
            else:
                valid = in_range
            if PAGE > 0:
                blk = tl.load(table_ptr + b * stab + cols // PAGE, mask=in_range, other=0).to(tl.int64)  # [BLOCK_N]
                k_rows = k_ptr + blk * skb + hk * skh + (cols % PAGE) * sks
                v_rows = v_ptr + blk * svb + hk * svh + (cols % PAGE) * svs
            else:
                k_rows = k_ptr + b * skb + hk * skh + cols * sks
                v_rows = v_ptr + b * svb + hk * svh + cols * svs
            k = tl.load(k_rows[:, None] + dims[None, :], mask=in_range[:, None], other=0.0)
            if DOT == 0:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")  # [R_PAD, BLOCK_N]
            elif DOT == 1:
                s = tl.dot(q, tl.trans(k.to(tl.bfloat16)))
            else:
                s = tl.dot(q, tl.trans(k.to(tl.float16)))  # e4m3 -> fp16 is exact
            s = s * qk_scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_rows[:, None] + dims[None, :], mask=in_range[:, None], other=0.0)
            if DOT == 0:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            elif DOT == 1:
                pv = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))
            else:
                pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        acc = acc * tl.load(v_scale_ptr)
        heads = kv_heads * N_REP
        head = hk * N_REP + rows
        base = (b * heads + head) * NUM_SPLITS + split
        out = acc / tl.maximum(l_i, 1e-30)[:, None]
        tl.store(out_ptr + base[:, None] * D + dims[None, :], out, mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(lse_ptr + base, lse, mask=row_ok)

    @triton.jit
    def merge_kernel(
        part_ptr, lse_ptr, out_ptr, heads, sob, soh,
        NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        b = pid // heads
        h = pid % heads
        splits = tl.arange(0, S_PAD)
        dims = tl.arange(0, D)
        ok = splits < NUM_SPLITS
        lse = tl.load(lse_ptr + pid * NUM_SPLITS + splits, mask=ok, other=float("-inf"))
        m = tl.max(lse, axis=0)
        w = tl.where(ok, tl.exp(lse - m), 0.0)
        part = tl.load(part_ptr + (pid * NUM_SPLITS + splits)[:, None] * D + dims[None, :], mask=ok[:, None], other=0)
        out = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
        tl.store(out_ptr + b * sob + h * soh + dims, out.to(out_ptr.dtype.element_ty))

    global _to_e4m3  # a module global: Triton resolves a kernel's callees among its module's globals
    from nemo_jetrl.precision.kernels.triton_quant import _to_e4m3

    @triton.jit
    def write_kernel(
        k_ptr, v_ptr, kbuf_ptr, vbuf_ptr, kv_len_ptr, k_scale_ptr, v_scale_ptr, table_ptr, kv_heads,
        skb, skh, svb, svh, sbb, sbh, sbs, slen, stab,
        D: tl.constexpr, FP8: tl.constexpr, PAGE: tl.constexpr,
    ):  # fmt: skip
        # one program per (sequence, KV head): k/v [D] -> cache[b, h, kv_len - 1, :]
        pid = tl.program_id(0)
        b, h = pid // kv_heads, pid % kv_heads
        dims = tl.arange(0, D)
        pos = tl.load(kv_len_ptr + b * slen).to(tl.int64) - 1
        k = tl.load(k_ptr + b * skb + h * skh + dims)
        v = tl.load(v_ptr + b * svb + h * svh + dims)
        if FP8:
            k = _to_e4m3(k.to(tl.float32), tl.load(k_scale_ptr))
            v = _to_e4m3(v.to(tl.float32), tl.load(v_scale_ptr))
        if PAGE > 0:  # block pool [blocks, H_kv, PAGE, D]
            blk = tl.load(table_ptr + b * stab + pos // PAGE).to(tl.int64)
            dst = blk * sbb + h * sbh + (pos % PAGE) * sbs + dims
        else:
            dst = b.to(tl.int64) * sbb + h * sbh + pos * sbs + dims
        tl.store(kbuf_ptr + dst, k.to(kbuf_ptr.dtype.element_ty))
        tl.store(vbuf_ptr + dst, v.to(vbuf_ptr.dtype.element_ty))

    return decode_kernel, merge_kernel, write_kernel


class _LazyKernel:
    """Defers the `triton` import (and JIT definition) to the first launch: CPU-only installs never import it."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __getitem__(self, grid):
        return _kernels()[self.index][grid]


@functools.cache
def _kernels():
    return _define_kernels()


_decode_kernel = _LazyKernel(0)
_merge_kernel = _LazyKernel(1)
_write_kernel = _LazyKernel(2)
