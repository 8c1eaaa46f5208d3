"""The lm_head both sides share and the trainer's logprobs over it in chunks: what `scoring.py` (padded rows) and
`packed_logprobs.py` (packed rows) both call, below both."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.models.decoder import compute_context
from nemo_jetrl.models.forward_plan import ForwardPlan
from nemo_jetrl.models.logprobs import token_logprobs
from nemo_jetrl.models.recompute import checkpoint_call, recomputes

# Upper bound on the elements of one float32 logits chunk in `sequence_logprobs` (64M floats = 256 MiB).
LOGPROB_CHUNK_ELEMENTS = 1 << 26


def compute_logits(model: nn.Module, hidden: torch.Tensor, *, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """lm_head over hidden [B, S, H] -> logits [B, S, V] in lm_head's output dtype (lm_head runs in `compute_dtype`
    when given): trainer and rollout hand them as they are to `token_logprobs` (the fused kernel reads bf16 in place,
    and a row's bits there follow the dtype it is given)."""
    with compute_context(model, hidden.device, compute_dtype):
        return model.lm_head(hidden)


def scored_tokens_only(logp: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """logp [B, S-1] of tokens 1..S-1 -> [B, S] in the shared layout: 0 at t = 0, on pads and on a row's first real
    token (no real context before it)."""
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # [B, S-1]
    return F.pad(torch.where(valid, logp, torch.zeros_like(logp)), (1, 0))  # [B, S]


def vocab_size(model: nn.Module) -> int:
    return model.lm_head.out_features if hasattr(model.lm_head, "out_features") else model.config.vocab_size


def chunk_logprobs(model: nn.Module, temperature: float, plan: ForwardPlan):
    """`fn(hidden [..., H], targets [...]) -> logprobs [...]` of one logits chunk (`target_logprobs`) in the plan's
    compute dtype; with the plan's activation checkpointing under autograd its logits are recomputed in the backward
    instead of kept. Callers run every chunk inside one `compute_context`: autocast then casts an FP32 lm_head to
    BF16 once for all of them (a context per chunk would keep one BF16 copy of the lm_head weight per chunk for the
    backward)."""

    def run(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_logprobs(model, hidden, targets, temperature, plan)

    return functools.partial(checkpoint_call, run) if recomputes(plan.activation_checkpointing) else run


def target_logprobs(
    model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, plan: ForwardPlan
) -> torch.Tensor:
    """log_softmax(lm_head(hidden) / temperature)[targets]: hidden [..., H], targets [...] -> float32 [...], with
    the plan's compute dtype and log-sum-exp.

    The logits stay in lm_head's dtype: on CUDA the fused `token_logprobs` reads them in place (no float32 copy)."""
    logits = compute_logits(model, hidden, compute_dtype=plan.compute_dtype)  # [..., V]
    return token_logprobs(logits, targets, temperature, batch_invariant=plan.exact.logsumexp)
