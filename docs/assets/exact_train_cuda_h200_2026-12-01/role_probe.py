"""Probe (2026-12-01, session 13): is mma.sync.m16n8k16 (bf16 -> f32) symmetric in its operands' roles?
D = C + A.B^T chained over 16-wide k steps, computed as (A rows, B cols) and as (B rows, A cols), compared D vs D'^T
bit for bit. If it holds, the exact attention's keys-as-rows products (S^T = K.Q^T, O^T = V^T.P^T) can be computed
with queries as the MMA's rows (S = Q.K^T, O = P.V) with the same bits.
GPU: python3 .gpu/role_probe.py"""

import torch

SRC = r"""
typedef unsigned int u32;
typedef unsigned short u16;
__device__ __forceinline__ void mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// A [M][KD] bf16 rows, B [N][KD] bf16 rows, C [M][N] f32 -> D [M][N]; one warp per (16-row, 8-col) tile
extern "C" __global__ void chain(const u16* A, const u16* B, const float* C, float* D, int M, int N, int KD) {
    const int mt = blockIdx.x, nt = blockIdx.y, lane = threadIdx.x, g = lane >> 2, c = lane & 3;
    const int r0 = 16 * mt + g, r1 = r0 + 8, n = 8 * nt + g;
    float d[4] = {C[r0 * N + 8 * nt + 2 * c], C[r0 * N + 8 * nt + 2 * c + 1],
                  C[r1 * N + 8 * nt + 2 * c], C[r1 * N + 8 * nt + 2 * c + 1]};
    for (int k = 0; k < KD; k += 16) {
        const u32 a0 = *(const u32*)(A + r0 * KD + k + 2 * c), a1 = *(const u32*)(A + r1 * KD + k + 2 * c);
        const u32 a2 = *(const u32*)(A + r0 * KD + k + 2 * c + 8), a3 = *(const u32*)(A + r1 * KD + k + 2 * c + 8);
        const u32 b0 = *(const u32*)(B + n * KD + k + 2 * c), b1 = *(const u32*)(B + n * KD + k + 2 * c + 8);
        mma(d, a0, a1, a2, a3, b0, b1);
    }
    D[r0 * N + 8 * nt + 2 * c] = d[0]; D[r0 * N + 8 * nt + 2 * c + 1] = d[1];
    D[r1 * N + 8 * nt + 2 * c] = d[2]; D[r1 * N + 8 * nt + 2 * c + 1] = d[3];
}
"""


def main(trials: int = 400) -> None:
    kern = torch.cuda._compile_kernel(SRC, "chain")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def run(a, b, c):
        d = torch.empty_like(c)
        kern(grid=(a.shape[0] // 16, b.shape[0] // 8, 1), block=(32, 1, 1),
             args=[a, b, c, d, a.shape[0], b.shape[0], a.shape[1]])  # fmt: skip
        return d

    bad = 0
    worst = 0.0
    for t in range(trials):
        kd = [128, 64, 16, 256][t % 4]
        sa, sb = [(1e-3, 1.0), (1.0, 1.0), (30.0, 1e3), (1e3, 1e-2), (1.0, 1e4)][t % 5]
        a = (torch.randn(64, kd, device="cuda", generator=gen) * sa).bfloat16()
        b = (torch.randn(64, kd, device="cuda", generator=gen) * sb).bfloat16()
        if t % 3 == 0:  # cancellation
            a[:, kd // 2:] = -a[:, : kd // 2]
            b[:, kd // 2:] = b[:, : kd // 2]
        if t % 7 == 0:  # wide exponent spread within a row
            a = a * torch.exp2(torch.randint(-20, 20, a.shape, device="cuda", generator=gen)).bfloat16()
        c = torch.randn(64, 64, device="cuda", generator=gen) * [0.0, 1.0, 1e4, 1e-4][t % 4] * sa * sb
        d1 = run(a, b, c.contiguous())
        d2 = run(b, a, c.t().contiguous()).t()
        diff = (d1.view(torch.int32) != d2.view(torch.int32)).sum().item()
        bad += diff > 0
        worst = max(worst, (d1 - d2).abs().max().item())
    print(f"role symmetry: {trials - bad}/{trials} trials bitwise equal; max abs diff {worst:.3e}")


if __name__ == "__main__":
    main()
