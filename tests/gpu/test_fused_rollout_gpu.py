"""The rollout fast path on CUDA: Triton small-M FP8 GEMM vs its emulated twin, fused glue kernels vs the HF math
(bf16 roundings on the real hardware), fused decoder forward vs eager, shared q/k/v quantization bitwise."""

import pytest
import torch

from nemo_jetrl.models import fused_ops
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import (
    PrecisionRecipe,
    act_quant,
    convert_to_fp8,
    fp8_blockwise_mm,
    rollout_mode,
    weight_quant,
)
from nemo_jetrl.precision.gemm import SMALL_M_MAX, gemm_backend

pytestmark = pytest.mark.gpu
DEV = "cuda"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("m", [1, 7, 64, 128, 200])
@pytest.mark.parametrize(("n", "k"), [(256, 512), (1024, 4096), (384, 1280)])
def test_triton_gemm_matches_emulation(m, n, k):
    gen = torch.Generator(device=DEV).manual_seed(m * 7 + n)
    x = torch.randn(m, k, device=DEV, generator=gen)
    w = torch.randn(n, k, device=DEV, generator=gen) * 0.05
    bias = torch.randn(n, device=DEV, generator=gen)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    for b in (None, bias):
        ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=b, backend="emulated")
        out = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=b, backend="triton")
        assert rel_err(out, ref) < 1e-3  # the same FP8 bits; Hopper FP8 MMA accumulation + FP32 order differ
        again = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=b, backend="triton")
        assert torch.equal(out, again)  # split-K partials summed in a fixed order
    ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="emulated")
    out16 = fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16, backend="triton")
    assert out16.dtype == torch.bfloat16 and rel_err(out16, ref) < 5e-3


@pytest.mark.parametrize("split_k", [1, 2, 8])
def test_triton_gemm_every_config_matches(split_k):
    from nemo_jetrl.precision.kernels.triton_gemm import fp8_gemm_small_m

    gen = torch.Generator(device=DEV).manual_seed(split_k)
    x, w = torch.randn(33, 2048, device=DEV, generator=gen), torch.randn(512, 2048, device=DEV, generator=gen)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="emulated")
    for block_n in (64, 128):
        out = fp8_gemm_small_m(xq, xs, wq, ws, torch.float32, None, (block_n, split_k, 8, 3))
        assert rel_err(out, ref) < 1e-3


def test_auto_backend_takes_the_faster_kernel_for_small_m():
    if gemm_backend(DEV) != "scaled_mm":
        pytest.skip("needs sm90 (scaled_mm present)")
    from nemo_jetrl.precision.gemm import small_m_config

    x, w = torch.randn(SMALL_M_MAX + 1, 4096, device=DEV), torch.randn(1024, 4096, device=DEV)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    small = fp8_blockwise_mm(xq[:64], xs[:64], wq, ws, torch.float32)
    choice = small_m_config(xq[:64], wq, torch.float32, False, library="scaled_mm")
    want = "scaled_mm" if choice is None else "triton"
    assert torch.equal(small, fp8_blockwise_mm(xq[:64], xs[:64], wq, ws, torch.float32, backend=want))
    big = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32)  # beyond SMALL_M_MAX: always cuBLAS
    assert torch.equal(big, fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="scaled_mm"))


def test_fused_add_norm_rope_silu_bf16_roundings():
    """On the GPU (real bf16 rounding) the add, RoPE and SiLU*up are bitwise the eager ops; the RMSNorm differs
    only by its FP32 reduction order (<= 1 bf16 ulp on a few elements)."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    bf = torch.bfloat16
    x, d = (
        torch.randn(64, 4096, device=DEV, generator=gen).to(bf),
        torch.randn(64, 4096, device=DEV, generator=gen).to(bf),
    )
    w = (1 + 0.1 * torch.randn(4096, device=DEV, generator=gen)).to(bf)
    r_ref, o_ref = fused_ops.add_rms_norm_ref(x, d, w, 1e-6)
    r, o = fused_ops.add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(r, r_ref)
    assert (o != o_ref).float().mean().item() < 0.02 and rel_err(o, o_ref) < 4e-3
    q = torch.randn(8, 3, 32, 128, device=DEV, generator=gen).to(bf)
    cos, sin = (
        torch.randn(8, 3, 128, device=DEV, generator=gen).to(bf),
        torch.randn(8, 3, 128, device=DEV, generator=gen).to(bf),
    )
    assert torch.equal(
        fused_ops.qk_norm_rope(q, None, 0.0, cos, sin), fused_ops.qk_norm_rope_ref(q, None, 0.0, cos, sin)
    )
    wn = (1 + 0.1 * torch.randn(128, device=DEV, generator=gen)).to(bf)
    out, ref = fused_ops.qk_norm_rope(q, wn, 1e-6, cos, sin), fused_ops.qk_norm_rope_ref(q, wn, 1e-6, cos, sin)
    assert (out != ref).float().mean().item() < 0.02 and rel_err(out, ref) < 4e-3
    g, u = (
        torch.randn(64, 12288, device=DEV, generator=gen).to(bf),
        torch.randn(64, 12288, device=DEV, generator=gen).to(bf),
    )
    s_out, s_ref = fused_ops.silu_mul(g, u), fused_ops.silu_mul_ref(g, u)
    assert (s_out != s_ref).float().mean().item() < 0.01 and rel_err(s_out, s_ref) < 2e-3


@pytest.mark.parametrize("pow2", [False, True])
def test_glue_kernels_write_fp8_inputs_bitwise_act_quant(pow2):
    """The decode step's norms and SiLU*up write the next linears' FP8 input: the bits and scales act_quant (the
    trainer's quantizer, Triton and pure torch alike) gives for their bf16 output."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    bf = torch.bfloat16
    x, d = (torch.randn(128, 4096, device=DEV, generator=gen).to(bf) for _ in range(2))
    w = (1 + 0.1 * torch.randn(4096, device=DEV, generator=gen)).to(bf)
    res, normed = fused_ops.add_rms_norm(x, d, w, 1e-6)
    res_q, q, s = fused_ops.add_rms_norm_fp8(x, d, w, 1e-6, 128, pow2)
    gu = torch.randn(128, 2 * 12288, device=DEV, generator=gen).to(bf)  # column views of the grouped output
    g, u = gu[:, :12288], gu[:, 12288:]
    qs, ss = fused_ops.silu_mul_fp8(g, u, 128, pow2)
    for backend in ("triton", "torch"):
        q0, s0 = act_quant(normed, 128, pow2, backend=backend)
        assert torch.equal(res_q, res)
        assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)
        assert backend == "torch" or s.stride() == s0.stride()  # the R-major scale layout scaled_mm takes
        q0, s0 = act_quant(fused_ops.silu_mul(g, u), 128, pow2, backend=backend)
        assert torch.equal(qs.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(ss, s0)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_fused_decoder_forward_matches_eager(fp8):
    model = random_tiny_qwen3(0, num_layers=2).to(DEV, torch.bfloat16)
    if fp8:
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (16, 24), generator=gen).to(DEV)
    mask = torch.ones_like(ids)
    mask[:4, :5] = 0
    pos = position_ids_from_mask(mask)
    with torch.no_grad(), rollout_mode(model):
        eager = decoder_forward(model, ids, pos, mask)
        fused = decoder_forward(model, ids, pos, mask, ForwardPlan(fused=True))
    assert fused.dtype == eager.dtype == torch.bfloat16
    assert rel_err(fused, eager) < (5e-2 if fp8 else 5e-3)  # rsqrt/exp last bits, amplified by FP8 rounding


NORM_INPUTS = {  # (x, residual delta or None, norm weight)
    "fp32-master": (torch.float32, torch.bfloat16, torch.float32),  # FP32 residual + BF16 branch output, autocast
    "fp32-master-first-layer": (torch.float32, None, torch.float32),  # the embeddings' norm: no delta
    "bf16-master": (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    "bf16-master-first-layer": (torch.bfloat16, None, torch.bfloat16),
}


@pytest.mark.parametrize("width", [1024, 2048, 4096, 5120])
@pytest.mark.parametrize("inputs", list(NORM_INPUTS))
def test_fused_norm_fp8_equals_plain_norm_then_act_quant(inputs, width):
    """The norm kernel with the FP8 quantization fused writes the bits of the plain norm kernel + act_quant (the
    trainer's path), and the same residual, at the shipped widths and master-weight dtypes (before the e4m3 store's
    runs, `fused_ops._norm_store_run`, the FP32 rows without a delta and the rows 5,120 wide differed)."""
    x_dtype, d_dtype, w_dtype = NORM_INPUTS[inputs]
    gen = torch.Generator(device=DEV).manual_seed(width)
    x = torch.randn(256, width, device=DEV, generator=gen).to(x_dtype)
    d = None if d_dtype is None else torch.randn(256, width, device=DEV, generator=gen).to(d_dtype)
    w = (1 + 0.1 * torch.randn(width, device=DEV, generator=gen)).to(w_dtype)
    res, normed = fused_ops.add_rms_norm(x, d, w, 1e-6)
    res_q, q, s = fused_ops.add_rms_norm_fp8(x, d, w, 1e-6, 128, False)
    assert torch.equal(res_q, res)
    q0, s0 = act_quant(normed.reshape(-1, width), 128, False)
    assert torch.equal(s, s0)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8))
