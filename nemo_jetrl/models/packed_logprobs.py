"""The trainer's logprobs over packed rows (`sequence_logprobs(pack_round=...)`, `policy.sequence_packing`): the
micro-batch's real tokens run as one row (models/packed.py) and the logprobs come back in its [B, S] layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nemo_jetrl.models.decoder import compute_context, decoder_forward
from nemo_jetrl.models.forward_plan import ForwardInputs, ForwardPlan
from nemo_jetrl.models.logits import LOGPROB_CHUNK_ELEMENTS, chunk_logprobs, scored_tokens_only, vocab_size
from nemo_jetrl.models.packed import PackedRows


def packed_sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    plan: ForwardPlan,
    pack_round: int,
    host_mask: torch.Tensor | None = None,
    packing: PackedRows | None = None,
) -> torch.Tensor:
    """`sequence_logprobs` with the rows' real tokens packed into one row; logits in token chunks of at most
    LOGPROB_CHUNK_ELEMENTS floats. The rounding slots hold the batch's first pad id (0 without pads).
    host_mask: attention_mask's copy on the host, if the caller has one: the packing is planned from it without
    a device -> host sync. packing: the rows' packing, planned by the caller (on the device; a captured micro-batch's
    fixed layout), instead of one planned here."""
    real = attention_mask.bool()  # [B, S]
    if packing is None:
        rows = host_mask.bool() if host_mask is not None else real
        packing = PackedRows.from_mask(rows, pack_round).to(input_ids.device)
    pads = ~real.flatten()  # [B * S]
    first_pad = input_ids.flatten().index_select(0, pads.long().argmax()[None])[0]  # 0-d (a tensor index syncs)
    fill = torch.where(pads.any(), first_pad, 0)  # the first pad's id, 0 without pads
    ids = torch.where(packing.real(), packing.pack(input_ids), fill)  # [1, T]
    inputs = ForwardInputs(packed=packing)
    hidden = decoder_forward(model, ids, packing.position_ids, packing.real().long(), plan, inputs)[0, :-1]  # [T-1, H]
    step = max(1, LOGPROB_CHUNK_ELEMENTS // vocab_size(model))  # slot t of `hidden` predicts slot t+1
    chunk = chunk_logprobs(model, temperature, plan)
    with compute_context(model, hidden.device, plan.compute_dtype):  # one autocast copy of lm_head for all chunks
        pieces = [chunk(hidden[lo : lo + step], ids[0, lo + 1 : lo + 1 + step]) for lo in range(0, len(hidden), step)]
    flat = torch.cat(pieces) if pieces else torch.zeros(0, device=hidden.device)  # [T-1]
    logp = packing.unpack(F.pad(flat, (1, 0))[None])  # [B, S]: each token's logp from its predecessor
    return scored_tokens_only(logp[:, 1:], real)  # the padded path's zeros (a row's first real token has no context)
