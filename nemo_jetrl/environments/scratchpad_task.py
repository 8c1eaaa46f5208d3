"""The shared machinery of the synthetic scratchpad tasks (`long_addition`, `long_multiplication`): two operands of
exactly `num_digits` digits, a worked solution that ends with `#` and the final answer, a seeded held-out set.

A subclass names its operation (`answer_of`), its prompt and worked-solution formats (`format_prompt`,
`parse_prompt`, `worked_solution`), its character alphabet and the longest solution (`max_response_chars`). Here:
the held-out set is `val_size` distinct pairs drawn once from the task seed; each training batch is drawn from
`(seed, step)` alone and redraws any held-out pair. Reward: `correct_reward` when the text after the last `#` is
exactly the reference's digits (no leading zero), else `wrong_reward`; the steps themselves are not checked.
"""

from __future__ import annotations

import numpy as np

from nemo_jetrl.environments.arithmetic import CorrectnessRewards, _check_float, _check_int
from nemo_jetrl.environments.interfaces import Problem

ANSWER_MARK = "#"
_VAL_STREAM, _TRAIN_STREAM = 0, 1


def final_answer(response_text: str) -> str | None:
    """The text after the last `#`, stripped; None when there is no `#`."""
    cut = response_text.rfind(ANSWER_MARK)
    return None if cut < 0 else response_text[cut + 1 :].strip()


class ScratchpadTask(CorrectnessRewards):
    """Seeded two-operand task with a worked solution; implements `VerifiableTask` (module docstring)."""

    ALPHABET: str = ""  # every character of prompts and solutions (a character-level tokenizer's)
    VOCAB_SIZE: int = 0  # the 4 specials of models/tokenizer.py + the alphabet, padded
    MIN_NUM_DIGITS: int = 2
    MAX_NUM_DIGITS: int = 0
    DEFAULT_NUM_DIGITS: int = 0

    def __init__(
        self,
        num_digits: int | None = None,  # None: DEFAULT_NUM_DIGITS
        val_size: int = 512,
        seed: int = 1234,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
    ) -> None:
        num_digits = self.DEFAULT_NUM_DIGITS if num_digits is None else num_digits
        self.num_digits = _check_int("data.num_digits", num_digits, self.MIN_NUM_DIGITS, self.MAX_NUM_DIGITS)
        pairs = (9 * 10 ** (self.num_digits - 1)) ** 2
        self.val_size = _check_int("data.val_size", val_size, 0, min(pairs // 2, 1_000_000))
        self.seed = _check_int("data.seed", seed, 0)
        self.correct_reward = _check_float("env.arithmetic.correct_reward", correct_reward)
        self.wrong_reward = _check_float("env.arithmetic.wrong_reward", wrong_reward)
        rng = np.random.default_rng([self.seed, _VAL_STREAM])
        val: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        while len(val) < self.val_size:
            pair = self._draw(rng)
            if pair not in seen:
                seen.add(pair)
                val.append(pair)
        self._val_pairs = val
        self._val_set = seen

    # --- what a subclass defines -------------------------------------------------------------------------------
    @staticmethod
    def answer_of(a: int, b: int) -> int:
        raise NotImplementedError

    @staticmethod
    def format_prompt(a: int, b: int, num_digits: int) -> str:
        raise NotImplementedError

    @staticmethod
    def parse_prompt(prompt: str) -> tuple[int, int]:
        raise NotImplementedError

    @staticmethod
    def worked_solution(a: int, b: int, num_digits: int) -> str:
        raise NotImplementedError

    @property
    def max_response_chars(self) -> int:
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------------------------
    @property
    def prompt_chars(self) -> int:
        """Characters of every prompt (all prompts of a task have the same length)."""
        top = 10**self.num_digits - 1
        return len(self.format_prompt(top, top, self.num_digits))

    def _draw(self, rng: np.random.Generator) -> tuple[int, int]:
        """One (a, b) pair of num_digits-digit numbers (Python ints: 26 digits overflow int64)."""
        digits = rng.integers(0, 10, size=(2, self.num_digits))  # [2, num_digits], most significant first
        digits[:, 0] = rng.integers(1, 10, size=2)  # no leading zero
        a, b = (int("".join(map(str, row))) for row in digits)
        return a, b

    def _problem(self, a: int, b: int) -> Problem:
        return Problem(prompt=self.format_prompt(a, b, self.num_digits), answer=str(self.answer_of(a, b)))

    def train_pairs(self, step: int, n: int) -> list[tuple[int, int]]:
        """The (a, b) pairs of training batch `step`: drawn from `(seed, step)`, never a held-out pair."""
        step = _check_int("train_batch step", step, 0)
        n = _check_int("train_batch n", n, 0)
        rng = np.random.default_rng([self.seed, _TRAIN_STREAM, step])
        out = []
        while len(out) < n:
            pair = self._draw(rng)
            if pair not in self._val_set:
                out.append(pair)
        return out

    def train_batch(self, step: int, n: int) -> list[Problem]:
        """`n` training problems drawn from `(seed, step)`; never a held-out pair."""
        return [self._problem(a, b) for a, b in self.train_pairs(step, n)]

    def validation(self, max_n: int | None = None) -> list[Problem]:
        """The fixed held-out problems (the first `max_n` of them when given)."""
        pairs = self._val_pairs if max_n is None else self._val_pairs[: _check_int("validation max_n", max_n, 0)]
        return [self._problem(a, b) for a, b in pairs]

    def solution(self, problem: Problem) -> str:
        """The worked solution of `problem` (read from its prompt), the SFT target."""
        a, b = self.parse_prompt(problem.prompt)
        return self.worked_solution(a, b, self.num_digits)

    def is_correct(self, response_text: str, answer: str) -> bool:
        """The text after the last `#` is exactly the reference's digits."""
        got = final_answer(response_text)
        return got is not None and got.isascii() and got.isdigit() and got == answer.strip()
