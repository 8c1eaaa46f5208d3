"""The trainer's scoring: per-token logprobs of whole sequences through `decoder_forward` and the lm_head.

`sequence_logprobs` is what the trainer differentiates (training, the logprob pass) and what the mismatch metrics
compare the rollout's own logprobs against; `compute_logits` is the lm_head both sides share. Packed rows
(`policy.sequence_packing`) go through `packed_logprobs.py`, in the same [B, S] layout.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.models.batch_invariant import exact_parts
from nemo_jetrl.models.decoder import AttnHook, compute_context, decoder_forward, position_ids_from_mask
from nemo_jetrl.models.logprobs import token_logprobs
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.models.recompute import checkpoint_call, recomputes

# Upper bound on the elements of one float32 logits chunk in `sequence_logprobs` (64M floats = 256 MiB).
LOGPROB_CHUNK_ELEMENTS = 1 << 26


def compute_logits(model: nn.Module, hidden: torch.Tensor, *, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """lm_head over hidden [B, S, H] -> logits [B, S, V] in lm_head's output dtype (lm_head runs in `compute_dtype`
    when given): trainer and rollout hand them as they are to `token_logprobs` (the fused kernel reads bf16 in place,
    and a row's bits there follow the dtype it is given)."""
    with compute_context(model, hidden.device, compute_dtype):
        return model.lm_head(hidden)


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_dtype: torch.dtype | None = None,
    attn_hook: AttnHook | None = None,
    fused_train: bool | None = None,
    causal_attention: bool = False,
    pack_round: int | None = None,
    host_mask: torch.Tensor | None = None,
    packing: PackedRows | None = None,
    activation_checkpointing: bool = False,
) -> torch.Tensor:
    """Per-token logprobs [B, S] float32 in the shared layout.

    logp[:, t] = log_softmax(logits[:, t-1] / temperature)[input_ids[:, t]]; 0 at t = 0, on pads, and on a
    sequence's first real token (no real context before it). Logits are computed in row chunks of at most
    LOGPROB_CHUNK_ELEMENTS floats, so besides the chunks autograd keeps (one [B, S, V] float32 in all) no second
    vocabulary-sized tensor is alive at once. Differentiable (the trainer calls it under autograd).

    fused_train (None: on CUDA): the trainer's differentiable glue kernels (`decoder_forward`). causal_attention:
    each row is rotated so that its left pads move behind its last token (positions, and so every real token's
    math, unchanged), the forward runs causal attention without a mask, and the logprobs are rotated back.
    pack_round: the rows' real tokens run packed in one row (its length a multiple of `pack_round`) with varlen
    causal attention (models/packed.py; causal_attention then changes nothing); the result is in the [B, S] layout.
    host_mask: attention_mask on the host, where the caller has it (the packing is planned there, no host sync).
    packing: the rows' packing planned by the caller (on the device, e.g. a fixed-shape one): packed as pack_round.
    activation_checkpointing: under autograd, each decoder layer and each logits chunk recomputes its activations
    in the backward instead of keeping them (models/recompute.py; same numbers).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids and attention_mask must both be [B, S]; got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if fused_train is None:
        fused_train = input_ids.is_cuda
    if pack_round is not None or packing is not None:
        from nemo_jetrl.models.packed_logprobs import packed_sequence_logprobs  # imports this module

        return packed_sequence_logprobs(
            model, input_ids, attention_mask, temperature, compute_dtype, attn_hook, fused_train, pack_round or 1,
            host_mask, packing, activation_checkpointing,
        )  # fmt: skip
    if causal_attention:
        index = left_align_index(attention_mask)  # [B, S]
        logp = _sequence_logprobs(
            model, input_ids.gather(1, index), attention_mask.gather(1, index), temperature, compute_dtype, attn_hook,
            fused_train, causal_attention=True, activation_checkpointing=activation_checkpointing,
        )  # fmt: skip
        return torch.zeros_like(logp).scatter(1, index, logp)  # [B, S]
    return _sequence_logprobs(
        model, input_ids, attention_mask, temperature, compute_dtype, attn_hook, fused_train,
        activation_checkpointing=activation_checkpointing,
    )  # fmt: skip


def left_align_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] -> [B, S] long: gather index rotating each row left by its number of leading pads (left-padded rows
    become right-padded; `x.gather(1, index)` aligns, `zeros.scatter(1, index, y)` restores)."""
    seq = attention_mask.shape[1]
    leading = (attention_mask.long().cumsum(-1) == 0).sum(-1, keepdim=True)  # [B, 1]
    return (torch.arange(seq, device=attention_mask.device)[None, :] + leading) % max(seq, 1)


def _sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    compute_dtype: torch.dtype | None,
    attn_hook: AttnHook | None,
    fused_train: bool,
    causal_attention: bool = False,
    activation_checkpointing: bool = False,
) -> torch.Tensor:
    bsz, seq = input_ids.shape
    position_ids = position_ids_from_mask(attention_mask)
    hidden = decoder_forward(
        model, input_ids, position_ids, attention_mask, attn_hook=attn_hook, compute_dtype=compute_dtype,
        fused_train=fused_train, causal_attention=causal_attention, right_padded=True if causal_attention else None,
        activation_checkpointing=activation_checkpointing,
    )  # [B, S, H]  # fmt: skip
    hidden = hidden[:, :-1]  # [B, S-1, H] predicts tokens 1..S-1
    targets = input_ids[:, 1:]  # [B, S-1]
    rows = max(1, LOGPROB_CHUNK_ELEMENTS // max(1, (seq - 1) * vocab_size(model)))
    chunk = chunk_logprobs(model, temperature, compute_dtype, activation_checkpointing)
    with compute_context(model, hidden.device, compute_dtype):  # one autocast copy of lm_head for all chunks
        pieces = [chunk(hidden[lo : lo + rows], targets[lo : lo + rows]) for lo in range(0, bsz, rows)]  # [b, S-1]
    logp = torch.cat(pieces) if pieces else hidden.new_zeros(0, seq - 1, dtype=torch.float32)  # [B, S-1]
    return scored_tokens_only(logp, attention_mask)


def scored_tokens_only(logp: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """logp [B, S-1] of tokens 1..S-1 -> [B, S] in the shared layout: 0 at t = 0, on pads and on a row's first real
    token (no real context before it)."""
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # [B, S-1]
    return F.pad(torch.where(valid, logp, torch.zeros_like(logp)), (1, 0))  # [B, S]


def vocab_size(model: nn.Module) -> int:
    return model.lm_head.out_features if hasattr(model.lm_head, "out_features") else model.config.vocab_size


def chunk_logprobs(model: nn.Module, temperature: float, compute_dtype, activation_checkpointing: bool):
    """`fn(hidden [..., H], targets [...]) -> logprobs [...]` of one logits chunk (`target_logprobs`); with
    activation checkpointing under autograd its logits are recomputed in the backward instead of kept. Callers run
    every chunk inside one `compute_context`: autocast then casts an FP32 lm_head to BF16 once for all of them (a
    context per chunk would keep one BF16 copy of the lm_head weight per chunk for the backward)."""

    def run(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return target_logprobs(model, hidden, targets, temperature, compute_dtype)

    return functools.partial(checkpoint_call, run) if recomputes(activation_checkpointing) else run


def target_logprobs(
    model: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, compute_dtype
) -> torch.Tensor:
    """log_softmax(lm_head(hidden) / temperature)[targets]: hidden [..., H], targets [...] -> float32 [...].

    The logits stay in lm_head's dtype: on CUDA the fused `token_logprobs` reads them in place (no float32 copy)."""
    logits = compute_logits(model, hidden, compute_dtype=compute_dtype)  # [..., V]
    return token_logprobs(logits, targets, temperature, batch_invariant=exact_parts(model).logsumexp)


class PolicyLogprobs(nn.Module):
    """`sequence_logprobs` of `model` as a module: the trainer's every forward enters through it (the root FSDP2
    unit when the trainer is sharded). `forward(input_ids [B, S], attention_mask [B, S], attn_hook, host_mask,
    packing) -> logprobs [B, S]` (fp32); `kernels`: `sequence_logprobs` keywords (`policy.trainer_setup`)."""

    def __init__(self, model: nn.Module, *, temperature: float, compute_dtype: torch.dtype | None, kernels=None):
        super().__init__()
        self.model = model
        self.kernels = dict(kernels or {})
        self.temperature = float(temperature)
        self.compute_dtype = compute_dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        attn_hook: AttnHook | None = None,
        host_mask: torch.Tensor | None = None,
        packing: PackedRows | None = None,
    ) -> torch.Tensor:
        return sequence_logprobs(
            self.model, input_ids, attention_mask, temperature=self.temperature, compute_dtype=self.compute_dtype,
            attn_hook=attn_hook, host_mask=host_mask, packing=packing, **self.kernels,
        )  # fmt: skip
