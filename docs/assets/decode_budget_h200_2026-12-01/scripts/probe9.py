"""Probe 9 (issue 44): the contiguous exact decode under a register budget (four programs an SM instead of three:
168 registers -> 128, 3 or 2 stages so that the shared memory fits four), against the shipped config; bits of each
against the default and against the trainer's tile."""

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
OLD = "SPLIT_OUT=split_out, num_warps=warps, num_stages=stages,\n"
assert SRC.count(OLD) == 1
pathlib.Path(".gpu/bik_nreg.py").write_text(
    SRC.replace(OLD, "SPLIT_OUT=split_out, num_warps=warps, num_stages=stages, maxnreg=CONTIG_MAXNREG,\n")
    + "\nCONTIG_MAXNREG = None\n"
)
sys.path.insert(0, ".gpu")
import bik_nreg as NR  # noqa: E402

from nemo_jetrl.generation.native.decode_attention import decode_attention  # noqa: E402
from nemo_jetrl.models import batch_invariant_kernels as DEF  # noqa: E402
from nemo_jetrl.precision.kv import kv_dequant, kv_quant  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
KS, VS = torch.tensor(3.1 / 448, device=dev), torch.tensor(2.7 / 448, device=dev)


def nreg(budget, config):
    def run(*a):
        NR.CONTIG_MAXNREG = budget
        try:
            return NR.attention(*a, config=config)
        finally:
            NR.CONTIG_MAXNREG = None

    return run


def timed(variants, row):
    names = list(variants)
    times = {vn: [] for vn in names}
    for r in range(5):
        for vn in names if r % 2 == 0 else names[::-1]:
            times[vn].append(1000 * triton.testing.do_bench_cudagraph(variants[vn], rep=40))
    for vn in names:
        t = times[vn]
        row[vn + " us"] = [round(statistics.median(t), 1), round(min(t), 1), round(max(t), 1)]


SHAPES = {
    "contig 1.7B 128x200": (128, 16, 8, 200, 692),
    "contig 1.7B 128x436": (128, 16, 8, 436, 692),
    "contig 1.7B 128x692": (128, 16, 8, 692, 692),
    "contig 8B 64x500": (64, 32, 8, 500, 1024),
    "contig 8B 64x1000": (64, 32, 8, 1000, 1024),
    "contig 8B 128x1000": (128, 32, 8, 1000, 1024),
    "contig 1.7B 32x4096 (split)": (32, 16, 8, 4096, 4608),
    "contig 8B 64x2000 (split)": (64, 32, 8, 2000, 2048),
}
for name, (bsz, heads, kvh, n, width) in SHAPES.items():
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
    variants = {
        "fast": lambda: decode_attention(q[:, :, 0], k, v, valid, kv_len, 0.088, KS, VS).unsqueeze(2),
        "shipped": lambda: DEF.attention(*a),
    }
    split = n > 1024
    cfgs = [((16, 4, 3), 128), ((16, 4, 2), 128), ((16, 4, 4), 128), ((16, 4, 3), 144), ((16, 4, 3), None)]
    if split:
        cfgs = [((16, 4, 3), 128), ((16, 4, 2), 128), ((16, 4, 4), 128), ((16, 4, 2), None), ((16, 4, 4), None)]
    ref = DEF.attention(*a)
    lse = torch.empty(heads, bsz * n, device=dev)
    train = DEF.attention(q_all, kd, vd, valid[:, :n].contiguous(), zero, 0.088, lse=lse)
    row["shipped decode==trainer"] = bool(torch.equal(ref[:, :, 0], train[:, :, n - 1]))
    same = {}
    for cfg, budget in cfgs:
        vn = f"{cfg} nreg {budget}"
        fn = nreg(budget, cfg)
        variants[vn] = lambda fn=fn: fn(*a)
        same[vn] = bool(torch.equal(fn(*a), ref))
    row["same bits as shipped"] = same
    timed(variants, row)
    res["rows"].append(row)
    print(name, {k: v for k, v in row.items() if k.endswith(" us")}, flush=True)
    print("   ", row["shipped decode==trainer"], same, flush=True)
regs = []


def walk(x, depth=0):
    if hasattr(x, "asm") and hasattr(x, "metadata"):
        try:
            x._init_handles()
        except Exception:
            pass
        regs.append(
            (
                x.metadata.num_stages,
                x.metadata.maxnreg,
                x.metadata.shared,
                getattr(x, "n_regs", None),
                getattr(x, "n_spills", None),
            )
        )
    elif isinstance(x, (dict, list, tuple)) and depth < 4:
        for v in x.values() if isinstance(x, dict) else x:
            walk(v, depth + 1)


walk(NR._attention_kernel.device_caches)
res["kernels (stages, maxnreg, shared, regs, spills)"] = sorted(set(map(str, regs)))
print(res["kernels (stages, maxnreg, shared, regs, spills)"])
json.dump(res, open(os.environ.get("OUT", ".") + "/probe9.json", "w"), indent=1)
