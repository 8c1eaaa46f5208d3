"""Probe 11: variants the exact attention compiles as the width changes class (divisible by 16 or not): the working
tree (no alignment specialization of S_q / S_k / svalb) against the specialized copy `bik_spec` (probe 10's)."""

import json
import os
import pathlib
import sys

import torch

SRC = pathlib.Path("nemo_jetrl/models/batch_invariant_kernels.py").read_text()
DEC = '@triton.jit(do_not_specialize_on_alignment=["S_q", "S_k", "svalb"])\ndef _attention_kernel('
assert SRC.count(DEC) == 1
pathlib.Path(".gpu/bik_spec.py").write_text(SRC.replace(DEC, "@triton.jit\ndef _attention_kernel("))
sys.path.insert(0, ".gpu")
import bik_spec as SPEC  # noqa: E402

from nemo_jetrl.models import batch_invariant_kernels as NEW  # noqa: E402
from nemo_jetrl.precision.kv import kv_quant  # noqa: E402

dev = "cuda"
KS = torch.tensor(3.1 / 448, device=dev)
out = {"device": torch.cuda.get_device_name()}
for label, mod in (("new", NEW), ("spec", SPEC)):
    seen = []
    for width in (692, 704, 700, 720):
        q = torch.randn(2, 16, 1, 128, device=dev).bfloat16()
        k = kv_quant(torch.randn(2, 8, width, 128, device=dev), KS)
        valid = torch.ones(2, width, dtype=torch.bool, device=dev)
        mod.attention(q, k, k, valid, torch.tensor(width - 1, device=dev), 0.088, KS, KS)
        seen.append(("decode", width, len(mod._attention_kernel.device_caches[0][0])))
    for s in (180, 192, 181, 208):
        q = torch.randn(2, 16, s, 128, device=dev).bfloat16()
        kk = torch.randn(2, 8, s, 128, device=dev).bfloat16()
        valid = torch.ones(2, s, dtype=torch.bool, device=dev)
        mod.attention(q, kk, kk, valid, torch.zeros((), dtype=torch.int64, device=dev), 0.088)
        seen.append(("prefill", s, len(mod._attention_kernel.device_caches[0][0])))
    out[label] = seen
    print(label, seen, flush=True)
json.dump(out, open(os.environ.get("OUT", ".") + "/probe11.json", "w"), indent=1)
