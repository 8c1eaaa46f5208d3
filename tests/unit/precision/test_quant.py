"""Blockwise E4M3 quantizers: exact formula (vs a loop implementation), accuracy bounds, layouts, edge cases."""

import math

import numpy as np
import pytest
import torch

from nemo_jetrl.precision import (
    act_dequant,
    act_quant,
    act_quant_dual,
    act_quant_t,
    weight_dequant,
    weight_quant,
    weight_quant_checked,
)
from nemo_jetrl.precision.quant import FLT_MAX, INV_E4M3_MAX, SCALE_EPS

E4M3 = torch.float8_e4m3fn


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    return (10 * torch.log10(ref.double().pow(2).sum() / (ref.double() - approx.double()).pow(2).sum())).item()


def loop_scale(block: torch.Tensor, pow2: bool) -> np.float32:
    """The formula, one block at a time, in numpy float32 scalars."""
    finite = [abs(float(v)) for v in block.flatten().tolist() if not math.isnan(v)]
    amax = max((min(v, FLT_MAX) for v in finite), default=0.0)
    scale = np.float32(max(np.float32(amax), np.float32(1e-10))) * np.float32(1.0 / 448.0)
    if pow2:
        mantissa, exponent = math.frexp(float(scale))
        scale = np.float32(scale if mantissa == 0.5 else 2.0**exponent)
    return np.float32(scale)


def loop_act_quant(x: torch.Tensor, block: int, pow2: bool):
    rows, k = x.shape
    nb = -(-k // block)
    q = torch.empty(rows, k, dtype=E4M3)
    s = torch.empty(rows, nb)
    for r in range(rows):
        for g in range(nb):
            chunk = x[r, g * block : (g + 1) * block].float()
            scale = loop_scale(chunk, pow2)
            s[r, g] = float(scale)
            q[r, g * block : (g + 1) * block] = (chunk / torch.tensor(scale)).clamp(-448, 448).to(E4M3)
    return q, s


def loop_weight_quant(w: torch.Tensor, block: int, pow2: bool):
    n, k = w.shape
    q = torch.empty(n, k, dtype=E4M3)
    s = torch.empty(-(-n // block), -(-k // block))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block].float()
            scale = loop_scale(tile, pow2)
            s[i, j] = float(scale)
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (
                (tile / torch.tensor(scale)).clamp(-448, 448).to(E4M3)
            )
    return q, s


def assert_bitwise(q, s, q_ref, s_ref):
    assert q.dtype == E4M3 and s.dtype == torch.float32
    assert torch.equal(s, s_ref)
    nan = torch.isnan(q_ref.float())
    assert torch.equal(torch.isnan(q.float()), nan)
    assert torch.equal(q.view(torch.uint8)[~nan], q_ref.view(torch.uint8)[~nan])


def heavy_tailed(shape, gen):
    x = torch.distributions.StudentT(torch.tensor(3.0)).sample(shape)
    x.view(-1)[torch.randint(0, x.numel(), (max(1, x.numel() // 500),), generator=gen)] *= 1000.0  # outliers
    return x


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_quant_matches_loop_formula(pow2, dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 300, generator=gen) * torch.logspace(-3, 3, 6)[:, None]).to(dtype)  # partial last group
    x[1, 130:256] = 0.0  # an all-zero group
    x[2, 5] = 7.0e4  # an outlier
    assert_bitwise(*act_quant(x, 128, pow2), *loop_act_quant(x, 128, pow2))


@pytest.mark.parametrize("pow2", [False, True])
def test_weight_quant_matches_loop_formula(pow2):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(200, 300, generator=gen) * 0.02  # partial blocks on both dims
    w[:128, 128:256] = 0.0
    w[150, 10] = 3.0
    assert_bitwise(*weight_quant(w, 128, pow2), *loop_weight_quant(w, 128, pow2))


def test_act_quant_leading_dims_and_layouts():
    x = torch.randn(3, 5, 300)
    q, s = act_quant(x)
    assert q.shape == (3, 5, 300) and s.shape == (3, 5, 3)
    q2, s2 = act_quant(x.reshape(15, 300))
    assert torch.equal(q.view(torch.uint8).reshape(15, 300), q2.view(torch.uint8)) and torch.equal(s.reshape(15, 3), s2)
    w = torch.randn(384, 256)
    qw, sw = weight_quant(w)
    assert qw.shape == (384, 256) and sw.shape == (3, 2)


def test_act_quant_t_is_act_quant_of_transpose():
    x = torch.randn(300, 64, dtype=torch.bfloat16)  # M=300 tokens: partial last group along M
    qt, st = act_quant_t(x)
    assert qt.shape == (64, 300) and st.shape == (64, 3)
    assert_bitwise(qt, st, *act_quant(x.t().contiguous()))
    assert_bitwise(qt, st, *loop_act_quant(x.t().contiguous(), 128, False))


@pytest.mark.parametrize("t_blocks", ["1x128", "128x128"])
def test_act_quant_dual_is_both_layouts_of_the_padded_input(t_blocks):
    x = torch.randn(200, 384, dtype=torch.bfloat16) * torch.logspace(-2, 2, 384).to(torch.bfloat16)
    q, s, qt, st = act_quant_dual(x, t_blocks=t_blocks)
    assert_bitwise(q, s, *act_quant(x))
    x_padded = torch.cat([x, torch.zeros(56, 384, dtype=x.dtype)])  # MP = 256 zero-padded tokens
    want = act_quant_t(x_padded) if t_blocks == "1x128" else weight_quant(x_padded.t())
    assert qt.shape == (384, 256) and st.shape == ((384, 2) if t_blocks == "1x128" else (3, 2))
    assert_bitwise(qt, st, *want)
    assert bool((qt[:, 200:].float() == 0).all())
    with pytest.raises(ValueError, match="t_blocks"):
        act_quant_dual(x, t_blocks="128x1")


@pytest.mark.parametrize("dist", ["gaussian", "heavy_tailed"])
def test_round_trip_sqnr_and_error_bound(dist):
    gen = torch.Generator().manual_seed(2)
    shape = (256, 512)
    x = torch.randn(shape, generator=gen) if dist == "gaussian" else heavy_tailed(shape, gen)
    for quant, dequant in ((act_quant, act_dequant), (weight_quant, weight_dequant)):
        q, s = quant(x)
        xd = dequant(q, s)
        assert sqnr_db(x, xd) >= 30.0  # e4m3 (3 mantissa bits) with per-block scaling: ~31 dB
        # Per element: RNE error <= half an ulp = 2^-4 |x| in the normal range, <= 2^-10 * scale in the
        # subnormal range (ulp 2^-9); 1e-6 relative slack for the FP32 division / multiply.
        s_full = (
            s.repeat_interleave(128, -1) if s.shape[0] == 256 else s.repeat_interleave(128, 0).repeat_interleave(128, 1)
        )
        bound = torch.maximum(x.abs() * 2.0**-4, s_full * 2.0**-10) * (1 + 1e-6)
        assert bool(((x - xd).abs() <= bound).all())
        # Per block: max error <= scale * 448 * 2^-4 (the top binade's half ulp).
        assert bool(((x - xd).abs() <= s_full * 448 * 2.0**-4 * (1 + 1e-6)).all())


def test_rne_on_rounding_boundaries():
    # pow2 scale with amax 300 -> scale 1.0 exactly, so q = x and the midpoints test round-to-nearest-even.
    x = torch.zeros(1, 128)
    vals = [300.0, 1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, 19.0, 21.0, 464.0 / 2, 0.0]
    # 300 -> 288 (ulp 32); 232 is the midpoint of 224 (even mantissa) and 240
    want = [288.0, 1.0, 1.25, -1.0, 0.0, 2.0**-8, 20.0, 20.0, 224.0, 0.0]
    x[0, : len(vals)] = torch.tensor(vals)
    q, s = act_quant(x, pow2=True)
    assert s.item() == 1.0
    assert q.float()[0, : len(vals)].tolist() == want


def test_pow2_scales_are_powers_of_two():
    x = torch.randn(64, 512) * torch.logspace(-8, 8, 64)[:, None]
    _, s = act_quant(x, pow2=True)
    _, s_plain = act_quant(x)
    mantissas = {math.frexp(v)[0] for v in s.flatten().tolist()}
    assert mantissas == {0.5}
    assert bool((s >= s_plain).all()) and bool((s < 2 * s_plain).all())
    _, sw = weight_quant(x, pow2=True)
    assert {math.frexp(v)[0] for v in sw.flatten().tolist()} == {0.5}


def test_zero_and_tiny_inputs():
    q, s = act_quant(torch.zeros(4, 256))
    assert bool((q.float() == 0).all()) and bool((s == np.float32(SCALE_EPS) * np.float32(INV_E4M3_MAX)).all())
    tiny = torch.full((2, 128), 1e-30)
    q, s = weight_quant(torch.cat([tiny, tiny]).reshape(4, 128))
    assert bool(torch.isfinite(s).all()) and bool((q.float() == 0).all())
    small = torch.full((1, 128), 1e-8)
    q, s = act_quant(small)
    assert torch.allclose(act_dequant(q, s), small, rtol=1e-6)


def test_huge_values_stay_finite():
    x = torch.randn(2, 256)
    x[0, 3] = 1e30
    x[1, 200] = -3.0e38
    q, s = act_quant(x)
    assert bool(torch.isfinite(s).all()) and bool(torch.isfinite(q.float()).all())
    xd = act_dequant(q, s)
    assert xd[0, 3].item() == pytest.approx(1e30, rel=1e-6) and xd[1, 200].item() == pytest.approx(-3.0e38, rel=0.07)


def test_inf_saturates_nan_stays_local_scale_finite():
    x = torch.randn(3, 256)
    x[0, 1], x[0, 2] = float("inf"), float("-inf")
    x[1, 7] = float("nan")
    q, s = act_quant(x)
    assert bool(torch.isfinite(s).all())
    assert q[0, 1].float().item() == 448.0 and q[0, 2].float().item() == -448.0
    assert s[0, 0].item() == np.float32(FLT_MAX) * np.float32(INV_E4M3_MAX)
    assert torch.isnan(q[1, 7].float()) and int(torch.isnan(q.float()).sum()) == 1
    clean = x[1, :128].clone()
    clean[7] = 0.0
    assert s[1, 0].item() == act_quant(clean[None])[1].item()  # NaN ignored by the amax
    qw, sw = weight_quant(x[:, :128].repeat(43, 1))
    assert bool(torch.isfinite(sw).all())


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        act_quant(torch.ones(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        weight_quant(torch.ones(2, 2, 128))
    with pytest.raises(ValueError, match="CUDA tensor"):
        act_quant(torch.ones(2, 128), backend="triton")
    with pytest.raises(ValueError, match="backend"):
        act_quant(torch.ones(2, 128), backend="cuda")
    with pytest.raises(ValueError, match="block must be a positive int"):
        act_quant(torch.ones(2, 128), block=0)
    q, s = act_quant(torch.ones(2, 256))
    with pytest.raises(ValueError, match="act_dequant: scale shape"):
        act_dequant(q, s[:, :1])
    with pytest.raises(ValueError, match="weight_dequant: scale shape"):
        weight_dequant(q, s)


def test_weight_quant_checked_is_weight_quant_plus_a_nonfinite_count():
    w = torch.randn(300, 260) * 0.02
    w[0, 0], w[129, 7], w[299, 259] = float("nan"), float("inf"), -float("inf")
    q, s, bad = weight_quant_checked(w)
    q_ref, s_ref = weight_quant(w)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    assert bad.dtype == torch.int32 and bad.dim() == 0 and int(bad) == 3
    assert int(weight_quant_checked(torch.randn(128, 128))[2]) == 0


CHECKED_CHILD = """
import json, torch
from nemo_jetrl.precision.kernels import triton_quant
from nemo_jetrl.precision.quant import weight_quant
# scales bitwise and counts (the interpreter's e4m3 cast is not the GPU's: the values are checked bitwise on the
# GPU, tests/gpu/test_precision_gpu.py)
w = torch.randn(300, 260) * 0.02
out = {}
for name, x in (("rows", w), ("strided", w.t())):
    count = torch.zeros(1, dtype=torch.int32)
    q, s = triton_quant.quant_tiles(x, 128, False, nonfinite=count)
    q_ref, s_ref = weight_quant(x.contiguous())
    out[name] = [torch.equal(s, s_ref), int(count[0])]
w[0, 0], w[129, 7], w[299, 259], w[5, 200] = float("nan"), float("inf"), -float("inf"), float("nan")
for name, x in (("bad_rows", w), ("bad_strided", w.t())):
    count = torch.zeros(1, dtype=torch.int32)
    triton_quant.quant_tiles(x, 128, True, nonfinite=count)
    out[name] = int(count[0])
print(json.dumps(out))
"""


def test_triton_weight_quant_counts_nonfinite_in_the_same_pass(run_interpreted):
    out = run_interpreted(CHECKED_CHILD)
    assert out["rows"] == [True, 0] and out["strided"] == [True, 0]
    assert out["bad_rows"] == 4 and out["bad_strided"] == 4


WIDTH_CHILD = """
import json, torch
import torch.nn.functional as F
from nemo_jetrl.precision.kernels import triton_quant
from nemo_jetrl.precision.quant import _act_quant_ref_t

x = (torch.randn(300, 256, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16)
x[5, 7] = float("nan")
out = {}
for pow2 in (False, True):
    for zero_rows in (False, True):
        q, s = triton_quant.quant_groups(x.t(), 128, pow2, zero_rows=zero_rows, width=384)  # no padded copy
        qp, sp = triton_quant.quant_groups(F.pad(x, (0, 0, 0, 84)).t(), 128, pow2)  # the padded input
        same = torch.equal(q.view(torch.uint8), qp.view(torch.uint8)) and torch.equal(s, sp)
        out[f"{pow2}/{zero_rows}"] = [same, list(q.shape), list(s.shape), int(q.view(torch.uint8)[:, 300:].sum())]
try:
    triton_quant.quant_groups(x.t(), 128, False, width=299)
except ValueError as e:
    out["narrow"] = str(e)
print(json.dumps(out))
"""


def test_triton_wgrad_operand_pads_the_tokens_without_a_copy(run_interpreted):
    """`quant_groups(x.t(), width=MP)` (the WGrad operand of `act_quant_dual`, tokens padded to the block by the
    kernel's masked loads) == the quantizer on the zero-padded copy: values, scales, zero bytes in the padding."""
    out = run_interpreted(WIDTH_CHILD)
    narrow = out.pop("narrow")
    assert out == {k: [True, [256, 384], [256, 3], 0] for k in ("False/False", "False/True", "True/False", "True/True")}
    assert "width 299 < the input's 300 columns" in narrow
