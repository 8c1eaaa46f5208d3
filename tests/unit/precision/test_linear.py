"""Fp8Linear: accuracy vs nn.Linear, dtypes under autocast, the shared QuantizedWeight cache, rollout_mode."""

import copy

import pytest
import torch
from torch import nn

from nemo_jetrl.precision import (
    Fp8Linear,
    PrecisionRecipe,
    QuantizedWeight,
    act_quant,
    fp8_blockwise_mm,
    fp8_wgrad_mm,
    rollout_mode,
    weight_quant,
)


def sqnr_db(ref, approx):
    return (10 * torch.log10(ref.double().pow(2).sum() / (ref.double() - approx.double()).pow(2).sum())).item()


def make_pair(k=256, n=384, recipe="jetrl", seed=0, **overrides):
    torch.manual_seed(seed)
    ref = nn.Linear(k, n)
    fp8 = Fp8Linear.from_linear(copy.deepcopy(ref), PrecisionRecipe.preset(recipe, **overrides))
    return ref, fp8


@pytest.mark.parametrize("wgrad_x_blocks", ["1x128", "128x128"])
def test_fwd_bwd_sqnr_vs_linear(wgrad_x_blocks):
    ref, fp8 = make_pair(wgrad_x_blocks=wgrad_x_blocks)
    x = torch.randn(2, 128, 256)  # M = 256 tokens, K = 256, N = 384
    x_ref, x_fp8 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y = ref(x_ref), fp8(x_fp8)
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y.backward(grad)
    assert y.shape == (2, 128, 384) and y.dtype == torch.float32
    assert sqnr_db(y_ref, y) >= 27.0  # measured ~28.8 dB
    assert sqnr_db(x_ref.grad, x_fp8.grad) >= 27.0
    assert sqnr_db(ref.weight.grad, fp8.weight.grad) >= 27.0
    torch.testing.assert_close(fp8.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wgrad_x_blocks", ["1x128", "128x128"])
def test_backward_is_exactly_the_documented_fp8_gemms(wgrad_x_blocks):
    _, fp8 = make_pair(k=256, n=128, wgrad_x_blocks=wgrad_x_blocks)
    x = torch.randn(200, 256, requires_grad=True)  # 200 tokens: WGrad pads to 256
    y = fp8(x)
    saved = y.grad_fn.saved_tensors  # the FP8 X^T operand, not the fp32 input
    assert [t.dtype for t in saved] == [torch.float8_e4m3fn, torch.float32] and saved[0].shape == (256, 256)
    dy = torch.randn_like(y)
    y.backward(dy)
    qw = fp8.quantized_weight()
    want_dx = fp8_blockwise_mm(*act_quant(dy), qw.data.t().contiguous(), qw.scale.t().contiguous(), torch.float32)
    assert torch.equal(x.grad, want_dx)
    assert torch.equal(fp8.weight.grad, fp8_wgrad_mm(dy, x.detach(), x_blocks=wgrad_x_blocks))


def test_frozen_weight_or_input_skip_their_gemms():
    _, fp8 = make_pair(k=128, n=128)
    fp8.weight.requires_grad_(False)
    x = torch.randn(8, 128, requires_grad=True)
    y = fp8(x)
    assert y.grad_fn.saved_tensors == ()
    y.sum().backward()
    assert fp8.weight.grad is None and x.grad is not None and fp8.bias.grad is not None
    fp8.weight.requires_grad_(True)
    fp8(torch.randn(8, 128)).sum().backward()
    assert fp8.weight.grad is not None


@pytest.mark.parametrize("scale", [0.0, 1e-20, 1e4])
def test_no_nan_on_edge_inputs(scale):
    _, fp8 = make_pair(k=128, n=128)
    x = (torch.randn(64, 128) * scale).requires_grad_()
    y = fp8(x)
    y.backward(torch.randn_like(y) * max(scale, 1.0))
    for t in (y, x.grad, fp8.weight.grad, fp8.bias.grad):
        assert bool(torch.isfinite(t).all())
    if scale == 0.0:
        assert torch.equal(y, fp8.bias.expand_as(y).detach())
        assert bool((fp8.weight.grad == 0).all())


def test_dtypes_without_autocast():
    _, fp8 = make_pair(k=128, n=256)
    x = torch.randn(3, 5, 128, dtype=torch.bfloat16, requires_grad=True)
    y = fp8(x)
    y.sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert fp8.weight.grad.dtype == torch.float32 and fp8.bias.grad.dtype == torch.float32


def test_autocast_output_is_the_fp32_result_cast_to_bf16():
    _, fp8 = make_pair(k=256, n=384)
    x = torch.randn(64, 256)
    plain = fp8(x)
    x_ac = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = fp8(x_ac)
    assert under.dtype == torch.bfloat16
    assert torch.equal(under, plain.to(torch.bfloat16))
    under.float().sum().backward()
    assert x_ac.grad.dtype == torch.float32 and fp8.weight.grad.dtype == torch.float32


def test_bf16_branch_follows_autocast_like_nn_linear():
    ref, fp8 = make_pair(k=128, n=128, recipe="bf16")
    fp8.train_fp8 = False
    x = torch.randn(8, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(x), fp8(x)
    assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
    assert torch.equal(ref(x), fp8(x))  # no autocast: plain F.linear in x's dtype


def test_quantized_weight_cached_until_the_optimizer_changes_the_weight():
    _, fp8 = make_pair(k=256, n=256)
    qw = fp8.quantized_weight()
    assert isinstance(qw, QuantizedWeight) and qw.data.shape == (256, 256) and qw.scale.shape == (2, 2)
    want_q, want_s = weight_quant(fp8.weight.detach())
    assert torch.equal(qw.data.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(qw.scale, want_s)
    opt = torch.optim.AdamW(fp8.parameters(), lr=1e-2)
    for _ in range(2):  # two micro-batches: one quantization
        fp8(torch.randn(16, 256)).sum().backward()
        assert fp8.quantized_weight() is qw
    with rollout_mode(fp8):
        assert fp8.quantized_weight() is qw
    opt.step()
    qw2 = fp8.quantized_weight()
    assert qw2 is not qw and qw2.version > qw.version
    assert not torch.equal(qw2.data.view(torch.uint8), qw.data.view(torch.uint8))
    assert fp8.quantized_weight() is qw2
    fp8.invalidate_quantized_weight()
    assert fp8.quantized_weight() is not qw2


def test_rollout_mode_shares_the_weight_and_computes_the_same_bits():
    model = nn.Sequential(make_pair(k=256, n=256)[1], nn.ReLU(), make_pair(k=256, n=128, seed=1)[1])
    x = torch.randn(4, 7, 256)
    train_out = model(x)
    train_qws = [m.quantized_weight() for m in model if isinstance(m, Fp8Linear)]
    with rollout_mode(model) as m:
        assert m is model and all(layer.mode == "rollout" for layer in model if isinstance(layer, Fp8Linear))
        rollout_out = model(x)
        assert [layer.quantized_weight() for layer in model if isinstance(layer, Fp8Linear)] == train_qws
    assert rollout_out.grad_fn is None and train_out.grad_fn is not None
    assert torch.equal(rollout_out, train_out)
    assert all(layer.mode == "train" for layer in model if isinstance(layer, Fp8Linear))


def test_rollout_mode_restores_on_error():
    _, fp8 = make_pair(k=128, n=128)
    with pytest.raises(RuntimeError, match="boom"), rollout_mode(fp8):
        raise RuntimeError("boom")
    assert fp8.mode == "train"


def test_fp8_rollout_only_trains_plain_and_rolls_out_fp8():
    ref, fp8 = make_pair(k=128, n=128, recipe="fp8_rollout_only")
    assert (fp8.train_fp8, fp8.rollout_fp8) == (False, True)
    x = torch.randn(16, 128)
    assert torch.equal(fp8(x), ref(x))
    with rollout_mode(fp8):
        y = fp8(x)
    assert not torch.equal(y, ref(x)) and sqnr_db(ref(x), y) >= 25.0


def test_from_linear_moves_the_parameters():
    lin = nn.Linear(128, 256, bias=False)
    weight = lin.weight
    fp8 = Fp8Linear.from_linear(lin, PrecisionRecipe.preset("jetrl"))
    assert fp8.weight is weight and fp8.bias is None
    assert list(fp8.state_dict()) == ["weight"]
    assert "train_fp8=True" in repr(fp8)
    with pytest.raises(ValueError, match="expects an nn.Linear"):
        Fp8Linear.from_linear(fp8, PrecisionRecipe.preset("jetrl"))


def test_pow2_weight_scales_reach_the_cache():
    _, fp8 = make_pair(k=256, n=256, pow2_weight_scales=True)
    mantissa, _ = torch.frexp(fp8.quantized_weight().scale)
    assert bool((mantissa == 0.5).all())


def test_bad_mode_and_shape():
    _, fp8 = make_pair(k=128, n=128)
    with pytest.raises(ValueError, match="mode must be one of"):
        fp8.mode = "eval"
    with pytest.raises(ValueError, match=r"expected input \[\.\.\., 128\]"):
        fp8(torch.randn(2, 64))


def test_cache_filled_by_an_inference_mode_rollout_serves_training():
    _, fp8 = make_pair(k=256, n=256)
    x = torch.randn(8, 256)
    with torch.inference_mode(), rollout_mode(fp8):
        rollout_y = fp8(x)
    qw = fp8.quantized_weight()
    x_train = x.clone().requires_grad_()
    train_y = fp8(x_train)
    train_y.sum().backward()
    assert fp8.quantized_weight() is qw and torch.equal(train_y.detach(), rollout_y)
    assert bool(torch.isfinite(x_train.grad).all()) and bool(fp8.weight.grad.abs().sum() > 0)
