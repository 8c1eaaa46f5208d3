"""What every scratchpad task gets from `ScratchpadTask`: a held-out split disjoint from training and seeded, and its
registration as a `data.dataset_name` whose rewards follow the `env` section."""

from __future__ import annotations

import operator

import pytest

from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.environments import LongAdditionTask, LongMultiplicationTask, make_task
from nemo_jetrl.environments.config import EnvConfig


@pytest.mark.parametrize("task_cls", [LongAdditionTask, LongMultiplicationTask])
def test_held_out_split_is_disjoint_from_training_and_seeded(task_cls):
    task = task_cls(num_digits=2, val_size=4000, seed=5)  # 4000 of the 8100 pairs: many redraws
    val = {p.prompt for p in task.validation()}
    assert len(val) == 4000
    assert val.isdisjoint(p.prompt for step in range(8) for p in task.train_batch(step, 500))
    again = task_cls(num_digits=2, val_size=4000, seed=5)
    assert [p.prompt for p in again.train_batch(3, 50)] == [p.prompt for p in task.train_batch(3, 50)]
    assert task.train_batch(3, 50) != task.train_batch(4, 50)
    other = [p.prompt for p in task_cls(num_digits=2, val_size=10, seed=6).validation()]
    assert other != [p.prompt for p in task_cls(num_digits=2, val_size=10, seed=5).validation()]
    assert other != [p.prompt for p in task.validation(10)]


@pytest.mark.parametrize(
    ("name", "task_cls", "digits", "op"),
    [
        ("long_addition", LongAdditionTask, 5, operator.add),
        ("long_multiplication", LongMultiplicationTask, 3, operator.mul),
    ],
)
def test_registered_as_a_dataset_name_with_env_rewards(name, task_cls, digits, op):
    task = make_task(
        DataConfig(dataset_name=name, num_digits=digits, val_size=8, seed=1),
        EnvConfig(arithmetic={"correct_reward": 2.0, "wrong_reward": -1.0}),
    )
    assert isinstance(task, task_cls) and task.num_digits == digits
    p = task.validation(1)[0]
    a, b = task.parse_prompt(p.prompt)
    low = 10 ** (digits - 1)
    assert low <= a < 10 * low and low <= b < 10 * low and p.answer == str(op(a, b))
    assert task.score([task.solution(p), "#1"], [p.answer, p.answer]).tolist() == [2.0, -1.0]
