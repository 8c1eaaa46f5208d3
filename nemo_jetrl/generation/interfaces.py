"""Generation interfaces, shaped like NeMo-RL's GenerationInterface, in the shared sequence layout.

Layout (docs/architecture.md): prompts left-padded to the longest prompt P, generated tokens at columns
P .. P+T-1, right-padded after each sequence's stop token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch


@dataclass
class GenerationOutput:
    """One generated batch of B sequences of width S = P + T."""

    input_ids: torch.Tensor  # [B, S] long: left-padded prompt, response, right pad
    attention_mask: torch.Tensor  # [B, S] long: 1 on real tokens (prompt and response)
    response_mask: torch.Tensor  # [B, S] long: 1 on generated tokens, the stop token included
    generation_logprobs: torch.Tensor  # [B, S] float32: logprob of each generated token, 0 elsewhere
    prompt_length: int  # P, the padded prompt width: responses start at column P
    response_lengths: torch.Tensor  # [B] long: generated tokens per sequence (stop token included)
    finished: torch.Tensor  # [B] bool: True = stopped by a stop token, False = truncated at max_new_tokens
    # [B, S, L, k] uint8 / int16: an MoE model's experts per token (as an input) and MoE layer, where the engine
    # records them (models/moe_routing.py); None for dense models and engines that do not
    routed_experts: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> GenerationOutput:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return GenerationOutput(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()})


class GenerationInterface(ABC):
    """What the GRPO driver needs from a rollout engine (native, vLLM, Ray workers); it uses nothing else."""

    @abstractmethod
    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Complete every prompt (a list of token ids); `generator` seeds sampling."""

    @abstractmethod
    def prepare_for_generation(self) -> bool:
        """Wake the engine before a rollout phase (load weights / allocate caches); True when ready."""

    @abstractmethod
    def finish_generation(self) -> bool:
        """Release what the rollout phase holds (caches) before training; True when done."""

    @abstractmethod
    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | None = None,
        *,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Refit hook after a training step: new weights (engines that hold a copy; None = re-read the policy's
        weights where they changed) and per-layer FP8 KV scales (k_scales [L], v_scales [L]) from the trainer's QKV
        calibration."""

    @property
    @abstractmethod
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The FP8 KV scales (k [L], v [L]) the next rollout uses, or None."""

    def rollout_timings(self) -> dict[str, float]:
        """Device seconds inside the last `generate` call, by part (the native engine: `prefill` or `admission`,
        `cuda_graph_capture`, `decode`); engines that do not measure them return {}."""
        return {}

    @abstractmethod
    def replace(self, **changes) -> GenerationInterface:
        """The engine with some settings changed for the calls made through the result; `kv_cache_dtype=None` is
        the rollout that feeds the first FP8 KV calibration, before any scales exist."""


@contextmanager
def rollout_phase(engine: GenerationInterface) -> Iterator[GenerationInterface]:
    """A rollout phase: the engine wakes before it (vLLM on CUDA: weights and KV cache back, pending refit loaded)
    and gives its memory back to the trainer after it, as NeMo-RL's prepare_for_generation / finish_generation."""
    engine.prepare_for_generation()
    try:
        yield engine
    finally:
        engine.finish_generation()


def max_prompt_length(total: int, new: int, max_input_seq_length: int | None) -> int:
    """Prompt-length limit of `policy.max_total_sequence_length` (`total`) and `policy.generation.max_new_tokens`
    (`new`): `data.max_input_seq_length` when set, else total - new (total - 1 when max_new_tokens is the total,
    NeMo-RL's spelling). At least one response token always fits; the engine caps each row's prompt + response at
    the total."""
    if max_input_seq_length is not None:
        limit = int(max_input_seq_length)
    else:
        limit = total - new if new < total else total - 1
    return max(1, min(limit, total - 1))
