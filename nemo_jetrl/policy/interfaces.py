"""Policy-side interfaces, shaped like NeMo-RL's PolicyInterface so Ray workers can implement them later."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields

import torch


@dataclass
class TrainBatch:
    """One GRPO batch in the shared sequence layout (docs/architecture.md).

    All per-token tensors are [B, S] aligned with `input_ids`; `advantages` is [B] (one value per sequence).
    """

    input_ids: torch.Tensor  # [B, S] long
    attention_mask: torch.Tensor  # [B, S] 1 = real token
    response_mask: torch.Tensor  # [B, S] 1 = generated token
    advantages: torch.Tensor  # [B] float32
    generation_logprobs: torch.Tensor  # [B, S] float32, from the rollout engine
    prev_logprobs: torch.Tensor | None = None  # [B, S] float32, trainer's logprobs before the update
    reference_logprobs: torch.Tensor | None = None  # [B, S] float32, frozen reference policy

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> TrainBatch:
        """Rows `index` of every tensor (None stays None)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: (v[index] if v is not None else None) for k, v in values.items()})

    def to(self, device: torch.device | str) -> TrainBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: (v.to(device) if v is not None else None) for k, v in values.items()})


class PolicyInterface(ABC):
    """What the GRPO driver needs from a trainer (one process, or a Ray worker group later)."""

    @abstractmethod
    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] of `batch.input_ids` under the current weights (no grad)."""

    @abstractmethod
    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] under the frozen reference weights."""

    @abstractmethod
    def train(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step over the global batch (micro-batched); returns metrics."""

    @abstractmethod
    def prepare_refit(self) -> dict[str, float]:
        """After a step: quantize weights once (FP8) and recalibrate KV scales for the rollout; returns metrics."""
