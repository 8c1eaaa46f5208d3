"""`env.coin_flip_rewards`: seeded coin-flip rewards for speed runs on random weights.

A random-weight model (examples/build_random_checkpoint.py) answers nothing right: every reward is the wrong reward,
every advantage is 0, and the trainer's backward runs on gradients that are exactly zero. Real runs do not, and the
kernels notice: the FP8 quantizer's IEEE division takes its slow path on zeros (docs/performance_history.md, "The
FP8 trainer at the 8B shape"). With this switch each response's reward is `correct_reward` or
`wrong_reward` by a coin flip seeded by `data.seed` and the response text (SHA-256: the same text, the same reward,
on every rank and in every run), so groups have reward variance and the trainer does a real step's work. For timing
only: the rewards say nothing about the answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from nemo_jetrl.data.problem import Problem
from nemo_jetrl.environments.interfaces import VerifiableTask


class CoinFlipRewards:
    """A `VerifiableTask` with `task`'s prompts and held-out set and coin-flip rewards."""

    def __init__(self, task: VerifiableTask, seed: int, correct_reward: float, wrong_reward: float):
        self.task, self.seed = task, int(seed)
        self.correct_reward, self.wrong_reward = float(correct_reward), float(wrong_reward)

    def train_batch(self, step: int, n: int) -> list[Problem]:
        return self.task.train_batch(step, n)

    def validation(self, max_n: int | None = None) -> list[Problem]:
        return self.task.validation(max_n)

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """float32 [n]: `correct_reward` where the first byte of SHA-256(seed, response) is odd, else `wrong_reward`."""
        heads = [hashlib.sha256(f"{self.seed}\x00{text}".encode()).digest()[0] & 1 for text in responses]
        return torch.tensor([self.correct_reward if h else self.wrong_reward for h in heads], dtype=torch.float32)
