"""Batched next-token sampling on device: greedy, temperature, top-k, top-p.

The returned logprob is that of the chosen token under `log_softmax(logits / temperature)` over the FULL vocabulary,
i.e. BEFORE top-k / top-p filtering. That is the quantity the trainer recomputes (`sequence_logprobs` with the same
temperature), so rollout and trainer logprobs are comparable token by token; filtering only restricts which tokens
can be drawn. Greedy picks the argmax (first index on ties, like HF) and reports the same unfiltered logprob.

Sampling draws with the exponential-race trick (argmax of p / E, E ~ Exp(1)), which samples exactly from p, needs
no host sync and takes an explicit `torch.Generator` for reproducibility.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature > 0; top_p in (0, 1]; top_k None (off) or >= 1."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be None or >= 1, got {self.top_k}")


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Set logits [B, V] outside the top-k / top-p (nucleus) set to -inf; the argmax always survives."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # [B, V] probability of strictly better tokens
        drop_sorted = mass_before >= top_p  # the first token has mass_before 0 < top_p: never dropped
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] long and their logprobs [B] float32 (unfiltered, see module doc) from logits [B, V]."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    scaled = logits.float() / params.temperature  # [B, V]
    if greedy:
        tokens = torch.argmax(scaled, dim=-1)  # [B]
    else:
        probs = filter_logits(scaled, params.top_k, params.top_p).softmax(dim=-1)  # [B, V]
        race = torch.empty_like(probs).exponential_(1.0, generator=generator)  # [B, V] ~ Exp(1)
        race.clamp_(min=torch.finfo(torch.float32).tiny)  # an exact 0 draw would give 0/0 = NaN on p = 0
        tokens = torch.argmax(probs / race, dim=-1)  # [B]
    return tokens, token_logprobs(logits, tokens, params.temperature)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B] float32 log p(tokens) under softmax(logits [B, V] / temperature), full vocabulary.

    `logit - logsumexp(logits)`, the very formula (and op order) of the trainer's `sequence_logprobs`:
    `log_softmax` rounds differently, which alone made every token differ in the last bit."""
    scaled = logits.float() / temperature  # [B, V]
    return scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
