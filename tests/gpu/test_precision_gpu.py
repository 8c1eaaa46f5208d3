"""GPU checks of the FP8 precision core: Triton == reference bitwise, scaled_mm == emulation, Fp8Linear on CUDA.

Run: `PYTHONPATH=. python3 -m pytest tests/gpu/test_precision_gpu.py -q` (or as a script).
"""

import copy
import sys

import pytest
import torch
from jetrl_testkit.quant_cases import e4m3_midpoints, scaled_midpoints, wide_values
from torch import nn

from nemo_jetrl.precision import (
    Fp8Linear,
    PrecisionRecipe,
    act_dequant,
    act_quant,
    act_quant_dual,
    act_quant_t,
    fp8_blockwise_mm,
    fp8_wgrad_mm,
    gemm_backend,
    rollout_mode,
    weight_quant,
)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def assert_bitwise(got, want):
    (q, s), (q_ref, s_ref) = got, want
    q, s = q.cpu(), s.cpu()
    assert q.shape == q_ref.shape and s.shape == s_ref.shape
    assert torch.equal(s, s_ref), f"scales differ at {(s != s_ref).nonzero()[:5].tolist()}"
    nan = torch.isnan(q_ref.float())
    assert torch.equal(torch.isnan(q.float()), nan)
    diff = q.view(torch.uint8)[~nan] != q_ref.view(torch.uint8)[~nan]
    assert not bool(diff.any()), f"{int(diff.sum())} fp8 values differ"


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def sqnr_db(ref, approx):
    return (10 * torch.log10(ref.double().pow(2).sum() / (ref.double() - approx.double()).pow(2).sum())).item()


def boundary_values(rows: int) -> torch.Tensor:
    """Blocks of e4m3 rounding midpoints (and their neighbours) with amax 300, so a pow2 scale is exactly 1."""
    mids = e4m3_midpoints()
    vals = torch.cat([mids, torch.nextafter(mids, torch.zeros(())), torch.nextafter(mids, torch.full((), 1e9))])
    vals = torch.cat([vals, -vals])
    x = vals[torch.arange(rows * 128) % vals.numel()].reshape(rows, 128)
    x[:, 0] = 300.0
    return x


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1, 128), torch.float32), ((7, 300), torch.bfloat16), ((129, 1000), torch.float16), ((2, 3, 256), torch.bfloat16),
     ((4096, 4096), torch.bfloat16), ((333, 14336), torch.bfloat16)],
)  # fmt: skip
def test_triton_act_quant_bitwise(shape, dtype, pow2):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * torch.logspace(-4, 4, shape[-1])).to(dtype)
    x.view(-1)[:3] = torch.tensor([float("inf"), float("nan"), -float("inf")]).to(dtype)
    want = act_quant(x, pow2=pow2)  # CPU reference
    assert_bitwise(act_quant(x.to(CUDA), pow2=pow2, backend="triton"), want)
    assert_bitwise(act_quant(x.to(CUDA), pow2=pow2, backend="torch"), want)  # reference on CUDA == on CPU


@pytest.mark.parametrize("division", ["plain", "reciprocal"])
@pytest.mark.parametrize("pow2", [False, True])
def test_triton_quantizer_divisions_bitwise(pow2, division):
    """Every `quant_groups` division (`triton_quant.DIVISIONS`: `div_rn` on every value; one division per group, then
    products and FMAs) against the reference quantizer, bitwise: the e4m3 midpoints times non-power-of-two scales,
    values over 60 decades with zeros of both
    signs, NaN, inf and denormals (fp32 and bf16, rows and the transposed view), and a gradient-sized bf16 tensor."""

    from nemo_jetrl.precision.kernels.triton_quant import quant_groups

    wide = wide_values()
    gen = torch.Generator().manual_seed(11)
    grad = (torch.randn(4096, 6144, generator=gen) * 1e-4).to(torch.bfloat16)
    grad[::3] = 0.0  # zero rows, as a zero-advantage sequence's
    for x in (scaled_midpoints(), boundary_values(64), wide, wide.to(torch.bfloat16), grad):
        for view in (x, x.t()):
            want = act_quant(view.contiguous(), pow2=pow2)
            assert_bitwise(quant_groups(view.to(CUDA), 128, pow2, division=division), want)


@pytest.mark.parametrize("pow2", [False, True])
def test_triton_rounding_boundaries_bitwise(pow2):
    x = boundary_values(64)
    want = act_quant(x, pow2=pow2)
    if pow2:
        assert bool((want[1] == 1.0).all())
    assert_bitwise(act_quant(x.to(CUDA), pow2=pow2, backend="triton"), want)
    assert_bitwise(
        weight_quant(x.to(CUDA).repeat(2, 1), pow2=pow2, backend="triton"), weight_quant(x.repeat(2, 1), pow2=pow2)
    )


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(128, 128), (200, 300), (384, 4096), (14336, 4096)])
def test_triton_weight_quant_bitwise(shape, pow2):
    gen = torch.Generator().manual_seed(shape[0])
    w = torch.randn(shape, generator=gen) * 0.02
    w[0, 0] = float("nan")
    assert_bitwise(weight_quant(w.to(CUDA), pow2=pow2, backend="triton"), weight_quant(w, pow2=pow2))
    wt = w.t()  # strided view (the 128x128 WGrad operand is X^T)
    assert_bitwise(weight_quant(wt.to(CUDA), pow2=pow2, backend="triton"), weight_quant(wt.contiguous(), pow2=pow2))


@pytest.mark.parametrize("shape", [(300, 256), (8192, 4096), (77, 1024)])
def test_triton_act_quant_t_bitwise(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert_bitwise(act_quant_t(x.to(CUDA), backend="triton"), act_quant(x.t().contiguous()))


@pytest.mark.parametrize("t_blocks", ["1x128", "128x128"])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(300, 256), (4096, 4096), (77, 1000), (128, 14336)])
def test_triton_act_quant_dual_bitwise(shape, pow2, t_blocks):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 4).to(torch.bfloat16)
    x[1, 2] = float("nan")
    got = act_quant_dual(x.to(CUDA), pow2=pow2, t_blocks=t_blocks, backend="triton")
    want = act_quant_dual(x, pow2=pow2, t_blocks=t_blocks)
    assert_bitwise(got[:2], want[:2])
    assert_bitwise(got[2:], want[2:])
    assert got[1].stride(0) == 1  # M-major scales: scaled_mm takes them without a copy


def test_triton_act_quant_dual_boundaries():
    x = boundary_values(256)
    for pow2 in (False, True):
        got = act_quant_dual(x.to(CUDA), pow2=pow2, backend="triton")
        want = act_quant_dual(x, pow2=pow2)
        assert_bitwise(got[:2], want[:2])
        assert_bitwise(got[2:], want[2:])


def test_gemm_backend_is_scaled_mm_on_hopper():
    if not is_hopper():
        pytest.skip("scaled_mm blockwise needs sm90")
    assert gemm_backend(CUDA) == "scaled_mm"
    assert gemm_backend("cpu") == "emulated"


def _operands(m, n, k, seed=0):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(m, k, device=CUDA, generator=gen, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device=CUDA, generator=gen) * 0.02).to(torch.bfloat16)
    dy = torch.randn(m, n, device=CUDA, generator=gen, dtype=torch.bfloat16)
    return x, w, dy


@pytest.mark.parametrize(("m", "n", "k"), [(4096, 4096, 4096), (100, 1024, 512), (2048, 384, 256)])
def test_scaled_mm_matches_emulation_fprop_dgrad(m, n, k):
    if not is_hopper():
        pytest.skip("scaled_mm blockwise needs sm90")
    x, w, dy = _operands(m, n, k)
    (xq, xs), (wq, ws), (dyq, dys) = act_quant(x), weight_quant(w), act_quant(dy)
    for out_dtype in (torch.bfloat16, torch.float32):
        fast = fp8_blockwise_mm(xq, xs, wq, ws, out_dtype, backend="scaled_mm")
        ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="emulated")
        assert fast.dtype == out_dtype and rel_err(fast, ref) <= 2e-3  # FProp
    wtq, wts = wq.t().contiguous(), ws.t().contiguous()  # DGrad: the forward's tiles transposed
    fast = fp8_blockwise_mm(dyq, dys, wtq, wts, torch.bfloat16, backend="scaled_mm")
    ref = fp8_blockwise_mm(dyq, dys, wtq, wts, torch.float32, backend="emulated")
    assert rel_err(fast, ref) <= 2e-3
    bias = torch.randn(n, device=CUDA).to(torch.bfloat16).float()  # scaled_mm takes the bias in bf16
    fast = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, bias=bias, backend="scaled_mm")
    assert rel_err(fast, fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="emulated")) <= 2e-3
    fast = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="scaled_mm")  # bias added in fp32
    err = rel_err(fast, fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="emulated"))
    print(f"scaled_mm fp32-out vs emulation ({m}x{n}x{k}): rel err {err:.2e}")
    assert err <= 1e-3


@pytest.mark.parametrize("x_blocks", ["1x128", "128x128"])
@pytest.mark.parametrize("m", [8192, 1000])
def test_scaled_mm_matches_emulation_wgrad(x_blocks, m):
    if not is_hopper():
        pytest.skip("scaled_mm blockwise needs sm90")
    x, _, dy = _operands(m, 1024, 512, seed=1)
    fast = fp8_wgrad_mm(dy, x, x_blocks=x_blocks, backend="scaled_mm")
    ref = fp8_wgrad_mm(dy, x, x_blocks=x_blocks, backend="emulated")
    assert fast.shape == (1024, 512) and fast.dtype == torch.float32
    assert rel_err(fast, ref) <= 2e-3
    assert sqnr_db(dy.float().t() @ x.float(), fast) >= 25.0


@pytest.mark.parametrize("wgrad_x_blocks", ["1x128", "128x128"])
def test_fp8_linear_cuda_fwd_bwd_vs_bf16(wgrad_x_blocks):
    torch.manual_seed(0)
    ref32 = nn.Linear(1024, 2048, device=CUDA)
    bf16 = copy.deepcopy(ref32)
    fp8 = Fp8Linear.from_linear(copy.deepcopy(ref32), PrecisionRecipe.preset("jetrl", wgrad_x_blocks=wgrad_x_blocks))
    x = torch.randn(4, 512, 1024, device=CUDA)
    gy = torch.randn(4, 512, 2048, device=CUDA)
    outs = {}
    for name, mod in (("fp32", ref32), ("bf16", bf16), ("fp8", fp8)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=name != "fp32"):
            y = mod(xi)
        y.backward(gy.to(y.dtype))
        outs[name] = (y.detach(), xi.grad, mod.weight.grad)
    assert outs["fp8"][0].dtype == torch.bfloat16 and outs["fp8"][1].dtype == torch.float32
    for i, what in enumerate(("out", "dX", "dW")):
        fp8_db, bf16_db = sqnr_db(outs["fp32"][i], outs["fp8"][i]), sqnr_db(outs["fp32"][i], outs["bf16"][i])
        print(f"{what} SQNR vs fp32: fp8 {fp8_db:.1f} dB, bf16 {bf16_db:.1f} dB")
        assert fp8_db >= 25.0 and bf16_db > fp8_db
    assert bool(torch.isfinite(fp8.weight.grad).all())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # rollout == trainer forward, bitwise
        train_y = fp8(x)
        with rollout_mode(fp8):
            rollout_y = fp8(x)
    assert torch.equal(train_y, rollout_y)


def test_cuda_and_cpu_fp8_linear_agree():
    torch.manual_seed(1)
    lin = nn.Linear(512, 384)
    cpu = Fp8Linear.from_linear(copy.deepcopy(lin), PrecisionRecipe.preset("jetrl"))
    gpu = Fp8Linear.from_linear(copy.deepcopy(lin).to(CUDA), PrecisionRecipe.preset("jetrl"))
    x = torch.randn(256, 512)
    # identical quantized weights and activations; only the GEMM differs (scaled_mm vs FP32 emulation)
    assert torch.equal(cpu.quantized_weight().scale, gpu.quantized_weight().scale.cpu())
    assert rel_err(gpu(x.to(CUDA)).cpu(), cpu(x)) <= 2e-3
    assert act_dequant(*act_quant(x)).equal(act_dequant(*act_quant(x.to(CUDA))).cpu())


def test_kv_fake_quant_memory_is_its_output_plus_one_slice():
    """The trainer's K/V fake-quant at a long micro-batch (64K tokens x 8 KV heads x 128): what it allocates beyond
    its input is its BF16 output (one pass over the memory, `triton_quant.kv_round_trip`), not FP32 copies."""
    from nemo_jetrl.precision.kv import FAKE_QUANT_SLICE_ELEMENTS, kv_dequant, kv_fake_quant, kv_quant

    k = torch.randn(1, 65536, 8, 128, device=CUDA, dtype=torch.bfloat16).transpose(1, 2)  # [1, H_kv, S, D]
    scale = torch.tensor(0.01, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = kv_fake_quant(k, scale)
    torch.cuda.synchronize()
    excess = torch.cuda.max_memory_allocated() - before
    out_bytes = out.numel() * out.element_size()
    assert excess <= out_bytes + (1 << 20), (excess, out_bytes, 3 * 4 * FAKE_QUANT_SLICE_ELEMENTS)
    assert torch.equal(out, kv_dequant(kv_quant(k, scale), scale, k.dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kv_fake_quant_one_pass_is_bitwise_the_round_trip(dtype):
    """On CUDA the trainer's K/V fake-quant is one Triton pass over the tensor's memory (`triton_quant.kv_round_trip`):
    bitwise the CPU `kv_dequant(kv_quant(...))` on a [B, H, S, D] view of a [B, S, H, D] buffer, with e4m3 rounding
    ties times the scale, signed zeros, saturation, inf and NaN (positions); the layout kept; a sliced (not dense)
    view takes the torch path, with the same bits."""
    from nemo_jetrl.precision.kv import kv_dequant, kv_fake_quant, kv_quant

    gen = torch.Generator().manual_seed(8)
    base = torch.randn(2, 300, 8, 128, generator=gen) * 2  # [B, S, H, D]
    ties = torch.tensor([0.5, 1.5, 2.5, 9.0, 17.0, 104.0, 240.0, 416.0, 432.0], dtype=torch.float64) * 0.0123
    base[0, 0, 0, :9], base[0, 0, 1, :9] = ties.float(), -ties.float()
    base[0, 1, 0, :6] = torch.tensor([0.0, -0.0, 7.0, -9.0, float("inf"), float("nan")])
    base = base.to(dtype)
    scale = torch.tensor(0.0123)
    k = base.transpose(1, 2)  # [B, H, S, D] view
    want = kv_dequant(kv_quant(k, scale), scale, dtype)
    kc = k.to(CUDA)  # the same [B, H, S, D] strides
    assert kc.stride() == k.stride()
    for got_in, ref in ((kc, want), (kc[:, :, 7:250], want[:, :, 7:250])):
        got = kv_fake_quant(got_in, scale.to(CUDA))
        nan = ref.isnan()
        assert torch.equal(got.isnan().cpu(), nan)
        assert torch.equal(got.cpu()[~nan], ref[~nan])
    assert kv_fake_quant(kc, scale.to(CUDA)).stride() == kc.stride()


@pytest.mark.parametrize("shape", [(200, 300), (6144, 4096), (4096, 12288)])
def test_triton_weight_quant_checked_bitwise_and_count(shape):
    from nemo_jetrl.precision import weight_quant_checked

    gen = torch.Generator().manual_seed(shape[1])
    w = (torch.randn(shape, generator=gen) * 0.02).bfloat16()
    w[0, 0], w[-1, -1], w[shape[0] // 2, 3] = float("nan"), float("inf"), -float("inf")
    q, s, bad = weight_quant_checked(w.to(CUDA), backend="triton")
    assert_bitwise((q, s), weight_quant(w))
    assert int(bad) == 3 and int(weight_quant_checked(torch.ones(256, 256, device=CUDA))[2]) == 0


@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 12288), (24576, 4096), (300, 200)])
def test_triton_transpose_is_the_byte_transpose(shape):
    from nemo_jetrl.precision.transpose import transpose_fp8

    buffer = torch.randint(0, 256, (shape[0] + 128, shape[1]), dtype=torch.uint8, device=CUDA)
    w = buffer[64 : 64 + shape[0]].view(torch.float8_e4m3fn)  # a row-slice view, as a grouped member's weight
    ref = w.view(torch.uint8).t().contiguous()
    assert torch.equal(transpose_fp8(w).view(torch.uint8), ref)
    out = torch.zeros(shape[1], shape[0], dtype=torch.float8_e4m3fn, device=CUDA)
    assert transpose_fp8(w, out=out) is out and torch.equal(out.view(torch.uint8), ref)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
