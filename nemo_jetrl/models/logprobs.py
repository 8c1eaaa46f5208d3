"""Token logprobs `log softmax(logits / temperature)[token]`: the ONE function the trainer and the rollout call.

Three implementations, chosen by the caller's arguments (never by module state):

| path | when | what |
|---|---|---|
| twin | CPU (and `fused=False`) | `logits.float() / temperature`, `gather - torch.logsumexp`, plain autograd |
| fused | CUDA (default) | `logprob_kernels`: one Triton program per row reads the low-precision logits (bf16) in place |
| exact | `batch_invariant=True` | `models.batch_invariant.token_logprobs` (the exact mode's log-sum-exp) |

The fused path never materialises float32 [T, V] logits: its forward keeps only the [T] log-sum-exp next to the
logits autograd already holds, and its backward writes `(onehot - softmax) * grad / temperature` straight in the
logits' dtype. Every row is one program with a fixed reduction order, so a row's logprob does not depend on the
rows around it (decode batch vs training micro-batch). It differs from the twin in the last bits only, and trainer
and rollout take the same path on the same device, so they agree with each other.
"""

from __future__ import annotations

import torch


def token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    *,
    batch_invariant: bool = False,
    fused: bool | None = None,
) -> torch.Tensor:
    """logits [..., V] (any float dtype), tokens [...] long -> [...] float32 log p(tokens) under
    softmax(logits / temperature) over the full vocabulary. Differentiable in every path.

    fused: None = on CUDA. batch_invariant: the exact mode's log-sum-exp (takes precedence)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens {tuple(tokens.shape)} must be logits {tuple(logits.shape)} without the last dim")
    if batch_invariant:
        from nemo_jetrl.models.batch_invariant import token_logprobs as exact_logprobs

        return exact_logprobs(logits, tokens, temperature)
    if fused is None:
        fused = logits.is_cuda
    if fused:
        flat = logits.reshape(-1, logits.shape[-1])  # [T, V]
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        ids = tokens.reshape(-1).contiguous()  # [T] (a column of [B, S] ids is strided: the kernel reads ids[t] at t)
        return _FusedTokenLogprobs.apply(flat, ids, float(temperature)).reshape(tokens.shape)
    return token_logprobs_twin(logits, tokens, temperature)


def token_logprobs_twin(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The pure-torch twin (the formula, and op order, the project always used): `logit - logsumexp` in float32."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    return scaled.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


class _FusedTokenLogprobs(torch.autograd.Function):
    """[T, V] low-precision logits -> [T] float32 logprobs; saves the logits (already alive) and a [T] lse."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature):
        from nemo_jetrl.models import logprob_kernels

        logp, lse = logprob_kernels.logprob_forward(logits, tokens, temperature)  # [T], [T]
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature = temperature
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        from nemo_jetrl.models import logprob_kernels

        logits, tokens, lse = ctx.saved_tensors
        grad = logprob_kernels.logprob_backward(logits, tokens, lse, grad_logp.contiguous(), ctx.temperature)
        return grad, None, None
