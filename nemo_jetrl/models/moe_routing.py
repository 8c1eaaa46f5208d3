"""What a forward's MoE routers did: the experts each token went to (rollout and trainer), their agreement, and the
load-balancing auxiliary loss.

`observing(model, *observers)` hands each `MoeBlock`'s router logits and top-k choices to the observers for the
forwards run inside it. Two observers:

- `RoutingRecord`: choices [B, S, L, k] (uint8 up to 256 experts, else int16) of the tokens of a [B, S] layout, per
  MoE layer. The rollout engine records its own choices as it prefills and decodes (`GenerationOutput.routed_experts`,
  the token at column t routed when it was the input, the way the trainer's forward routes it); the trainer records
  its logprob forward's, and `routing_agreement_counts` compares the two over the tokens whose output is a scored
  response token's logprob (`train/routing_agreement`). Recording beats recomputing the rollout's logits after the
  fact: a recomputation runs the trainer's shapes, so on the fast path it would measure itself, not the rollout.
- `RouterLogits`: each layer's logits [T, E] with their graph, for HF's `load_balancing_loss_func` (the Switch
  Transformer loss Qwen3-MoE trains with, its coefficient `router_aux_loss_coef`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from nemo_jetrl.models.moe import MoeObserver, moe_blocks, moe_shape


@contextlib.contextmanager
def observing(model: nn.Module, *observers: MoeObserver | None) -> Iterator[None]:
    """Hand every MoE block's routing to `observers` (None entries skipped) for the forwards run in the block."""
    blocks = moe_blocks(model)
    previous = [b.observers for b in blocks]
    chosen = tuple(o for o in observers if o is not None)
    for b in blocks:
        b.observers = chosen
    try:
        yield
    finally:
        for b, held in zip(blocks, previous):
            b.observers = held


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type that holds an expert index."""
    return torch.uint8 if num_experts <= 256 else torch.int16


class RoutingRecord:
    """The experts chosen for the tokens of a [B, S] layout, per MoE layer: `choices` [B, S, L, k] (module doc).

    A forward writes its tokens at columns `start` .. (an int; or a 0-dim long tensor for one token per row, the
    captured decode step reading its column on the device), or, with `token_index` [T] set (the trainer's rotated or
    packed layouts), token i of the forward at flat position token_index[i] of [B, S] (B * S: not a real slot)."""

    def __init__(self, batch: int, width: int, num_layers: int, top_k: int, num_experts: int, device) -> None:
        self.shape = (batch, width)
        self._flat = torch.zeros(batch * width + 1, num_layers, top_k, dtype=routing_dtype(num_experts), device=device)
        self.choices = self._flat[:-1].view(batch, width, num_layers, top_k)  # [B, S, L, k]
        self.start: int | torch.Tensor = 0
        self.token_index: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model: nn.Module, batch: int, width: int, device) -> RoutingRecord | None:
        """A record for `model`'s MoE layers (None for a dense model)."""
        if not moe_blocks(model):
            return None
        layers, experts, top_k = moe_shape(model)
        return cls(batch, width, layers, top_k, experts, device)

    def __call__(self, moe_index: int, logits: torch.Tensor, experts: torch.Tensor, lead: tuple[int, ...]) -> None:
        chosen = experts.to(self._flat.dtype)  # [T, k]
        if self.token_index is not None:
            self._flat[:, moe_index].index_copy_(0, self.token_index, chosen)
            return
        batch, top_k = self.shape[0], chosen.shape[-1]
        chosen = chosen.view(batch, -1, top_k)  # [B, S_new, k]
        if isinstance(self.start, torch.Tensor):  # one token per row at a column held on the device
            self.choices[:, :, moe_index].index_copy_(1, self.start.reshape(1), chosen)
        else:
            self.choices[:, self.start : self.start + chosen.shape[1], moe_index] = chosen


class RouterLogits:
    """Every MoE layer's router logits [T, E] of a forward (with their graph) and the load-balancing loss of them."""

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []

    def __call__(self, moe_index: int, logits: torch.Tensor, experts: torch.Tensor, lead: tuple[int, ...]) -> None:
        self.logits.append(logits)

    def load_balancing_loss(self, num_experts: int, top_k: int, token_mask: torch.Tensor) -> torch.Tensor:
        """HF's `load_balancing_loss_func` over the recorded layers, real tokens only (token_mask [T] 1 = real)."""
        if not self.logits:
            raise ValueError("load_balancing_loss: no router logits were recorded")
        return load_balancing_loss_func(tuple(self.logits), num_experts, top_k, token_mask.reshape(1, -1))


def scored_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: the tokens whose forward output is the logprob of a response token (the token before each)."""
    scored = torch.zeros_like(response_mask, dtype=torch.bool)
    scored[:, :-1] = response_mask[:, 1:].bool()
    return scored


def routing_agreement_counts(
    trainer: torch.Tensor, rollout: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(matching, total) 0-dim counts of (token, layer) pairs whose k chosen experts are the same set on both sides,
    over the `scored_positions`: trainer / rollout [B, S, L, k], response_mask [B, S]."""
    scored = scored_positions(response_mask).to(trainer.device)  # [B, S]
    same = (trainer.long().sort(-1).values == rollout.to(trainer.device).long().sort(-1).values).all(-1)  # [B, S, L]
    return (same & scored[..., None]).sum(), scored.sum() * trainer.shape[2]
