"""FP8 expert linears (precision/expert_linear.py): each expert is an `Fp8Linear` of its own weight, bit for bit, in
every scale layout (weight casts, FProp, DGrad, WGrad), the blockwise FProp is the dequantize-then-matmul reference
bit for bit, the error against FP32 stays within FP8's bounds, and the exact mode's rows do not depend on the batch."""

import pytest
import torch

from nemo_jetrl.precision import Fp8Linear, FpropKernel, PrecisionRecipe
from nemo_jetrl.precision.expert_linear import ExpertLinear, ExpertSplit, Fp8ExpertLinear, expert_linear
from nemo_jetrl.precision.quant import act_dequant, act_quant, weight_dequant

E, N, K = 4, 256, 128
COUNTS = (5, 0, 9, 3)  # expert 1 takes no row
PRESETS = ["jetrl", "rowwise", "tensorwise"]


def sqnr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach(), ref.detach()
    return float(10 * torch.log10(ref.pow(2).mean() / (x - ref).pow(2).mean()))


def make(preset: str, seed: int = 0) -> tuple[Fp8ExpertLinear, torch.Tensor, ExpertSplit]:
    torch.manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(E, N, K) * 0.05)
    fp8 = Fp8ExpertLinear.from_expert_linear(ExpertLinear(weight), PrecisionRecipe.preset(preset))
    x = torch.randn(sum(COUNTS), K)  # [M, K] rows sorted by expert
    return fp8, x, ExpertSplit(torch.tensor(COUNTS))


def per_expert_linears(fp8: Fp8ExpertLinear) -> list[Fp8Linear]:
    out = []
    for e in range(E):
        lin = torch.nn.Linear(K, N, bias=False)
        lin.weight = torch.nn.Parameter(fp8.weight.detach()[e].clone())
        out.append(Fp8Linear.from_linear(lin, fp8.recipe))
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_each_expert_is_an_fp8_linear_bit_for_bit(preset):
    fp8, x, split = make(preset)
    linears = per_expert_linears(fp8)
    qweight = fp8.quantized_weight()
    assert qweight.data.shape == (E, N, K) and qweight.nonfinite.dtype == torch.int32 and int(qweight.nonfinite) == 0
    for e, lin in enumerate(linears):  # the expert cast is each expert's own weight cast
        q = lin.quantized_weight()
        assert torch.equal(qweight.data[e].view(torch.uint8), q.data.view(torch.uint8))
        assert torch.equal(qweight.scale[e], q.scale.reshape(qweight.scale[e].shape))
    xg = x.clone().requires_grad_(True)
    y = fp8(xg, split)  # [M, N]: the training FProp
    grad = torch.randn_like(y)
    y.backward(grad)
    lo = 0
    for e, count in enumerate(COUNTS):
        xe = x[lo : lo + count].clone().requires_grad_(True)
        ye = linears[e](xe)
        if count:
            ye.backward(grad[lo : lo + count])
            assert torch.equal(y[lo : lo + count], ye)  # FProp
            assert torch.equal(xg.grad[lo : lo + count], xe.grad)  # DGrad
            assert torch.equal(fp8.weight.grad[e], linears[e].weight.grad)  # WGrad over the expert's own tokens
        else:
            assert not fp8.weight.grad[e].any()  # an expert without rows gets a zero gradient
        lo += count
    with torch.no_grad():  # the trainer's no-grad forward and the rollout's are the training FProp
        assert torch.equal(fp8(x, split), y)
        fp8.mode = "rollout"
        assert torch.equal(fp8(x, split), y)


def test_blockwise_fprop_is_dequantize_then_matmul_bit_for_bit():
    fp8, x, split = make("jetrl", seed=1)
    with torch.no_grad():
        y = fp8(x, split)
        qweight, lo = fp8.quantized_weight(), 0
        for e, count in enumerate(COUNTS):
            if count:
                xq, xs = act_quant(x[lo : lo + count], 128)
                want = act_dequant(xq, xs, 128) @ weight_dequant(qweight.data[e], qweight.scale[e], 128).t()
                assert torch.equal(y[lo : lo + count], want)
            lo += count


@pytest.mark.parametrize("preset", PRESETS)
def test_error_against_fp32_stays_within_fp8_bounds(preset):
    fp8, x, split = make(preset, seed=2)
    xg = x.clone().requires_grad_(True)
    ref_x = x.clone().requires_grad_(True)
    y = fp8(xg, split)
    ref = expert_linear(ref_x, fp8.weight, split, exact=False)  # FP32 per expert
    grad = torch.randn_like(y)
    y.backward(grad)
    w_fp8_grad = fp8.weight.grad.clone()
    fp8.weight.grad = None
    ref.backward(grad)
    assert sqnr_db(y, ref) > 25  # FProp
    assert sqnr_db(xg.grad, ref_x.grad) > 25  # DGrad
    assert sqnr_db(w_fp8_grad, fp8.weight.grad) > 25  # WGrad (experts without rows: both 0)


def test_bf16_experts_and_the_exact_mode_are_batch_invariant():
    fp8, x, split = make("jetrl", seed=3)
    fp8.fprop_kernel = FpropKernel.BATCH_INVARIANT  # what enable_batch_invariant sets: the batch-invariant FP8 GEMM per expert
    plain = ExpertLinear(fp8.weight)
    plain.fprop_kernel = FpropKernel.BATCH_INVARIANT
    with torch.no_grad():
        for module in (fp8, plain):
            whole = module(x, split)
            first = module(x[:1], ExpertSplit(torch.tensor([1, 0, 0, 0])))  # expert 0's first row alone
            assert torch.equal(whole[:1], first)
            rest = module(x[5:14], ExpertSplit(torch.tensor([0, 0, 9, 0])))  # expert 2's rows without the others
            assert torch.equal(whole[5:14], rest)


def test_shapes_are_checked():
    fp8, x, split = make("jetrl")
    with pytest.raises(ValueError, match=r"expected x2 \[M, 128\]"):
        fp8(x[:, :64], split)
    with pytest.raises(ValueError, match=r"weight must be \[E, N, K\]"):
        ExpertLinear(torch.nn.Parameter(torch.zeros(4, 4)))
