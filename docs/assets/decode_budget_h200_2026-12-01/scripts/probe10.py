"""Probe 10: the exact attention kernel without alignment specialization of S_q / S_k / svalb (working tree) against
the specialized one (`bik_spec`): bits at widths in both divisible-by-16 classes (decode, prefill, paged), decode
timings, and how many variants each compiled."""

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
DEC = '@triton.jit(do_not_specialize_on_alignment=["S_q", "S_k", "svalb"])\ndef _attention_kernel('
assert SRC.count(DEC) == 1
pathlib.Path(".gpu/bik_spec.py").write_text(SRC.replace(DEC, "@triton.jit\ndef _attention_kernel("))
sys.path.insert(0, ".gpu")
import bik_spec as SPEC  # noqa: E402

from nemo_jetrl.models import batch_invariant_kernels as NEW  # noqa: E402
from nemo_jetrl.precision.kv import kv_dequant, kv_quant  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
KS, VS = torch.tensor(3.1 / 448, device=dev), torch.tensor(2.7 / 448, device=dev)
res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}


def bench(fns):
    t = {k: [] for k in fns}
    for r in range(5):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t[k].append(1000 * triton.testing.do_bench_cudagraph(fns[k], rep=30))
    return {k: round(statistics.median(v), 1) for k, v in t.items()}


for name, (bsz, heads, kvh, n, width) in {
    "1.7B 128x436 w692": (128, 16, 8, 436, 692),
    "1.7B 128x436 w704": (128, 16, 8, 436, 704),
    "8B 64x1000 w1000": (64, 32, 8, 1000, 1000),
    "8B 64x1000 w1024": (64, 32, 8, 1000, 1024),
    "1.7B 32x1500 w1501 (split)": (32, 16, 8, 1500, 1501),
}.items():
    q_all = torch.randn(bsz, heads, n, 128, device=dev).bfloat16()
    q = q_all[:, :, n - 1 : n].contiguous()
    k = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, KS)
    v = kv_quant(torch.randn(bsz, kvh, width, 128, device=dev) * 2, VS)
    valid = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
    valid[:, 3:n] = True
    st = torch.tensor(n - 1, device=dev)
    a = (q, k, v, valid, st, 0.088, KS, VS)
    row = {"shape": name, "decode same bits": bool(torch.equal(NEW.attention(*a), SPEC.attention(*a)))}
    kd = kv_dequant(k[:, :, :n], KS, torch.bfloat16).contiguous()
    vd = kv_dequant(v[:, :, :n], VS, torch.bfloat16).contiguous()
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    rows = min(bsz, 8)
    lse = torch.empty(heads, rows * n, device=dev)
    train = NEW.attention(q_all[:rows], kd[:rows], vd[:rows], valid[:rows, :n].contiguous(), zero, 0.088, lse=lse)
    row["decode == trainer (new)"] = bool(torch.equal(NEW.attention(*a)[:rows, :, 0], train[:, :, n - 1]))
    pre = (q_all[:rows], kd[:rows], vd[:rows], valid[:rows, :n].contiguous(), zero, 0.088)
    row["prefill same bits"] = bool(torch.equal(NEW.attention(*pre), SPEC.attention(*pre)))
    row["decode us"] = bench({"new": lambda: NEW.attention(*a), "spec": lambda: SPEC.attention(*a)})
    res["rows"].append(row)
    print(row, flush=True)


def count(mod):
    n = 0

    def walk(x, depth=0):
        nonlocal n
        if hasattr(x, "asm") and hasattr(x, "metadata"):
            n += 1
        elif isinstance(x, (dict, list, tuple)) and depth < 4:
            for y in x.values() if isinstance(x, dict) else x:
                walk(y, depth + 1)

    walk(mod._attention_kernel.device_caches)
    return n


res["variants compiled"] = {"new": count(NEW), "spec": count(SPEC)}
print(res["variants compiled"])
json.dump(res, open(os.environ.get("OUT", ".") + "/probe10.json", "w"), indent=1)
