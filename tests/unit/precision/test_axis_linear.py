"""The rowwise / tensorwise recipes in Fp8Linear: accuracy vs nn.Linear, backward = the documented FP8 GEMMs
(each operand cast along the dim its GEMM contracts), rollout = trainer FProp bits, GEMM error bounds."""

import copy

import pytest
import torch
from torch import nn

from nemo_jetrl.precision import Fp8Linear, FpropKernel, PrecisionRecipe, convert_to_fp8, rollout_mode
from nemo_jetrl.precision.axis_gemm import fp8_axis_mm, pad_rows
from nemo_jetrl.precision.axis_quant import axis_dequant, col_quant_t, row_quant, tensor_quant
from nemo_jetrl.precision.shared_input import quantize_shared_input, shared_input_quant
from nemo_jetrl.precision.weight_group import project_shared_input

from .test_linear import sqnr_db

RECIPES = ["rowwise", "tensorwise"]


def make_pair(recipe, k=256, n=384, seed=0):
    torch.manual_seed(seed)
    ref = nn.Linear(k, n)
    return ref, Fp8Linear.from_linear(copy.deepcopy(ref), PrecisionRecipe.preset(recipe))


@pytest.mark.parametrize("recipe", RECIPES)
def test_fwd_bwd_sqnr_vs_linear(recipe):
    ref, fp8 = make_pair(recipe)
    x = torch.randn(2, 100, 256)
    x_ref, x_fp8 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(x_ref), fp8(x_fp8)
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y.backward(grad)
    assert y.shape == (2, 100, 384) and y.dtype == torch.float32
    # measured 28.6-28.8 dB on Gaussian data (blockwise: 28.8)
    assert sqnr_db(y_ref, y) >= 27.0
    assert sqnr_db(x_ref.grad, x_fp8.grad) >= 27.0
    assert sqnr_db(ref.weight.grad, fp8.weight.grad) >= 27.0
    torch.testing.assert_close(fp8.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)


def test_rowwise_backward_is_exactly_the_documented_gemms():
    _, fp8 = make_pair("rowwise", k=256, n=128)
    w = fp8.weight.detach()
    x = torch.randn(200, 256, requires_grad=True)  # 200 tokens: WGrad pads to 208
    y = fp8(x)
    xt_fp8, xt_scale = y.grad_fn.saved_tensors  # X^T cast per input channel over the tokens, not the fp32 input
    assert (xt_fp8.dtype, tuple(xt_fp8.shape), tuple(xt_scale.shape)) == (torch.float8_e4m3fn, (256, 208), (256, 1))
    dy = torch.randn_like(y)
    y.backward(dy)
    qw = fp8.quantized_weight()
    assert torch.equal(qw.scale, row_quant(w)[1])  # FProp: W per output channel over K
    assert torch.equal(y.detach(), fp8_axis_mm(*row_quant(x.detach()), qw.data, qw.scale, torch.float32, bias=fp8.bias))
    want_dx = fp8_axis_mm(*row_quant(dy), *col_quant_t(w), torch.float32)  # DGrad: W^T per input channel over N
    assert torch.equal(x.grad, want_dx)
    want_dw = fp8_axis_mm(*col_quant_t(pad_rows(dy)), *col_quant_t(pad_rows(x.detach())), torch.float32)
    assert torch.equal(fp8.weight.grad, want_dw)


def test_tensorwise_backward_reuses_the_forward_bits():
    _, fp8 = make_pair("tensorwise", k=256, n=128)
    x = torch.randn(200, 256, requires_grad=True)
    y = fp8(x)
    xt_fp8, x_scale = y.grad_fn.saved_tensors  # the FProp cast of X itself, transposed (no WGrad re-quantization)
    xq, xs = tensor_quant(x.detach())
    assert xt_fp8.shape == (256, 208) and torch.equal(x_scale, xs)  # tokens zero-padded to 208
    assert torch.equal(xt_fp8.view(torch.uint8)[:, :200], xq.view(torch.uint8).t())
    assert not xt_fp8.view(torch.uint8)[:, 200:].any()
    dy = torch.randn_like(y)
    y.backward(dy)
    qw = fp8.quantized_weight()
    dq, ds = tensor_quant(dy)
    want_dx = axis_dequant(dq, ds) @ axis_dequant(qw.data, qw.scale)
    want_dw = axis_dequant(dq, ds).t() @ axis_dequant(xq, xs)
    torch.testing.assert_close(x.grad, want_dx, rtol=1e-5, atol=1e-5)  # same products, other summation order
    torch.testing.assert_close(fp8.weight.grad, want_dw, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", RECIPES)
def test_rollout_mode_runs_the_trainer_fprop_bits(recipe):
    _, fp8 = make_pair(recipe)
    x = torch.randn(3, 50, 256)
    y_train = fp8(x)
    qw = fp8.quantized_weight()
    with rollout_mode(fp8), torch.no_grad():
        y_roll = fp8(x)
        shared = quantize_shared_input(x, (fp8,))
        y_shared = fp8(shared)
    assert fp8.quantized_weight() is qw and qw.granularity == recipe  # by reference, one cast per weight version
    assert torch.equal(y_train, y_roll) and torch.equal(y_roll, y_shared)
    assert shared_input_quant(256, (fp8,)) is None  # the fused 1x128 producers stay off for this recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_grouped_projection_equals_the_separate_linears(recipe):
    torch.manual_seed(0)
    block = nn.Module()
    block.q_proj, block.k_proj, block.v_proj = nn.Linear(256, 256), nn.Linear(256, 128), nn.Linear(256, 128)
    members = (block.q_proj, block.k_proj, block.v_proj)
    convert_to_fp8(block, PrecisionRecipe.preset(recipe), layer_map=dict.fromkeys(("q_proj", "k_proj", "v_proj"), "fp8"))
    members = (block.q_proj, block.k_proj, block.v_proj)
    assert block.q_proj.weight_group is not None
    x = torch.randn(2, 40, 256)
    with rollout_mode(block), torch.no_grad():
        grouped = project_shared_input(x, members, grouped=True)
        separate = [m(x) for m in members]
    for g, s in zip(grouped, separate):
        torch.testing.assert_close(g, s, rtol=1e-6, atol=1e-6)  # one GEMM over the shared buffer
    if recipe == "tensorwise":  # each member keeps its own scale
        assert [m.quantized_weight().scale.shape for m in members] == [(1, 1)] * 3


@pytest.mark.parametrize("scales", ["rowwise", "tensorwise", "mixed"])
def test_axis_mm_error_bound_vs_dequantized_reference(scales):
    torch.manual_seed(0)
    a, b = torch.randn(48, 256), torch.randn(80, 256)
    aq, sa = tensor_quant(a) if scales != "rowwise" else row_quant(a)
    bq, sb = row_quant(b) if scales != "tensorwise" else tensor_quant(b)
    bias = torch.randn(80)
    ref = axis_dequant(aq, sa).double() @ axis_dequant(bq, sb).double().t() + bias.double()
    out = fp8_axis_mm(aq, sa, bq, sb, torch.float32, bias=bias)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6  # FP32 accumulation of the same products
    assert fp8_axis_mm(aq, sa, bq, sb).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="b_scale"):
        fp8_axis_mm(aq, sa, bq, torch.ones(3, 1))


def test_exact_mode_refuses_non_blockwise():
    _, fp8 = make_pair("rowwise")
    fp8.fprop_kernel = FpropKernel.BATCH_INVARIANT
    with pytest.raises(ValueError, match="exact mode's FP8 GEMM is blockwise"):
        fp8(torch.randn(4, 256))


def test_scaled_mm_scales_are_moved_to_16_byte_boundaries():
    """Expert e's tensorwise scale is a view e x 4 bytes into the [E, 1, 1] scales: cuBLASLt refuses such a pointer,
    so `aligned_16` copies it (same value); an aligned scale is passed through as is."""
    from nemo_jetrl.precision.axis_gemm import aligned_16

    scales = torch.arange(1.0, 9.0).view(8, 1, 1)  # [E, 1, 1] fp32
    moved = [aligned_16(scales[e].reshape(())) for e in range(8)]
    assert [m.item() for m in moved] == [float(e + 1) for e in range(8)]
    assert all(m.data_ptr() % 16 == 0 for m in moved)
    assert moved[0].data_ptr() == scales.data_ptr() and moved[1].data_ptr() != scales[1].data_ptr()
