"""Group advantages: hand-computed values for mean / leave-one-out baselines, with and without std division."""

import math
import random
import statistics

import pytest
import torch

from nemo_jetrl.algorithms.advantages import group_advantages, reward_metrics, zero_std_groups

EPS = 1e-6


def test_mean_baseline_with_std():
    # group 0 = [1, 0, 0, 1]: mean 0.5 -> centred [.5, -.5, -.5, .5];
    #   unbiased var = (4 * 0.25) / 3 = 1/3 -> std = sqrt(1/3) = 0.57735; adv = +-0.5 / (0.57735 + 1e-6)
    # group 1 = [1, 1, 1, 1]: all equal -> 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    a = 0.5 / (math.sqrt(1 / 3) + EPS)  # 0.866024...
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, 4), expected, rtol=1e-6, atol=0)


def test_mean_baseline_without_std():
    # group 0 = [3, 1, 2]: mean 2 -> [1, -1, 0]; group 1 = [0, 0, 6]: mean 2 -> [-2, -2, 4]
    rewards = torch.tensor([3.0, 1.0, 2.0, 0.0, 0.0, 6.0])
    out = group_advantages(rewards, 3, normalize_std=False)
    assert torch.equal(out, torch.tensor([1.0, -1.0, 0.0, -2.0, -2.0, 4.0]))


def test_leave_one_out_baseline_and_std():
    # [1, 0, 0, 1]: sample 0 sees others [0, 0, 1]: baseline 1/3 -> adv 2/3;
    #   std of [0, 0, 1] (unbiased): devs^2 = 1/9 + 1/9 + 4/9 = 2/3, / (3 - 1) = 1/3 -> sqrt(1/3).
    #   sample 1 sees [1, 0, 1]: baseline 2/3 -> adv -2/3, devs^2 = 1/9 + 4/9 + 1/9 -> same std.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a = (2 / 3) / (math.sqrt(1 / 3) + EPS)
    torch.testing.assert_close(
        group_advantages(rewards, 4, leave_one_out=True), torch.tensor([a, -a, -a, a]), rtol=1e-6, atol=0
    )
    raw = group_advantages(rewards, 4, leave_one_out=True, normalize_std=False)
    torch.testing.assert_close(raw, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]), rtol=1e-6, atol=0)


def test_leave_one_out_changes_the_std():
    # [1, 1, 0] with LOO: sample 0 -> others [1, 0]: baseline .5, adv .5, std(unbiased) = sqrt(.5) = .70711
    #   sample 2 -> others [1, 1]: baseline 1, adv -1, std 0 -> left unnormalized (NeMo-RL: only std > 0 divides)
    rewards = torch.tensor([1.0, 1.0, 0.0])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(
        group_advantages(rewards, 3, leave_one_out=True), torch.tensor([a, a, -1.0]), rtol=1e-6, atol=0
    )
    # Mean baseline on the same group: mean 2/3, std = sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3)
    b = (1 / 3) / (math.sqrt(1 / 3) + EPS)
    torch.testing.assert_close(group_advantages(rewards, 3), torch.tensor([b, b, -2 * b]), rtol=1e-6, atol=0)


def test_leave_one_out_matches_reference_loop():
    rng = random.Random(0)
    g = 5
    rewards = [rng.choice([0.0, 0.5, 1.0]) for _ in range(4 * g)]
    expected = []
    for start in range(0, len(rewards), g):
        group = rewards[start : start + g]
        for i in range(g):
            others = group[:i] + group[i + 1 :]
            base, std = statistics.fmean(others), statistics.stdev(others)
            adv = group[i] - base
            expected.append(0.0 if len(set(group)) == 1 else (adv / (std + EPS) if std > 0 else adv))
    out = group_advantages(torch.tensor(rewards, dtype=torch.float64), g, leave_one_out=True)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_small_groups():
    # G = 2 with LOO: the baseline is the other reward, one sample has no spread -> std 0 -> no division.
    out = group_advantages(torch.tensor([1.0, 0.0]), 2, leave_one_out=True)
    assert torch.equal(out, torch.tensor([1.0, -1.0]))
    # G = 2 mean baseline: [1, 0] -> [.5, -.5], std = sqrt(.5) -> .5 / (.70711 + 1e-6)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(group_advantages(torch.tensor([1.0, 0.0]), 2), torch.tensor([a, -a]))
    # G = 1: no group to compare against -> 0 (NeMo-RL sets baseline = reward)
    assert torch.equal(group_advantages(torch.tensor([3.0, 5.0]), 1), torch.zeros(2))


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_all_equal_groups_are_exactly_zero_and_dropped(leave_one_out):
    # 0.1 * 3 / 3 != 0.1 in floating point: the advantage must still be exactly 0.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    out = group_advantages(rewards, 3, leave_one_out=leave_one_out)
    assert torch.equal(out[:3], torch.zeros(3)) and torch.equal(out[6:], torch.zeros(3))
    assert (out[3:6] != 0).all()
    drop = zero_std_groups(rewards, 3)
    assert drop.dtype == torch.bool
    assert drop.tolist() == [True] * 3 + [False] * 3 + [True] * 3


def test_reward_metrics():
    # groups [1, 0] and [1, 1]: mean 3/4; population var = (3 * 1/16 + 9/16) / 4 = 3/16; best per group 1, 1
    m = reward_metrics(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    assert m["reward_mean"] == 0.75
    assert m["reward_std"] == pytest.approx(math.sqrt(3 / 16), rel=1e-6)
    assert m["reward_group_best_mean"] == 1.0
    assert m["zero_std_group_fraction"] == 0.5


@pytest.mark.parametrize(
    "rewards, g, match",
    [
        (torch.zeros(2, 3), 3, "1-D"),
        (torch.zeros(7), 3, "multiple of group_size"),
        (torch.zeros(6), 0, "group_size"),
        (torch.tensor([1.0, float("nan")]), 2, "NaN"),
    ],
)
def test_bad_input(rewards, g, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, g)
