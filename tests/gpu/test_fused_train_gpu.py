"""The trainer's CUDA fast path: differentiable glue kernels at Qwen3-8B widths (forward vs the HF math, gradients
vs FP64 autograd next to eager bf16 autograd), and `sequence_logprobs` with them (and optionally left-aligned rows
with causal SDPA) against the eager masked path and an FP64 model."""

import pytest
import torch
import torch.nn.functional as F

from nemo_jetrl.models import fused_ops, fused_train_ops
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8

pytestmark = pytest.mark.gpu
DEV = "cuda"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def grads_of(fn, inputs, grads_out):
    ins = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*ins)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(outs, grads_out)
    return outs, [t.grad for t in ins]


def glue_case(name: str, gen: torch.Generator):
    """(fused fn, eager fn, inputs, output grads, number of inputs with a gradient) at Qwen3-8B widths, bf16."""

    def randn(*shape, around=0.0):
        x = torch.randn(shape, device=DEV, generator=gen)
        return (around + 0.1 * x if around else x).bfloat16()

    if name == "add_norm":
        return (
            lambda a, b, c: fused_train_ops.add_rms_norm(a, b, c, 1e-6),
            lambda a, b, c: fused_ops.add_rms_norm_ref(a, b, c, 1e-6),
            [randn(512, 4096), randn(512, 4096), randn(4096, around=1.0)],
            [randn(512, 4096), randn(512, 4096)],
            3,
        )
    if name == "qk_norm_rope":
        return (
            lambda a, c, cos, sin: fused_train_ops.qk_norm_rope(a, c, 1e-6, cos, sin),
            lambda a, c, cos, sin: fused_ops.qk_norm_rope_ref(a, c, 1e-6, cos, sin),
            [randn(2, 256, 32, 128), randn(128, around=1.0), randn(2, 256, 128), randn(2, 256, 128)],
            [randn(2, 256, 32, 128)],
            2,  # cos/sin carry no gradient
        )
    return (
        fused_train_ops.silu_mul,
        fused_ops.silu_mul_ref,
        [randn(512, 12288), randn(512, 12288)],
        [randn(512, 12288)],
        2,
    )


@pytest.mark.parametrize("name", ["add_norm", "qk_norm_rope", "silu_mul"])
def test_train_glue_kernels_match_eager_and_fp64(name):
    fused, ref, inputs, grads_out, n_grad = glue_case(name, torch.Generator(device=DEV).manual_seed(0))
    (o1, g1), (o2, g2) = grads_of(fused, inputs, grads_out), grads_of(ref, inputs, grads_out)
    _, g3 = grads_of(ref, [t.double() for t in inputs], [g.double() for g in grads_out])
    for a, b in zip(o1, o2):
        assert (a != b).float().mean().item() < 0.01 and rel(a, b) < 2e-3  # rsqrt/exp last bits only
    for a, b, c in list(zip(g1, g2, g3))[:n_grad]:
        assert 0 < rel(b, c) < 1e-2
        assert rel(a, c) <= 1.2 * rel(b, c), (name, rel(a, c), rel(b, c))


@pytest.mark.parametrize("causal", [False, True], ids=["masked", "causal"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_trainer_fast_path_is_as_accurate_as_eager(fp8, causal, monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k.get("is_causal")) or sdpa(*a, **k)
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (8, 40), generator=gen).to(DEV)
    mask = torch.ones_like(ids)
    mask[:3, :6] = 0  # left-padded prompts
    mask[5:, 33:] = 0  # right-padded responses
    weights = torch.linspace(0.5, 1.5, 40, device=DEV)

    def trainer_pass(model, fast):
        model.zero_grad()
        logp = sequence_logprobs(model, ids, mask, fused_train=fast, causal_attention=fast and causal)
        (logp * weights.to(logp.dtype)).sum().backward()
        grads = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
        return logp.detach().double(), grads

    ref_logp, ref_grads = trainer_pass(random_tiny_qwen3(0, num_layers=2).to(DEV, torch.float64), False)
    model = random_tiny_qwen3(0, num_layers=2).to(DEV, torch.bfloat16)
    if fp8:
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    calls.clear()
    fast_logp, fast_grads = trainer_pass(model, True)
    assert calls == ([True, True] if causal else [None, None])  # both layers: causal without a mask, or masked
    eager_logp, eager_grads = trainer_pass(model, False)
    assert bool((fast_logp[mask == 0] == 0).all())
    fast_err, eager_err = (float((x - ref_logp).abs().max()) for x in (fast_logp, eager_logp))
    assert 0 < eager_err and fast_err <= 1.5 * eager_err, (fast_err, eager_err)
    fast_gerr, eager_gerr = rel(fast_grads, ref_grads), rel(eager_grads, ref_grads)
    assert 0 < eager_gerr and fast_gerr <= 1.5 * eager_gerr, (fast_gerr, eager_gerr)


def test_fp8_down_proj_making_silu_mul_itself_is_bitwise_the_plain_call_and_frees_the_product():
    """`linear_after(down_proj, SiluMulInput, gate, up)` (the trainer's MLP) at Qwen3-8B widths, 2,048 tokens: the
    output and the gradients of gate, up and the weight equal `down_proj(silu_mul(gate, up))`'s bit for bit. The
    forward's peak is one output [T, N] lower: the BF16 product [T, F] is freed before the GEMM writes the output
    (the plain call holds the product, its two FP8 copies and the output at once; here the peak is the product
    and its copies while the cast runs)."""
    from nemo_jetrl.precision import Fp8Linear
    from nemo_jetrl.precision.op_input_linear import linear_after

    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    down = Fp8Linear(12288, 4096, bias=False, recipe=PrecisionRecipe.preset("jetrl"), device=DEV, dtype=torch.bfloat16)
    tokens = 2048
    gate, up = (torch.randn(tokens, 12288, device=DEV, generator=gen).bfloat16() for _ in range(2))
    dy = torch.randn(tokens, 4096, device=DEV, generator=gen).bfloat16()
    down.quantized_weight()
    runs, peaks = [], []
    for fused in (False, True):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        down.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = linear_after(down, fused_train_ops.SiluMulInput, g, u) if fused else down(fused_train_ops.silu_mul(g, u))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        y.backward(dy)
        runs.append([y.detach(), g.grad, u.grad, down.weight.grad])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    output = tokens * 4096 * 2
    assert peaks[0] - peaks[1] == pytest.approx(output, rel=0.05), peaks
