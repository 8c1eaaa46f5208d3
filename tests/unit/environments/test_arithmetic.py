"""ArithmeticTask: determinism, train/held-out disjointness, exact rewards, factory errors."""

import pytest
import torch

from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.environments import ArithmeticTask, Problem, VerifiableTask, make_task
from nemo_jetrl.environments.config import EnvConfig


def _pairs(problems):
    return {p.prompt for p in problems}


def test_prompt_and_answer_format():
    task = ArithmeticTask(num_digits=2, val_size=4, seed=7)
    for p in task.train_batch(0, 200) + task.validation():
        a, b = p.prompt[:2], p.prompt[3:5]
        assert len(p.prompt) == 6 and p.prompt[2] == "+" and p.prompt[5] == "="
        assert a.isdigit() and b.isdigit()
        assert p.answer == str(int(a) + int(b))
    assert task._problem(7 * 100 + 35) == Problem(prompt="07+35=", answer="42")
    assert task._problem(0) == Problem(prompt="00+00=", answer="0")
    assert task._problem(9999) == Problem(prompt="99+99=", answer="198")
    assert task.max_answer_chars == 3


def test_train_batch_is_a_function_of_seed_and_step():
    task, twin = ArithmeticTask(seed=1234), ArithmeticTask(seed=1234)
    assert task.train_batch(5, 64) == twin.train_batch(5, 64)
    assert task.train_batch(5, 64) == task.train_batch(5, 64)  # no hidden state advanced by a call
    assert task.train_batch(5, 64) != task.train_batch(6, 64)
    assert task.train_batch(5, 64) != ArithmeticTask(seed=99).train_batch(5, 64)
    assert task.train_batch(3, 0) == []


def test_validation_is_fixed_distinct_and_prefix_stable():
    task = ArithmeticTask(seed=1234, val_size=512)
    val = task.validation()
    assert len(val) == 512 and len(_pairs(val)) == 512
    assert val == ArithmeticTask(seed=1234, val_size=512).validation()
    assert task.validation(128) == val[:128]
    assert _pairs(val) != _pairs(ArithmeticTask(seed=1, val_size=512).validation())


def test_train_never_returns_held_out_pairs():
    task = ArithmeticTask(seed=1234, val_size=512)
    held_out = _pairs(task.validation())
    seen = set()
    for step in range(40):
        seen |= _pairs(task.train_batch(step, 128))  # 5120 draws: ~5% would hit the held-out set by chance
    assert len(seen) > 3000
    assert not seen & held_out


def test_train_covers_all_non_held_out_pairs_with_tiny_space():
    task = ArithmeticTask(num_digits=1, val_size=50, seed=3)  # 100 pairs, half held out
    train = _pairs(task.train_batch(0, 2000))
    assert len(train) == 50 and not train & _pairs(task.validation())


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("42", 1.0),
        ("42 ", 1.0),
        (" 42\n", 1.0),
        ("042", 0.0),
        ("4", 0.0),
        ("", 0.0),
        ("  ", 0.0),
        ("4 2", 0.0),
        ("42+", 0.0),
        ("x42", 0.0),
        ("<reserved_0>", 0.0),
        ("٤٢", 0.0),
        ("43", 0.0),
    ],
)
def test_reward_exact_values(response, reward):
    assert ArithmeticTask(val_size=0).reward(response, "42") == reward


def test_reward_values_are_configurable_and_score_is_float32():
    task = ArithmeticTask(val_size=0, correct_reward=2.5, wrong_reward=-0.5)
    scores = task.score(["42", "042", "198 ", ""], ["42", "42", "198", "0"])
    assert scores.dtype == torch.float32 and scores.shape == (4,)
    assert scores.tolist() == [2.5, -0.5, 2.5, -0.5]
    with pytest.raises(ValueError, match="3 responses but 2 answers"):
        task.score(["1", "2", "3"], ["1", "2"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_digits": 0}, "data.num_digits"),
        ({"num_digits": 10}, "data.num_digits"),
        ({"val_size": 60, "num_digits": 1}, "data.val_size"),
        ({"seed": -1}, "data.seed"),
        ({"seed": 1.5}, "data.seed"),
        ({"correct_reward": float("nan")}, "correct_reward"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


def test_make_task_from_master_config_sections():
    omegaconf = pytest.importorskip("omegaconf")  # the GPU image has no omegaconf
    cfg = omegaconf.OmegaConf.create(
        {
            "data": {"dataset_name": "arithmetic", "num_digits": 2, "val_size": 64, "seed": 5},
            "env": {"arithmetic": {"correct_reward": 1.0, "wrong_reward": -1.0}},
        }
    )
    task = make_task(DataConfig(**cfg.data), EnvConfig(**cfg.env))
    assert isinstance(task, VerifiableTask) and isinstance(task, ArithmeticTask)
    assert task.validation() == ArithmeticTask(val_size=64, seed=5).validation()
    assert task.score(["1", "2"], ["1", "3"]).tolist() == [1.0, -1.0]
    assert make_task(DataConfig(), EnvConfig()).reward("7", "7") == 1.0


def test_make_task_unknown_dataset_names_the_key():
    with pytest.raises(ValueError, match=r"data\.dataset_name='gsm8k'.*arithmetic"):
        make_task(DataConfig(dataset_name="gsm8k"), EnvConfig())


def test_make_task_takes_the_typed_sections_and_refuses_their_dicts():
    env = EnvConfig(arithmetic={"correct_reward": 2.5, "wrong_reward": -0.5})
    task = make_task(DataConfig(num_digits=3, val_size=4, seed=2), env)
    assert task.num_digits == 3 and len(task.validation()) == 4
    assert task.score(["1", "2"], ["1", "3"]).tolist() == [2.5, -0.5]
    assert make_task(DataConfig()).score(["1", "2"], ["1", "3"]).tolist() == [1.0, 0.0]  # env: the defaults
    with pytest.raises(TypeError, match=r"^make_task expects the validated config section DataConfig, got dict: "):
        make_task(DataConfig().model_dump(), env)
    with pytest.raises(TypeError, match=r"^make_task expects the validated config section EnvConfig, got dict: "):
        make_task(DataConfig(), env.model_dump())
