"""Probe 8: the paged decode with the per-slot sums and a 128-register budget (the working tree) against the shipped
kernel, at the paged shapes of probes 4-7; bits of each config against its own default; the compiled registers."""
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



res = {"device": torch.cuda.get_device_name(), "rows": []}
for name, shape in {"paged 8B 64x1000 split": (64, 32, 8, 1000, 64), "paged 8B 128x1000 split": (128, 32, 8, 1000, 64),
                    "paged 8B 32x4000 split": (32, 32, 8, 4000, 64), "paged 8B 64x1000 table 1008": (64, 32, 8, 1000, 0),
                    "paged 1.7B 128x436": (128, 16, 8, 436, 64), "paged 1.7B 32x4000 split": (32, 16, 8, 4000, 64)}.items():
    a = paged(*shape)
    variants = {"shipped": lambda: SHIP.paged_attention(*a), "defer": lambda: DEF.paged_attention(*a)}
    times = {vn: [] for vn in variants}
    for r in range(5):
        for vn in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    row = {"shape": name}
    for vn, t in times.items():
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]
    ref = DEF.paged_attention(*a)
    row["defer configs same bits"] = all(torch.equal(DEF.paged_attention(*a, config=c), ref)
                                         for c in ((16, 4, 2), (16, 4, 3), (16, 4, 4)))
    res["rows"].append(row)
    print(row, flush=True)
regs = []
def walk(x, depth=0):
    if hasattr(x, "asm") and hasattr(x, "metadata"):
        try:
            x._init_handles()
        except Exception:
            pass
        regs.append((x.metadata.num_stages, x.metadata.shared, getattr(x, "n_regs", None), getattr(x, "n_spills", None)))
    elif isinstance(x, (dict, list, tuple)) and depth < 4:
        for v in (x.values() if isinstance(x, dict) else x):
            walk(v, depth + 1)
walk(DEF._attention_kernel.device_caches)
res["defer kernels (stages, shared, regs, spills)"] = regs
print(regs)
json.dump(res, open(os.environ.get("OUT", ".") + "/probe8.json", "w"), indent=1)
