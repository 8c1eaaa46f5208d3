"""Synthetic verifiable task: `a+b=` with zero-padded operands, exact-match reward on the decoded answer.

Prompt text is e.g. "07+35=" (the tokenizer adds <bos>); the reference answer is `str(a + b)`, here "42", with no
padding. A pair (a, b) is identified by the integer `a * 10**num_digits + b`. The held-out set is `val_size` distinct
pairs drawn once from the task seed; every training batch is drawn from `(seed, step)` alone (so a resumed run
sees the same data) and redraws any pair that belongs to the held-out set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from nemo_jetrl.environments.interfaces import Problem

_VAL_STREAM, _TRAIN_STREAM = 0, 1  # independent numpy streams for the held-out set and the training batches
MAX_NUM_DIGITS = 9  # 10**18 pairs still fit an int64


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return int(value)


def _check_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class CorrectnessRewards:
    """`reward` / `score` of a task from its `is_correct(response_text, answer)`: `correct_reward` or
    `wrong_reward` per response."""

    correct_reward: float
    wrong_reward: float

    def is_correct(self, response_text: str, answer: str) -> bool:
        raise NotImplementedError

    def reward(self, response_text: str, answer: str) -> float:
        """`correct_reward` when `is_correct`, else `wrong_reward`."""
        return self.correct_reward if self.is_correct(response_text, answer) else self.wrong_reward

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses: float32 `[n]`."""
        if len(responses) != len(answers):
            raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
        return torch.tensor([self.reward(r, a) for r, a in zip(responses, answers)], dtype=torch.float32)


class ArithmeticTask(CorrectnessRewards):
    """Deterministic, seeded addition task; implements `VerifiableTask`."""

    def __init__(
        self,
        num_digits: int = 2,
        val_size: int = 512,
        seed: int = 1234,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
    ) -> None:
        self.num_digits = _check_int("data.num_digits", num_digits, 1, MAX_NUM_DIGITS)
        self.num_pairs = 10 ** (2 * self.num_digits)
        # keep at least half the pairs for training so rejection sampling of train pairs stays cheap
        self.val_size = _check_int("data.val_size", val_size, 0, self.num_pairs // 2)
        self.seed = _check_int("data.seed", seed, 0)
        self.correct_reward = _check_float("env.arithmetic.correct_reward", correct_reward)
        self.wrong_reward = _check_float("env.arithmetic.wrong_reward", wrong_reward)
        rng = np.random.default_rng([self.seed, _VAL_STREAM])
        # val_ids: [val_size] int64, distinct pair ids in draw order (so validation(k) is a random subset)
        self._val_ids = rng.choice(self.num_pairs, size=self.val_size, replace=False).astype(np.int64)
        self._val_sorted = np.sort(self._val_ids)

    @property
    def max_answer_chars(self) -> int:
        """Longest reference answer: num_digits + 1 characters (a carry out of the top digit)."""
        return self.num_digits + 1

    def _problem(self, pair_id: int) -> Problem:
        a, b = divmod(int(pair_id), 10**self.num_digits)
        d = self.num_digits
        return Problem(prompt=f"{a:0{d}d}+{b:0{d}d}=", answer=str(a + b))

    def _is_validation(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(ids, self._val_sorted, assume_unique=False)

    def train_batch(self, step: int, n: int) -> list[Problem]:
        """`n` training problems drawn (with replacement) from `(seed, step)`; never a held-out pair."""
        step = _check_int("train_batch step", step, 0)
        n = _check_int("train_batch n", n, 0)
        rng = np.random.default_rng([self.seed, _TRAIN_STREAM, step])
        ids = rng.integers(0, self.num_pairs, size=n, dtype=np.int64)  # ids: [n]
        held_out = self._is_validation(ids)
        while held_out.any():  # redraw held-out pairs; terminates fast since val_size <= num_pairs / 2
            ids[held_out] = rng.integers(0, self.num_pairs, size=int(held_out.sum()), dtype=np.int64)
            held_out = self._is_validation(ids)
        return [self._problem(i) for i in ids]

    def validation(self, max_n: int | None = None) -> list[Problem]:
        """The fixed held-out problems (the first `max_n` of them when given)."""
        ids = self._val_ids if max_n is None else self._val_ids[: _check_int("validation max_n", max_n, 0)]
        return [self._problem(i) for i in ids]

    def is_correct(self, response_text: str, answer: str) -> bool:
        """Exact match of the digits after stripping surrounding whitespace ("042" != "42", "" is wrong)."""
        text = response_text.strip()
        return text.isascii() and text.isdigit() and text == answer.strip()
