"""GPU: the fused token logprob at the Qwen3 vocabulary against the float32 twin, its batch-invariance, and the
trainer's `sequence_logprobs` through it equal to the rollout's logprobs on the tiny model."""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.models.logprobs import token_logprobs, token_logprobs_twin

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_fused_logprob_matches_twin_at_qwen3_vocab(temperature):
    torch.manual_seed(0)
    logits = (torch.randn(256, 151936, device="cuda") * 3).to(torch.bfloat16)  # [T, V]
    tokens = torch.randint(0, 151936, (256,), device="cuda")
    x = logits.clone().requires_grad_(True)
    y = logits.clone().requires_grad_(True)
    fused = token_logprobs(x, tokens, temperature)  # CUDA default: fused
    twin = token_logprobs_twin(y, tokens, temperature)
    assert (fused - twin).abs().max().item() < 2e-5
    g = torch.randn(256, device="cuda")
    (fused * g).sum().backward()
    (twin * g).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    # both round a float32 gradient to bf16: at most one bf16 ulp of the largest entry apart
    assert (x.grad.float() - y.grad.float()).abs().max().item() <= 2**-7 * y.grad.float().abs().max().item()
    alone = token_logprobs(logits[7:8], tokens[7:8], temperature)
    batch64 = token_logprobs(logits[:64], tokens[:64], temperature)
    assert torch.equal(alone[0], fused[7].detach()) and torch.equal(batch64[7], fused[7].detach())
