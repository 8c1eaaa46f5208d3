"""The rollout fast path's Triton kernels on CPU, through Triton's interpreter (TRITON_INTERPRET=1, in a child
process: the flag is read when kernels are defined): fused glue vs the eager HF math, the small-M FP8 GEMM vs its
emulated twin, the fused decoder forward vs the eager one. Plus the shared q/k/v input quantization (in-process)."""

import textwrap

import pytest
import torch

from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, QuantizedInput, convert_to_fp8, quantize_shared_input, rollout_mode

pytest.importorskip("triton")

CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.models import fused_ops as F
    from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
    from nemo_jetrl.models.forward_plan import ForwardPlan
    from nemo_jetrl.models.tiny import random_tiny_qwen3
    from nemo_jetrl.precision import PrecisionRecipe, act_quant, convert_to_fp8, fp8_blockwise_mm, rollout_mode, weight_quant
    from nemo_jetrl.precision.kernels.triton_gemm import fp8_gemm_small_m
    from nemo_jetrl.precision.kernels.triton_quant import quant_groups
    import nemo_jetrl.precision.linear as L
    import nemo_jetrl.precision.recipes.blockwise as RQ

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    torch.manual_seed(0)
    r = {}
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        x, d = torch.randn(6, 256).to(dt), torch.randn(6, 256).to(dt)
        w = (1 + 0.1 * torch.randn(256)).to(dt)
        (r1, o1), (r2, o2) = F.add_rms_norm_ref(x, d, w, 1e-6), F.add_rms_norm(x, d, w, 1e-6)
        r[name + "_add_equal"] = torch.equal(r1, r2)
        r[name + "_norm_equal"], r[name + "_norm_rel"] = torch.equal(o1, o2), rel(o2, o1)
        q, wn = torch.randn(2, 3, 4, 32).to(dt), (1 + 0.1 * torch.randn(32)).to(dt)
        cos, sin = torch.randn(2, 3, 32).to(dt), torch.randn(2, 3, 32).to(dt)
        r[name + "_rope_equal"] = torch.equal(F.qk_norm_rope(q, None, 0.0, cos, sin), F.qk_norm_rope_ref(q, None, 0.0, cos, sin))
        a, b = F.qk_norm_rope(q, wn, 1e-6, cos, sin), F.qk_norm_rope_ref(q, wn, 1e-6, cos, sin)
        r[name + "_norm_rope_equal"], r[name + "_norm_rope_rel"] = torch.equal(a, b), rel(a, b)
        # a decode step's q: one token per row, a column view of the grouped q/k/v output (odd size-1 stride)
        qd = torch.randn(3, 200).to(dt)[:, :128].view(3, 1, 4, 32)
        cd, sd = torch.randn(3, 1, 32).to(dt), torch.randn(3, 1, 32).to(dt)
        a, b = F.qk_norm_rope(qd, wn, 1e-6, cd, sd), F.qk_norm_rope_ref(qd, wn, 1e-6, cd, sd)
        r[name + "_decode_rope_rel"] = rel(a, b)
        g, u = torch.randn(5, 64).to(dt), torch.randn(5, 64).to(dt)
        r[name + "_silu_rel"] = rel(F.silu_mul(g, u), F.silu_mul_ref(g, u))
        r[name + "_silu_equal"] = torch.equal(F.silu_mul(g, u), F.silu_mul_ref(g, u))
        gu = torch.randn(2, 3, 2 * 96).to(dt)  # column views of one grouped gate/up output
        g, u = gu[..., :96], gu[..., 96:]
        r[name + "_silu_views_equal"] = torch.equal(F.silu_mul(g, u), F.silu_mul_ref(g, u))
        r[name + "_silu_views_rel"] = rel(F.silu_mul(g, u), F.silu_mul_ref(g, u))
    gemm = []
    for m, n, k, with_bias in ((5, 256, 384, False), (40, 512, 256, True)):
        x, w = torch.randn(m, k), torch.randn(n, k)
        (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
        bias = torch.randn(n) if with_bias else None
        ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, bias=bias, backend="emulated")
        for config in ((64, 1, 8, 3), (128, 2, 8, 4), (64, 3, 8, 3)):
            gemm.append(rel(fp8_gemm_small_m(xq, xs, wq, ws, torch.float32, bias, config), ref))
    r["gemm_rel"] = gemm
    x, w1, w2 = torch.randn(24, 256), torch.randn(384, 256), torch.randn(128, 256)
    (xq, xs), (wq1, ws1), (wq2, ws2) = act_quant(x), weight_quant(w1), weight_quant(w2)
    both = fp8_gemm_small_m(xq, xs, torch.cat([wq1, wq2]), torch.cat([ws1, ws2]), torch.float32, None, (128, 2, 8, 3))
    one = [fp8_gemm_small_m(xq, xs, w, s, torch.float32, None, (128, 2, 8, 3)) for w, s in ((wq1, ws1), (wq2, ws2))]
    r["grouped_gemm_equal"] = torch.equal(both, torch.cat(one, dim=1))
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = random_tiny_qwen3(0, num_layers=2).to(dt)
        ids = torch.randint(3, 30, (3, 7))
        mask = torch.ones_like(ids)
        mask[0, :2] = 0
        pos = position_ids_from_mask(mask)
        with torch.no_grad():
            eager, fused = decoder_forward(model, ids, pos, mask), decoder_forward(model, ids, pos, mask, ForwardPlan(fused=True))
        r[name + "_decoder_rel"] = rel(fused, eager)
    # norm / SiLU*up kernels writing the next linear's FP8 input: bitwise the Triton quantizer of their output
    fp8_out = []
    for dt in (torch.bfloat16, torch.float32):
        for pow2 in (False, True):
            x, d = torch.randn(5, 384).to(dt), torch.randn(5, 384).to(dt)
            w = (1 + 0.1 * torch.randn(384)).to(dt)
            res, normed = F.add_rms_norm(x, d, w, 1e-6)
            res_q, q, s = F.add_rms_norm_fp8(x, d, w, 1e-6, 128, pow2)
            q0, s0 = quant_groups(normed, 128, pow2)
            fp8_out.append(torch.equal(res_q, res) and torch.equal(q.view(torch.uint8), q0.view(torch.uint8)))
            fp8_out.append(torch.equal(s, s0) and s.stride() == s0.stride())
            g, u = torch.randn(3, 2304).to(dt), torch.randn(3, 2304).to(dt)  # 18 groups over 2 programs per row
            q, s = F.silu_mul_fp8(g, u, 128, pow2)
            q0, s0 = quant_groups(F.silu_mul(g, u), 128, pow2)
            fp8_out.append(torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0))
    r["fp8_out_equal"] = fp8_out
    # the interpreter's fp32 -> e4m3 cast does not round to nearest even: the per-linear path quantizes with the
    # same (Triton) quantizer as the fused kernels here, so that the comparison below sees only real differences
    quantized = []
    L.act_quant = lambda x, block=128, pow2=False, backend="auto": quantized.append(1) or quant_groups(x, block, pow2)
    RQ.act_quant = L.act_quant  # the rollout's activation cast (BlockwiseLayout.input_quant)
    model = random_tiny_qwen3(1, num_layers=2)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))  # q/k/v and gate/up grouped
    calls, act_calls = [], []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: calls.append(1))
    model.model.layers[0].mlp.act_fn.register_forward_hook(lambda *a: act_calls.append(1))
    with torch.no_grad(), rollout_mode(model):
        eager = decoder_forward(model, ids, pos, mask)
        r["eager_act_quants"] = len(quantized)
        fused = decoder_forward(model, ids, pos, mask, ForwardPlan(fused=True))
        r["fused_act_quants"] = len(quantized) - r["eager_act_quants"]
    r["fp8_decoder_rel"], r["fp8_q_proj_calls"], r["act_calls"] = rel(fused, eager), len(calls), len(act_calls)
    # with an exact part on (matched kernels) the norm writes its FP8 output too, over BF16 and FP32 activations
    from nemo_jetrl.models.batch_invariant import ExactParts, enable_batch_invariant
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = random_tiny_qwen3(1, num_layers=2).to(dt)
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
        enable_batch_invariant(model, ExactParts.only("attention"))
        before = len(quantized)
        with torch.no_grad(), rollout_mode(model):
            decoder_forward(model, ids, pos, mask, ForwardPlan.rollout(model, None, fused=True))
        r[name + "_exact_part_act_quants"] = len(quantized) - before
    print(json.dumps(r))
    """
)


@pytest.fixture(scope="module")
def interpreted(run_interpreted) -> dict:
    return run_interpreted(CHILD)


def test_bf16_glue_is_bitwise_the_eager_math(interpreted):
    # with every intermediate rounded as the eager ops round it, bf16 outputs are the same bits
    for key in ("add", "norm", "rope", "norm_rope", "silu"):
        assert interpreted[f"bf16_{key}_equal"], key


def test_fp32_glue_matches_to_rsqrt_rounding(interpreted):
    assert interpreted["fp32_add_equal"] and interpreted["fp32_rope_equal"]
    assert interpreted["fp32_norm_rel"] < 1e-6 and interpreted["fp32_norm_rope_rel"] < 1e-6
    assert interpreted["fp32_silu_rel"] < 1e-6


def test_small_m_gemm_matches_emulation_for_every_config(interpreted):
    assert len(interpreted["gemm_rel"]) == 6
    assert max(interpreted["gemm_rel"]) < 1e-6  # same FP8 bits, FP32 accumulation order only


def test_fused_decoder_forward_matches_eager(interpreted):
    assert interpreted["fp32_decoder_rel"] < 1e-5
    assert interpreted["bf16_decoder_rel"] < 1e-2


def test_grouped_projections_match_the_per_linear_path(interpreted):
    # one GEMM over concatenated FP8 weights computes every output tile exactly as the separate GEMMs do
    assert interpreted["grouped_gemm_equal"]
    assert interpreted["bf16_silu_views_equal"] and interpreted["fp32_silu_views_rel"] < 1e-6
    assert interpreted["fp32_decode_rope_rel"] < 1e-6 and interpreted["bf16_decode_rope_rel"] < 1e-2
    # FP8 rollout: fused glue + grouped q/k/v and gate/up GEMMs vs the eager per-linear forward
    assert interpreted["fp8_q_proj_calls"] == 1  # the eager pass only: the fused one ran the grouped GEMM
    assert interpreted["act_calls"] == 1  # ... and silu_mul, not the model's SiLU module (transformers 5 naming)
    # per layer the eager path quantizes the q/k/v, o, gate/up and down inputs; the fused one only o's (the
    # attention output): the norms and SiLU*up wrote the others quantized
    assert interpreted["eager_act_quants"] == 8 and interpreted["fused_act_quants"] == 2
    # (fp32 glue differs from eager in the last bits, which can flip single e4m3 roundings of the next linear's
    # input; a wrong split of the grouped output would be O(1))
    assert interpreted["fp8_decoder_rel"] < 1e-3


def test_glue_kernels_write_the_next_linears_fp8_input_bitwise(interpreted):
    assert len(interpreted["fp8_out_equal"]) == 12 and all(interpreted["fp8_out_equal"])


def test_with_exact_parts_the_norm_casts_at_every_activation_dtype(interpreted):
    # per layer, BF16 and FP32 activations alike: o's input only (the norms and SiLU*up wrote the others)
    assert interpreted["bf16_exact_part_act_quants"] == 2 and interpreted["fp32_exact_part_act_quants"] == 2


def test_shared_input_quantization_is_bitwise_each_linears_own():
    model = random_tiny_qwen3(0, num_layers=1)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, 5, model.config.hidden_size)
    linears = (attn.q_proj, attn.k_proj, attn.v_proj)
    assert quantize_shared_input(x, linears) is x  # train mode: each linear keeps its autograd path
    with torch.no_grad(), rollout_mode(model):
        shared = quantize_shared_input(x, linears)
        assert isinstance(shared, QuantizedInput)
        for linear in linears:
            assert torch.equal(linear(shared), linear(x))
        mask = torch.ones(3, 5, dtype=torch.long)
        out = decoder_forward(model, x.new_zeros(3, 5).long() + 4, position_ids_from_mask(mask), mask)
        assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="QuantizedInput"):
        attn.q_proj(shared)  # outside rollout mode
