"""The fused token logprob (`models/logprobs.py`, `logprob_kernels.py`): the Triton kernels under the interpreter
against the float64 formula and the twin's autograd; per-row results independent of the batch; the CPU twin is the
formula trainer and rollout always used."""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.models.logprobs import token_logprobs, token_logprobs_twin

CHILD = r"""
import json, torch
from nemo_jetrl.models.logprobs import token_logprobs, token_logprobs_twin
torch.manual_seed(0)
out = {}
for dtype, temp in ((torch.bfloat16, 1.0), (torch.bfloat16, 0.7), (torch.float32, 1.3)):
    logits = (torch.randn(6, 9000) * 4).to(dtype)  # V over two LOGPROB_BLOCK steps, a partial last one
    tokens = torch.randint(0, 9000, (6,))
    tokens[0] = 8999  # the last column
    x = logits.detach().clone().requires_grad_(True)
    fused = token_logprobs(x, tokens, temp, fused=True)
    ref64 = (logits.double() / temp).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    alone = token_logprobs(logits[3:4], tokens[3:4], temp, fused=True)
    strided = torch.stack([tokens, tokens + 1], 1)[:, 0]  # a column of [T, 2]: ids with stride 2
    strided_equal = torch.equal(token_logprobs(logits, strided, temp, fused=True), fused.detach())
    g = torch.linspace(-1.0, 2.0, 6)
    (fused * g).sum().backward()
    y = logits.detach().clone().requires_grad_(True)
    (token_logprobs_twin(y, tokens, temp) * g).sum().backward()
    key = f"{str(dtype).split('.')[-1]}_{temp}"
    out[key] = {
        "fwd_err": float((fused.double() - ref64).abs().max()),
        "alone_equal": bool(torch.equal(alone[0], fused[3])),
        "strided_equal": strided_equal,
        "grad_dtype": str(x.grad.dtype),
        "grad_err": float((x.grad.float() - y.grad.float()).abs().max()),
        "grad_scale": float(y.grad.float().abs().max()),
        "grad_row_sum": float(x.grad.float().sum(-1).abs().max()),
    }
print(json.dumps(out))
"""


def test_fused_kernels_in_the_interpreter(run_interpreted):
    res = run_interpreted(CHILD)
    for key, r in res.items():
        assert r["fwd_err"] < 1e-5, (key, r)  # measured <= 1.5e-6: float32 sums over 9000 entries
        assert r["alone_equal"], key  # one row alone == the same row inside the batch, bitwise
        assert r["strided_equal"], key  # strided token ids (a column of the rollout's [B, S] ids) read right
        assert r["grad_dtype"] == ("torch.bfloat16" if key.startswith("bfloat16") else "torch.float32")
        # the twin's gradient is computed in float32 then rounded to the logits' dtype: one bf16 ulp of the largest
        bound = 2**-7 * r["grad_scale"] if key.startswith("bfloat16") else 1e-6 * max(1.0, r["grad_scale"])
        assert r["grad_err"] <= bound, (key, r)
        assert r["grad_row_sum"] < 0.05, (key, r)  # softmax gradient rows sum to 0 (up to bf16 rounding)


def test_twin_is_the_formula_trainer_and_rollout_always_used():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 70)
    tokens = torch.randint(0, 70, (3, 5))
    for temp in (1.0, 0.6):
        scaled = logits.float() / temp
        old = scaled.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        assert torch.equal(token_logprobs(logits, tokens, temp), old)  # CPU default: the twin, bitwise
        assert torch.equal(token_logprobs_twin(logits, tokens, temp), old)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="without the last dim"):
        token_logprobs(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long), 1.0)
