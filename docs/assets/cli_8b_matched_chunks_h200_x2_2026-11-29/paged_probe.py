"""Exact decode attention at the 8B shape: contiguous vs paged (width 4,608 as the CLI's table), chunks 1024 vs one.

The record of the probe that ran (paged_probe.log); `bench_batch_invariant_kernels --shapes` now times the paged
variants with the other decode shapes."""

import torch

import nemo_jetrl.models.batch_invariant_kernels as K

torch.manual_seed(0)
dev = "cuda"
B, H, HKV, D, PAGE, WIDTH = 64, 32, 8, 128, 16, 4608


def timeit(fn0, n=20):
    """us per call: 10 calls captured in one CUDA graph, median of n replays."""
    for _ in range(3):
        fn0()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn0()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 100)
    ts.sort()
    return ts[len(ts) // 2]


q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
nb = B * WIDTH // PAGE + 1
kp = torch.randn(nb, HKV, PAGE, D, device=dev).to(torch.float8_e4m3fn)
vp = torch.randn_like(kp.float()).to(torch.float8_e4m3fn)
table = torch.arange(B * (WIDTH // PAGE), device=dev, dtype=torch.int32).view(B, -1)
ks = torch.tensor(0.01, device=dev)
vs = torch.tensor(0.01, device=dev)
for keys in (1024, 2048, 4096):
    kv_len = torch.full((B,), keys, device=dev, dtype=torch.int64)
    kc = torch.randn(B, HKV, keys, D, device=dev).to(torch.float8_e4m3fn)
    vc = kc.clone()
    valid = torch.ones(B, keys, device=dev, dtype=torch.bool)
    start = torch.full((B,), keys - 1, device=dev, dtype=torch.int64)
    row = []
    for split in (1024, 1 << 20):
        K.ATTN_SPLIT_KEYS = split
        paged = (q, kp, vp, table, kv_len, 0.088, ks, vs)
        contiguous = (q, kc, vc, valid, start, 0.088, ks, vs)
        row.append(timeit(lambda a=paged: K.paged_attention(*a)))
        row.append(timeit(lambda a=contiguous: K.attention(*a)))
    print(f"keys {keys}: paged/1024 {row[0]:.1f} us, contiguous/1024 {row[1]:.1f}, paged/one {row[2]:.1f}, "
          f"contiguous/one {row[3]:.1f}", flush=True)  # fmt: skip
