"""What `decoder_forward` runs (`ForwardPlan`, chosen once per side) and what one call brings (`ForwardInputs`).

A side (the rollout engine, the trainer's scoring) builds its plan once from its settings and its model: the
compute dtype, the glue kernels (the rollout's fused ones or the trainer's differentiable ones), the attention
(masked, or causal without a mask), activation checkpointing, the exact mode's parts (batch-invariant attention
and log-sum-exp, `models.batch_invariant.ExactParts`, read off the model once, where `enable_batch_invariant` /
`match_kernels` put them, so both sides run the same ones), plus the attention hook of the rollout / step. The
linears' forward GEMM is each one's `fprop_kernel` (`precision.recipes.gemm_choice.FpropKernel`), held on the
modules both sides share (docs/architecture.md, "the forward plan", says why).
`ForwardInputs` holds what changes from one call to the next: the KV cache and where the new tokens go in it, or
the packed rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from nemo_jetrl.models.batch_invariant import NO_EXACT_PARTS, ExactParts, exact_parts
from nemo_jetrl.models.packed import PackedRows

# attn_hook(layer_idx, q, k, v) -> (q, k, v); q: [B, H, S, D], k/v: [B, H_kv, S, D] of the new tokens only, after
# RoPE and q/k-norm, cast to the attention dtype, before the KV cache write. A hook with side effects (a calibrator
# observing Q/K/V) carries `replay`: the same transform without them, which a recomputed forward calls instead
# (models/recompute.py).
AttnHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class DecoderCache(Protocol):
    """What `decoder_forward` calls on a KV cache (`generation.native`'s `KVCache`, `PagedKVCache`): `update`
    only where `uses_fused_decode(q)` is False (a paged cache serves every query it is given). The exact mode's
    attention reads more of it (`batch_invariant_attention.decoder_attention`)."""

    max_seq_len: int

    def uses_fused_decode(self, q: torch.Tensor) -> bool: ...

    def decode_attention(self, layer: int, q, k, v, start, mask, sm_scale: float) -> torch.Tensor: ...

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class ForwardPlan:
    """One side's forward: compute_dtype (autocast; None = the parameters' dtype); fused: the rollout fast path
    (fused glue kernels, grouped FP8 GEMMs); fused_train: the trainer's differentiable glue kernels;
    causal_attention: causal SDPA without a mask where there is no cache and no row has a pad before a real token;
    activation_checkpointing: under autograd each layer recomputes its activations in the backward; exact: the exact
    mode's parts (attention, log-sum-exp) the model runs (`decoder_forward` refuses a plan whose parts are not the
    model's); attn_hook: see `AttnHook`."""

    compute_dtype: torch.dtype | None = None
    fused: bool = False
    fused_train: bool = False
    causal_attention: bool = False
    activation_checkpointing: bool = False
    exact: ExactParts = NO_EXACT_PARTS
    attn_hook: AttnHook | None = None

    @classmethod
    def rollout(cls, model: nn.Module, compute_dtype: torch.dtype | None, *, fused: bool) -> ForwardPlan:
        """The rollout engine's for `model` (prefill and decode): masked attention over the KV cache."""
        return cls(compute_dtype=compute_dtype, fused=fused, exact=exact_parts(model))

    @classmethod
    def trainer(
        cls,
        model: nn.Module,
        compute_dtype: torch.dtype | None,
        *,
        fused_train: bool,
        causal_attention: bool = False,
        activation_checkpointing: bool = False,
    ) -> ForwardPlan:
        """The trainer's scoring and training forward of `model`."""
        return cls(
            compute_dtype=compute_dtype, fused_train=fused_train, causal_attention=causal_attention,
            activation_checkpointing=activation_checkpointing, exact=exact_parts(model),
        )  # fmt: skip

    def with_hook(self, attn_hook: AttnHook | None) -> ForwardPlan:
        """This plan with the attention hook of one rollout / step."""
        return dataclasses.replace(self, attn_hook=attn_hook)


@dataclass(frozen=True)
class ForwardInputs:
    """What one `decoder_forward` call brings besides ids, positions and mask.

    kv_cache: the S new tokens are written at cache positions `cache_start .. cache_start+S-1`; an int
    `cache_start` attends over the cache prefix, a 0-dim LongTensor over the whole buffer (static shapes for a
    captured decode step), and so does a [B] LongTensor of per-row columns (continuous batching). packed: one
    packed row (B = 1, no cache) attending per sequence (models/packed.py). right_padded: no row has a pad before a
    real token, where the caller knows (None: checked on the device when the plan's causal attention needs it)."""

    kv_cache: DecoderCache | None = None
    cache_start: int | torch.Tensor = 0
    packed: PackedRows | None = None
    right_padded: bool | None = None

    @classmethod
    def cached(cls, kv_cache: DecoderCache, cache_start: int | torch.Tensor) -> ForwardInputs:
        """New tokens written into `kv_cache` from `cache_start` (prefill: 0)."""
        return cls(kv_cache=kv_cache, cache_start=cache_start)


EAGER = ForwardPlan()  # eager glue, masked attention, the parameters' dtype
NO_CACHE = ForwardInputs()  # whole sequences, no cache
