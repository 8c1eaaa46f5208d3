"""The exact attention's forward over the trainer's own keys (no cache; `batch_invariant_train`) as a hand-written
CUDA kernel (sm_90, NVRTC at first use): the bits of `batch_invariant_kernels`' Triton kernel in its training
configuration, padded rows or one packed row, with each query's log-sum-exp for the backward.

The Triton kernel computes the keys-as-rows products S^T = K . Q^T and O^T = V^T . P^T. This kernel computes the same
products with the queries as the MMA's rows, S = Q . K^T and O = P . V, flash-attention style: a warp owns 16 query
rows and every key of a block, so the block max stays in a warp and P stays in registers. Each score and output
element is still one chain of 16-wide bf16 MMA steps in the Triton kernel's order (over the head dim from zero; over
a block's keys from the rescaled accumulator). That an MMA gives the same bits with its operands' roles swapped,
and that `mma.sync` gives wgmma's, are properties of the GPU: `exact_cuda_choice` compares this kernel with the
Triton kernel on this device before it serves. The rest repeats the Triton kernel's arithmetic as
`exact_decode_cuda` does (its docstring), plus the training configuration's own steps:
- each key slot's running sum, summed once a 1,024-key chunk ends in the Triton reduction's tree: slots (k, k + 8),
  then k's bits 2, 1, 0, then the 16-key groups as (0 + 2) + (1 + 3);
- the chunks merged in order as they end: x_run * a + x_chunk * w, each product rounded on its own;
- the output acc / max(sum, 1e-30) by `div.full.f32`; the log-sum-exp max + log(sum) (+inf for a query that sees
  no key), which only the backward reads.

CTA: (row or segment, KV head, 64 query rows), 4 warps. A query row r of the tile is query position r // n_rep of head
KV head x n_rep + r % n_rep, as in the Triton kernel. K/V tiles of 64 keys arrive by cp.async in 2 stages, their
16-byte chunks XOR-swizzled by key; the merged chunks' output waits in shared memory while the next chunk runs.
Imported on CUDA only (it imports the Triton kernels).
"""

from __future__ import annotations

import functools

import torch

from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.models.exact_decode_cuda import CUDA_HELPERS, HEAD_DIM, device_problem, load_kernel

BLOCK_M = 64  # query rows a CTA (the Triton tile's; any tiling gives the same bits)
BLOCK_N = 64  # keys per online-softmax block the source is written for (the Triton kernel's ATTN_BLOCK_N)
STAGE_BYTES = 2 * BLOCK_N * HEAD_DIM * 2  # a block's K and V tiles, bf16
STAGES = 2

_SOURCE = r"""
#define SPLIT __SPLIT__
#define STAGES __STAGES__
#define STAGE_BYTES __STAGE_BYTES__

__device__ __forceinline__ void ldsm4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ float div_full(float x, float y) {
    float r; asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y)); return r;
}
// byte offset of 16-byte chunk ch of row r in a [rows][256 B] tile: chunks XOR-swizzled by the row
__device__ __forceinline__ u32 swz(int r, int ch) { return r * 256 + ((ch ^ (r & 7)) << 4); }

// a block's K and V tiles [64 keys][128 dims] bf16 into a stage; keys at or past hi are zero
__device__ __forceinline__ void load_kv(u32 st, const u16* kb, const u16* vb, long long sks, long long svs,
                                        int start, int hi) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int id = threadIdx.x + 128 * i, key = id >> 4, ch = id & 15, col = start + key;
        const bool ok = col < hi;
        const u32 so = swz(key, ch);
        cp16(st + so, kb + (ok ? col * sks : 0) + 8 * ch, ok ? 16 : 0);
        cp16(st + 16384 + so, vb + (ok ? col * svs : 0) + 8 * ch, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
}

// One block's online-softmax step for a thread's rows g, g + 8 (scores s [key n-tile][..], in place): the scaled,
// masked scores, the block max over the quad, alpha, P (bf16 pairs, pf) and the per-slot sums ls. FULL: every key
// of the block is allowed for every row (no mask: the same bits, fewer instructions).
template <bool FULL>
__device__ __forceinline__ void softmax_block(float (&s)[8][4], float (&ls)[8][4], u32 (&pf)[8][2], float (&m)[2],
                                              float (&alpha)[2], unsigned long long kmask, int start, int qa, int qb,
                                              float sm_scale, int c) {
    float mx[2] = {NEG_INF, NEG_INF};
    bool ok[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int kk = 8 * j + 2 * c + (e & 1);
            ok[j][e] = FULL || (((kmask >> kk) & 1ull) && start + kk <= (e < 2 ? qa : qb));
            s[j][e] = ok[j][e] ? __fmul_rn(s[j][e], sm_scale) : NEG_INF;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h]);
        alpha[h] = m_new == m[h] ? 1.0f : ex2_diff(m[h], m_new);
        m[h] = m_new;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            p[e] = ok[j][e] ? ex2_diff(s[j][e], m[e >> 1]) : 0.0f;
            ls[j][e] = __fmaf_rn(ls[j][e], alpha[e >> 1], p[e]);
        }
        pf[j][0] = pack_bf16(p[0], p[1]);
        pf[j][1] = pack_bf16(p[2], p[3]);
    }
}

extern "C" __global__ void __launch_bounds__(128, 2) exact_train_fwd(
    const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v, const u8* __restrict__ valid,
    const int* __restrict__ cu, u16* __restrict__ out, float* __restrict__ lse, int S_q, int kv_heads, int n_rep,
    double sm_scale_d, int sqb_, int sqh_, int sqs_, int skb_, int skh_, int sks_, int svb_, int svh_, int svs_,
    int svalb_, int sob_, int soh_, int sos_, int slse_, int varlen) {  // strides in elements (the launch's ints)
    const long long sqb = sqb_, sqh = sqh_, sqs = sqs_, skb = skb_, skh = skh_, sks = sks_, svb = svb_, svh = svh_,
                    svs = svs_, svalb = svalb_, sob = sob_, soh = soh_, sos = sos_, slse = slse_;
    extern __shared__ __align__(128) u8 smem[];  // STAGES x (K, V) tiles; Q tile, then the merged output [64][128]
    float* run = (float*)(smem + STAGES * STAGE_BYTES);
    int* lead_s = (int*)(smem + STAGES * STAGE_BYTES + 32768);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int b = blockIdx.x / kv_heads, hk = blockIdx.x % kv_heads;
    const int tile = gridDim.y - 1 - blockIdx.y;  // the longest tiles first
    long long row0 = (long long)b * S_q, boff = b;  // lse row of query 0; the row's offset in q / k / v / out
    if (varlen) {
        row0 = cu[b];
        S_q = cu[b + 1] - (int)row0;
        boff = 0;
        q += row0 * sqs; k += row0 * sks; v += row0 * svs; out += row0 * sos;
    }
    if (tile * 64 >= S_q * n_rep) return;
    const int last_s = min((tile * 64 + 63) / n_rep, S_q - 1), hi = last_s + 1;
    const u8* vrow = valid + boff * svalb;
    int lead = 0;
    if (!varlen) lead = first_valid(vrow, hi, lead_s);  // the row's first valid key before the tile's end
    const float sm_scale = (float)sm_scale_d;
    const u16* kb = k + boff * skb + hk * skh;
    const u16* vb = v + boff * svb + hk * svh;
    const u32 sbase = smem_addr(smem), qs = smem_addr(run);
    const int nblk = hi > lead ? (hi - lead + 63) / 64 : 0;
    if (nblk > 0) load_kv(sbase, kb, vb, sks, svs, lead, hi);
    // the Q tile [64 rows][128 dims] into shared memory, then this warp's 16 rows into registers (A operand)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int id = tid + 128 * i, r = id >> 4, ch = id & 15, tr = tile * 64 + r, s = tr / n_rep;
        const bool ok = s < S_q;
        const u16* src = q + boff * sqb + (long long)(hk * n_rep + tr % n_rep) * sqh + (ok ? (long long)s * sqs : 0);
        cp16(qs + swz(r, ch), src + 8 * ch, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    u32 qf[8][4];
    {
        const int mi = lane >> 3, r = 16 * warp + (lane & 7) + 8 * (mi & 1);
#pragma unroll
        for (int t = 0; t < 8; ++t) ldsm4(qs + swz(r, 2 * t + (mi >> 1)), qf[t][0], qf[t][1], qf[t][2], qf[t][3]);
    }
    __syncthreads();  // the Q tile's space becomes the merged output's
    const int ra = tile * 64 + 16 * warp + g, rb = ra + 8;  // this thread's query rows
    const int qa = ra / n_rep, qb = rb / n_rep;            // their query positions (= their key columns)
    const int qmin = (tile * 64 + 16 * warp) / n_rep;       // the warp's first query position

    float m[2] = {-1.0e30f, -1.0e30f}, mr[2] = {-1.0e30f, -1.0e30f}, lr[2] = {0.f, 0.f};
    float ls[8][4], acc[16][4];  // per key slot sums [key n-tile][..]; output [dim n-tile][..]: rows g, g + 8
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) ls[j][e] = 0.f;
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int i = 0; i < nblk; ++i) {
        asm volatile("cp.async.wait_group 0;");
        __syncthreads();  // block i is in; every warp is done with block i - 1's stage
        if (i + 1 < nblk) load_kv(sbase + ((i + 1) % STAGES) * STAGE_BYTES, kb, vb, sks, svs, lead + 64 * (i + 1), hi);
        const u32 ks = sbase + (i % STAGES) * STAGE_BYTES, vs = ks + 16384;
        const int start = lead + 64 * i;
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
        const int mi = lane >> 3;
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                u32 b0, b1, b2, b3;
                ldsm4(ks + swz(16 * jj + (lane & 7) + 8 * (mi >> 1), 2 * t + (mi & 1)), b0, b1, b2, b3);
                mma(s[2 * jj], qf[t][0], qf[t][1], qf[t][2], qf[t][3], b0, b1);
                mma(s[2 * jj + 1], qf[t][0], qf[t][1], qf[t][2], qf[t][3], b2, b3);
            }
        // the block's keys a row may see by range and mask: bit kk for key start + kk, the same in every lane
        unsigned long long kmask;
        if (varlen) {
            kmask = hi - start >= 64 ? ~0ull : (1ull << (hi - start)) - 1;
        } else {
            const bool v0 = start + lane < hi && vrow[start + lane] != 0;
            const bool v1 = start + 32 + lane < hi && vrow[start + 32 + lane] != 0;
            kmask = (unsigned long long)__ballot_sync(~0u, v0) | (unsigned long long)__ballot_sync(~0u, v1) << 32;
        }
        float alpha[2];
        u32 pf[8][2];  // P in bf16, the A operand of P . V: [key n-tile][row g, row g + 8]
        if (kmask == ~0ull && start + 63 <= qmin)  // every key of the block for every row of the warp: no mask
            softmax_block<true>(s, ls, pf, m, alpha, kmask, start, qa, qb, sm_scale, c);
        else
            softmax_block<false>(s, ls, pf, m, alpha, kmask, start, qa, qb, sm_scale, c);
        if (!__all_sync(~0u, alpha[0] == 1.0f && alpha[1] == 1.0f))  // x * 1 is x: no rescale changes no bit
#pragma unroll
            for (int n = 0; n < 16; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] = __fmul_rn(acc[n][e], alpha[e >> 1]);
#pragma unroll
        for (int t = 0; t < 4; ++t)  // the block's 16-key steps, in key order
#pragma unroll
            for (int nn = 0; nn < 8; ++nn) {
                u32 b0, b1, b2, b3;
                ldsm4t(vs + swz(16 * t + (lane & 7) + 8 * (mi & 1), 2 * nn + (mi >> 1)), b0, b1, b2, b3);
                mma(acc[2 * nn], pf[2 * t][0], pf[2 * t][1], pf[2 * t + 1][0], pf[2 * t + 1][1], b0, b1);
                mma(acc[2 * nn + 1], pf[2 * t][0], pf[2 * t][1], pf[2 * t + 1][0], pf[2 * t + 1][1], b2, b3);
            }
        if ((i + 1) % (SPLIT / 64) != 0 && i + 1 < nblk) continue;
        // the chunk ends: its sum over the 64 key slots (slot 16w + 8h + 2c + e of n-tile j = 2w + h) in the
        // Triton tree, then merged into the running state
        const bool first = i < SPLIT / 64, last = i + 1 == nblk;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l4[4];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                float l3[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float x = __fadd_rn(ls[2 * w][2 * h + e], ls[2 * w + 1][2 * h + e]);
                    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
                    l3[e] = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
                }
                l4[w] = __fadd_rn(l3[0], l3[1]);
            }
            const float lc = __fadd_rn(__fadd_rn(l4[0], l4[2]), __fadd_rn(l4[1], l4[3]));
            const float m_new = fmaxf(mr[h], m[h]);
            const float a = m_new == mr[h] ? 1.0f : ex2_diff(mr[h], m_new);
            const float w = m_new == m[h] ? 1.0f : ex2_diff(m[h], m_new);
            lr[h] = __fadd_rn(__fmul_rn(lr[h], a), __fmul_rn(lc, w));
            mr[h] = m_new;
#pragma unroll
            for (int n = 0; n < 16; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float* slot = run + (n * 4 + 2 * h + e) * 128 + tid;
                    const float x = __fadd_rn(__fmul_rn(first ? 0.0f : *slot, a), __fmul_rn(acc[n][2 * h + e], w));
                    if (last) acc[n][2 * h + e] = x;
                    else { *slot = x; acc[n][2 * h + e] = 0.f; }
                }
            m[h] = -1.0e30f;
        }
        if (!last)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) ls[j][e] = 0.f;
    }
    // the output acc / max(sum, 1e-30) and the log-sum-exp (+inf where a query sees no key)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = h ? rb : ra, s = r / n_rep, head = hk * n_rep + r % n_rep;
        if (s >= S_q) continue;
        const float den = fmaxf(lr[h], 1.0e-30f);
        u16* o = out + boff * sob + (long long)s * sos + (long long)head * soh + 2 * c;
#pragma unroll
        for (int n = 0; n < 16; ++n)
            *(u32*)(o + 8 * n) = pack_bf16(div_full(acc[n][2 * h], den), div_full(acc[n][2 * h + 1], den));
        if (c == 0)
            lse[(long long)head * slse + row0 + s] = lr[h] > 0.f ? __fadd_rn(mr[h], logf(den)) : __int_as_float(0x7f800000);
    }
}
"""


def kernel_source(split: int | None = None, stages: int = STAGES) -> str:
    """The CUDA source; keys per chunk default the Triton kernel's `ATTN_SPLIT_KEYS` (read at each launch)."""
    split = K.ATTN_SPLIT_KEYS if split is None else split
    body = _SOURCE.replace("__SPLIT__", str(split)).replace("__STAGES__", str(stages))
    return CUDA_HELPERS + body.replace("__STAGE_BYTES__", str(STAGE_BYTES))


def shared_bytes(stages: int = STAGES) -> int:
    """Dynamic shared memory of a CTA: the K/V stages, the Q tile / merged output (64 x 128 float32), the lead."""
    return stages * STAGE_BYTES + BLOCK_M * HEAD_DIM * 4 + 16


@functools.cache
def _compiled(split: int, stages: int, device: int):
    """The kernel loaded on `device` (a module is per device context)."""
    return load_kernel(kernel_source(split, stages), "exact_train_fwd", shared_bytes(stages), device)


def kernel_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor | None = None) -> str | None:
    """Why this kernel cannot run the trainer's forward (None: it can): bf16 q / k / v on a CUDA sm_90 device, head
    dim 128 contiguous with 16-byte aligned rows, whole query heads a KV head, keys per chunk a multiple of 64; a key
    mask (padded rows) bool with contiguous columns."""
    if (problem := device_problem(q)) is not None:
        return problem
    if key_valid is not None and (key_valid.dtype != torch.bool or key_valid.stride(-1) != 1):
        return "needs a bool key mask with contiguous columns"
    if K.ATTN_BLOCK_N != BLOCK_N or K.ATTN_SPLIT_KEYS % BLOCK_N:
        return f"written for {BLOCK_N}-key blocks and chunks of whole blocks"
    if any(t.dtype != torch.bfloat16 for t in (q, k, v)) or q.shape[-1] != HEAD_DIM:
        return f"needs bf16 queries, keys and values of head dim {HEAD_DIM}"
    if q.shape[1] % k.shape[1] or any(t.stride(-1) != 1 or t.data_ptr() % 16 for t in (q, k, v)):
        return "needs whole query heads a KV head and 16-byte aligned, contiguous head dims"
    if any(s % 8 for t in (q, k, v) for s in t.stride()[:3]):
        return "needs 16-byte aligned rows"
    if max(*q.stride(), *k.stride(), *v.stride(), q.numel() // q.shape[-1]) >= 2**31:
        return "needs strides that fit a 32-bit int (the launch passes them as int)"
    return None


def forward(q, k, v, key_valid: torch.Tensor | None, cu_seqlens: torch.Tensor | None, max_seqlen: int,
            sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The trainer's exact forward: (out [B, H, S, D], lse float32 [H, B * S]). Padded rows: q [B, H, S, D],
    k / v [B, H_kv, S, D], key_valid bool [B, >= S] (cu_seqlens None); one packed row: q [1, H, T, D], segments
    cu_seqlens int32 [n + 1] of at most max_seqlen tokens (key_valid None). Query s sees keys 0..s of its row or
    segment that are valid; lse row b * S + s (packed: the token's slot)."""
    bsz, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    n_rep = heads // kv_heads
    varlen = cu_seqlens is not None
    out = torch.empty((bsz, seq, heads, dim), dtype=q.dtype, device=q.device)  # [B, S, H, D]
    lse = torch.empty((heads, bsz * seq), dtype=torch.float32, device=q.device)  # [H, B * S]
    rows = cu_seqlens.numel() - 1 if varlen else bsz
    longest = max_seqlen if varlen else seq
    valid = q if varlen else key_valid.view(torch.uint8)  # any pointer where no mask is read
    grid = (rows * kv_heads, max(1, -(-longest * n_rep // BLOCK_M)), 1)
    with torch.cuda.device(q.device):
        _compiled(K.ATTN_SPLIT_KEYS, STAGES, q.device.index)(
            grid=grid,
            block=(128, 1, 1),
            args=[
                q, k, v, valid, cu_seqlens if varlen else q, out, lse, seq, kv_heads, n_rep, float(sm_scale),
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], 0 if varlen else key_valid.stride(0),
                out.stride(0), out.stride(2), out.stride(1), lse.stride(0), int(varlen),
            ],
            shared_mem=shared_bytes(),
        )  # fmt: skip
    return out.transpose(1, 2), lse
