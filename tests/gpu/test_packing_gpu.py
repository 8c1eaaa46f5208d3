"""Sequence packing on CUDA: torch's flash varlen kernel against the block-diagonal SDPA twin at Qwen3-8B head
shapes (forward and gradients, grouped K/V), and `sequence_logprobs(pack_round=...)` as accurate as the padded
forward against an FP64 model (BF16 and FP8)."""

import functools

import pytest
import torch

from nemo_jetrl.models import packed as packed_module
from nemo_jetrl.models.packed import PackedRows, block_causal_mask, flash_varlen_kwargs, varlen_causal_attention
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8

pytestmark = pytest.mark.gpu
DEV = "cuda"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def repeat_kv(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.repeat_interleave(n, dim=1)


def test_flash_varlen_matches_the_twin_at_qwen3_8b_heads():
    gen = torch.Generator(device=DEV).manual_seed(0)
    lengths = [700, 35, 1500, 9, 400, 1200, 2]  # long-tailed; the rounding slots form one more segment
    mask = torch.zeros(len(lengths), 1600, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, 100 : 100 + n] = 1
    packing = PackedRows.from_mask(mask, round_to=64).to(DEV)
    t = packing.width
    q = torch.randn(1, 32, t, 128, device=DEV, generator=gen, dtype=torch.bfloat16)  # [1, H, T, D]
    k = torch.randn(1, 8, t, 128, device=DEV, generator=gen, dtype=torch.bfloat16)  # [1, H_kv, T, D]
    v = torch.randn(1, 8, t, 128, device=DEV, generator=gen, dtype=torch.bfloat16)
    grad_out = torch.randn(1, 32, t, 128, device=DEV, generator=gen, dtype=torch.bfloat16)
    kwargs = flash_varlen_kwargs(q, 4, 128**-0.5)
    print("varlen_attn keywords on this torch:", torch.__version__, kwargs)
    assert kwargs is not None  # the flash kernel runs here

    def run(fn, dtype):
        ins = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out = fn(*ins)
        out.backward(grad_out.to(dtype))
        return out.detach(), [x.grad for x in ins]

    flash = run(lambda a, b, c: varlen_causal_attention(a, b, c, packing, 128**-0.5, repeat_kv), torch.bfloat16)

    def twin(a, b, c):
        m = block_causal_mask(packing.cu_seqlens, t)
        return torch.nn.functional.scaled_dot_product_attention(a, repeat_kv(b, 4), repeat_kv(c, 4), attn_mask=m)

    eager = run(twin, torch.bfloat16)
    exact = run(twin, torch.float32)
    for got, ref, fp32 in zip([flash[0], *flash[1]], [eager[0], *eager[1]], [exact[0], *exact[1]]):
        assert rel(got, fp32) <= 1.5 * rel(ref, fp32) + 1e-3, (rel(got, fp32), rel(ref, fp32))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_packed_logprobs_are_as_accurate_as_padded(fp8, monkeypatch):
    calls = []
    real_varlen = packed_module.varlen_attn
    spy = functools.wraps(real_varlen)(lambda *a, **k: calls.append(1) or real_varlen(*a, **k))  # same signature
    monkeypatch.setattr(packed_module, "varlen_attn", spy)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (8, 40), generator=gen).to(DEV)
    mask = torch.ones_like(ids)
    mask[:3, :6] = 0  # left-padded prompts
    mask[5:, 33:] = 0  # right-padded responses
    weights = torch.linspace(0.5, 1.5, 40, device=DEV)

    def trainer_pass(model, pack_round):
        model.zero_grad()
        logp = sequence_logprobs(model, ids, mask, pack_round=pack_round)
        (logp * weights.to(logp.dtype)).sum().backward()
        grads = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
        return logp.detach().double(), grads

    ref_logp, ref_grads = trainer_pass(random_tiny_qwen3(0, num_layers=2).to(DEV, torch.float64), None)
    model = random_tiny_qwen3(0, num_layers=2).to(DEV, torch.bfloat16)
    if fp8:
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    packed_logp, packed_grads = trainer_pass(model, 64)
    assert len(calls) == 2  # both layers ran the flash varlen kernel
    padded_logp, padded_grads = trainer_pass(model, None)
    assert bool((packed_logp[mask == 0] == 0).all())
    packed_err, padded_err = (float((x - ref_logp).abs().max()) for x in (packed_logp, padded_logp))
    assert 0 < padded_err and packed_err <= 1.5 * padded_err, (packed_err, padded_err)
    packed_gerr, padded_gerr = rel(packed_grads, ref_grads), rel(padded_grads, ref_grads)
    print(f"fp8={fp8}: logp max err packed {packed_err:.3g} padded {padded_err:.3g}; "
          f"grad rel err packed {packed_gerr:.3g} padded {padded_gerr:.3g}")  # fmt: skip
    assert 0 < padded_gerr and packed_gerr <= 1.5 * padded_gerr, (packed_gerr, padded_gerr)
