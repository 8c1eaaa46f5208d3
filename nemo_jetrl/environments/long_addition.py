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
`wrong_reward`; the steps themselves are not checked (final answer exact). Operands, splits and rewards:
environments/scratchpad_task.py.
"""

from __future__ import annotations

from nemo_jetrl.environments.scratchpad_task import ANSWER_MARK, ScratchpadTask, final_answer

__all__ = ["ALPHABET", "VOCAB_SIZE", "LongAdditionTask", "final_answer", "format_prompt", "parse_prompt",
           "worked_solution"]  # fmt: skip

TAGS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ALPHABET = "0123456789+=;#" + TAGS  # the characters of prompts and solutions (a character-level tokenizer's)
VOCAB_SIZE = 64  # the 4 specials of models/tokenizer.py + the 40 characters, padded to 64
MAX_NUM_DIGITS = len(TAGS)
COLUMN_CHARS = 10  # "A4+8+0=12;"


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


class LongAdditionTask(ScratchpadTask):
    """Deterministic, seeded long-addition task with a scratchpad; implements `VerifiableTask`."""

    ALPHABET = ALPHABET
    VOCAB_SIZE = VOCAB_SIZE
    MAX_NUM_DIGITS = MAX_NUM_DIGITS
    DEFAULT_NUM_DIGITS = 20
    format_prompt = staticmethod(format_prompt)
    parse_prompt = staticmethod(parse_prompt)
    worked_solution = staticmethod(worked_solution)

    @staticmethod
    def answer_of(a: int, b: int) -> int:
        return a + b

    @property
    def max_response_chars(self) -> int:
        """Longest worked solution: the columns, `#` and an answer of num_digits + 1 digits."""
        return COLUMN_CHARS * self.num_digits + 1 + self.num_digits + 1
