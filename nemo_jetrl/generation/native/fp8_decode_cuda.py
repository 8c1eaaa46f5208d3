"""FP8-cache decode attention as a hand-written CUDA kernel (sm_89+, compiled at first use with NVRTC).

Same contract and math as the Triton kernel in `decode_attention.py` (twin: `decode_attention_ref`): K/V tiles
are read as stored (e4m3), widened to fp16 exactly, Q·K and P·V run as fp16 tensor-core MMAs with fp32
accumulation, the per-layer scales multiply the scores and the output, the softmax is online. What differs is
where the bytes go: Triton widens an FP8 tile in registers and then round-trips it through shared memory to reach
its MMA operand layout, which holds the e4m3 read well below the bf16 kernel's bandwidth (docs/
performance_history.md, "Decode attention"). Here every thread
loads, straight from HBM into registers, exactly the bytes its `mma.sync.m16n8k16` fragments need:

- Q·K^T (rows = the n_rep query heads of one KV head, padded to 16; cols = 16 keys; k = head dim). The head dim
  is permuted (the dot product does not care) so that a thread's K fragments for all 8 k-steps are 2 x 16
  contiguous bytes of one key: 4 lanes read 64 contiguous bytes, one `cvt.f16x2.e4m3x2` widens 2 values.
- P·V (k = the 16 keys): the scores' accumulator fragments are the A fragments of P as they lie (FlashAttention-2's
  register reuse); V fragments pair two keys of one dim, so a thread reads 16 contiguous bytes of 4 keys and
  `prmt` interleaves them before the widening cvt. Output dims come out permuted and are stored in place.

One CTA per (sequence, KV head, split of the keys); its warps take 16-key tiles round-robin, keep their own
online-softmax state and merge it through shared memory at the end. One split writes the bf16 output directly;
several write fp32 partials + LSE, which `decode_attention` merges. Needs head_dim 128, n_rep <= 8, bf16 queries.
`decode_attention(..., impl="auto"|"cuda")` is the entry point: it checks the arguments, allocates the outputs
and calls `launch` here.
"""

from __future__ import annotations

import functools

import torch

HEAD_DIM = 128

_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
#define NW __NW__
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ void ld16(const u8* p, u32* r) {  // 16 bytes, read once: bypass L1
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
}
__device__ __forceinline__ void widen4(u32 x, u32& lo, u32& hi) {  // 4 x e4m3 -> 2 x f16x2, exact
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;}"
        : "=r"(lo), "=r"(hi) : "r"(x));
}
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ float bf16_bits_to_f32(u32 bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
// D[16x8] += A[16x16] B[16x8]; A rows 8..15 are zero (at most 8 query heads), so only d0, d1 (row g) are kept
__device__ __forceinline__ void mma(float& d0, float& d1, u32 a0, u32 a2, u32 b0, u32 b1) {
    float z2, z3;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%12};"
                 : "=f"(d0), "=f"(d1), "=f"(z2), "=f"(z3)
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(d0), "f"(d1), "f"(0.0f));
}

struct Tile {        // one warp's share of 16 keys; thread (g = lane / 4, c = lane % 4)
    u32 k[2][2][4];  // [key 8j + g][dims 64h + 16c .. +15]
    u32 v[4][4];     // [key 2c, 2c+1, 2c+8, 2c+9][dims 16g .. +15]
};

// where chunk i (16 bytes) of this thread's share of the tile at key0 lies: K chunks 0..3, V chunks 4..7
__device__ __forceinline__ const u8* chunk(const u8* kb, const u8* vb, long long sks, long long svs, int key0,
                                           int last, int g, int c, int i) {
    if (i < 4) return kb + (long long)min(key0 + 8 * (i >> 1) + g, last) * sks + 64 * (i & 1) + 16 * c;
    const int off = 2 * c + (i & 1) + 8 * ((i - 4) >> 1);  // keys 2c, 2c+1, 2c+8, 2c+9
    return vb + (long long)min(key0 + off, last) * svs + 16 * g;
}
__device__ __forceinline__ u32* tile_word(Tile& t, int i) { return i < 4 ? t.k[i >> 1][i & 1] : t.v[i - 4]; }

extern "C" __global__ void __launch_bounds__(NW * 32, __MINB__) fp8_decode_attention(
    const u16* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ vc, const u8* __restrict__ valid,
    const long long* __restrict__ kv_len_ptr, const float* __restrict__ k_scale_ptr,
    const float* __restrict__ v_scale_ptr, float* __restrict__ part_out, float* __restrict__ part_lse,
    u16* __restrict__ out, double sm_scale, int kv_heads, int s_max, int n_rep, int num_splits,
    int sqb, int sqh, int skb, int skh, int sks, int svb, int svh, int svs, int svalb, int sob, int soh,
    int slen, const int* __restrict__ table, int stab, int page, int use_valid) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int b = blockIdx.x / kv_heads, hk = blockIdx.x % kv_heads, split = blockIdx.y;
    const int kv_len = (int)min((long long)s_max, kv_len_ptr[(long long)b * slen]);
    const int per_split = ((kv_len + num_splits - 1) / num_splits + 15) / 16 * 16;
    const int lo = split * per_split, hi = min(lo + per_split, kv_len);
    const float qk2 = (float)sm_scale * *k_scale_ptr * 1.4426950408889634f;  // scores in log2 units

    // Q as fp16 A fragments: k-step t (h = t / 4, w = t % 4) holds dims 64h + 16c + 4w + {0,1} and {2,3}
    u32 qa[8][2];
    const bool row_ok = g < n_rep;
    const u16* qrow = q + (long long)b * sqb + (long long)(hk * n_rep + (row_ok ? g : 0)) * sqh;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int d = 64 * (t >> 2) + 16 * c + 4 * (t & 3) + 2 * e;
            const float x0 = row_ok ? bf16_bits_to_f32(qrow[d]) : 0.0f;
            const float x1 = row_ok ? bf16_bits_to_f32(qrow[d + 1]) : 0.0f;
            qa[t][e] = pack_f16(x0, x1);
        }
    }
    const u8* kb = kc + (long long)b * skb + (long long)hk * skh;
    const u8* vb = vc + (long long)b * svb + (long long)hk * svh;
    const u8* vrow = valid + (long long)b * svalb;
    float m = -1.0e30f, l = 0.0f, acc[16][2];  // acc[u]: dims 32c + u and 32c + 16 + u of row g
#pragma unroll
    for (int u = 0; u < 16; ++u) acc[u][0] = acc[u][1] = 0.0f;

    const int n_tiles = hi > lo ? (hi - lo + 15) / 16 : 0, last = hi - 1;
    const int n_mine = n_tiles > warp ? (n_tiles - warp + NW - 1) / NW : 0;  // tiles warp, warp + NW, ...
    for (int it = 0; it < n_mine; ++it) {
        const int key0 = lo + 16 * (warp + it * NW);
        const u8 *kt = kb, *vt = vb;
        int t0 = key0, tlast = last;  // the tile's keys relative to kt / vt
        if (page > 0) {  // a 16-key tile lies in one block (16 | page, key0 % 16 == 0)
            const long long blk = table[(long long)b * stab + key0 / page];
            kt = kc + blk * skb + (long long)hk * skh;
            vt = vc + blk * svb + (long long)hk * svh;
            t0 = key0 % page;
            tlast = t0 + (last - key0);
        }
        Tile cur;
#pragma unroll
        for (int i = 0; i < 8; ++i) ld16(chunk(kt, vt, sks, svs, t0, tlast, g, c, i), tile_word(cur, i));
        float s[2][2];  // keys key0 + 8j + 2c + e
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
            for (int kt = 0; kt < 8; ++kt) {
                u32 b0, b1;
                widen4(cur.k[j][kt >> 2][kt & 3], b0, b1);
                mma(d0, d1, qa[kt][0], qa[kt][1], b0, b1);
            }
            s[j][0] = d0;
            s[j][1] = d1;
        }
        float tmax = -1.0e30f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = key0 + 8 * j + 2 * c + e;
                const bool ok = key < hi && (!use_valid || vrow[key] != 0);
                s[j][e] = ok ? s[j][e] * qk2 : NEG_INF;
                tmax = fmaxf(tmax, s[j][e]);
            }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m, tmax), alpha = ex2(m - m_new);
        float p[2][2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) p[j][e] = ex2(s[j][e] - m_new);
        l = l * alpha + (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
        if (__any_sync(0xffffffffu, m_new > m)) {  // alpha == 1 wherever the max held: skip the rescale
#pragma unroll
            for (int u = 0; u < 16; ++u) acc[u][0] *= alpha, acc[u][1] *= alpha;
        }
        m = m_new;
        const u32 pa0 = pack_f16(p[0][0], p[0][1]), pa2 = pack_f16(p[1][0], p[1][1]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            // n-tile u = 4w + i reads byte i of word w: B rows (keys) 2c, 2c+1 | 2c+8, 2c+9, col (dim) 16g + u
            const u32 lo01 = __byte_perm(cur.v[0][w], cur.v[1][w], 0x5140);
            const u32 hi01 = __byte_perm(cur.v[0][w], cur.v[1][w], 0x7362);
            const u32 lo89 = __byte_perm(cur.v[2][w], cur.v[3][w], 0x5140);
            const u32 hi89 = __byte_perm(cur.v[2][w], cur.v[3][w], 0x7362);
            u32 b0[4], b1[4];
            widen4(lo01, b0[0], b0[1]);
            widen4(hi01, b0[2], b0[3]);
            widen4(lo89, b1[0], b1[1]);
            widen4(hi89, b1[2], b1[3]);
#pragma unroll
            for (int i = 0; i < 4; ++i) mma(acc[4 * w + i][0], acc[4 * w + i][1], pa0, pa2, b0[i], b1[i]);
        }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);

    __shared__ float sm_m[NW][8], sm_l[NW][8], sm_acc[NW][8][128];  // the warps' states, merged below
    if (row_ok) {
        if (c == 0) { sm_m[warp][g] = m; sm_l[warp][g] = l; }
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            sm_acc[warp][g][32 * c + u] = acc[u][0];
            sm_acc[warp][g][32 * c + 16 + u] = acc[u][1];
        }
    }
    __syncthreads();
    const float v_scale = *v_scale_ptr;
    const int heads = kv_heads * n_rep;
    for (int idx = threadIdx.x; idx < n_rep * 128; idx += NW * 32) {
        const int r = idx >> 7, d = idx & 127, head = hk * n_rep + r;
        float mx = -1.0e30f, lsum = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][r]);
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float f = ex2(sm_m[w][r] - mx);
            lsum += f * sm_l[w][r];
            o += f * sm_acc[w][r][d];
        }
        const float val = o / fmaxf(lsum, 1.0e-30f) * v_scale;
        if (num_splits == 1) {
            u16 bits;
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(val));
            out[(long long)b * sob + (long long)head * soh + d] = bits;
        } else {
            const long long base = ((long long)b * heads + head) * num_splits + split;
            part_out[base * 128 + d] = val;
            if (d == 0) part_lse[base] = lsum > 0.0f ? (mx + __log2f(lsum)) * 0.6931471805599453f : NEG_INF;
        }
    }
}
"""


LONG_KEYS = 4096  # from this many keys a row may hold (the cache's width) up, `default_config` takes 3 CTAs/SM


def default_config(s_max: int) -> tuple[int, int]:
    """(warps per CTA, CTAs per SM the registers must allow) for a cache of s_max keys a row. 4 x 4 caps a thread
    at 128 registers (a few spilled words): best over short caches, where a second wave of CTAs matters; 4 x 3
    allows 168 (no spill): faster over long caches, where each CTA streams thousands of keys
    (docs/performance_history.md, "Decode attention")."""
    return (4, 3) if s_max >= LONG_KEYS else (4, 4)


def kernel_source(num_warps: int = 4, min_blocks: int = 4) -> str:
    """The CUDA source for one configuration: warps per CTA, CTAs per SM the register allocation must allow
    (`default_config`)."""
    return _SOURCE.replace("__NW__", str(num_warps)).replace("__MINB__", str(min_blocks))


@functools.cache
def _compiled(num_warps: int, min_blocks: int):
    return torch.cuda._compile_kernel(kernel_source(num_warps, min_blocks), "fp8_decode_attention")


@functools.cache
def cuda_decode_available() -> bool:
    """NVRTC compilation through torch is there and the GPU has FP8 conversions (sm_89+)."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_compile_kernel") or torch.version.hip:
        return False
    return torch.cuda.get_device_capability() >= (8, 9)


def cuda_kernel_problem(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, key_valid: torch.Tensor | None, n_rep: int, page: int = 0
) -> str | None:
    """Why this kernel cannot serve the call (None: it can). q [B, H, D]; k_buf/v_buf [B, H_kv, S_max, D], or with
    page > 0 a block pool [num_blocks, H_kv, page, D]; key_valid [B, >= S_max] bool or None (paged)."""
    if not (q.is_cuda and cuda_decode_available()):
        return "needs CUDA sm_89+ and torch.cuda._compile_kernel (NVRTC)"
    if k_buf.dtype != torch.float8_e4m3fn or q.dtype != torch.bfloat16:
        return "needs an e4m3 cache and bf16 queries"
    if q.shape[-1] != HEAD_DIM or n_rep > 8:
        return f"needs head_dim {HEAD_DIM} and at most 8 query heads per KV head"
    if key_valid is not None and key_valid.dtype != torch.bool:
        return f"needs a bool key mask, got {key_valid.dtype}"
    if page % 16:
        return f"reads 16-key tiles: needs a page size divisible by 16, got {page}"
    strides = (*q.stride()[:2], *k_buf.stride()[:3], *v_buf.stride()[:3])
    if max(strides) >= 2**31 or any(t.stride(2) % 16 or t.data_ptr() % 16 for t in (k_buf, v_buf)):
        return "needs 16-byte aligned cache rows and int32 strides"
    return None


def balanced_splits(programs: int, s_max: int, slots: int) -> int:
    """Key splits per (sequence, KV head) that fill the last wave of CTAs best, given `slots` CTAs resident at once
    (1 to 4 splits of at least 256 keys; the fewest within 5% of the best wave efficiency: a split costs a merge)."""

    def efficiency(splits: int) -> float:
        waves = programs * splits / slots
        return waves / -(-programs * splits // slots)

    candidates = [s for s in range(1, 5) if s == 1 or s_max >= 256 * s]
    best = max(efficiency(s) for s in candidates)
    return next(s for s in candidates if efficiency(s) >= 0.95 * best)


def default_splits(q: torch.Tensor, kv_heads: int, s_max: int, min_blocks: int = 4) -> int:
    """`balanced_splits` for this GPU at `min_blocks` resident CTAs per multiprocessor."""
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return balanced_splits(q.shape[0] * kv_heads, s_max, sms * min_blocks)


def launch(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    key_valid: torch.Tensor,
    kv_len: torch.Tensor,
    sm_scale: float,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    out: torch.Tensor,
    part_out: torch.Tensor | None,
    part_lse: torch.Tensor | None,
    *,
    slen: int = 0,
    block_table: torch.Tensor | None = None,
    s_max: int | None = None,
    num_warps: int = 4,
    min_blocks: int = 4,
) -> None:
    """Run the kernel on arguments `decode_attention` has checked (`cuda_kernel_problem`). out [B, H, D] bf16 is
    written directly with one split; with S splits part_out [B, H, S, D] / part_lse [B, H, S] (fp32) are.
    Paged: block_table int32 [B, max_blocks] over a pool k_buf/v_buf [num_blocks, H_kv, page, D], s_max the
    table's key capacity."""
    bsz, heads, _ = q.shape
    kv_heads = k_buf.shape[1]
    num_splits = 1 if part_out is None else part_out.shape[2]
    _compiled(num_warps, min_blocks)(
        grid=(bsz * kv_heads, num_splits, 1),
        block=(32 * num_warps, 1, 1),
        args=[
            q, k_buf, v_buf, kv_len if key_valid is None else key_valid, kv_len, k_scale, v_scale,
            out if part_out is None else part_out, out if part_lse is None else part_lse, out,
            float(sm_scale), kv_heads, k_buf.shape[2] if s_max is None else s_max, heads // kv_heads, num_splits,
            *q.stride()[:2], *k_buf.stride()[:3], *v_buf.stride()[:3], 0 if key_valid is None else key_valid.stride(0),
            *out.stride()[:2], slen, kv_len if block_table is None else block_table,
            0 if block_table is None else block_table.stride(0), 0 if block_table is None else k_buf.shape[2],
            int(key_valid is not None),
        ],
    )  # fmt: skip
