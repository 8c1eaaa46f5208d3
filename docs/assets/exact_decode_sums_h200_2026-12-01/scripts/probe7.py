"""Probe 7: the compiled paged split decode (per-slot sums) at 4 and 2 query heads per KV head as this GPU's Triton
builds it (PTX / TTGIR / SASS stats written out), and 4 heads per KV head with 4 KV heads (grid halves)."""
# ruff: noqa: B023  (each lambda runs within its iteration)
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


res = {"rows": []}
for name, shape in {"8B 64x1000 split": (64, 32, 8, 1000, 64), "1.7B-heads 64x1000 split": (64, 16, 8, 1000, 64),
                    "4 per KV, 4 KV heads, 64x1000 split": (64, 16, 4, 1000, 64),
                    "4 per KV, 8 KV, 128x1000 split": (128, 32, 8, 1000, 64)}.items():
    a = paged(*shape)
    row = {"shape": name}
    for mn, mod in (("shipped", SHIP), ("defer", DEF)):
        f = lambda mod=mod: mod.paged_attention(*a)  # noqa: E731
        t = [1000 * triton.testing.do_bench_cudagraph(f, rep=40) for _ in range(3)]
        row[mn + " us"] = round(statistics.median(t), 1)
    res["rows"].append(row)
    print(row, flush=True)
out = os.environ.get("OUT", ".")
n = 0
for mn, mod in (("shipped", SHIP), ("defer", DEF)):
    def walk(x, depth=0):
        global n
        if hasattr(x, "asm") and hasattr(x, "metadata"):
            n += 1
            tag = f"{mn}_{n}"
            open(f"{out}/{tag}.ptx", "w").write(x.asm.get("ptx", ""))
            open(f"{out}/{tag}.ttgir", "w").write(x.asm.get("ttgir", ""))
            try:
                x._init_handles()
            except Exception:
                pass
            print(tag, x.metadata.num_stages, x.metadata.shared, getattr(x, "n_regs", None), getattr(x, "n_spills", None),
                  "N_REP=4" if "c4_i32" in x.asm.get("ttgir", "") else "", flush=True)
        elif isinstance(x, dict) and depth < 4:
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple)) and depth < 4:
            for v in x:
                walk(v, depth + 1)
    walk(mod._attention_kernel.device_caches)
json.dump(res, open(f"{out}/probe7.json", "w"), indent=1)
