"""Policy-side interfaces, shaped like NeMo-RL's PolicyInterface so Ray workers can implement them later."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
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

    @classmethod
    def cat(cls, batches: Sequence[TrainBatch]) -> TrainBatch:
        """Rows of same-width batches, in order (a field is None when it is None in the first batch)."""
        names = [f.name for f in fields(cls)]
        first = batches[0]
        return cls(
            **{n: None if getattr(first, n) is None else torch.cat([getattr(b, n) for b in batches]) for n in names}
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: (v.to(device) if v is not None else None) for k, v in values.items()})


def split_global_batches(
    batch: TrainBatch, global_batch_size: int, keep: torch.Tensor | None = None
) -> list[TrainBatch]:
    """One optimizer step's rows per element: contiguous chunks of `global_batch_size` rows in batch order (no
    shuffle, as NeMo-RL's `get_batch(batch_idx, gbs)`), each reduced to its `keep` [B] rows; empty chunks dropped."""
    if global_batch_size < 1 or len(batch) % global_batch_size:
        raise ValueError(f"batch of {len(batch)} rows does not split into global batches of {global_batch_size}")
    keep = torch.ones(len(batch), dtype=torch.bool) if keep is None else keep.bool()
    chunks = []
    for start in range(0, len(batch), global_batch_size):
        rows = torch.arange(start, start + global_batch_size)[keep[start : start + global_batch_size]]
        if len(rows):
            chunks.append(batch.select(rows))
    return chunks


def combine_step_metrics(per_step: Sequence[dict[str, float]]) -> dict[str, float]:
    """Metrics of one GRPO step's optimizer steps: extrema (`*_min` / `*_max`) and `num_micro_batches` combine
    as such, everything else (loss, grad_norm, lr, ...) is the mean over the steps; adds `num_optimizer_steps`."""
    out: dict[str, float] = {}
    for key in {k for m in per_step for k in m}:
        values = [float(m[key]) for m in per_step if key in m]
        if key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max"):
            out[key] = max(values)
        elif key == "num_micro_batches":
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    out["num_optimizer_steps"] = float(len(per_step))
    return out


class PolicyInterface(ABC):
    """What the GRPO driver needs from a trainer (one process, or a Ray worker group later)."""

    @abstractmethod
    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] of `batch.input_ids` under the current weights (no grad)."""

    @abstractmethod
    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] under the frozen reference weights."""

    @abstractmethod
    def train(self, batch: TrainBatch | Sequence[TrainBatch]) -> dict[str, float]:
        """One GRPO step's training: one optimizer step per given batch (micro-batched; a lone batch = one step),
        then one LR-scheduler step (NeMo-RL steps it once per train() call); returns `combine_step_metrics`."""

    @abstractmethod
    def prepare_refit(self) -> dict[str, float]:
        """After a step: quantize weights once (FP8) and recalibrate KV scales for the rollout; returns metrics."""
