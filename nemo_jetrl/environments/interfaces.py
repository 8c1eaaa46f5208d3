"""What the GRPO loop needs from a verifiable task: training prompts by step, a held-out set, and rewards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from nemo_jetrl.data.problem import Problem

__all__ = ["Problem", "VerifiableTask"]


@runtime_checkable
class VerifiableTask(Protocol):
    """A task whose rewards are computed from decoded response text (arithmetic now, math later)."""

    def train_batch(self, step: int, n: int) -> list[Problem]:
        """`n` training problems, a pure function of (task seed, step): a resumed run sees the same data."""
        ...

    def validation(self, max_n: int | None = None) -> list[Problem]:
        """The fixed held-out set (its first `max_n` items), disjoint from every training batch."""
        ...

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses against reference answers: float32 `[n]`."""
        ...
