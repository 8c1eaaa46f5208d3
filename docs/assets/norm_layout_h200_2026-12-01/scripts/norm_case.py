"""The first mismatching fused-norm call of fp32_norm_diag (bad_case.pt: FP32 x, no residual delta, FP32 weight),
re-run alone: fused FP8 output against the plain norm + act_quant, with variants that tell where the rows differ."""

import json
import os
import sys

import torch

from nemo_jetrl.models import fused_ops
from nemo_jetrl.precision import act_quant

case = torch.load(sys.argv[1])
x, w, eps, block, pow2 = case["x"].cuda(), case["weight"].cuda(), case["eps"], case["block"], case["pow2"]
n = x.shape[-1]
R = torch.tensor(1 / 448, dtype=torch.float32).item()
rep = {"shape": list(x.shape), "x": str(x.dtype), "w": str(w.dtype), "eps": eps, "block": block, "pow2": pow2}


def plain(x, delta=None):
    res, h = fused_ops.add_rms_norm(x, delta, w, eps)
    q, s = act_quant(h.reshape(-1, n), block, pow2)
    return h.reshape(-1, n), q, s.float()


def fused(x, delta=None):
    res, q, s = fused_ops.add_rms_norm_fp8(x, delta, w, eps, block, pow2)
    return q.reshape(-1, n), s.float().reshape(-1, n // block)


def diff(a, b):
    (qa, sa), (qb, sb) = a, b
    return {
        "q": int((qa.view(torch.uint8) != qb.view(torch.uint8)).sum()),
        "s": int((sa != sb).sum()),
        "rows": int(((qa.view(torch.uint8) != qb.view(torch.uint8)).any(-1) | (sa != sb).any(-1)).sum()),
    }


h, q0, s0 = plain(x)
f = fused(x)
rep["fused vs plain"] = diff(f, (q0, s0))
rep["fused vs fused again"] = diff(f, fused(x))
rep["fused(x.clone()) vs plain"] = diff(fused(x.clone()), (q0, s0))
z = torch.zeros_like(x)
hz, qz, sz = plain(x, z)
rep["plain with a zero delta vs plain"] = {"h equal": bool(torch.equal(hz, h)), **diff((qz, sz), (q0, s0))}
rep["fused with a zero delta vs plain"] = diff(fused(x, z), (q0, s0))
zb = torch.zeros_like(x, dtype=torch.bfloat16)
rep["fused with a zero bf16 delta vs plain"] = diff(fused(x, zb), (q0, s0))
rep["plain, h from a zero bf16 delta, equal h"] = bool(torch.equal(plain(x, zb)[0], h))
# where the scales differ: is the fused scale the plain h's amax * R, or another amax?
qf, sf = f
bad = (sf != s0).nonzero()[:8].tolist()
amax = h.abs().reshape(-1, n // block, block).amax(-1)  # [R, G]
rows = []
for r, g in bad:
    rows.append(
        {
            "row": r,
            "group": g,
            "plain s": s0[r, g].item(),
            "fused s": sf[r, g].item(),
            "plain amax*R": (amax[r, g] * R).item(),
            "fused s/R": (sf[r, g] / R).item(),
            "plain amax": amax[r, g].item(),
            "ulps": int(sf[r, g].view(torch.int32) - s0[r, g].view(torch.int32)),
        }
    )
rep["differing scales"] = rows
# the row's rstd several ways
xr = x.reshape(-1, n).double()
for r, _ in bad[:3]:
    ss64 = (xr[r] * xr[r]).sum().item()
    rep.setdefault("rstd", []).append(
        {"row": r, "float64 mean square": ss64 / n, "h/x ratio (plain)": (h[r].double() / xr[r]).median().item()}
    )
print(json.dumps(rep, indent=1))
json.dump(rep, open(os.environ.get("OUT", ".") + "/norm_case.json", "w"), indent=1)
