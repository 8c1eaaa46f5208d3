"""Probe: the exact decode with power-of-two KV scales folded (POW2: e4m3 straight into the MMA's registers, the
scales on the scores and the output) against the shipped exact decode and the fast FP8 decode kernel; bits against
the shipped exact decode at the same scales; the compiled kernels' registers / shared memory."""
# ruff: noqa: B023
import json
import os
import statistics

import torch
import triton
import triton.testing

from nemo_jetrl.generation.native.decode_attention import decode_attention
from nemo_jetrl.models import batch_invariant_kernels as K
from nemo_jetrl.precision.kv import kv_quant

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
KS, VS = torch.tensor(2.0**-7, device=dev), torch.tensor(2.0**-7, device=dev)  # amax ~ 3.5 / 448 rounded


def timed(variants, row):
    names = list(variants)
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in (names if r % 2 == 0 else names[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    for vn in names:
        t = times[vn]
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]


def paged(bsz, heads, kvh, n, page=16, slack=64):
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
    return q, pools, table, kv_len


CONFIGS = [(16, 4, 2), (16, 4, 3), (16, 4, 4)]
for name, (bsz, heads, kvh, n, width) in {
    "contig 1.7B 128x436": (128, 16, 8, 436, 692), "contig 1.7B 128x692": (128, 16, 8, 692, 692),
    "contig 8B 64x1000": (64, 32, 8, 1000, 1024), "contig 1.7B 32x4096 (split)": (32, 16, 8, 4096, 4608),
}.items():
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, VS)
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, 5:n] = True
    kv_len, start = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
    a = (q, k, v, valid, start, 0.088, KS, VS)
    ref = K.attention(*a)
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, KS, VS).unsqueeze(2),
        "exact": lambda: K.attention(*a),
        "pow2": lambda: K.attention(*a, pow2_scales=True),
    }
    for c in CONFIGS:
        variants[f"pow2 {c}"] = lambda c=c: K.attention(*a, config=c, pow2_scales=True)
    row = {"shape": name}
    for vn, fn in variants.items():
        out = fn()
        row[vn + " same bits"] = bool(torch.equal(out, ref))
        row[vn + " maxerr"] = float((out.float() - ref.float()).abs().max())
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us")}, flush=True)

for name, (bsz, heads, kvh, n) in {"paged 1.7B 128x436": (128, 16, 8, 436), "paged 1.7B 32x4000": (32, 16, 8, 4000),
                                   "paged 8B 64x1000": (64, 32, 8, 1000)}.items():
    q, (kp, vp), table, kv_len = paged(bsz, heads, kvh, n)
    a = (q, kp, vp, table, kv_len, 0.088, KS, VS)
    ref = K.paged_attention(*a)
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], kp, vp, None, kv_len, 0.088, KS, VS, block_table=table).unsqueeze(2),
        "exact": lambda: K.paged_attention(*a),
        "pow2": lambda: K.paged_attention(*a, pow2_scales=True),
    }
    for c in CONFIGS:
        variants[f"pow2 {c}"] = lambda c=c: K.paged_attention(*a, config=c, pow2_scales=True)
    row = {"shape": name}
    for vn, fn in variants.items():
        out = fn()
        row[vn + " same bits"] = bool(torch.equal(out, ref))
        row[vn + " maxerr"] = float((out.float() - ref.float()).abs().max())
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us")}, flush=True)

kernels = []
def walk(x, depth=0):
    if hasattr(x, "asm") and hasattr(x, "metadata"):
        try:
            x._init_handles()
        except Exception:
            pass
        c = x.metadata
        ir = x.asm.get("ttgir", "")
        kernels.append({"consts": str(getattr(c, "constants", ""))[:300], "warps": c.num_warps, "stages": c.num_stages,
                        "shared": c.shared, "regs": getattr(x, "n_regs", None), "spills": getattr(x, "n_spills", None),
                        "local_alloc": ir.count("ttg.local_alloc"), "local_load": ir.count("ttg.local_load"),
                        "pow2": "POW2" in str(getattr(c, "constants", "")) })
    elif isinstance(x, dict) and depth < 4:
        for v in x.values():
            walk(v, depth + 1)
    elif isinstance(x, (list, tuple)) and depth < 4:
        for v in x:
            walk(v, depth + 1)
walk(K._attention_kernel.device_caches)
res["kernels"] = kernels
for kk in kernels:
    print({k: v for k, v in kk.items() if k != "consts"})
json.dump(res, open(os.environ.get("OUT", ".") + "/pow2_probe.json", "w"), indent=1)
