"""Rowwise / tensorwise E4M3 quantizers: the formula (one group = one row / the whole tensor), the transposed
WGrad operand, edge cases, and the Triton twins under the interpreter (scales and counts bitwise; the e4m3 values
bitwise on the GPU, tests/gpu/test_recipes_gpu.py)."""

import pytest
import torch

from nemo_jetrl.precision.axis_quant import (
    axis_dequant,
    col_quant_t,
    row_quant,
    row_quant_checked,
    tensor_quant,
    tensor_quant_dual,
)
from nemo_jetrl.precision.quant import FLT_MAX, act_quant

from .test_quant import loop_scale

E4M3 = torch.float8_e4m3fn


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("pow2", [False, True])
def test_row_quant_is_one_group_per_row(pow2):
    x = torch.randn(37, 300, dtype=torch.bfloat16) * torch.logspace(-3, 2, 37, dtype=torch.bfloat16)[:, None]
    q, s = row_quant(x, pow2)
    assert q.dtype == E4M3 and s.shape == (37, 1) and s.dtype == torch.float32
    want = [loop_scale(row.float(), pow2) for row in x]
    assert s.squeeze(1).tolist() == [float(v) for v in want]
    q_ref, s_ref = act_quant(x, block=300, pow2=pow2)  # the blockwise quantizer with one group per row
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(s, s_ref)


def test_col_quant_t_is_row_quant_of_the_transpose():
    x = torch.randn(200, 96) * 3
    q, s = col_quant_t(x)
    q_ref, s_ref = row_quant(x.t().contiguous())
    assert q.shape == (96, 200) and s.shape == (96, 1) and q.is_contiguous()
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(s, s_ref)


@pytest.mark.parametrize("pow2", [False, True])
def test_tensor_quant_is_one_group(pow2):
    x = torch.randn(64, 130) * 7
    q, s = tensor_quant(x, pow2)
    assert s.shape == (1, 1) and s.item() == float(loop_scale(x, pow2))
    q_ref, s_ref = act_quant(x.reshape(1, -1), block=x.numel(), pow2=pow2)
    assert torch.equal(bits(q), bits(q_ref.view(64, 130))) and torch.equal(s, s_ref)
    assert (axis_dequant(q, s) - x).abs().max().item() <= 448 * s.item() / 16  # half an e4m3 ulp at the top


def test_tensor_quant_dual_is_the_cast_and_its_padded_transpose():
    x = torch.randn(200, 96) * 3
    q, qt, s = tensor_quant_dual(x, pad=16)
    q_ref, s_ref = tensor_quant(x)
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(s, s_ref) and qt.shape == (96, 208)
    assert torch.equal(bits(qt)[:, :200], bits(q).t()) and not bits(qt)[:, 200:].any()


def test_round_trip_error_and_dequant_shapes():
    x = torch.randn(128, 512)
    for q, s in (row_quant(x), tensor_quant(x)):
        err = (axis_dequant(q, s) - x).norm() / x.norm()
        assert err.item() < 0.04  # e4m3: 3 mantissa bits (measured ~0.02)
    with pytest.raises(ValueError, match="scale"):
        axis_dequant(row_quant(x)[0], torch.ones(3, 1))


def test_edge_values_stay_finite():
    x = torch.zeros(4, 256)
    x[1, 3], x[2, 5], x[2, 6], x[3, 0] = float("nan"), float("inf"), -1.0, 1e-30
    q, s = row_quant(x)
    assert torch.isfinite(s).all() and s[0, 0].item() == s[3, 0].item() > 0  # zero / tiny rows: the eps scale
    assert s[2, 0].item() == float(loop_scale(torch.tensor([FLT_MAX]), False))  # inf counts as FLT_MAX
    assert q[1, 3].float().isnan() and q[2, 5].float().item() == 448.0 and q[0].float().abs().sum() == 0
    qt, st = tensor_quant(x)
    assert torch.isfinite(st).all() and qt[1, 3].float().isnan()
    _, _, count = row_quant_checked(x)
    assert int(count) == 2 and int(tensor_quant(x, count_nonfinite=True)[2]) == 2
    with pytest.raises(ValueError, match="2-D"):
        row_quant(torch.randn(2, 3, 4))


CHILD = """
import json, torch
from nemo_jetrl.precision.kernels import triton_axis_quant as k
from nemo_jetrl.precision.axis_quant import _row_quant_ref, _tensor_quant_ref
torch.manual_seed(0)
# 100 x 140: partial tiles everywhere (rows: 8 x 512 tiles; the transposed view: 64 x 64 tiles, 3 x 2 of them);
# every row a program of the one-pass kernel, so the interpreter's time grows with the rows
x = torch.randn(100, 140) * torch.logspace(-2, 2, 140)
x[7, 9], x[60, 3], x[99, 139] = float("nan"), float("inf"), -float("inf")
out = {}
for pow2 in (False, True):
    for name, v in (("rows", x), ("strided", x.t())):
        q, s, n = k.quant_rows(v, pow2, count_nonfinite=True)
        q_ref, s_ref = _row_quant_ref(v.contiguous(), pow2)
        out[f"rows_{name}_{pow2}"] = [torch.equal(s, s_ref), int(n), list(q.shape)]
        q1, s1 = k.quant_rows(v.contiguous(), pow2)  # the one-pass row kernel (row-major rows)
        same = torch.equal(q1.view(torch.uint8), q.view(torch.uint8))  # kernel vs kernel (the interpreter's cast)
        out[f"onepass_{name}_{pow2}"] = [torch.equal(s1, s_ref), same]
        q, s, n = k.quant_tensor(v, pow2, count_nonfinite=True)
        q_ref, s_ref = _tensor_quant_ref(v.contiguous(), pow2)
        out[f"tensor_{name}_{pow2}"] = [torch.equal(s, s_ref), int(n), list(q.shape)]
        q, qt, s = k.quant_tensor_dual(v, pow2, 16)
        b, bt = q.view(torch.uint8), qt.view(torch.uint8)
        same = torch.equal(bt[:, : b.shape[0]], b.t()) and not bt[:, b.shape[0]:].any()
        out[f"dual_{name}_{pow2}"] = [torch.equal(s, s_ref), same, list(qt.shape)]
print(json.dumps(out))
"""


def test_triton_twins_scales_and_counts_under_the_interpreter(run_interpreted):
    out = run_interpreted(CHILD)
    for pow2 in ("False", "True"):
        assert out[f"rows_rows_{pow2}"] == [True, 3, [100, 140]]
        assert out[f"rows_strided_{pow2}"] == [True, 3, [140, 100]]
        assert out[f"tensor_rows_{pow2}"] == [True, 3, [100, 140]]
        assert out[f"tensor_strided_{pow2}"] == [True, 3, [140, 100]]
        assert out[f"dual_rows_{pow2}"] == [True, True, [140, 112]]  # 100 rows padded to 7 x 16
        assert out[f"onepass_rows_{pow2}"] == [True, True] and out[f"onepass_strided_{pow2}"] == [True, True]
        assert out[f"dual_strided_{pow2}"] == [True, True, [100, 144]]  # 140 rows padded to 9 x 16
