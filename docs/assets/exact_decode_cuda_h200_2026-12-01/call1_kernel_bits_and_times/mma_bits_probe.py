"""Probe for the exact attention's restructure (queries as the MMA's rows): does a 16-row tile in one warp (mma.sync,
MMAv2) give the bits of the same rows inside a 64-row, 4-warp tile (wgmma, MMAv3), for S = Q.K^T, its row sums /
maxes, and O = P.V? If yes, a decode tile of one warp and the trainer's 64-row tile could share every reduction.

GPU:  python3 .gpu/mma_bits_probe.py            (bits over many random cases, several magnitudes)
CPU:  python3 .gpu/mma_bits_probe.py --compile  (sm_90 TTGIR: which MMA each variant lowers to; needs Triton 3.6)
"""

import sys

import triton
import triton.language as tl


@triton.jit
def probe_kernel(q_ptr, k_ptr, p_ptr, v_ptr, s_ptr, o_ptr, sum_ptr, max_ptr, BM: tl.constexpr, BN: tl.constexpr,
                 D: tl.constexpr):  # fmt: skip
    rows = tl.arange(0, BM)
    keys = tl.arange(0, BN)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :])  # [BM, D] bf16
    k = tl.load(k_ptr + keys[:, None] * D + dims[None, :])  # [BN, D] bf16
    s = tl.dot(q, tl.trans(k))  # [BM, BN] fp32
    tl.store(s_ptr + rows[:, None] * BN + keys[None, :], s)
    tl.store(sum_ptr + rows, tl.sum(s, axis=1))
    tl.store(max_ptr + rows, tl.max(s, axis=1))
    p = tl.load(p_ptr + rows[:, None] * BN + keys[None, :])  # [BM, BN] bf16
    v = tl.load(v_ptr + keys[:, None] * D + dims[None, :])  # [BN, D] bf16
    o = tl.dot(p, v)  # [BM, D] fp32
    tl.store(o_ptr + rows[:, None] * D + dims[None, :], o)


VARIANTS = [(16, 1), (16, 4), (64, 4), (64, 8), (128, 8)]  # (rows, warps); the first 16 rows are compared


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "p_ptr", "v_ptr")} | {"s_ptr": "*fp32", "o_ptr": "*fp32",
           "sum_ptr": "*fp32", "max_ptr": "*fp32"}  # fmt: skip
    names = probe_kernel.arg_names
    for bm, warps in VARIANTS:
        const = dict(BM=bm, BN=64, D=128)
        src = ASTSource(probe_kernel, sig | dict.fromkeys(const, "constexpr"),
                        {(names.index(k),): v for k, v in const.items()})  # fmt: skip
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
        ir = c.asm["ttgir"]
        mma = sorted(set(line.split("=", 1)[0].strip() + " " + line.split("<", 1)[1][:80]
                         for line in ir.splitlines() if "#ttg.nvidia_mma" in line and line.startswith("#")))  # fmt: skip
        print(f"rows {bm:3d} warps {warps}: wgmma {ir.count('warp_group_dot')}, dots {ir.count('tt.dot')}", *mma,
              sep="\n   ")


def gpu_bits(trials: int = 200):
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, a syntax check
    gen = torch.Generator(device=dev).manual_seed(0)
    bad = {f"{bm}x{w}": [0, 0, 0, 0] for bm, w in VARIANTS[1:]}
    for t in range(trials):
        scale = [1e-3, 1.0, 30.0, 1e3][t % 4]
        q = (torch.randn(128, 128, device=dev, generator=gen) * scale).bfloat16()
        k = torch.randn(64, 128, device=dev, generator=gen).bfloat16()
        if t % 5 == 0:  # cancellation: k's second half negates its first
            k[:, 64:] = -k[:, :64]
        p = torch.rand(128, 64, device=dev, generator=gen).bfloat16()
        v = (torch.randn(64, 128, device=dev, generator=gen) * scale).bfloat16()
        outs = {}
        for bm, w in VARIANTS:
            s = torch.empty(bm, 64, device=dev)
            o = torch.empty(bm, 128, device=dev)
            sm, mx = torch.empty(bm, device=dev), torch.empty(bm, device=dev)
            probe_kernel[(1,)](q[:bm].contiguous(), k, p[:bm].contiguous(), v, s, o, sm, mx, BM=bm, BN=64, D=128,
                               num_warps=w)  # fmt: skip
            outs[f"{bm}x{w}"] = (s[:16], o[:16], sm[:16], mx[:16])
        ref = outs["16x1"]
        for name, got in outs.items():
            if name == "16x1":
                continue
            for i in range(4):
                bad[name][i] += int(not torch.equal(ref[i], got[i]))
    print(f"{trials} cases; cases whose first 16 rows differ from the one-warp 16-row tile (S, O, row sum, row max):")
    for name, counts in bad.items():
        print(f"  {name}: {counts}")


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else gpu_bits()
