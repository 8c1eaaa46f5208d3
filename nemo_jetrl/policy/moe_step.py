"""The trainer's side of its MoE forwards: the load-balancing loss it adds and the routing agreement it measures.

Load-balancing loss: HF's Switch-Transformer loss (`load_balancing_loss_func`, what `Qwen3MoeForCausalLM` adds with
`output_router_logits`) over each training micro-batch's real tokens, times `router_aux_loss_coef`
(`policy.router_aux_loss_coef`, null: the model config's, which `policy.hf_config_overrides` sets as NeMo-RL's
Automodel recipes do; 0: off, NeMo-RL's Megatron GRPO default `moe_router_load_balancing_type: none`), weighted by
the micro-batch's share of the optimizer step's real tokens so that the step's total is their token-weighted mean.

Routing agreement: the trainer's logprob forward (or, with `prev_logprobs_source: train_forward`, the first optimizer
step's training forward: the rollout's weights) records the experts each token goes to and compares them with the
rollout's record (`TrainBatch.generation_routing`): `train/routing_agreement`, the share of (scored token, MoE layer)
pairs whose k experts are the same (models/moe_routing.py).

A forward's tokens run in the micro-batch's padded layout, rotated (`train_causal_attention`) or packed
(`sequence_packing`): `forward_token_index` maps them back to the padded [b, w] positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nemo_jetrl.models.moe import moe_blocks, moe_shape
from nemo_jetrl.models.moe_routing import RouterLogits, RoutingRecord, observing, routing_agreement_counts
from nemo_jetrl.models.packed import PackedRows
from nemo_jetrl.models.scoring import left_align_index
from nemo_jetrl.policy.interfaces import TrainBatch


@dataclass(frozen=True)
class MoeTraining:
    """An MoE policy's settings: its shape (L MoE layers, E experts, top-k) and the load-balancing coefficient."""

    num_layers: int
    num_experts: int
    top_k: int
    aux_coef: float

    @classmethod
    def of(cls, model: nn.Module, policy_cfg: Any) -> MoeTraining | None:
        """The settings of `model` under a `PolicyConfig` (None: a dense model); freezes its routers with
        `policy.freeze_moe_router`."""
        if not moe_blocks(model):
            return None
        if policy_cfg.freeze_moe_router:
            for block in moe_blocks(model):
                block.gate.weight.requires_grad_(False)
        coef = policy_cfg.router_aux_loss_coef
        coef = getattr(model.config, "router_aux_loss_coef", 0.0) if coef is None else coef
        return cls(*moe_shape(model), aux_coef=float(coef))

    def observe(
        self,
        model: nn.Module,
        mb: TrainBatch,
        host_mask: torch.Tensor,
        kernels: Mapping[str, Any],
        packing: PackedRows | None,
        *,
        aux_weight: float | None = None,
        compare: bool = False,
    ) -> MicroBatchMoe:
        """The observers of one micro-batch's forward: the load-balancing loss when `aux_weight` is given (training,
        a non-zero coefficient), the routing record when `compare` and the batch carries the rollout's; host_mask:
        the micro-batch's attention mask on the host (a packing is planned from it)."""
        if packing is None and kernels.get("pack_round") is not None:  # the packing the forward would plan
            packing = PackedRows.from_mask(host_mask.bool(), kernels["pack_round"]).to(mb.input_ids.device)
        index, mask = forward_token_index(mb.attention_mask, bool(kernels.get("causal_attention")), packing)
        logits = RouterLogits() if aux_weight is not None and self.aux_coef > 0 else None
        record = None
        if compare and mb.generation_routing is not None:
            b, w = mb.input_ids.shape
            record = RoutingRecord(b, w, self.num_layers, self.top_k, self.num_experts, mb.input_ids.device)
            record.token_index = index
        return MicroBatchMoe(self, mb, packing, mask, logits, record, aux_weight or 0.0)


@dataclass
class MicroBatchMoe:
    """One micro-batch forward's MoE observers (`MoeTraining.observe`) and what they give after it."""

    settings: MoeTraining
    mb: TrainBatch
    packing: PackedRows | None  # the packing the forward runs (planned here where the forward would have)
    token_mask: torch.Tensor  # [T] 1 on the forward's real tokens
    logits: RouterLogits | None
    record: RoutingRecord | None
    aux_weight: float

    def observing(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return observing(model, self.logits, self.record)

    def outputs(self) -> dict[str, torch.Tensor]:
        """`moe/aux_loss` (coefficient x weight x loss, with its graph), `moe/load_balancing_loss` (detached: NeMo-RL's
        metric name, logged as train/moe/load_balancing_loss), and
        `moe/routing_match` / `moe/routing_total` (0-dim counts), for the observers that ran."""
        out: dict[str, torch.Tensor] = {}
        s = self.settings
        if self.logits is not None:
            loss = self.logits.load_balancing_loss(s.num_experts, s.top_k, self.token_mask)
            out["moe/aux_loss"] = s.aux_coef * self.aux_weight * loss
            out["moe/load_balancing_loss"] = loss.detach()
        if self.record is not None:
            mb = self.mb
            match, total = routing_agreement_counts(self.record.choices, mb.generation_routing, mb.response_mask)
            out["moe/routing_match"], out["moe/routing_total"] = match, total
        return out


def forward_token_index(
    attention_mask: torch.Tensor, rotated: bool, packing: PackedRows | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(each forward token's flat position in the padded [b, w] layout, b * w on a packed row's rounding slots;
    None: the padded layout itself) and the forward's real-token mask [T]."""
    if packing is not None:
        return packing.index.to(attention_mask.device), packing.real().flatten()
    if rotated:  # `sequence_logprobs(causal_attention=True)`: rows rotated left by their leading pads
        b, w = attention_mask.shape
        index = left_align_index(attention_mask)  # [b, w]
        flat = (torch.arange(b, device=index.device)[:, None] * w + index).flatten()
        return flat, attention_mask.gather(1, index).flatten()
    return None, attention_mask.flatten()


class RoutingAgreement:
    """(match, total) counts of the routing agreement of the step's logprob forward, read by `train()`."""

    def __init__(self) -> None:
        self.counts: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, outputs: Mapping[str, torch.Tensor]) -> None:
        if "moe/routing_match" in outputs:
            self.counts.append((outputs["moe/routing_match"], outputs["moe/routing_total"]))

    def pop_metrics(self) -> dict[str, float]:
        """{"routing_agreement": share} when counts were added (then cleared), else {}."""
        if not self.counts:
            return {}
        match = sum(int(m) for m, _ in self.counts)
        total = sum(int(t) for _, t in self.counts)
        self.counts.clear()
        return {"routing_agreement": match / total} if total else {}
