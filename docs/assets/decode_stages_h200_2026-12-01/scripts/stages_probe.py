"""Side by side: the exact decode kernel's pipeline depth (16 rows, 4 warps, 2 / 3 / 4 stages), contiguous and paged
(pages of 16), at rollout shapes, with the fast FP8 decode kernel beside. One process, 5 rounds alternating."""
# ruff: noqa: B023  (each iteration's lambdas run within that iteration)
import json
import os
import statistics

import torch
import triton.testing

from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.precision.kv import kv_quant

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "rows": []}
CONFIGS = [(16, 4, 2), (16, 4, 3), (16, 4, 4)]
SHAPES = {"1.7B 128x436": (128, 16, 436), "1.7B 128x692": (128, 16, 692), "1.7B 32x2048": (32, 16, 2048),
          "1.7B 32x4096": (32, 16, 4096), "1.7B 32x8192": (32, 16, 8192), "8B 64x1000": (64, 32, 1000),
          "8B 64x4096": (64, 32, 4096)}


def timed(variants):
    names, row = list(variants), {}
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in (names if r % 2 == 0 else names[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=30))
    for vn in names:
        row[vn] = [round(statistics.median(times[vn]), 1), round(min(times[vn]), 1), round(max(times[vn]), 1)]
    return row


for name, (bsz, heads, n) in SHAPES.items():
    kvh, page = 8, 16
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    ks, vs = torch.tensor(4.0 / 448, device=dev), torch.tensor(3.0 / 448, device=dev)
    k = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), ks)
    v = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), vs)
    valid = torch.ones(bsz, n, dtype=torch.bool, device=dev)
    start, kv_len0 = torch.tensor(n - 1, device=dev), torch.tensor(n, device=dev)
    per_row = -(-n // page)
    table = (torch.randperm(bsz * per_row, device=dev, dtype=torch.int32) + 1).view(bsz, per_row)
    pools = []
    for cache in (k, v):
        pool = torch.zeros(bsz * per_row + 1, kvh, page, 128, dtype=torch.uint8, device=dev)
        padded = torch.zeros(bsz, kvh, per_row * page, 128, dtype=torch.uint8, device=dev)
        padded[:, :, :n] = cache.view(torch.uint8)
        pool[table.flatten().long()] = padded.view(bsz, kvh, per_row, page, 128).transpose(1, 2).flatten(0, 1)
        pools.append(pool.view(cache.dtype))
    kv_len = torch.full((bsz,), n, dtype=torch.int64, device=dev)
    a = (q, k, v, valid, start, 0.088, ks, vs)
    p = (q, *pools, table, kv_len, 0.088, ks, vs)
    ref = K.attention(*a, config=(16, 4, 3))
    variants = {"fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len0, 0.088, ks, vs),
                "fast paged": lambda: decode_attention(q[:, :, 0], *pools, None, kv_len, 0.088, ks, vs, block_table=table)}
    bits = {}
    for c in CONFIGS:
        variants[f"contiguous {c}"] = lambda c=c: K.attention(*a, config=c)
        variants[f"paged {c}"] = lambda c=c: K.paged_attention(*p, config=c)
        bits[f"contiguous {c}"] = torch.equal(K.attention(*a, config=c), ref)
        bits[f"paged {c}"] = torch.equal(K.paged_attention(*p, config=c), ref)
    row = {"shape": name, "same bits as contiguous (16, 4, 3)": bits, "us (median, min, max)": timed(variants)}
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/stages_probe.json", "w"), indent=1)
