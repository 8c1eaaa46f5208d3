"""How the Triton quantizer divides by the scale (`triton_quant.DIVISIONS`, chosen by `division_for`), each giving
the same bits. The division by a reciprocal (`triton_quant._to_e4m3_by_reciprocal`): r = rn(1 / s),
q0 = rn(x r), q = rn(q0 + rn-exact(x - q0 s) r) equals rn(x / s), checked here in numpy with a correctly rounded
FMA (jetrl_testkit.exact_fma, itself checked against exact rationals), and in the kernel under Triton's
interpreter with that FMA (the interpreter's own rounds twice). tests/gpu/test_precision_gpu.py checks the kernel's
bits against the reference quantizer on the GPU."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
from jetrl_testkit.exact_fma import fma32

from nemo_jetrl.precision.e4m3 import INV_E4M3_MAX, SCALE_EPS


def _rounded_to_float32(value: Fraction) -> np.float32:
    """rn(value) in float32, ties to even, from the exact rational."""
    f = np.float32(float(value))
    near = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    ranked = sorted(near, key=lambda v: (abs(Fraction(float(v)) - value), int(np.float32(v).view(np.uint32)) & 1))
    return ranked[0]


def _random_floats(rng, n: int, exponents: tuple[int, int]) -> np.ndarray:
    mantissa = rng.integers(0, 1 << 23, n)
    special = rng.integers(0, 4, n)  # a quarter each: random, all ones, all zeros, ones at the top
    mantissa = np.where(special == 1, (1 << 23) - 1, np.where(special == 2, 0, mantissa))
    mantissa = np.where(special == 3, mantissa | ((1 << 23) - (1 << 16)), mantissa)
    exponent, sign = rng.integers(*exponents, n), rng.integers(0, 2, n) << 31
    return (sign | (exponent << 23) | mantissa).astype(np.uint32).view(np.float32)


def test_exact_fma_helper_is_correctly_rounded():
    rng = np.random.default_rng(0)
    a, b, c = (_random_floats(rng, 3000, (100, 150)) for _ in range(3))
    c[:1500] = (-(a[:1500].astype(np.float64) * b[:1500])).astype(np.float32)  # cancellations: ties and tails
    got = fma32(a, b, c)
    want = [
        _rounded_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))) for x, y, z in zip(a, b, c)
    ]
    assert np.array_equal(got.view(np.uint32), np.array(want, dtype=np.float32).view(np.uint32))


def test_division_by_the_reciprocal_is_the_division():
    rng = np.random.default_rng(1)
    n = 1 << 21
    amax = np.exp(rng.uniform(np.log(1e-12), np.log(1e37), n)).astype(np.float32)
    scale = np.maximum(amax, np.float32(SCALE_EPS)) * np.float32(INV_E4M3_MAX)  # as the quantizer makes it
    scale[::4] = np.float32(2.0) ** np.ceil(np.log2(scale[::4].astype(np.float64)))  # power-of-two scales
    scale[1::4] = np.abs(_random_floats(rng, len(scale[1::4]), (60, 190)))  # special significands
    u = rng.uniform(-448, 448, n) * 2.0 ** -rng.integers(0, 40, n)  # x / scale: at most 448, as the quantizer's
    x = (scale.astype(np.float64) * u).astype(np.float32)
    x[::3] = (x[::3].view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16 values
    special = np.abs(_random_floats(rng, n, (100, 135)))  # special significands in [2^-27, 2^8)
    x[1::3] = (scale[1::3] * special[1::3]).astype(np.float32)
    r = np.float32(1.0) / scale
    q0 = x * r
    q = fma32(fma32(-q0, scale, x), r, q0)
    want = x / scale  # IEEE float32 division
    assert np.array_equal(q.view(np.uint32), want.view(np.uint32)), int((q != want).sum())


CHILD = """
import json, sys, numpy as np, torch
sys.path.insert(0, "tests")
from jetrl_testkit.exact_fma import fma32
from jetrl_testkit.quant_cases import scaled_midpoints, wide_values
from triton.runtime import interpreter
from nemo_jetrl.precision.kernels import triton_quant

builder = next(c for c in vars(interpreter).values() if isinstance(c, type) and hasattr(c, "create_fma"))
builder.create_fma = lambda self, x, y, z: interpreter.TensorHandle(fma32(x.data, y.data, z.data), z.dtype.scalar)
wide = wide_values()
out = {}
for name, x in (("wide", wide), ("bf16", wide.to(torch.bfloat16)), ("transposed", wide.t()),
                ("scaled", scaled_midpoints())):
    for pow2 in (False, True):
        want_q, want_s = triton_quant.quant_groups(x, 128, pow2, division="plain")  # the interpreter's division
        for division in ("reciprocal",):
            q, s = triton_quant.quant_groups(x, 128, pow2, division=division)
            same = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
            out[f"{name}/{pow2}/{division}"] = same
out["signs"] = {d: [int(b) for b in triton_quant.quant_groups(wide, 128, False, division=d)[0].view(torch.uint8)[::8, 0][:2]]
                for d in triton_quant.DIVISIONS}
print(json.dumps(out))
"""


def test_triton_quantizer_divisions_give_the_reference_bits(run_interpreted):
    """The division by the reciprocal against the plain one (`div_rn` on every value;
    the interpreter's `div_rn` is not IEEE on denormal quotients, so not against the reference quantizer: the GPU
    test is): values over 60 decades, zeros of both signs, NaN, inf, denormals, bf16, the transposed view, e4m3
    rounding midpoints times a scale (where the reciprocal's FMA correction decides the byte), with and without
    power-of-two scales; +0 and -0 keep their signs."""
    out = run_interpreted(CHILD)
    signs = out.pop("signs")
    assert out == {k: True for k in out} and len(out) == 8, json.dumps(out)
    assert signs == {d: [0x00, 0x80] for d in ("plain", "reciprocal")}


def test_the_division_follows_the_layout_and_the_gradients(monkeypatch):
    """`division_for`: plain on row-major activations, by the reciprocal on the transposed view and wherever rows may
    be all zero; the blockwise recipe asks for the latter on every gradient it quantizes (DGrad and WGrad operands,
    the grouped experts' DGrad) and not on activations."""
    import torch

    from nemo_jetrl.precision import quant
    from nemo_jetrl.precision.kernels import triton_quant
    from nemo_jetrl.precision.recipe import PrecisionRecipe
    from nemo_jetrl.precision.recipes.blockwise import BlockwiseLayout

    x = torch.zeros(256, 512)
    assert triton_quant.division_for(x, zero_rows=False) == "plain"
    assert triton_quant.division_for(x.t(), zero_rows=False) == "reciprocal"
    assert triton_quant.division_for(x, zero_rows=True) == "reciprocal"
    assert triton_quant.division_for(x[:, :1], zero_rows=False) == "plain"  # one column: not a transposed view

    asked = []

    def recording(x2, block, pow2, zero_rows=False, **kw):
        asked.append(triton_quant.division_for(x2, zero_rows))
        return quant._act_quant_ref(x2, block, pow2)

    monkeypatch.setattr(quant, "_use_triton", lambda *a: True)
    monkeypatch.setattr(triton_quant, "quant_groups", recording)
    scaling, recipe = BlockwiseLayout(), PrecisionRecipe(wgrad_x_blocks="1x128")
    scaling.grad_quant(torch.randn(200, 256), recipe, need_dx=True, need_dw=True)
    assert asked == ["reciprocal", "reciprocal"]  # dY rows, dY^T
    asked.clear()
    scaling.grad_quant(torch.randn(200, 256), recipe, need_dx=True, need_dw=False)
    assert asked == ["reciprocal"]
    asked.clear()
    scaling.input_quant_train(torch.randn(200, 256), recipe)
    assert asked == ["plain", "reciprocal"]  # X rows, X^T (1x128 WGrad blocks)
