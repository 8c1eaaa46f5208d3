"""Probe 5: where the per-slot sums slow the paged decode (8B, 64 x 1,000 keys in call 4): query heads per KV head
(2 / 4), keys split into chunks or not (the block table's width over 1,024), batch; shipped vs the working tree."""
# ruff: noqa: B023
import json
import os
import statistics
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, ".gpu")
import bik_shipped as SHIP  # noqa: E402

from nemo_jetrl.models import batch_invariant_kernels as DEF  # noqa: E402
from nemo_jetrl.precision.kv import kv_quant  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
KS, VS = torch.tensor(3.1 / 448, device=dev), torch.tensor(2.7 / 448, device=dev)
for name, (bsz, heads, kvh, n, slack) in {
    "8B 64x1000 table 1072 (split)": (64, 32, 8, 1000, 64), "8B 64x1000 table 1008": (64, 32, 8, 1000, 0),
    "1.7B-heads 64x1000 table 1072 (split)": (64, 16, 8, 1000, 64), "1.7B-heads 64x1000 table 1008": (64, 16, 8, 1000, 0),
    "8B 64x436 table 500": (64, 32, 8, 436, 64), "8B 128x436 table 500": (128, 32, 8, 436, 64),
    "8B 32x4000 (split)": (32, 32, 8, 4000, 64),
}.items():
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    page = 16
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
    a = (q, pools[0], pools[1], table, kv_len, 0.088, KS, VS)
    variants = {"shipped": lambda: SHIP.paged_attention(*a), "defer": lambda: DEF.paged_attention(*a)}
    times = {vn: [] for vn in variants}
    for r in range(5):
        for vn in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    row = {"shape": name}
    for vn, t in times.items():
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]
    res["rows"].append(row)
    print(row, flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/probe5.json", "w"), indent=1)
