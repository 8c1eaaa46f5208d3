"""`transpose_fp8` (DGrad's W^T): the Triton kernel under the interpreter and the CPU twin equal `t.t().contiguous()`
byte for byte, on odd shapes, row-slice views (a weight group's member) and into a given output."""

import torch

from nemo_jetrl.precision.transpose import transpose_fp8

CHILD = """
import json, torch
from nemo_jetrl.precision.kernels.triton_transpose import transpose_bytes
g = torch.Generator().manual_seed(0)
out = {}
buffer = torch.randint(0, 256, (300, 200), dtype=torch.uint8, generator=g)
for name, x in (("odd", buffer[:, :130]), ("rows_view", buffer[64:192]), ("small", buffer[:5, :3])):
    ref = x.t().contiguous()
    fresh = transpose_bytes(x)
    into = torch.zeros_like(ref)
    transpose_bytes(x, into)
    out[name] = [torch.equal(fresh, ref), torch.equal(into, ref), list(fresh.shape)]
print(json.dumps(out))
"""


def test_triton_transpose_equals_the_twin_byte_for_byte(run_interpreted):
    out = run_interpreted(CHILD)
    assert out == {"odd": [True, True, [130, 300]], "rows_view": [True, True, [200, 128]], "small": [True, True, [3, 5]]}


def test_cpu_transpose_is_the_byte_transpose_fresh_and_into_out():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(256, 384, generator=g) * 40).to(torch.float8_e4m3fn)
    ref = w.view(torch.uint8).t().contiguous()
    fresh = transpose_fp8(w[128:])  # a row-slice view, as a weight group's member holds
    assert fresh.dtype == torch.float8_e4m3fn and fresh.shape == (384, 128) and fresh.is_contiguous()
    assert torch.equal(fresh.view(torch.uint8), ref[:, 128:])
    into = torch.zeros(384, 256, dtype=torch.float8_e4m3fn)
    assert transpose_fp8(w, out=into) is into and torch.equal(into.view(torch.uint8), ref)
