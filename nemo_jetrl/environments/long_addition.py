"""Synthetic long chain-of-thought task: add two `num_digits`-digit numbers column by column, then give the sum.

The prompt lists the digit columns, least significant first, each as a tag letter (A = units, B = tens, ...)
followed by the digit of `a` and the digit of `b`, then `=`. The worked solution (the SFT target) adds one column
per step, `<tag><a_k>+<b_k>+<carry in>=<carry out><sum digit>;`, and ends with `#` and the sum, most significant
digit first. For a = 1234, b = 5678 (num_digits 4):

    prompt    A48B37C26D15=
    solution  A4+8+0=12;B3+7+1=11;C2+6+1=09;D1+5+0=06;#6912

The response is 10 characters per column plus the answer (num_digits 20: about 220 tokens with a character-level
tokenizer), each token fixed by the prompt and the steps before it, so an early slip spoils the final answer.
Reward: `correct_reward` when the text after the last `#` is exactly the sum's digits ("06912" != "6912"), else
`wrong_reward`; the steps themselves are not checked (final answer exact).

Operands have exactly `num_digits` digits (no leading zero). The held-out set is `val_size` distinct pairs drawn
once from the task seed; each training batch is drawn from `(seed, step)` alone and redraws any held-out pair.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nemo_jetrl.environments.arithmetic import _check_float, _check_int
from nemo_jetrl.environments.interfaces import Problem

TAGS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ALPHABET = "0123456789+=;#" + TAGS  # the characters of prompts and solutions (a character-level tokenizer's)
VOCAB_SIZE = 64  # the 4 specials of models/tokenizer.py + the 40 characters, padded to 64
MAX_NUM_DIGITS = len(TAGS)
COLUMN_CHARS = 10  # "A4+8+0=12;"
ANSWER_MARK = "#"
_VAL_STREAM, _TRAIN_STREAM = 0, 1


def format_prompt(a: int, b: int, num_digits: int) -> str:
    """The digit columns of `a` and `b`, least significant first, each `<tag><a_k><b_k>`, then `=`."""
    da, db = str(a).zfill(num_digits)[::-1], str(b).zfill(num_digits)[::-1]  # units first
    return "".join(f"{TAGS[k]}{da[k]}{db[k]}" for k in range(num_digits)) + "="


def parse_prompt(prompt: str) -> tuple[int, int]:
    """(a, b) of a `format_prompt` string; ValueError on anything else."""
    body = prompt[:-1] if prompt.endswith("=") else None
    if not body or len(body) % 3 or len(body) // 3 > MAX_NUM_DIGITS:
        raise ValueError(f"not a long-addition prompt: {prompt!r}")
    columns = [body[i : i + 3] for i in range(0, len(body), 3)]
    for k, col in enumerate(columns):
        if col[0] != TAGS[k] or not (col[1:].isascii() and col[1:].isdigit()):
            raise ValueError(f"not a long-addition prompt: {prompt!r} (column {k}: {col!r})")
    a = int("".join(col[1] for col in reversed(columns)))
    b = int("".join(col[2] for col in reversed(columns)))
    return a, b


def worked_solution(a: int, b: int, num_digits: int) -> str:
    """The column-by-column scratchpad and the final answer (module docstring); the SFT target."""
    da, db = str(a).zfill(num_digits)[::-1], str(b).zfill(num_digits)[::-1]
    steps, carry = [], 0
    for k in range(num_digits):
        x, y = int(da[k]), int(db[k])
        total = x + y + carry
        steps.append(f"{TAGS[k]}{x}+{y}+{carry}={total // 10}{total % 10};")
        carry = total // 10
    return "".join(steps) + ANSWER_MARK + str(a + b)


def final_answer(response_text: str) -> str | None:
    """The text after the last `#`, stripped; None when there is no `#`."""
    cut = response_text.rfind(ANSWER_MARK)
    return None if cut < 0 else response_text[cut + 1 :].strip()


class LongAdditionTask:
    """Deterministic, seeded long-addition task with a scratchpad; implements `VerifiableTask`."""

    def __init__(
        self,
        num_digits: int = 20,
        val_size: int = 512,
        seed: int = 1234,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
    ) -> None:
        self.num_digits = _check_int("data.num_digits", num_digits, 2, MAX_NUM_DIGITS)
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

    @property
    def max_response_chars(self) -> int:
        """Longest worked solution: the columns, `#` and an answer of num_digits + 1 digits."""
        return COLUMN_CHARS * self.num_digits + 1 + self.num_digits + 1

    def _draw(self, rng: np.random.Generator) -> tuple[int, int]:
        """One (a, b) pair of num_digits-digit numbers (Python ints: 26 digits overflow int64)."""
        digits = rng.integers(0, 10, size=(2, self.num_digits))  # [2, num_digits], most significant first
        digits[:, 0] = rng.integers(1, 10, size=2)  # no leading zero
        a, b = (int("".join(map(str, row))) for row in digits)
        return a, b

    def _problem(self, a: int, b: int) -> Problem:
        return Problem(prompt=format_prompt(a, b, self.num_digits), answer=str(a + b))

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
        """The worked solution of `problem` (its prompt's columns), the SFT target."""
        a, b = parse_prompt(problem.prompt)
        return worked_solution(a, b, self.num_digits)

    def is_correct(self, response_text: str, answer: str) -> bool:
        """The text after the last `#` is exactly the reference's digits."""
        got = final_answer(response_text)
        return got is not None and got.isascii() and got.isdigit() and got == answer.strip()

    def reward(self, response_text: str, answer: str) -> float:
        return self.correct_reward if self.is_correct(response_text, answer) else self.wrong_reward

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses: float32 `[n]`."""
        if len(responses) != len(answers):
            raise ValueError(f"score: {len(responses)} responses but {len(answers)} answers")
        return torch.tensor([self.reward(r, a) for r, a in zip(responses, answers)], dtype=torch.float32)
