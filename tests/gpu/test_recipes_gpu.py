"""GPU checks of the rowwise / tensorwise recipes: Triton casts == reference bitwise, scaled_mm within bounds of
the emulation, Fp8Linear fwd/bwd SQNR on CUDA, and the fused rollout fast path == the trainer's FProp per recipe.

Run: `PYTHONPATH=. python3 -m pytest tests/gpu/test_recipes_gpu.py -q`.
"""

import copy

import pytest
import torch
from torch import nn

from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, rollout_mode
from nemo_jetrl.precision.axis_gemm import fp8_axis_mm
from nemo_jetrl.precision.axis_quant import axis_dequant, col_quant_t, row_quant, tensor_quant, tensor_quant_dual

from .test_precision_gpu import assert_bitwise, boundary_values, is_hopper, rel_err, sqnr_db

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize(
    ("shape", "dtype"), [((1, 128), torch.float32), ((7, 300), torch.bfloat16), ((4096, 4096), torch.bfloat16),
                         ((333, 12288), torch.bfloat16), ((16384, 1024), torch.bfloat16)],
)  # fmt: skip
def test_triton_row_col_tensor_casts_bitwise(shape, dtype, pow2):
    gen = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[1])).to(dtype)
    x[0, 0] = float("nan")
    xc = x.to(CUDA)
    assert_bitwise(row_quant(xc, pow2, backend="triton"), row_quant(x, pow2, backend="torch"))
    assert_bitwise(col_quant_t(xc, pow2, backend="triton"), col_quant_t(x, pow2, backend="torch"))
    assert_bitwise(tensor_quant(xc, pow2, backend="triton"), tensor_quant(x, pow2, backend="torch"))
    q, qt, s = tensor_quant_dual(xc, pow2, backend="triton")
    q_ref, qt_ref, s_ref = tensor_quant_dual(x, pow2, backend="torch")
    assert_bitwise((q, s), (q_ref, s_ref))
    assert_bitwise((qt, s), (qt_ref, s_ref))


@pytest.mark.parametrize("pow2", [False, True])
def test_triton_casts_on_rounding_boundaries(pow2):
    x = boundary_values(64)  # every row has amax 300
    for fn in (row_quant, tensor_quant, col_quant_t):
        assert_bitwise(fn(x.to(CUDA), pow2, backend="triton"), fn(x, pow2, backend="torch"))


@pytest.mark.skipif(not is_hopper(), reason="scaled_mm rowwise / tensorwise path: sm90")
@pytest.mark.parametrize("scales", ["rowwise", "tensorwise", "mixed"])
@pytest.mark.parametrize(("m", "n", "k"), [(16384, 1024, 4096), (200, 4096, 4096), (1, 6144, 4096)])
def test_scaled_mm_matches_emulation(scales, m, n, k):
    gen = torch.Generator(device=CUDA).manual_seed(0)
    a, b = torch.randn(m, k, device=CUDA, generator=gen), torch.randn(n, k, device=CUDA, generator=gen) * 0.02
    aq, sa = row_quant(a) if scales == "rowwise" else tensor_quant(a)
    bq, sb = tensor_quant(b) if scales == "tensorwise" else row_quant(b)
    bias = torch.randn(n, device=CUDA)
    ref = axis_dequant(aq, sa) @ axis_dequant(bq, sb).t() + bias
    # FP32 out: cuBLAS's accumulation order vs the FP32 matmul, measured 1.0e-4 at K = 4096 (blockwise: 4e-5..1e-4)
    for out_dtype, bound in ((torch.bfloat16, 8e-3), (torch.float32, 5e-4)):
        out = fp8_axis_mm(aq, sa, bq, sb, out_dtype, bias=bias)
        assert out.dtype == out_dtype and rel_err(out, ref) < bound
    emulated = fp8_axis_mm(aq, sa, bq, sb, torch.float32, bias=bias, backend="emulated")
    assert rel_err(emulated, ref) < 1e-6


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_linear_cuda_fwd_bwd_vs_bf16(recipe):
    torch.manual_seed(0)
    ref = nn.Linear(4096, 1024, bias=False, device=CUDA)
    fp8 = Fp8Linear.from_linear(copy.deepcopy(ref), PrecisionRecipe.preset("jetrl", granularity=recipe))
    x = torch.randn(4, 1000, 4096, device=CUDA)  # 4000 tokens: WGrad pads to 4000 (16 | 4000)
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(4, 1000, 1024, device=CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yr, yf = ref(xr), fp8(xf)
    yr.backward(g)
    yf.backward(g)
    # e4m3 on Gaussian data: ~28-29 dB for every recipe on CPU (tests/unit/precision/test_axis_linear.py)
    assert sqnr_db(yr, yf) >= 25 and sqnr_db(xr.grad, xf.grad) >= 25 and sqnr_db(ref.weight.grad, fp8.weight.grad) >= 25
    cpu = Fp8Linear.from_linear(copy.deepcopy(ref).cpu(), fp8.recipe)  # the CPU twin: same bits, emulated GEMM
    x2 = x[0, :64].cpu()
    assert torch.equal(cpu.quantized_weight().scale, fp8.quantized_weight().scale.cpu())
    assert rel_err(fp8(x2.to(CUDA)).cpu(), cpu(x2)) <= 2e-3


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fused_rollout_path_equals_the_trainer_fprop(recipe):
    model = random_tiny_qwen3(0, num_layers=2).to(CUDA, torch.bfloat16)
    convert_to_fp8(model, PrecisionRecipe.preset(recipe))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (16, 24), generator=gen).to(CUDA)
    mask = torch.ones_like(ids)
    mask[:4, :5] = 0
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        trainer = decoder_forward(model, ids, pos, mask)
        with rollout_mode(model):
            eager = decoder_forward(model, ids, pos, mask)
            fused = decoder_forward(model, ids, pos, mask, ForwardPlan(fused=True))  # grouped GEMMs, fused glue
    assert torch.equal(trainer, eager)  # the trainer's FProp bits and scales, by reference
    assert rel_err(fused, eager) < 5e-2  # rsqrt/exp last bits of the glue kernels, amplified by FP8 rounding
