"""Probe 3: the row sums per key slot (`defer`, the working tree's kernel) and a two-pass chunk (`twopass`: the
chunk's max first, per key slot, one reduction; then exp / sums / P.V with no rescaling) against the shipped kernel:
decode timings, decode == the variant's own trainer tile bit for bit, and the trainer's forward (packed rows)."""
# ruff: noqa: B023
import json
import os
import pathlib
import statistics
import sys

import torch
import triton
import triton.testing

SRC = pathlib.Path("nemo_jetrl/models/batch_invariant_kernels.py").read_text()
start = SRC.index("    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)\n    l_slots")
end = SRC.index("    return m_i, tl.sum(l_slots, axis=0), acc\n")
TWO = '''    m_slots = tl.full([BLOCK_N, BLOCK_M], -1.0e30, dtype=tl.float32)
    for start in range(c0, tl.minimum(c0 + SPLIT_N, hi), BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_range = cols < hi
        if PAGED or VARLEN:
            valid = in_range
        else:
            valid = tl.load(valid_row + cols, mask=in_range, other=0) != 0
        k_offs = _key_offsets(cols, in_range, table_row, skb, sks, PAGE, PAGED)  # [BN]
        k = _load_kv(k_base, k_offs, in_range, dims, k_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        s = _dot(k, qt, DT) * sm_scale
        allowed = valid[:, None] & (cols[:, None] <= qcol[None, :])
        m_slots = tl.maximum(m_slots, tl.where(allowed, s, -1.0e30))
    m_i = tl.max(m_slots, axis=0)
    l_slots = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)
    for start in range(c0, tl.minimum(c0 + SPLIT_N, hi), BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_range = cols < hi
        if PAGED or VARLEN:
            valid = in_range
        else:
            valid = tl.load(valid_row + cols, mask=in_range, other=0) != 0
        k_offs = _key_offsets(cols, in_range, table_row, skb, sks, PAGE, PAGED)  # [BN]
        k = _load_kv(k_base, k_offs, in_range, dims, k_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        s = _dot(k, qt, DT) * sm_scale
        allowed = valid[:, None] & (cols[:, None] <= qcol[None, :])
        p = tl.where(allowed, tl.exp(s - m_i[None, :]), 0.0)
        l_slots = l_slots + p
        v_offs = _key_offsets(cols, in_range, table_row, svb, svs, PAGE, PAGED)  # [BN]
        v = _load_kv(v_base, v_offs, in_range, dims, v_scale, KV_FP8, DT, HW_CAST)  # [BN, D]
        acc = acc + _dot(tl.trans(v), p.to(DT), DT)
'''
pathlib.Path(".gpu/bik_twopass.py").write_text(SRC[:start] + TWO + SRC[end:])
sys.path.insert(0, ".gpu")
import bik_shipped as SHIP  # noqa: E402
import bik_twopass as TWOP  # noqa: E402

from nemo_jetrl.generation.native.decode_attention import decode_attention  # noqa: E402
from nemo_jetrl.models import batch_invariant_kernels as DEF  # noqa: E402
from nemo_jetrl.models.packed import PackedRows  # noqa: E402
from nemo_jetrl.precision.kv import kv_dequant, kv_quant  # noqa: E402

MODS = {"shipped": SHIP, "defer": DEF, "twopass": TWOP}
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
    kv_len, st = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    a = (q, k, v, valid, st, 0.088, KS, VS)
    row = {"shape": name}
    variants = {"fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, KS, VS).unsqueeze(2)}
    for mn, mod in MODS.items():
        variants[mn] = lambda mod=mod: mod.attention(*a)
        variants[mn + " (16, 4, 3)"] = lambda mod=mod: mod.attention(*a, config=(16, 4, 3))
        dec = mod.attention(*a)
        lse = torch.empty(heads, bsz * n, device=dev)
        train = mod.attention(q_all, kd, vd, valid[:, :n].contiguous(), zero, 0.088, lse=lse)
        row[mn + " decode==trainer"] = bool(torch.equal(dec[:, :, 0], train[:, :, n - 1]))
        row[mn + " maxerr vs shipped"] = float((dec.float() - SHIP.attention(*a).float()).abs().max())
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
    variants = {"fast": lambda: decode_attention(q[:, :, 0], pools[0], pools[1], None, kv_len, 0.088, KS, VS,
                                                 block_table=table).unsqueeze(2)}
    for mn, mod in MODS.items():
        variants[mn] = lambda mod=mod: mod.paged_attention(*a)
        row[mn + " maxerr vs shipped"] = float((mod.paged_attention(*a).float() - SHIP.paged_attention(*a).float()).abs().max())
    timed(variants, row)
    report(row)

for name, (seqs, heads, kvh, n) in {"trainer fwd 1.7B 16x692 packed": (16, 16, 8, 692),
                                    "trainer fwd 8B 8x1024 packed": (8, 32, 8, 1024)}.items():
    mask = torch.ones(seqs, n, dtype=torch.long)
    packing = PackedRows.from_mask(mask, 64)
    T = seqs * n
    q = torch.randn(1, heads, T, 128, device=dev).bfloat16()
    k = torch.randn(1, kvh, T, 128, device=dev).bfloat16()
    v = torch.randn(1, kvh, T, 128, device=dev).bfloat16()
    cu = packing.cu_seqlens.to(dev)
    row = {"shape": name}
    variants = {mn: (lambda mod=mod: mod.varlen_attention(q, k, v, cu, packing.max_seqlen, 0.088)) for mn, mod in MODS.items()}
    ref = SHIP.varlen_attention(q, k, v, cu, packing.max_seqlen, 0.088)[0]
    for mn, fn in variants.items():
        row[mn + " maxerr vs shipped"] = float((fn()[0].float() - ref.float()).abs().max())
    timed(variants, row)
    report(row)
json.dump(res, open(os.environ.get("OUT", ".") + "/probe3.json", "w"), indent=1)
