"""Probe: the exact decode kernel with the e4m3 scales folded into scores/output (FOLD), without _pin (PIN=0),
and tile configs, against the shipped exact kernel and the fast FP8 decode kernel; contiguous and paged (pages of
16)."""
# ruff: noqa: B023  (each iteration's lambdas run within that iteration)
import json
import os
import pathlib
import statistics
import sys

import torch
import triton
import triton.testing

SRC = pathlib.Path("nemo_jetrl/models/batch_invariant_kernels.py").read_text()
subs = [
 ("def _load_kv(base, offsets, in_range, dims, scale, FP8: tl.constexpr, DT: tl.constexpr, HW_CAST: tl.constexpr):",
  "def _load_kv(base, offsets, in_range, dims, scale, FP8: tl.constexpr, DT: tl.constexpr, HW_CAST: tl.constexpr, FOLD: tl.constexpr, PIN: tl.constexpr):"),
 ("""    if FP8:
        x = x.to(tl.float32) * scale
        if not HW_CAST:
            x = _round(x, DT)
    x = x.to(DT)
    if HW_CAST and DT != tl.float32:""",
  """    if FP8 and FOLD:
        x = x.to(DT)
    elif FP8:
        x = x.to(tl.float32) * scale
        if not HW_CAST:
            x = _round(x, DT)
    x = x.to(DT)
    if HW_CAST and DT != tl.float32 and PIN:"""),
 ("DT: tl.constexpr, HW_CAST: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, VARLEN: tl.constexpr,\n):",
  "DT: tl.constexpr, HW_CAST: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, VARLEN: tl.constexpr, FOLD: tl.constexpr = False, PIN: tl.constexpr = True,\n):"),
 ("k_scale, KV_FP8, DT, HW_CAST)", "k_scale, KV_FP8, DT, HW_CAST, FOLD, PIN)"),
 ("v_scale, KV_FP8, DT, HW_CAST)", "v_scale, KV_FP8, DT, HW_CAST, FOLD, PIN)"),
 ("    LEAD_SCAN: tl.constexpr = 1024,\n):", "    LEAD_SCAN: tl.constexpr = 1024, FOLD: tl.constexpr = False, PIN: tl.constexpr = True,\n):"),
 ("    v_scale = tl.load(vs_ptr)\n", "    v_scale = tl.load(vs_ptr)\n    if FOLD:\n        sm_scale = sm_scale * k_scale\n"),
 ("KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN,\n        )", "KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN, FOLD, PIN,\n        )"),
 ("                sm_scale, SPLIT_N, BLOCK_M, BLOCK_N, D, KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN,\n",
  "                sm_scale, SPLIT_N, BLOCK_M, BLOCK_N, D, KV_FP8, DT, HW_CAST, PAGE, PAGED, VARLEN, FOLD, PIN,\n"),
 ("        out = tl.trans(acc / tl.maximum(l_i, 1e-30)[None, :])  # [BM, D]; a row that may see no key gives 0\n",
  "        out = tl.trans(acc / tl.maximum(l_i, 1e-30)[None, :])  # [BM, D]; a row that may see no key gives 0\n        if FOLD:\n            out = out * v_scale\n"),
 ("                    config: tuple[int, int, int] | None = None) -> torch.Tensor:  # fmt: skip\n    \"\"\"See `batch_invariant_attention.paged_attention`",
  "                    config: tuple[int, int, int] | None = None, fold=False, pin=True) -> torch.Tensor:  # fmt: skip\n    \"\"\"See `batch_invariant_attention.paged_attention`"),
 ("            SPLIT_OUT=split_out, num_warps=warps, num_stages=stages,\n        )  # fmt: skip\n\n    with on_device(q):\n        _run_chunks(launch, out, kv_heads, block_m, width)",
  "            SPLIT_OUT=split_out, num_warps=warps, num_stages=stages, FOLD=fold, PIN=pin,\n        )  # fmt: skip\n\n    with on_device(q):\n        _run_chunks(launch, out, kv_heads, block_m, width)"),
]
subs += [("            config: tuple[int, int, int] | None = None, lse: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip",
  "            config: tuple[int, int, int] | None = None, lse: torch.Tensor | None = None, fold=False, pin=True) -> torch.Tensor:  # fmt: skip"),
 ("            WRITE_LSE=lse is not None, SPLIT_OUT=split_out, num_warps=warps, num_stages=stages,\n",
  "            WRITE_LSE=lse is not None, SPLIT_OUT=split_out, num_warps=warps, num_stages=stages, FOLD=fold, PIN=pin,\n"),
]
for a, b in subs:
    assert SRC.count(a) >= 1, a[:80]
    SRC = SRC.replace(a, b)
pathlib.Path(".gpu/bik_fold.py").write_text(SRC)
sys.path.insert(0, ".gpu")
import bik_fold as F  # noqa: E402

from nemo_jetrl.generation.native.decode_attention import decode_attention  # noqa: E402
from nemo_jetrl.models import batch_invariant_kernels as K  # noqa: E402
from nemo_jetrl.precision.kv import kv_quant  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "rows": []}


def paged(bsz, heads, kvh, n, page=16, slack=512):
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    ks, vs = torch.tensor(4.0 / 448, device=dev), torch.tensor(3.0 / 448, device=dev)
    k = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), ks)
    v = kv_quant(torch.randn(bsz, kvh, n, 128, device=dev), vs)
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
    return q, pools, table, kv_len, ks, vs



def contiguous(bsz, heads, kvh, n, width):
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    ks, vs = torch.tensor(4.0 / 448, device=dev), torch.tensor(3.0 / 448, device=dev)
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev), ks)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev), vs)
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, :n] = True
    return q, k, v, valid, ks, vs


def timed(variants, row):
    names = list(variants)
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in (names if r % 2 == 0 else names[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    for vn in names:
        t = times[vn]
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]


CONFIGS = [(16, 4, 2), (16, 4, 1), (16, 4, 4), (32, 4, 2)]
for name, (bsz, heads, kvh, n, width) in {"contig 1.7B 128x436": (128, 16, 8, 436, 692),
        "contig 1.7B 128x692": (128, 16, 8, 692, 692), "contig 8B 64x1000": (64, 32, 8, 1000, 1024),
        "contig 8B 64x384": (64, 32, 8, 384, 512)}.items():
    q, k, v, valid, ks, vs = contiguous(bsz, heads, kvh, n, width)
    kv_len, start = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
    a = (q, k, v, valid, start, 0.088, ks, vs)
    ref = K.attention(*a)
    qh = q.half()
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, ks, vs).unsqueeze(2),
        "fast triton": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, ks, vs, impl="triton").unsqueeze(2),
        "exact": lambda: K.attention(*a),
        "exact nopin": lambda: F.attention(*a, pin=False),
        "fold fp16": lambda: F.attention(qh, *a[1:], fold=True),
        "fold fp16 nopin": lambda: F.attention(qh, *a[1:], fold=True, pin=False),
    }
    for c in CONFIGS:
        variants[f"exact {c}"] = lambda c=c: K.attention(*a, config=c)
    variants["exact nopin (16, 4, 2)"] = lambda: F.attention(*a, config=(16, 4, 2), pin=False)
    variants["fold fp16 (16, 4, 2)"] = lambda: F.attention(qh, *a[1:], config=(16, 4, 2), fold=True)
    row = {"shape": name}
    for vn, fn in variants.items():
        out = fn()
        row[vn + " maxerr"] = float((out.float() - ref.float()).abs().max())
        row[vn + " same bits"] = bool(torch.equal(out, ref))
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us")}, flush=True)

for name, (bsz, heads, kvh, n) in {"paged 1.7B 128x436": (128, 16, 8, 436), "paged 1.7B 32x4000": (32, 16, 8, 4000)}.items():
    q, (kp, vp), table, kv_len, ks, vs = paged(bsz, heads, kvh, n, slack=64)
    a = (q, kp, vp, table, kv_len, 0.088)
    ref = K.paged_attention(*a, ks, vs)
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], kp, vp, None, kv_len, 0.088, ks, vs, block_table=table).unsqueeze(2),
        "exact": lambda: K.paged_attention(*a, ks, vs),
        "fold fp16": lambda: F.paged_attention(q.half(), *a[1:], ks, vs, fold=True),
    }
    for c in CONFIGS:
        variants[f"exact {c}"] = lambda c=c: K.paged_attention(*a, ks, vs, config=c)
    row = {"shape": name}
    for vn, fn in variants.items():
        out = fn()
        row[vn + " maxerr"] = float((out.float() - ref.float()).abs().max())
        row[vn + " same bits"] = bool(torch.equal(out, ref))
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us")}, flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/fold_probe2.json", "w"), indent=1)
