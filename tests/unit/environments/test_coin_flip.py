"""env.coin_flip_rewards: the task's prompts, seeded coin-flip rewards (speed runs on random weights)."""

import torch

from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.environments import factory
from nemo_jetrl.environments.arithmetic import ArithmeticTask
from nemo_jetrl.environments.coin_flip import CoinFlipRewards
from nemo_jetrl.environments.config import EnvConfig


def test_rewards_are_seeded_coin_flips_of_the_response_text():
    task = CoinFlipRewards(
        ArithmeticTask(num_digits=2, val_size=8, seed=3), seed=5, correct_reward=1.0, wrong_reward=-0.5
    )
    texts = [f"garbage {i}" for i in range(2000)]
    rewards = task.score(texts, ["0"] * len(texts))
    assert rewards.dtype == torch.float32 and set(rewards.tolist()) == {1.0, -0.5}
    heads = int((rewards == 1.0).sum())
    assert 900 < heads < 1100  # a fair coin: 1000 +- 4.5 standard deviations
    assert torch.equal(task.score(texts[:50], ["x"] * 50), rewards[:50])  # the text decides, not the answer or order
    assert torch.equal(task.score(texts[::-1], ["0"] * len(texts)), rewards.flip(0))
    other_seed = CoinFlipRewards(task.task, seed=6, correct_reward=1.0, wrong_reward=-0.5).score(texts, ["0"] * 2000)
    assert 0.4 < float((other_seed != rewards).float().mean()) < 0.6  # another seed, other flips


def test_make_task_wraps_only_when_asked_and_keeps_the_prompts():
    data = DataConfig(dataset_name="arithmetic", num_digits=2, val_size=8, seed=11)
    plain = factory.make_task(data, EnvConfig())
    flipped = factory.make_task(data, EnvConfig(coin_flip_rewards=True, arithmetic={"correct_reward": 2.0}))
    assert isinstance(plain, ArithmeticTask) and isinstance(flipped, CoinFlipRewards)
    assert flipped.train_batch(4, 6) == plain.train_batch(4, 6) and flipped.validation(3) == plain.validation(3)
    problem = plain.train_batch(0, 1)[0]
    right = plain.score([problem.answer], [problem.answer])  # the task's own reward of a right answer: 1
    assert float(right[0]) == 1.0
    assert set(flipped.score([f"r{i}" for i in range(64)], [problem.answer] * 64).tolist()) == {0.0, 2.0}
