"""The long-addition task: worked solutions, the final-answer verifier, the config hook (the seeded disjoint splits:
test_scratchpad_task.py)."""

from __future__ import annotations

import pytest
from jetrl_testkit.accuracy import answer_corruptions

from nemo_jetrl.environments import LongAdditionTask
from nemo_jetrl.environments.long_addition import (
    ALPHABET,
    VOCAB_SIZE,
    final_answer,
    format_prompt,
    parse_prompt,
    worked_solution,
)
from nemo_jetrl.models.tokenizer import build_char_tokenizer


def test_worked_solution_of_a_known_pair():
    assert format_prompt(1234, 5678, 4) == "A48B37C26D15="
    assert worked_solution(1234, 5678, 4) == "A4+8+0=12;B3+7+1=11;C2+6+1=09;D1+5+0=06;#6912"
    assert worked_solution(9999, 1, 4) == "A9+1+0=10;B9+0+1=10;C9+0+1=10;D9+0+1=10;#10000"  # carry out of the top
    assert parse_prompt("A48B37C26D15=") == (1234, 5678)


@pytest.mark.parametrize("bad", ["A48B37C26D15", "B48=", "A4xB37=", "=", "A48B3=", "A48C37="])
def test_parse_prompt_refuses_other_text(bad):
    with pytest.raises(ValueError, match="not a long-addition prompt"):
        parse_prompt(bad)


def test_verifier_accepts_every_worked_solution_and_rejects_corruptions():
    task = LongAdditionTask(num_digits=20, val_size=64, seed=3)
    problems = task.train_batch(0, 64) + task.validation()
    solutions = [task.solution(p) for p in problems]
    assert task.score(solutions, [p.answer for p in problems]).tolist() == [1.0] * 128
    for p, sol in zip(problems[:16], solutions[:16]):
        a, b = parse_prompt(p.prompt)
        assert p.answer == str(a + b) and final_answer(sol) == p.answer
        corrupted = answer_corruptions(sol)
        assert task.score(corrupted, [p.answer] * len(corrupted)).tolist() == [0.0] * len(corrupted)
    # the steps are not checked: a wrong scratchpad with the right final answer scores (final answer exact)
    sol = solutions[0]
    assert task.reward("A0+0+0=00;" + sol[10:], problems[0].answer) == 1.0


def test_operands_have_exactly_num_digits_digits():
    task = LongAdditionTask(num_digits=20, val_size=4, seed=0)
    for p in task.train_batch(0, 200):
        a, b = parse_prompt(p.prompt)
        assert 10**19 <= a < 10**20 and 10**19 <= b < 10**20


def test_response_length_and_char_tokenizer():
    task = LongAdditionTask(num_digits=20, val_size=4, seed=0)
    tok = build_char_tokenizer(ALPHABET, VOCAB_SIZE, model_max_length=512)
    p = task.validation(1)[0]
    sol = task.solution(p)
    ids = tok(sol, add_special_tokens=False).input_ids
    assert len(ids) == len(sol) <= task.max_response_chars == 222  # one token per character
    assert tok.decode(tok(p.prompt).input_ids, skip_special_tokens=True) == p.prompt
    assert tok(p.prompt).input_ids[0] == tok.bos_token_id and len(tok) == VOCAB_SIZE


@pytest.mark.parametrize(("kwargs", "key"), [({"num_digits": 27}, "data.num_digits"), ({"num_digits": 1}, "data.num_digits"),
                                             ({"val_size": -1}, "data.val_size"), ({"correct_reward": float("nan")}, "env.arithmetic.correct_reward")])  # fmt: skip
def test_bad_settings_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LongAdditionTask(**kwargs)
