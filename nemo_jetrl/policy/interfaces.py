"""Policy-side interfaces, shaped like NeMo-RL's: the batch layout, the trainer (`PolicyInterface`, implemented by
`NativePolicy` for every world size and by the Ray fan-out `RayPolicy`) and the loss it is handed (`LossFunction`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import torch

from nemo_jetrl.utils.transfer import to_device

if TYPE_CHECKING:
    from nemo_jetrl.precision import PrecisionRecipe
    from nemo_jetrl.precision.kv import KVScales


@dataclass
class TrainBatch:
    """One GRPO batch in the shared sequence layout (docs/architecture.md).

    All per-token tensors are [B, S] (routing [B, S, L, k]) aligned with `input_ids`; `advantages` is [B] (one value
    per sequence).
    """

    input_ids: torch.Tensor  # [B, S] long
    attention_mask: torch.Tensor  # [B, S] 1 = real token
    response_mask: torch.Tensor  # [B, S] 1 = generated token
    advantages: torch.Tensor  # [B] float32
    generation_logprobs: torch.Tensor  # [B, S] float32, from the rollout engine
    prev_logprobs: torch.Tensor | None = None  # [B, S] float32, trainer's logprobs before the update
    reference_logprobs: torch.Tensor | None = None  # [B, S] float32, frozen reference policy
    generation_routing: torch.Tensor | None = None  # [B, S, L, k] an MoE rollout's experts per token and layer

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> TrainBatch:
        """Rows `index` of every tensor (None stays None)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: (v[index] if v is not None else None) for k, v in values.items()})

    def window(self, rows: torch.Tensor, cols: slice) -> TrainBatch:
        """Rows `rows` and, of the per-token [B, S, ...] tensors, the columns `cols` (per-sequence [B] tensors whole)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(
            **{k: None if v is None else (v[rows][:, cols] if v.dim() >= 2 else v[rows]) for k, v in values.items()}
        )

    @classmethod
    def cat(cls, batches: Sequence[TrainBatch]) -> TrainBatch:
        """Rows of same-width batches, in order (a field is None when it is None in the first batch)."""
        names = [f.name for f in fields(cls)]
        first = batches[0]
        return cls(
            **{n: None if getattr(first, n) is None else torch.cat([getattr(b, n) for b in batches]) for n in names}
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch on `device`; host -> CUDA copies go through pinned memory without a host sync (a pageable copy
        waits for the device, which would drain the launch queue before every micro-batch)."""
        device = torch.device(device)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return TrainBatch(**{k: (to_device(v, device) if v is not None else None) for k, v in values.items()})


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


def metrics_to_floats(metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Metric dicts whose values are floats or 0-d tensors, as floats, with one host sync for all of them."""
    tensors = [v.detach().reshape(()).double() for m in metrics for v in m.values() if isinstance(v, torch.Tensor)]
    values = iter(torch.stack([t.to(tensors[0].device) for t in tensors]).tolist() if tensors else [])
    return [{k: next(values) if isinstance(v, torch.Tensor) else float(v) for k, v in m.items()} for m in metrics]


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


class LossFunction(Protocol):
    """What `PolicyInterface.train` applies to each micro-batch (NeMo-RL's `LossFunction`): the trainers hold no loss
    of their own. It must pickle (Ray workers receive it with their micro-batches)."""

    def normalizer(self, batch: TrainBatch) -> float:
        """The global count one optimizer step's loss is normalised by (its tokens or its sequences), so that
        micro-batch losses and gradients sum to the full batch's mean."""

    def __call__(
        self, logprobs: torch.Tensor, batch: TrainBatch, normalizer: float
    ) -> tuple[torch.Tensor, dict[str, float | torch.Tensor]]:
        """Loss of one micro-batch (logprobs [b, S] carry the gradient) and its metrics: floats or 0-d tensors (the
        trainers read the tensors of all micro-batches in one host sync at the end of the optimizer step)."""


class PolicyInterface(ABC):
    """What the GRPO driver needs from a trainer (one process, or a Ray worker group); it uses nothing else.

    Attributes every implementation sets:
    - `recipe`: the run's one frozen `PrecisionRecipe` (its `kv_fp8` says whether FP8 KV scales are calibrated);
    - `tokenizer`: the model's tokenizer (prompts are encoded and responses decoded on the driver);
    - `layer_map`: module name -> "fp8" | "bf16" for every converted linear ({} without FP8);
    - `step`: optimizer steps taken (what an engine's refit is keyed on);
    - `kv_scales`: the FP8 KV scales (`KVScales`, q/k/v [L]) the next rollout runs with, None before the first
      calibration and without FP8 KV.
    """

    recipe: PrecisionRecipe
    tokenizer: Any
    layer_map: dict[str, str]
    step: int
    kv_scales: KVScales | None

    @property
    @abstractmethod
    def has_reference(self) -> bool:
        """A frozen reference policy is held (for `get_reference_policy_logprobs`)."""

    @abstractmethod
    def parameter_bytes(self) -> int:
        """Bytes of the full (unsharded) master weights: what a checkpoint's model part takes."""

    @abstractmethod
    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] of `batch.input_ids` under the current weights (no grad)."""

    @abstractmethod
    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Per-token logprobs [B, S] under the frozen reference weights."""

    @abstractmethod
    def calibrate_kv_scales(self, batch: TrainBatch) -> KVScales:
        """A calibrating no-grad forward over `batch` observing Q/K/V; returns (and holds) the new FP8 KV scales."""

    @abstractmethod
    def train(self, batch: TrainBatch | Sequence[TrainBatch], loss_fn: LossFunction) -> dict[str, float]:
        """One GRPO step's training: one optimizer step per given batch (micro-batched, `loss_fn` on each micro-batch;
        a lone batch = one step), then one LR-scheduler step (NeMo-RL steps it once per train() call); returns
        `combine_step_metrics`."""

    @abstractmethod
    def prepare_refit(self) -> dict[str, float]:
        """After a step: quantize weights once (FP8) and recalibrate KV scales for the rollout; returns metrics."""

    @abstractmethod
    def nonfinite_state(self) -> str | None:
        """Name of the first non-finite master weight, FP8 weight scale or KV scale after a step, else None."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, LR scheduler, step and KV scales in the single-process layout (checkpoints move
        between local and Ray runs)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
