"""The exact attention's decode step over an e4m3 KV cache as a hand-written CUDA kernel (sm_90, NVRTC at first use):
the bits of `batch_invariant_kernels`' Triton kernel (the trainer's forward and the prefill run that one), at the
cost of a kernel that loads its operands the way the fast FP8 decode does.

It repeats the Triton kernel's arithmetic step for step, as its sm_90 PTX has it (docs/mismatch.md):
- per 64-key block, the keys are the MMA's rows: scores transposed S^T = K . Q^T, one chain of 16-wide bf16 MMA
  steps over the head dim from zero, then `* sm_scale`; masked scores -inf;
- the block's max per query (exact in any order); alpha = 1 where the max held, else exp(m - m_new), exp being
  `mul.f32` by log2(e) then `ex2.approx.f32`; p = exp(s - m_new), 0 where masked;
- a running sum per key slot, `fma(l, alpha, p)`, summed over the 64 slots once the chunk ends in the Triton
  reduction's tree: the slot pair (g, g + 8) in a thread, lanes xor 16, 8, 4, then the warps as (0 + 2) + (1 + 3);
- the output transposed, O^T = (O^T * alpha) + V^T . P^T: the MMA chain over the block's four 16-key steps starts
  from the rescaled accumulator (Triton folds the add into the dot); P rounded to bf16;
- K / V dequantized as `kv_dequant` does: float32(e4m3) * scale, rounded to bf16 (the hardware's cast).
Keys come in chunks of `ATTN_SPLIT_KEYS` from the row's first valid key (one CTA a chunk); each chunk's state goes
to the Triton kernel's partial buffer and its `_merge_splits_kernel` merges them, so the merge is the same code.

What the Triton kernel runs as a warp-group MMA (wgmma, m64) this kernel runs as `mma.sync.m16n8k16` per warp, the
same 16-wide steps in the same order. That the two give the same bits is a property of the GPU, not of the code:
`exact_cuda_choice` compares the two kernels on this device once, and a decode step takes this kernel only where
they agreed. Imported on CUDA only (it imports the Triton kernels).

CTA: (sequence, KV head, chunk), 4 warps. Per block, warp w takes keys 16w..16w+15 for the scores and 32 of the
head dims for the output (all 64 keys); the max and P go through shared memory. K/V tiles arrive by cp.async in
`STAGES` stages, stored with their 16-byte chunks XOR-swizzled by key so the fragment loads hit distinct banks.
"""

from __future__ import annotations

import functools

import torch

from nemo_jetrl.models import batch_invariant_kernels as K

HEAD_DIM = 128
BLOCK_N = 64  # keys per online-softmax block the source is written for (must be the Triton kernel's ATTN_BLOCK_N)
# cp.async stages of (K, V) tiles (16 KiB each) and CTAs an SM the registers must allow: 3 x 4 was the fastest of
# 4 x 3, 3 x 4 and 2 x 4 at every shape timed on an H200 (docs/mismatch.md); they give the same bits (tests/gpu)
STAGES = 3
MIN_BLOCKS = 4

# The device functions both hand-written exact kernels use (`exact_train_cuda` too).
CUDA_HELPERS = r"""
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E __int_as_float(0x3fb8aa3b)  // Triton's exp: mul.f32 by this, then ex2.approx.f32

__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
// exp(a - b) as Triton computes it
__device__ __forceinline__ float ex2_diff(float a, float b) { return ex2(__fmul_rn(__fsub_rn(a, b), LOG2E)); }
__device__ __forceinline__ float f16_to_f32(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ u16 to_bf16(float x) { u16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r; }
// two e4m3 (low byte first) -> float32, exact
__device__ __forceinline__ void widen2(u16 x, float& lo, float& hi) {
    u32 h2; asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(x));
    u16 l, h; asm("mov.b32 {%0, %1}, %2;" : "=h"(l), "=h"(h) : "r"(h2));
    lo = f16_to_f32(l); hi = f16_to_f32(h);
}
// kv_dequant of two e4m3: bf16(float32(e) * scale), low byte -> low half
__device__ __forceinline__ u32 deq2(u16 x, float s) {
    float lo, hi; widen2(x, lo, hi);
    return pack_bf16(__fmul_rn(lo, s), __fmul_rn(hi, s));
}
__device__ __forceinline__ void deq4(u32 w, float s, float* f) {  // 4 e4m3 -> 4 float32 products (not rounded)
    u16 l, h; asm("mov.b32 {%0, %1}, %2;" : "=h"(l), "=h"(h) : "r"(w));
    widen2(l, f[0], f[1]); widen2(h, f[2], f[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __fmul_rn(f[i], s);
}
__device__ __forceinline__ void mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp16(u32 dst, const void* src, int bytes) {  // bytes 0: zero-fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// the first column before hi whose mask byte is set (hi if none), by a CTA of 128 threads that all call it
__device__ __forceinline__ int first_valid(const u8* vrow, int hi, int* slot) {
    if (threadIdx.x == 0) *slot = hi;
    __syncthreads();
    for (int col = threadIdx.x; col < hi; col += 128)
        if (vrow[col]) { atomicMin(slot, col); break; }
    __syncthreads();
    return *slot;
}

"""

_SOURCE = r"""
#define STAGES __STAGES__
#define SPLIT __SPLIT__
// one block's K and V tiles [64 keys][128 B] into shared memory, chunk ch of key r at r * 128 + (ch ^ (r & 7)) * 16;
// keys at or past hi are zero (as the Triton kernel's masked loads)
__device__ __forceinline__ void load_tiles(u32 ks, u32 vs, const u8* kbase, const u8* vbase, const int* trow,
                                           int start, int hi, int page, long long skb, long long sks,
                                           long long svb, long long svs) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int id = threadIdx.x + 128 * i, key = id >> 3, ch = id & 7, col = start + key;
        const bool ok = col < hi;
        long long ko = 0, vo = 0;
        if (ok) {
            if (page > 0) {
                const long long blk = trow[col / page];
                const int slot = col % page;
                ko = blk * skb + slot * sks;
                vo = blk * svb + slot * svs;
            } else {
                ko = col * sks;
                vo = col * svs;
            }
        }
        const u32 so = key * 128 + ((ch ^ (key & 7)) << 4);
        cp16(ks + so, kbase + ko + 16 * ch, ok ? 16 : 0);
        cp16(vs + so, vbase + vo + 16 * ch, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
}

extern "C" __global__ void __launch_bounds__(128, __MINB__) exact_decode_e4m3(
    const u16* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ vc, const u8* __restrict__ valid,
    const long long* __restrict__ q_start, const float* __restrict__ ks_ptr, const float* __restrict__ vs_ptr,
    float* __restrict__ part, const int* __restrict__ table, int S_k, int kv_heads, int n_rep, double sm_scale_d,
    int sqb, int sqh, int skb_, int skh, int sks_, int svb_, int svh, int svs_, int svalb, int sstart, int stab,
    int page) {
    extern __shared__ __align__(128) u8 smem[];  // STAGES x (K 8 KiB, V 8 KiB), P [8][64] bf16, max / sum [4][8]
    u16* ps = (u16*)(smem + STAGES * 16384);
    float* red = (float*)(smem + STAGES * 16384 + 1024);
    int* lead_s = (int*)(red + 32);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int b = blockIdx.x / kv_heads, hk = blockIdx.x % kv_heads, chunk = blockIdx.y, splits = gridDim.y;
    const long long skb = skb_, sks = sks_, svb = svb_, svs = svs_;
    const float sm_scale = (float)sm_scale_d, k_scale = *ks_ptr, v_scale = *vs_ptr;
    const long long q0 = q_start[(long long)b * sstart];
    const int hi = (int)min(q0 + 1, (long long)S_k);  // one past the query's column
    const u8* vrow = valid + (long long)b * svalb;
    int lead = 0;  // the row's first valid key (a paged row has no padding)
    if (page == 0) lead = first_valid(vrow, hi, lead_s);
    const int c0 = lead + chunk * SPLIT, cend = min(c0 + SPLIT, hi);
    const int nblk = c0 < hi ? (cend - c0 + 63) / 64 : 0;

    // Q^T as the B operand: k-step t holds dims 16t + 2c, +1 and 16t + 2c + 8, +9 of query g (0 past n_rep)
    u32 qb[8][2];
    const bool q_ok = g < n_rep;
    const u16* qrow = q + (long long)b * sqb + (long long)(hk * n_rep + (q_ok ? g : 0)) * sqh;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        qb[t][0] = q_ok ? *(const u32*)(qrow + 16 * t + 2 * c) : 0u;
        qb[t][1] = q_ok ? *(const u32*)(qrow + 16 * t + 2 * c + 8) : 0u;
    }
    const u8* kbase = kc + (long long)hk * skh + (page > 0 ? 0 : (long long)b * skb);
    const u8* vbase = vc + (long long)hk * svh + (page > 0 ? 0 : (long long)b * svb);
    const int* trow = table + (long long)b * stab;

    float m[2] = {-1.0e30f, -1.0e30f};          // queries 2c, 2c + 1
    float lsl[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // key slot 16w + g (+8) x query 2c (+1)
    float acc[2][4];                             // O^T: tile mt rows dims 32w + 4g + 2mt (+1), cols queries 2c (+1)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = 0.f;

    const u32 sbase = smem_addr(smem);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nblk) load_tiles(sbase + s * 16384, sbase + s * 16384 + 8192, kbase, vbase, trow, c0 + 64 * s, hi,
                                 page, skb, sks, svb, svs);
        else asm volatile("cp.async.commit_group;");
    }
    const int kr0 = 16 * warp + g;  // this thread's key slots kr0, kr0 + 8 (both = g mod 8)
    for (int i = 0; i < nblk; ++i) {
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2));
        __syncthreads();  // block i is in; every warp is done with block i - 1 (its stage, P and maxima)
        {
            const int nx = i + STAGES - 1, st = nx % STAGES;
            if (nx < nblk) load_tiles(sbase + st * 16384, sbase + st * 16384 + 8192, kbase, vbase, trow,
                                      c0 + 64 * nx, hi, page, skb, sks, svb, svs);
            else asm volatile("cp.async.commit_group;");
        }
        const u8* kt = smem + (i % STAGES) * 16384;
        const u8* vt = kt + 8192;
        const int start = c0 + 64 * i;
        // scores transposed: rows keys kr0, kr0 + 8; cols queries 2c, 2c + 1
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            const int off = ((t ^ g) << 4) + 2 * c;
            const u8* r0 = kt + kr0 * 128 + off;
            const u8* r1 = r0 + 8 * 128;
            mma(d, deq2(*(const u16*)r0, k_scale), deq2(*(const u16*)r1, k_scale), deq2(*(const u16*)(r0 + 8), k_scale),
                deq2(*(const u16*)(r1 + 8), k_scale), qb[t][0], qb[t][1]);
        }
        bool ok[2];
        float s[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int col = start + kr0 + 8 * r;
            ok[r] = col < hi && (page > 0 || vrow[col] != 0);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = __fmul_rn(d[2 * r + e], sm_scale);
                s[r][e] = ok[r] ? x : NEG_INF;
            }
        }
        float mx[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            mx[e] = fmaxf(s[0][e], s[1][e]);
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 16));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 8));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 4));
            if (g == 0) red[warp * 8 + 2 * c + e] = mx[e];
        }
        __syncthreads();
        float alpha[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int qq = 2 * c + e;
            const float bmax = fmaxf(fmaxf(red[qq], red[8 + qq]), fmaxf(red[16 + qq], red[24 + qq]));
            const float m_new = fmaxf(m[e], bmax);
            alpha[e] = m_new == m[e] ? 1.0f : ex2_diff(m[e], m_new);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float p = ok[r] ? ex2_diff(s[r][e], m_new) : 0.0f;
                lsl[r][e] = __fmaf_rn(lsl[r][e], alpha[e], p);
                ps[qq * 64 + kr0 + 8 * r] = to_bf16(p);
            }
            m[e] = m_new;
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            acc[mt][0] = __fmul_rn(acc[mt][0], alpha[0]);
            acc[mt][1] = __fmul_rn(acc[mt][1], alpha[1]);
            acc[mt][2] = __fmul_rn(acc[mt][2], alpha[0]);
            acc[mt][3] = __fmul_rn(acc[mt][3], alpha[1]);
        }
        __syncthreads();
        // O^T += V^T . P^T over the block's 4 steps of 16 keys, in key order
        const int vch = 2 * warp + (g >> 2), vword = (g & 3) << 2;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const u32 b0 = *(const u32*)(ps + g * 64 + 16 * t + 2 * c);
            const u32 b1 = *(const u32*)(ps + g * 64 + 16 * t + 2 * c + 8);
            float f[4][4];  // keys 16t + 2c, +1, +8, +9 x dims 32w + 4g .. + 3
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = 16 * t + 2 * c + (e & 1) + 8 * (e >> 1);
                deq4(*(const u32*)(vt + key * 128 + ((vch ^ (key & 7)) << 4) + vword), v_scale, f[e]);
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
                mma(acc[mt], pack_bf16(f[0][2 * mt], f[1][2 * mt]), pack_bf16(f[0][2 * mt + 1], f[1][2 * mt + 1]),
                    pack_bf16(f[2][2 * mt], f[3][2 * mt]), pack_bf16(f[2][2 * mt + 1], f[3][2 * mt + 1]), b0, b1);
        }
    }
    asm volatile("cp.async.wait_group 0;");
    // the chunk's sum over the 64 key slots, in the Triton reduction's tree
    __syncthreads();
    float l[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        float x = lsl[0][e] + lsl[1][e];
        x = x + __shfl_xor_sync(0xffffffffu, x, 16);
        x = x + __shfl_xor_sync(0xffffffffu, x, 8);
        x = x + __shfl_xor_sync(0xffffffffu, x, 4);
        if (g == 0) red[warp * 8 + 2 * c + e] = x;
    }
    __syncthreads();
    const long long entries = (long long)gridDim.x * n_rep;  // B * H
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int qq = 2 * c + e;
        if (qq >= n_rep) continue;
        l[e] = (red[qq] + red[16 + qq]) + (red[8 + qq] + red[24 + qq]);
        const long long entry = chunk * entries + (long long)b * kv_heads * n_rep + hk * n_rep + qq;
        float* o = part + entry * 128 + 32 * warp + 4 * g;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            o[2 * mt] = acc[mt][e];
            o[2 * mt + 1] = acc[mt][2 + e];
        }
        if (warp == 0 && g == 0) {
            float* ml = part + (long long)splits * entries * 128 + 2 * entry;
            ml[0] = m[e];
            ml[1] = l[e];
        }
    }
}
"""


def split_keys() -> int:
    """Keys per chunk: the Triton kernel's `ATTN_SPLIT_KEYS`, read at each launch (a test or a benchmark may set it)."""
    return K.ATTN_SPLIT_KEYS


def kernel_source(stages: int = STAGES, min_blocks: int = MIN_BLOCKS, split: int | None = None) -> str:
    """The CUDA source: cp.async stages, CTAs an SM the registers must allow, keys per chunk (default
    `split_keys()`)."""
    split = split_keys() if split is None else split
    return CUDA_HELPERS + (
        _SOURCE.replace("__STAGES__", str(stages)).replace("__MINB__", str(min_blocks)).replace("__SPLIT__", str(split))
    )


def shared_bytes(stages: int = STAGES) -> int:
    """Dynamic shared memory of a CTA: the K/V stages, P and the per-warp maxima / sums, the lead."""
    return stages * 16384 + 1024 + 32 * 4 + 16


@functools.cache
def _compiled(stages: int, min_blocks: int, split: int, device: int):
    """The kernel loaded on `device` (a module is per device context)."""
    return load_kernel(kernel_source(stages, min_blocks, split), "exact_decode_e4m3", shared_bytes(stages), device)


def load_kernel(source: str, name: str, shared: int, device: int):
    """Kernel `name` of CUDA `source` compiled (NVRTC) and loaded on `device`, allowed `shared` bytes of dynamic
    shared memory (both hand-written exact kernels)."""
    with torch.cuda.device(device):
        kernel = torch.cuda._compile_kernel(source, name)
        if hasattr(kernel, "set_shared_memory_config"):
            kernel.set_shared_memory_config(shared)
    return kernel


def device_problem(q: torch.Tensor) -> str | None:
    """Why no hand-written exact kernel runs on q's device (None: one may): CUDA with NVRTC, and sm_90, where their
    bits were compared with the Triton kernel's."""
    if not q.is_cuda or not hasattr(torch.cuda, "_compile_kernel") or torch.version.hip:
        return "needs CUDA and torch.cuda._compile_kernel (NVRTC)"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "compared with the Triton kernel on sm_90 only"
    return None


def kernel_problem(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, key_valid: torch.Tensor | None
) -> str | None:
    """Why this kernel cannot serve a decode step (None: it can): q [B, H, 1, D] bf16 on a CUDA sm_90 device, an
    e4m3 cache of head dim 128 with contiguous, 16-byte aligned rows, at most 8 query heads a KV head, a key mask
    (contiguous cache) with contiguous columns."""
    if (problem := device_problem(q)) is not None:
        return problem
    if K.ATTN_BLOCK_N != BLOCK_N:
        return f"written for the Triton kernel's {BLOCK_N}-key blocks, not {K.ATTN_BLOCK_N}"
    if k_buf.dtype != torch.float8_e4m3fn or q.dtype != torch.bfloat16 or q.shape[2] != 1:
        return "needs one bf16 query a row over an e4m3 cache"
    if q.shape[-1] != HEAD_DIM or q.shape[1] // k_buf.shape[1] > 8 or q.stride(-1) != 1:
        return f"needs head dim {HEAD_DIM} (contiguous) and at most 8 query heads a KV head"
    if any(t.stride(-1) != 1 or t.stride(2) % 16 or t.data_ptr() % 16 for t in (k_buf, v_buf)):
        return "needs 16-byte aligned cache rows"
    masks = () if key_valid is None else key_valid.stride()
    if max(*q.stride(), *k_buf.stride(), *v_buf.stride(), *masks) >= 2**31:
        return "needs strides that fit a 32-bit int (the launch passes them as int)"
    if key_valid is not None and (key_valid.dtype != torch.bool or key_valid.stride(-1) != 1):
        return "needs a bool key mask with contiguous columns"
    return None


def key_width(k_buf: torch.Tensor, block_table: torch.Tensor | None) -> int:
    """The most keys a row may hold: the cache's columns, or the block table's blocks x the page size."""
    return k_buf.shape[2] if block_table is None else block_table.shape[1] * k_buf.shape[2]


def launch(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale, part, splits: int,
           block_table: torch.Tensor | None = None, stages: int = STAGES, min_blocks: int = MIN_BLOCKS) -> None:  # fmt: skip
    """Each chunk's state (the Triton kernel's SPLIT_OUT layout) into part, float32 [splits * B * H * (D + 2)].
    Contiguous: k_buf / v_buf [B, H_kv, S_k, D], key_valid [B, >= S_k], q_start int64 0-dim or [B]. Paged
    (block_table int32 [B, n]): pools [blocks, H_kv, page, D], q_start = kv_len - 1 [B]."""
    bsz, heads = q.shape[:2]
    kv_heads = k_buf.shape[1]
    paged = block_table is not None
    valid = block_table if paged else key_valid.view(torch.uint8)
    _compiled(stages, min_blocks, split_keys(), q.device.index)(
        grid=(bsz * kv_heads, splits, 1),
        block=(128, 1, 1),
        args=[
            q, k_buf, v_buf, valid, q_start, k_scale, v_scale, part, block_table if paged else q_start,
            key_width(k_buf, block_table), kv_heads, heads // kv_heads, float(sm_scale), *q.stride()[:2],
            *k_buf.stride()[:3], *v_buf.stride()[:3],
            0 if paged else key_valid.stride(0), 0 if q_start.dim() == 0 else q_start.stride(0),
            block_table.stride(0) if paged else 0, k_buf.shape[2] if paged else 0,
        ],
        shared_mem=shared_bytes(stages),
    )  # fmt: skip


def decode(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale, out: torch.Tensor,
           block_table: torch.Tensor | None = None, stages: int = STAGES, min_blocks: int = MIN_BLOCKS) -> None:  # fmt: skip
    """One decode step of the exact attention into out [B, 1, H, D]: this kernel's chunk states (`launch`'s
    arguments), merged by the Triton kernel's merge (`batch_invariant_kernels.merge_chunks`)."""
    splits = max(1, -(-key_width(k_buf, block_table) // split_keys()))
    part = torch.empty(splits * q.shape[0] * q.shape[1] * (HEAD_DIM + 2), dtype=torch.float32, device=q.device)
    with torch.cuda.device(q.device):  # the launch's stream and module: q's device
        launch(q, k_buf, v_buf, key_valid, q_start, sm_scale, k_scale, v_scale, part, splits, block_table, stages,
               min_blocks)  # fmt: skip
        K.merge_chunks(part, out, splits)
