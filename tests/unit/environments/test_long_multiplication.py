"""The long-multiplication task: worked solutions, the final-answer verifier, token lengths against the formula,
the config hook (the seeded disjoint splits: test_scratchpad_task.py)."""

from __future__ import annotations

import re

import pytest
from jetrl_testkit.accuracy import answer_corruptions

from nemo_jetrl.environments import LongMultiplicationTask
from nemo_jetrl.environments.long_multiplication import (
    ALPHABET,
    VOCAB_SIZE,
    format_prompt,
    parse_prompt,
    response_chars,
    row_chars,
    worked_solution,
)
from nemo_jetrl.environments.scratchpad_task import final_answer
from nemo_jetrl.models.tokenizer import build_char_tokenizer

MULT_STEP = re.compile(r"([A-Z])(\d)\*(\d)\+(\d)=(\d)(\d);")
ADD_STEP = re.compile(r"([a-z])(\d)\+(\d)\+(\d)=(\d)(\d);")


def test_worked_solution_of_a_known_pair():
    assert format_prompt(1234, 5678, 4) == "A4B3C2D1*a8b7c6d5="
    assert parse_prompt("A4B3C2D1*a8b7c6d5=") == (1234, 5678)
    sol = worked_solution(1234, 5678, 4)
    assert (
        sol[: row_chars(4)]
        == "a8:A4*8+0=32;B3*8+3=27;C2*8+2=18;D1*8+1=09;a0+2+0=02;b0+7+0=07;c0+8+0=08;d0+9+0=09;e0+0+0=00;"
    )
    assert sol[row_chars(4) : 2 * row_chars(4)] == (
        "b7:A4*7+0=28;B3*7+2=23;C2*7+2=16;D1*7+1=08;b7+8+0=15;c8+3+1=12;d9+6+1=16;e0+8+1=09;f0+0+0=00;"
    )
    assert sol.endswith(";#7006652") and 1234 * 5678 == 7006652
    assert len(sol) == response_chars(4, 7) == 4 * 93 + 1 + 7


@pytest.mark.parametrize("n", [2, 5, 13])
def test_every_step_is_arithmetic_that_holds(n):
    """Each multiplication step is a_i * b_j + carry, each addition step total + partial + carry, carries chain."""
    task = LongMultiplicationTask(num_digits=n, val_size=4, seed=1)
    for p in task.train_batch(0, 8):
        a, b = parse_prompt(p.prompt)
        sol = task.solution(p)
        rows = [sol[r * row_chars(n) : (r + 1) * row_chars(n)] for r in range(n)]
        for j, row in enumerate(rows):
            assert row[:3] == f"{chr(97 + j)}{str(b).zfill(n)[::-1][j]}:"
            mults, adds = MULT_STEP.findall(row), ADD_STEP.findall(row)
            assert len(mults) == n and len(adds) == n + 1
            carry = 0
            for i, (tag, x, y, c, hi, lo) in enumerate(mults):
                assert tag == chr(65 + i) and int(x) == int(str(a).zfill(n)[::-1][i]) and int(c) == carry
                assert int(x) * int(y) + int(c) == 10 * int(hi) + int(lo)
                carry = int(hi)
            carry = 0
            for i, (tag, s, q, c, hi, lo) in enumerate(adds):
                assert tag == chr(97 + j + i) and int(c) == carry and int(s) + int(q) + int(c) == 10 * int(hi) + int(lo)
                assert int(q) == (int(mults[i][5]) if i < n else int(mults[-1][4]))  # the partial product's digit
                carry = int(hi)
        assert final_answer(sol) == str(a * b) == p.answer


def test_verifier_accepts_every_worked_solution_and_rejects_corruptions():
    task = LongMultiplicationTask(num_digits=7, val_size=64, seed=3)
    problems = task.train_batch(0, 64) + task.validation()
    solutions = [task.solution(p) for p in problems]
    assert task.score(solutions, [p.answer for p in problems]).tolist() == [1.0] * 128
    for p, sol in zip(problems[:16], solutions[:16]):
        corrupted = [*answer_corruptions(sol), sol[: len(sol) // 2]]  # + truncated mid-scratchpad
        assert task.score(corrupted, [p.answer] * len(corrupted)).tolist() == [0.0] * len(corrupted)
    # the steps are not checked: a wrong scratchpad with the right final answer scores (final answer exact)
    assert task.reward("a0:" + solutions[0][3:], problems[0].answer) == 1.0


def test_token_lengths_match_the_formula():
    """One token per character; 20 n^2 + 13 n + 1 + digits of the product; the three study lengths."""
    tok = build_char_tokenizer(ALPHABET, VOCAB_SIZE, model_max_length=4096)
    assert len(tok) == VOCAB_SIZE and len(ALPHABET) == 68
    for n, lo, hi in ((7, 1085, 1086), (10, 2150, 2151), (13, 3575, 3576)):
        task = LongMultiplicationTask(num_digits=n, val_size=4, seed=0)
        assert task.max_response_chars == 20 * n * n + 15 * n + 1 == hi
        assert task.prompt_chars == 4 * n + 2
        lengths = set()
        for p in task.train_batch(0, 64):
            sol = task.solution(p)
            ids = tok(sol, add_special_tokens=False).input_ids
            assert len(ids) == len(sol) == 20 * n * n + 13 * n + 1 + len(p.answer)
            assert tok.decode(ids) == sol
            lengths.add(len(ids))
        assert lengths <= {lo, hi} and hi in lengths
        p = task.validation(1)[0]
        assert tok.decode(tok(p.prompt).input_ids, skip_special_tokens=True) == p.prompt


@pytest.mark.parametrize("bad", ["A4B3*a8b7", "A4B3*a8=", "B4A3*a8b7=", "A4B3*a8c7=", "A4Bx*a8b7=", "*=", "A4B3a8b7="])
def test_parse_prompt_refuses_other_text(bad):
    with pytest.raises(ValueError, match="not a long-multiplication prompt"):
        parse_prompt(bad)


@pytest.mark.parametrize(("kwargs", "key"), [({"num_digits": 14}, "data.num_digits"), ({"num_digits": 1}, "data.num_digits"),
                                             ({"val_size": -1}, "data.val_size"), ({"wrong_reward": float("inf")}, "env.arithmetic.wrong_reward")])  # fmt: skip
def test_bad_settings_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LongMultiplicationTask(**kwargs)
