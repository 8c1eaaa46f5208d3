"""Probe 6: the paged split decode at 4 query heads per KV head (8B) slowed by the per-slot sums (probe 5): each
kernel's own time (torch.profiler: the attention kernel vs the chunk merge), and the contiguous split at 8B."""
# ruff: noqa: B023
import json
import os
import statistics
import sys

import torch
import triton
import triton.testing
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".gpu")
import bik_shipped as SHIP  # noqa: E402

from nemo_jetrl.models import batch_invariant_kernels as DEF  # noqa: E402
from nemo_jetrl.precision.kv import kv_quant  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "rows": []}
KS, VS = torch.tensor(3.1 / 448, device=dev), torch.tensor(2.7 / 448, device=dev)


def paged(bsz, heads, kvh, n, slack, page=16):
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    k = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev) * 2, VS)
    per_row = -(-(n + slack) // page)
    table = (torch.randperm(bsz * per_row, device=dev, dtype=torch.int32) + 1).view(bsz, per_row)
    pools = []
    for cache in (k, v):
        pool = torch.zeros(bsz * per_row + 1, kvh, page, 128, dtype=torch.uint8, device=dev)
        padded = torch.zeros(bsz, kvh, per_row * page, 128, dtype=torch.uint8, device=dev)
        padded[:, :, :n] = cache.view(torch.uint8)
        pool[table.flatten().long()] = padded.view(bsz, kvh, per_row, page, 128).transpose(1, 2).flatten(0, 1)
        pools.append(pool.view(cache.dtype))
    kv_len = torch.full((bsz,), n, dtype=torch.int64, device=dev)
    return q, pools[0], pools[1], table, kv_len, 0.088, KS, VS


def kernel_times(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or "kernel" in e.key:
            out[e.key[:40]] = round(e.device_time_total / max(e.count, 1), 1)
    return out


for name, a, fn_name in [
    ("paged 8B 64x1000 (split)", paged(64, 32, 8, 1000, 64), "paged_attention"),
    ("paged 1.7B-heads 64x1000 (split)", paged(64, 16, 8, 1000, 64), "paged_attention"),
]:
    row = {"shape": name}
    for mn, mod in (("shipped", SHIP), ("defer", DEF)):
        row[mn + " kernels us"] = kernel_times(lambda: getattr(mod, fn_name)(*a))
    res["rows"].append(row)
    print(row, flush=True)

for name, (bsz, heads, kvh, n, width) in {"contig 8B 32x4096 (split)": (32, 32, 8, 4096, 4608),
                                          "contig 8B 64x1000+100 (split)": (64, 32, 8, 1100, 1152)}.items():
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, VS)
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, 5:n] = True
    a = (q, k, v, valid, torch.tensor(n - 1, device=dev), 0.088, KS, VS)
    variants = {"shipped": lambda: SHIP.attention(*a), "defer": lambda: DEF.attention(*a)}
    times = {vn: [] for vn in variants}
    for r in range(5):
        for vn in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    row = {"shape": name}
    for vn, t in times.items():
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]
    for mn, mod in (("shipped", SHIP), ("defer", DEF)):
        row[mn + " kernels us"] = kernel_times(lambda: mod.attention(*a))
    res["rows"].append(row)
    print(row, flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/probe6.json", "w"), indent=1)
