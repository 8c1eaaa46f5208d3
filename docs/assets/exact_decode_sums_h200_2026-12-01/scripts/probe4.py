"""Probe 4: the paged decode's pipeline depth under the per-slot sums (the working tree's kernel: `defer`), and
`pairs`: one max (a reduction across the warps) per two 64-key blocks; bits decode == own trainer tile; compiled
kernels' registers / spills / shared memory on this GPU's Triton."""
# ruff: noqa: B023, F841
import json
import os
import pathlib
import statistics
import sys

import torch
import triton
import triton.testing

SRC = pathlib.Path("nemo_jetrl/models/batch_invariant_kernels.py").read_text()
start = SRC.index("    for start in range(c0, tl.minimum(c0 + SPLIT_N, hi), BLOCK_N):")
end = SRC.index("    return m_i, tl.sum(l_slots, axis=0), acc\n")
PAIRS = '''    for start in range(c0, tl.minimum(c0 + SPLIT_N, hi), 2 * BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cols1 = cols + BLOCK_N
        in_range = cols < hi
        in_range1 = cols1 < hi
        if PAGED or VARLEN:
            valid = in_range
            valid1 = in_range1
        else:
            valid = tl.load(valid_row + cols, mask=in_range, other=0) != 0
            valid1 = tl.load(valid_row + cols1, mask=in_range1, other=0) != 0
        k_offs = _key_offsets(cols, in_range, table_row, skb, sks, PAGE, PAGED)  # [BN]
        k_offs1 = _key_offsets(cols1, in_range1, table_row, skb, sks, PAGE, PAGED)  # [BN]
        k = _load_kv(k_base, k_offs, in_range, dims, k_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        k1 = _load_kv(k_base, k_offs1, in_range1, dims, k_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        s = _dot(k, qt, DT) * sm_scale
        s1 = _dot(k1, qt, DT) * sm_scale
        allowed = valid[:, None] & (cols[:, None] <= qcol[None, :])
        allowed1 = valid1[:, None] & (cols1[:, None] <= qcol[None, :])
        s = tl.where(allowed, s, float("-inf"))
        s1 = tl.where(allowed1, s1, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(tl.maximum(s, s1), axis=0))
        alpha = tl.where(m_new == m_i, 1.0, tl.exp(m_i - m_new))
        p = tl.where(allowed, tl.exp(s - m_new[None, :]), 0.0)
        p1 = tl.where(allowed1, tl.exp(s1 - m_new[None, :]), 0.0)
        l_slots = l_slots * alpha[None, :] + p + p1
        v_offs = _key_offsets(cols, in_range, table_row, svb, svs, PAGE, PAGED)
        v_offs1 = _key_offsets(cols1, in_range1, table_row, svb, svs, PAGE, PAGED)
        v = _load_kv(v_base, v_offs, in_range, dims, v_scale, KV_FP8, DT, HW_CAST)
        v1 = _load_kv(v_base, v_offs1, in_range1, dims, v_scale, KV_FP8, DT, HW_CAST)
        acc = acc * alpha[None, :] + _dot(tl.trans(v), p.to(DT), DT)
        acc = acc + _dot(tl.trans(v1), p1.to(DT), DT)
        m_i = m_new
'''
pathlib.Path(".gpu/bik_pairs.py").write_text(SRC[:start] + PAIRS + SRC[end:])
sys.path.insert(0, ".gpu")
import bik_pairs as PAIR  # noqa: E402
import bik_shipped as SHIP  # noqa: E402

from nemo_jetrl.models import batch_invariant_kernels as DEF  # noqa: E402
from nemo_jetrl.models.packed import PackedRows  # noqa: E402
from nemo_jetrl.precision.kv import kv_dequant, kv_quant  # noqa: E402

MODS = {"shipped": SHIP, "defer": DEF, "pairs": PAIR}
dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
KS, VS = torch.tensor(3.1 / 448, device=dev), torch.tensor(2.7 / 448, device=dev)


def timed(variants, row):
    names = list(variants)
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in (names if r % 2 == 0 else names[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    for vn in names:
        t = times[vn]
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]


def report(row):
    res["rows"].append(row)
    print(row["shape"], {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us") and k != "shape"}, flush=True)


for name, (bsz, heads, kvh, n, width) in {
    "contig 1.7B 128x436": (128, 16, 8, 436, 692), "contig 1.7B 128x692": (128, 16, 8, 692, 692),
    "contig 8B 64x1000": (64, 32, 8, 1000, 1024), "contig 1.7B 32x4096 (split)": (32, 16, 8, 4096, 4608),
}.items():
    q_all = torch.randn(bsz, heads, n, 128, device=dev).bfloat16()
    q = q_all[:, :, n - 1 : n].contiguous()
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, VS)
    kd = kv_dequant(k[:, :, :n], KS, torch.bfloat16).contiguous()
    vd = kv_dequant(v[:, :, :n], VS, torch.bfloat16).contiguous()
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, 5:n] = True
    st = torch.tensor(n - 1, device=dev)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    a = (q, k, v, valid, st, 0.088, KS, VS)
    row = {"shape": name}
    variants = {}
    for mn, mod in MODS.items():
        variants[mn] = lambda mod=mod: mod.attention(*a)
        dec = mod.attention(*a)
        lse = torch.empty(heads, bsz * n, device=dev)
        train = mod.attention(q_all, kd, vd, valid[:, :n].contiguous(), zero, 0.088, lse=lse)
        row[mn + " decode==trainer"] = bool(torch.equal(dec[:, :, 0], train[:, :, n - 1]))
    variants["pairs (16, 4, 3)"] = lambda: PAIR.attention(*a, config=(16, 4, 3))
    variants["pairs (16, 4, 2)"] = lambda: PAIR.attention(*a, config=(16, 4, 2))
    timed(variants, row)
    report(row)

for name, (bsz, heads, kvh, n) in {"paged 1.7B 128x436": (128, 16, 8, 436), "paged 8B 64x1000": (64, 32, 8, 1000),
                                   "paged 1.7B 32x4000": (32, 16, 8, 4000)}.items():
    q = torch.randn(bsz, heads, 1, 128, device=dev).bfloat16()
    page, slack = 16, 64
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
    row = {"shape": name}
    variants = {}
    for mn, mod in MODS.items():
        for c in ((16, 4, 2), (16, 4, 3), (16, 4, 4)):
            variants[f"{mn} {c}"] = lambda mod=mod, c=c: mod.paged_attention(*a, config=c)
    ref = {mn: mod.paged_attention(*a) for mn, mod in MODS.items()}
    for vn, fn in variants.items():
        row[vn + " same bits as own default"] = bool(torch.equal(fn(), ref[vn.split()[0]]))
    timed(variants, row)
    report(row)

for name, (seqs, heads, kvh, n) in {"trainer fwd 1.7B 16x692 packed": (16, 16, 8, 692),
                                    "trainer fwd 8B 8x1024 packed": (8, 32, 8, 1024)}.items():
    packing = PackedRows.from_mask(torch.ones(seqs, n, dtype=torch.long), 64)
    T = seqs * n
    q = torch.randn(1, heads, T, 128, device=dev).bfloat16()
    k = torch.randn(1, kvh, T, 128, device=dev).bfloat16()
    v = torch.randn(1, kvh, T, 128, device=dev).bfloat16()
    cu = packing.cu_seqlens.to(dev)
    row = {"shape": name}
    variants = {mn: (lambda mod=mod: mod.varlen_attention(q, k, v, cu, packing.max_seqlen, 0.088)) for mn, mod in MODS.items()}
    timed(variants, row)
    report(row)

kernels = []
for mn, mod in MODS.items():
    def walk(x, depth=0):
        if hasattr(x, "asm") and hasattr(x, "metadata"):
            try:
                x._init_handles()
            except Exception:
                pass
            c = x.metadata
            cs = str(getattr(x, "src", "")) + str(getattr(c, "constants", ""))
            kernels.append({"mod": mn, "warps": c.num_warps, "stages": c.num_stages, "shared": c.shared,
                            "regs": getattr(x, "n_regs", None), "spills": getattr(x, "n_spills", None),
                            "paged": "PAGE=16" in str(x.asm.get("ttir", ""))[:0] or None, "name": c.name})
        elif isinstance(x, dict) and depth < 4:
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple)) and depth < 4:
            for v in x:
                walk(v, depth + 1)
    walk(mod._attention_kernel.device_caches)
res["kernels"] = kernels
for kk in kernels:
    print(kk)
json.dump(res, open(os.environ.get("OUT", ".") + "/probe4.json", "w"), indent=1)
