"""The trainer's scoring: per-token logprobs of whole sequences through `decoder_forward` and the lm_head.

`sequence_logprobs` is what the trainer differentiates (training, the logprob pass) and what the mismatch metrics
compare the rollout's own logprobs against; `models/logits.py` holds the lm_head both sides share. Packed rows
(`policy.sequence_packing`) go through `packed_logprobs.py`, in the same [B, S] layout.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from nemo_jetrl.models.decoder import compute_context, decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import AttnHook, ForwardInputs, ForwardPlan
from nemo_jetrl.models.logits import LOGPROB_CHUNK_ELEMENTS, chunk_logprobs, scored_tokens_only, vocab_size
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.models.packed_logprobs import packed_sequence_logprobs


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
    plan = ForwardPlan.trainer(
        model, compute_dtype, fused_train=fused_train, causal_attention=causal_attention,
        activation_checkpointing=activation_checkpointing,
    ).with_hook(attn_hook)  # fmt: skip
    if pack_round is not None or packing is not None:  # varlen attention: causal_attention changes nothing
        plan = dataclasses.replace(plan, causal_attention=False)
        return packed_sequence_logprobs(
            model, input_ids, attention_mask, temperature, plan, pack_round or 1, host_mask, packing
        )  # fmt: skip
    if causal_attention:
        index = left_align_index(attention_mask)  # [B, S]
        logp = _sequence_logprobs(model, input_ids.gather(1, index), attention_mask.gather(1, index), temperature, plan)
        return torch.zeros_like(logp).scatter(1, index, logp)  # [B, S]
    return _sequence_logprobs(model, input_ids, attention_mask, temperature, plan)


def left_align_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] -> [B, S] long: gather index rotating each row left by its number of leading pads (left-padded rows
    become right-padded; `x.gather(1, index)` aligns, `zeros.scatter(1, index, y)` restores)."""
    seq = attention_mask.shape[1]
    leading = (attention_mask.long().cumsum(-1) == 0).sum(-1, keepdim=True)  # [B, 1]
    return (torch.arange(seq, device=attention_mask.device)[None, :] + leading) % max(seq, 1)


def _sequence_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, plan: ForwardPlan
) -> torch.Tensor:
    bsz, seq = input_ids.shape
    position_ids = position_ids_from_mask(attention_mask)
    inputs = ForwardInputs(right_padded=True if plan.causal_attention else None)  # causal: rows left-aligned
    hidden = decoder_forward(model, input_ids, position_ids, attention_mask, plan, inputs)  # [B, S, H]
    hidden = hidden[:, :-1]  # [B, S-1, H] predicts tokens 1..S-1
    targets = input_ids[:, 1:]  # [B, S-1]
    rows = max(1, LOGPROB_CHUNK_ELEMENTS // max(1, (seq - 1) * vocab_size(model)))
    chunk = chunk_logprobs(model, temperature, plan)
    with compute_context(model, hidden.device, plan.compute_dtype):  # one autocast copy of lm_head for all chunks
        pieces = [chunk(hidden[lo : lo + rows], targets[lo : lo + rows]) for lo in range(0, bsz, rows)]  # [b, S-1]
    logp = torch.cat(pieces) if pieces else hidden.new_zeros(0, seq - 1, dtype=torch.float32)  # [B, S-1]
    return scored_tokens_only(logp, attention_mask)


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
