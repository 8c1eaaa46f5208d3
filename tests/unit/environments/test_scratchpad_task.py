"""What every scratchpad task gets from `ScratchpadTask`: a held-out split disjoint from training and seeded."""

from __future__ import annotations

import pytest

from nemo_jetrl.environments import LongAdditionTask, LongMultiplicationTask


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
