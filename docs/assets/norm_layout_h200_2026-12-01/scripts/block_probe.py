# ruff: noqa: B023, E731  (each variant is timed in the iteration that defines it)
"""Side by side: the exact attention's key block (ATTN_BLOCK_N, both sides' contract) 64 (shipped) against 128, at
decode (contiguous and paged, several tile configs) and the trainer's forward (varlen). One process, 5 alternating
rounds, CUDA-graph timing; bits checked within each block size (decode == prefill's last query, paged ==
contiguous, varlen == prefill)."""

import json
import os
import statistics

import torch
import triton.testing

from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.precision.kv import kv_dequant, kv_quant

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "rows": []}
SHAPES = {
    "1.7B 128x436": (128, 16, 436),
    "1.7B 128x692": (128, 16, 692),
    "8B 64x1000": (64, 32, 1000),
    "1.7B 32x4096": (32, 16, 4096),
}
DEC = {64: [None, (16, 4, 2), (16, 4, 4)], 128: [(16, 4, 2), (16, 4, 3), (16, 4, 4), (16, 8, 2), (16, 8, 3)]}
PAGED = {64: [None], 128: [(16, 4, 2), (16, 4, 3), (16, 8, 2)]}
TRAIN = {64: [(64, 4, 3)], 128: [(64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3), (32, 4, 3)]}


def bn(n, fn):
    def f():
        K.ATTN_BLOCK_N = n
        return fn()

    return f


def timed(variants):
    names, row = list(variants), {}
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in names if r % 2 == 0 else names[::-1]:
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=30))
    for vn in names:
        row[vn] = [round(statistics.median(times[vn]), 1), round(min(times[vn]), 1), round(max(times[vn]), 1)]
    return row


for name, (bsz, heads, n) in SHAPES.items():
    kvh, page = 8, 16
    qf = torch.randn(bsz, heads, n, 128, device=dev).bfloat16() if n <= 1000 else None
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16() if qf is None else qf[:, :, -1:].contiguous()
    ks, vs = torch.tensor(4.0 / 448, device=dev), torch.tensor(3.0 / 448, device=dev)
    k = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), ks)
    v = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), vs)
    valid = torch.ones(bsz, n, dtype=torch.bool, device=dev)
    start, kv_len0, zero = torch.tensor(n - 1, device=dev), torch.tensor(n, device=dev), torch.tensor(0, device=dev)
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
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len0, 0.088, ks, vs),
        "fast paged": lambda: decode_attention(q[:, :, 0], *pools, None, kv_len, 0.088, ks, vs, block_table=table),
    }
    bits = {}
    for nb in (64, 128):
        K.ATTN_BLOCK_N = nb
        ref = K.attention(*a)
        if qf is not None:
            pre = K.attention(qf, k, v, valid, zero, 0.088, ks, vs)[:, :, -1:]
            bits[f"bn{nb} decode == prefill"] = torch.equal(ref, pre)
        for c in DEC[nb]:
            variants[f"bn{nb} contiguous {c}"] = bn(nb, lambda c=c: K.attention(*a, config=c))
            bits[f"bn{nb} contiguous {c}"] = torch.equal(K.attention(*a, config=c), ref)
        for c in PAGED[nb]:
            variants[f"bn{nb} paged {c}"] = bn(nb, lambda c=c: K.paged_attention(*p, config=c))
            bits[f"bn{nb} paged {c}"] = torch.equal(K.paged_attention(*p, config=c), ref)
    K.ATTN_BLOCK_N = 64
    row = {"shape": name, "bits (each against its block size's default decode)": bits, "us": timed(variants)}
    res["rows"].append(row)
    print(json.dumps(row), flush=True)

# the trainer's forward: one packed row of `segs` sequences of `n` tokens (varlen), bf16 K/V as the trainer has them
for name, (segs, heads, n) in {"1.7B 16x1024": (16, 16, 1024), "8B 4x4096": (4, 32, 4096)}.items():
    kvh, T = 8, segs * n
    q = torch.randn(1, heads, T, 128, device=dev).bfloat16()
    ks = torch.tensor(4.0 / 448, device=dev)
    k = kv_dequant(kv_quant(torch.randn(1, kvh, T, 128, device=dev), ks), ks, torch.bfloat16)
    v = kv_dequant(kv_quant(torch.randn(1, kvh, T, 128, device=dev), ks), ks, torch.bfloat16)
    cu = torch.arange(0, T + 1, n, dtype=torch.int32, device=dev)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(
        q.view(heads, segs, n, 128).transpose(0, 1),
        k.view(kvh, segs, n, 128).transpose(0, 1),
        v.view(kvh, segs, n, 128).transpose(0, 1),
        is_causal=True,
        enable_gqa=True,
    )
    variants, bits = {"sdpa (fast)": sdpa}, {}
    for nb in (64, 128):
        K.ATTN_BLOCK_N = nb
        ref = None
        for c in TRAIN[nb]:

            def run(c=c, nb=nb):
                K.ATTN_BLOCK_N, K.TRAIN_CONFIG = nb, c
                return K.varlen_attention(q, k, v, cu, n, 0.088)[0]

            out = run()
            ref = out if ref is None else ref
            bits[f"bn{nb} {c}"] = torch.equal(out, ref)
            variants[f"bn{nb} train {c}"] = run
    K.ATTN_BLOCK_N, K.TRAIN_CONFIG = 64, (64, 4, 3)
    row = {"shape": f"trainer forward {name}", "bits (against the first config)": bits, "us": timed(variants)}
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/block_probe.json", "w"), indent=1)
