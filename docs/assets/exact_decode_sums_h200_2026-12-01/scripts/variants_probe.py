"""Probe 2: which part of the folded decode costs (K folded only, V folded only), and the row sums kept per key slot
until the chunk ends (one cross-warp reduction a block fewer); each variant's decode against its own trainer tile
(prefill of the dequantized cache, TRAIN_CONFIG) bit for bit, and timed beside the shipped kernel."""
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
K_FOLD = "        if KV_FP8 and POW2:  # (K_q . Q^T)"
V_FOLD = "        if KV_FP8 and POW2:  # loaded transposed"
V_END = "    if KV_FP8 and POW2:\n        acc = acc * v_scale"
SUM = ("    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)\n    acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)\n    for start",
       "    l_i = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)\n    acc = tl.zeros([D, BLOCK_M], dtype=tl.float32)\n    for start")
SUM2 = ("        l_i = l_i * alpha + tl.sum(p, axis=0)\n", "        l_i = l_i * alpha[None, :] + p\n")
SUM3 = ("    return m_i, l_i, acc\n", "    return m_i, tl.sum(l_i, axis=0), acc\n")


def variant(name, subs):
    s = SRC
    for a, b in subs:
        assert s.count(a) == 1, (name, a[:50])
        s = s.replace(a, b)
    pathlib.Path(f".gpu/bik_{name}.py").write_text(s)
    return __import__(f"bik_{name}")


sys.path.insert(0, ".gpu")
kfold = [(V_FOLD, V_FOLD.replace("POW2", "POW2 and False")), (V_END, V_END.replace("POW2", "POW2 and False"))]
vfold = [(K_FOLD, K_FOLD.replace("POW2", "POW2 and False"))]
MODS = {"kfold": variant("kfold", kfold), "vfold": variant("vfold", vfold),
        "defer": variant("defer", [SUM, SUM2, SUM3]), "defer_kfold": variant("defer_kfold", [SUM, SUM2, SUM3] + kfold)}

from nemo_jetrl.generation.native.decode_attention import decode_attention  # noqa: E402
from nemo_jetrl.models import batch_invariant_kernels as K  # noqa: E402
from nemo_jetrl.precision.kv import kv_dequant, kv_quant  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
KS, VS = torch.tensor(2.0**-7, device=dev), torch.tensor(2.0**-7, device=dev)


def timed(variants, row):
    names = list(variants)
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in (names if r % 2 == 0 else names[::-1]):
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    for vn in names:
        t = times[vn]
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]


for name, (bsz, heads, kvh, n, width) in {
    "contig 1.7B 128x436": (128, 16, 8, 436, 692), "contig 8B 64x1000": (64, 32, 8, 1000, 1024),
    "contig 1.7B 32x4096 (split)": (32, 16, 8, 4096, 4608),
}.items():
    q_all = torch.randn(bsz, heads, n, 128, device=dev).bfloat16()
    q = q_all[:, :, n - 1 : n].contiguous()
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, VS)
    kd, vd = kv_dequant(k[:, :, :n], KS, torch.bfloat16).contiguous(), kv_dequant(v[:, :, :n], VS, torch.bfloat16).contiguous()
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, 5:n] = True
    kv_len, start = torch.tensor(n, device=dev), torch.tensor(n - 1, device=dev)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    a = (q, k, v, valid, start, 0.088, KS, VS)
    row = {"shape": name}
    variants = {"fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, KS, VS).unsqueeze(2),
                "exact": lambda: K.attention(*a)}
    mods = {"exact": (K, False)}
    for mn, mod in MODS.items():
        pow2 = "fold" in mn
        variants[mn] = lambda mod=mod, pow2=pow2: mod.attention(*a, pow2_scales=pow2)
        mods[mn] = (mod, pow2)
    for mn, (mod, pow2) in mods.items():  # decode == the variant's own trainer tile at the last query
        dec = mod.attention(*a, pow2_scales=pow2)
        lse = torch.empty(heads, bsz * n, device=dev)
        train = mod.attention(q_all, kd, vd, valid[:, :n].contiguous(), zero, 0.088, lse=lse)
        row[mn + " decode==trainer"] = bool(torch.equal(dec[:, :, 0], train[:, :, n - 1]))
        row[mn + " == shipped"] = bool(torch.equal(dec, K.attention(*a)))
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", {k: v for k, v in row.items() if not k.endswith(" us")}, flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/variants_probe.json", "w"), indent=1)
