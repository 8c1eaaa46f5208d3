"""Blockwise FP8 GEMM dispatch on CPU: exact emulation, WGrad padding/layouts, errors."""

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.precision import (
    act_dequant,
    act_quant,
    act_quant_t,
    fp8_blockwise_mm,
    fp8_wgrad_mm,
    gemm_backend,
    weight_dequant,
    weight_quant,
)


def sqnr_db(ref, approx):
    return (10 * torch.log10(ref.double().pow(2).sum() / (ref.double() - approx.double()).pow(2).sum())).item()


def test_backend_on_cpu_is_emulated():
    assert gemm_backend("cpu") == "emulated"
    assert gemm_backend(torch.device("cpu")) == "emulated"


def test_emulation_is_exact_dequant_matmul():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 256, generator=gen), torch.randn(384, 256, generator=gen)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    out = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32)
    want = act_dequant(xq, xs) @ weight_dequant(wq, ws).t()
    assert out.shape == (96, 384) and torch.equal(out, want)
    assert torch.equal(fp8_blockwise_mm(xq, xs, wq, ws), want.to(torch.bfloat16))  # default out: bf16
    assert sqnr_db(x @ w.t(), out) >= 25.0


def test_emulation_equals_an_fp64_matmul_of_hand_dequantized_operands():
    """Independent of the project's dequantizers: value = e4m3 code x its block's scale (x: 1x128 groups along K,
    w: 128x128 tiles), product in FP64. The emulation dequantizes to FP32 and multiplies in FP32, so each output
    may differ by FP32 rounding of a K-term sum: at most K * 2^-24 * sum_k |x_k w_k|."""
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(40, 384, generator=gen) * 3, torch.randn(256, 384, generator=gen) / 7
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    assert xs.shape == (40, 3) and ws.shape == (2, 3)
    x64 = xq.double() * xs.double().repeat_interleave(128, dim=1)  # [M, K]
    w64 = wq.double() * ws.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)  # [N, K]
    want = x64 @ w64.t()  # [M, N]
    bound = 384 * 2.0**-24 * (x64.abs() @ w64.abs().t())  # [M, N]
    out = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32)
    assert bool(((out.double() - want).abs() <= bound).all())


def test_bias_is_added_in_fp32_before_the_cast():
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(32, 128, generator=gen), torch.randn(128, 128, generator=gen), torch.randn(128, generator=gen)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    out32 = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=b)
    assert torch.equal(out32, fp8_blockwise_mm(xq, xs, wq, ws, torch.float32) + b)
    assert torch.equal(fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, bias=b), out32.to(torch.bfloat16))


def test_groups_layout_for_b():
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 256, generator=gen), torch.randn(128, 256, generator=gen)
    (xq, xs), (wq, ws) = act_quant(x), act_quant(w)  # w in 1x128 groups: scale [N, K/128]
    out = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, w_blocks="1x128")
    assert torch.equal(out, act_dequant(xq, xs) @ act_dequant(wq, ws).t())


def test_autocast_does_not_downcast_the_emulation():
    gen = torch.Generator().manual_seed(3)
    (xq, xs), (wq, ws) = act_quant(torch.randn(16, 128, generator=gen)), weight_quant(torch.randn(128, 128))
    plain = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32)
    assert under.dtype == torch.float32 and torch.equal(plain, under)


@pytest.mark.parametrize("x_blocks", ["1x128", "128x128"])
def test_wgrad_matches_reference_and_pads_tokens(x_blocks):
    gen = torch.Generator().manual_seed(4)
    m, n, k = 200, 384, 256  # M not a multiple of 128
    dy, x = torch.randn(m, n, generator=gen), torch.randn(m, k, generator=gen)
    dw = fp8_wgrad_mm(dy, x, x_blocks=x_blocks)
    assert dw.shape == (n, k) and dw.dtype == torch.float32
    assert sqnr_db(dy.t() @ x, dw) >= 25.0
    # explicit zero tokens up to 256 give the same bits: padding happens before the M-groups are formed
    dy_p, x_p = F.pad(dy, (0, 0, 0, 56)), F.pad(x, (0, 0, 0, 56))
    assert torch.equal(dw, fp8_wgrad_mm(dy_p, x_p, x_blocks=x_blocks))
    # and equals the hand-assembled product of the layouts the docstring names
    dyt, dyt_s = act_quant_t(dy_p)  # [N, Mp], [N, Mp/128]
    if x_blocks == "1x128":
        xt = act_dequant(*act_quant_t(x_p))  # [K, Mp]
    else:
        xt = weight_dequant(*weight_quant(x_p.t().contiguous()))  # [K, Mp], 128x128 tiles
    assert torch.equal(dw, act_dequant(dyt, dyt_s) @ xt.t())


def test_wgrad_layouts_differ_but_both_are_accurate():
    gen = torch.Generator().manual_seed(5)
    dy, x = torch.randn(256, 128, generator=gen), torch.randn(256, 128, generator=gen) * torch.logspace(-2, 2, 128)
    a, b = fp8_wgrad_mm(dy, x, x_blocks="1x128"), fp8_wgrad_mm(dy, x, x_blocks="128x128")
    exact = dy.t() @ x
    assert not torch.equal(a, b)
    assert sqnr_db(exact, a) >= 25.0 and sqnr_db(exact, b) >= 25.0
    assert sqnr_db(exact, a) > sqnr_db(exact, b)  # per-channel groups track the channel scales


def test_operand_checks():
    xq, xs = act_quant(torch.randn(4, 256))
    wq, ws = weight_quant(torch.randn(128, 256))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_blockwise_mm(xq.float(), xs, wq, ws)
    with pytest.raises(ValueError, match=r"x_scale must be \(4, 2\)"):
        fp8_blockwise_mm(xq, xs[:, :1], wq, ws)
    with pytest.raises(ValueError, match=r"w_scale must be \(128, 2\) for 1x128"):
        fp8_blockwise_mm(xq, xs, wq, ws, w_blocks="1x128")
    with pytest.raises(ValueError, match="w_blocks"):
        fp8_blockwise_mm(xq, xs, wq, ws, w_blocks="64x64")
    with pytest.raises(ValueError, match="expected x \\[M, K\\] and w \\[N, K\\]"):
        fp8_blockwise_mm(xq, xs, wq[:, :128], ws[:, :1])
    with pytest.raises(ValueError, match="not available on cpu"):
        fp8_blockwise_mm(xq, xs, wq, ws, backend="scaled_mm")
    with pytest.raises(ValueError, match="dy \\[M, N\\] and x \\[M, K\\]"):
        fp8_wgrad_mm(torch.randn(4, 128), torch.randn(5, 128))
    with pytest.raises(ValueError, match="x_blocks"):
        fp8_wgrad_mm(torch.randn(4, 128), torch.randn(4, 128), x_blocks="1x64")


@pytest.mark.parametrize("rows, handed", [(1, 64), (8, 64), (61, 64), (64, 64), (65, 80), (300, 304)])
def test_the_matched_pin_hands_cublas_at_least_64_rows_and_slices_them_off(monkeypatch, rows, handed):
    """backend "scaled_mm_padded" (`FpropKernel.CUBLAS`): fewer rows than PADDED_MIN_ROWS are padded to it, more are
    16-aligned as "scaled_mm" pads them; the caller gets its own rows, each the emulated product's (the fake
    library GEMM below dequantizes: the padding is what is checked, on the CPU)."""
    from nemo_jetrl.precision import gemm

    seen = []

    def fake_library(a, b, a_scale, b_scale, w_blocks, bias, out_dtype):  # a [Mp, K] e4m3, b [K, N] view
        seen.append(a.shape[0])
        x = act_dequant(a, a_scale.contiguous())
        w = weight_dequant(b.t(), b_scale.t()[:, : b.shape[0] // 128])
        return (x @ w.t()).to(out_dtype)

    caps = gemm.ScaledMMCaps(pad_tile_scale_rows=False, fp32_out=True, groups_1x128_b=True)
    monkeypatch.setattr(gemm, "scaled_mm_caps", lambda device: caps)
    monkeypatch.setattr(gemm, "_call_scaled_mm", fake_library)
    gen = torch.Generator().manual_seed(3)
    xq, xs = act_quant(torch.randn(rows, 256, generator=gen))
    wq, ws = weight_quant(torch.randn(128, 256, generator=gen))
    padded = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="scaled_mm_padded")
    plain = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="scaled_mm")
    assert seen == [handed, rows + -rows % 16] and gemm.PADDED_MIN_ROWS == 64
    want = act_dequant(xq, xs) @ weight_dequant(wq, ws).t()  # this CPU's float32 GEMM may round by row count
    assert padded.shape == plain.shape == (rows, 128)
    assert torch.allclose(padded, want, rtol=1e-5, atol=1e-4) and torch.allclose(plain, want, rtol=1e-5, atol=1e-4)


def test_the_row_padding_writes_each_operand_once(monkeypatch):
    """A padded product (the matched pin at a decode batch) costs one copy of x and one of its scales, straight into
    the column-major layout scaled_mm takes: no fills (the added rows change no output row kept, which the GPU test
    `test_cublas_fp8_row_at_decode_prefill_and_trainer_sizes` checks bitwise) and no second copy of the scales."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nemo_jetrl.precision import gemm

    class Writes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("copy_", "fill_", "zero_", "constant_pad_nd", "clone", "contiguous"):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    caps = gemm.ScaledMMCaps(pad_tile_scale_rows=False, fp32_out=True, groups_1x128_b=True)
    handed = []
    monkeypatch.setattr(gemm, "scaled_mm_caps", lambda device: caps)
    monkeypatch.setattr(
        gemm, "_call_scaled_mm", lambda a, b, a_s, b_s, *rest: handed.append((a, a_s)) or a.new_zeros(a.shape[0], 128)
    )
    gen = torch.Generator().manual_seed(5)
    xq, xs = act_quant(torch.randn(5, 256, generator=gen))
    wq, ws = weight_quant(torch.randn(128, 256, generator=gen))
    with Writes() as writes:
        fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, backend="scaled_mm_padded")
    ((a, a_scale),) = handed
    assert writes.ops == ["copy_", "copy_"]
    assert a.shape == (64, 256) and a_scale.shape == (64, 2) and a_scale.stride() == (1, 64)
    assert torch.equal(a[:5].view(torch.uint8), xq.view(torch.uint8)) and torch.equal(a_scale[:5], xs)
