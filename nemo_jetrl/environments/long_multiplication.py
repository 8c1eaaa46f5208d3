"""Synthetic long chain-of-thought task: multiply two `num_digits`-digit numbers with a full scratchpad.

The prompt lists the digits of `a` (least significant first, tagged `A`, `B`, ... by position) and of `b` (tagged
`a`, `b`, ...), then `=`. The worked solution (the SFT target) has one row per digit b_j of `b`, units first:

- the row header `<tag j><b_j>:`;
- the partial product a * b_j, one digit of `a` per step, `<A+i><a_i>*<b_j>+<carry in>=<carry out><digit>;`;
- that partial product (shifted by j) added into the running total column by column, columns j .. j + n,
  `<a+k><total digit k before>+<partial product digit k>+<carry in>=<carry out><new digit k>;` (the digit of the
  column beyond the partial product is its last carry; the total before row 0 is 0);

then `#` and the product, most significant digit first. For a = 1234, b = 5678 (num_digits 4), the first two rows:

    prompt    A4B3C2D1*a8b7c6d5=
    row 0     a8:A4*8+0=32;B3*8+3=27;C2*8+2=18;D1*8+1=09;a0+2+0=02;b0+7+0=07;c0+8+0=08;d0+9+0=09;e0+0+0=00;
    row 1     b7:A4*7+0=28;B3*7+2=23;C2*7+2=16;D1*7+1=08;b7+8+0=15;c8+3+1=12;d9+6+1=16;e0+8+1=09;f0+0+0=00;
    ...       #7006652

Every step is 10 characters and every row 3 + 10 n + 10 (n + 1) = 20 n + 13, so a response is

    20 n^2 + 13 n + 1 + len(str(a * b))  characters  (20 n^2 + 15 n + 1 at most; one token each, + eos)

with a character-level tokenizer: n = 7 -> 1,085-1,086, n = 10 -> 2,150-2,151, n = 13 -> 3,575-3,576 (columns
are tagged `a`..`z`, so 2 n <= 26). Each token is fixed by the prompt and the steps before it, within reach of a
tag or a fixed offset: a_i by its tag, b_j and the carry from the step before, the previous total's digit k one row
back, the partial product's digit k n + 1 steps back; one slip anywhere spoils the product. Reward, operands and
splits as long_addition (environments/scratchpad_task.py): the text after the last `#` must be exactly the
product's digits; the steps are not checked.
"""

from __future__ import annotations

from nemo_jetrl.environments.scratchpad_task import ANSWER_MARK, ScratchpadTask

A_TAGS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # digit i of a (and the multiplication step that uses it)
COLUMN_TAGS = "abcdefghijklmnopqrstuvwxyz"  # digit j of b, row j, product column k
ALPHABET = "0123456789*+=;:#" + A_TAGS + COLUMN_TAGS  # 68 characters
VOCAB_SIZE = 128  # the 4 specials of models/tokenizer.py + the 68 characters, padded to 128
MAX_NUM_DIGITS = len(COLUMN_TAGS) // 2  # the product's 2 n columns need 2 n tags
STEP_CHARS = 10  # "A4*8+3=35;" and "c8+3+1=12;"
HEADER_CHARS = 3  # "b7:"


def row_chars(num_digits: int) -> int:
    """Characters of one row: the header, n multiplication steps and n + 1 addition steps."""
    return HEADER_CHARS + STEP_CHARS * (2 * num_digits + 1)


def response_chars(num_digits: int, answer_digits: int) -> int:
    """Characters of a worked solution whose product has `answer_digits` digits (the module's formula)."""
    return num_digits * row_chars(num_digits) + len(ANSWER_MARK) + answer_digits


def _digits(x: int, num_digits: int) -> list[int]:
    return [int(c) for c in str(x).zfill(num_digits)[::-1]]  # units first


def format_prompt(a: int, b: int, num_digits: int) -> str:
    """`A<a_0>B<a_1>...*a<b_0>b<b_1>...=` (least significant digits first)."""
    da, db = _digits(a, num_digits), _digits(b, num_digits)
    left = "".join(f"{A_TAGS[i]}{d}" for i, d in enumerate(da))
    right = "".join(f"{COLUMN_TAGS[j]}{d}" for j, d in enumerate(db))
    return f"{left}*{right}="


def parse_prompt(prompt: str) -> tuple[int, int]:
    """(a, b) of a `format_prompt` string; ValueError on anything else."""
    left, star, right = prompt.partition("*")
    n = len(left) // 2
    ok = star and right.endswith("=") and 1 <= n <= MAX_NUM_DIGITS and len(left) == 2 * n and len(right) == 2 * n + 1
    if ok:
        ok = all(left[2 * i] == A_TAGS[i] and right[2 * i] == COLUMN_TAGS[i] for i in range(n)) and all(
            c.isascii() and c.isdigit() for c in left[1::2] + right[1:-1:2]
        )
    if not ok:
        raise ValueError(f"not a long-multiplication prompt: {prompt!r}")
    a = int(left[1::2][::-1])
    b = int(right[1:-1:2][::-1])
    return a, b


def worked_solution(a: int, b: int, num_digits: int) -> str:
    """The row-by-row scratchpad and the final answer (module docstring); the SFT target."""
    n = num_digits
    da, db = _digits(a, n), _digits(b, n)
    total = [0] * (2 * n + 1)  # the running total's digits, units first
    rows = []
    for j, bj in enumerate(db):
        steps, partial, carry = [f"{COLUMN_TAGS[j]}{bj}:"], [], 0
        for i, ai in enumerate(da):
            value = ai * bj + carry
            steps.append(f"{A_TAGS[i]}{ai}*{bj}+{carry}={value // 10}{value % 10};")
            partial.append(value % 10)
            carry = value // 10
        partial.append(carry)  # the partial product's top digit
        carry = 0
        for i, p in enumerate(partial):
            k = j + i
            s = total[k]
            value = s + p + carry
            steps.append(f"{COLUMN_TAGS[k]}{s}+{p}+{carry}={value // 10}{value % 10};")
            total[k] = value % 10
            carry = value // 10
        assert carry == 0  # the total after row j has at most n + j + 1 digits
        rows.append("".join(steps))
    return "".join(rows) + ANSWER_MARK + str(a * b)


class LongMultiplicationTask(ScratchpadTask):
    """Deterministic, seeded long-multiplication task with a scratchpad; implements `VerifiableTask`."""

    ALPHABET = ALPHABET
    VOCAB_SIZE = VOCAB_SIZE
    MAX_NUM_DIGITS = MAX_NUM_DIGITS
    DEFAULT_NUM_DIGITS = 10
    format_prompt = staticmethod(format_prompt)
    parse_prompt = staticmethod(parse_prompt)
    worked_solution = staticmethod(worked_solution)

    @staticmethod
    def answer_of(a: int, b: int) -> int:
        return a * b

    @property
    def max_response_chars(self) -> int:
        """Longest worked solution: 20 n^2 + 15 n + 1 (a 2 n-digit product)."""
        return response_chars(self.num_digits, 2 * self.num_digits)
