"""NeMo-RL options its current configs use, with NeMo-RL's meaning: `loss_fn.force_on_policy_ratio`,
`grpo.reward_scaling`, and DAPO's answer check (`env.math.math_verify_impl: dapo_math_verify`)."""

import pytest
import torch
from pydantic import ValidationError

from nemo_jetrl.algorithms.config import LossConfig, RewardScalingConfig
from nemo_jetrl.algorithms.dapo import scale_rewards
from nemo_jetrl.algorithms.loss import clipped_pg_loss
from nemo_jetrl.environments.config import MathEnvConfig
from nemo_jetrl.environments.dapo_verify import dapo_check, normalize_answer
from nemo_jetrl.environments.math_env import MathEnvironment


def _pg(force: bool, logp_old: torch.Tensor, **cfg) -> tuple[torch.Tensor, dict, torch.Tensor]:
    torch.manual_seed(0)
    logp = (-torch.rand(2, 5) - 0.1).requires_grad_(True)  # [B, S]
    logp_gen = logp.detach() - 0.05
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    adv = torch.tensor([1.5, -0.5])
    settings = LossConfig(force_on_policy_ratio=force, **cfg)
    loss, metrics = clipped_pg_loss(logp, logp_old, logp_gen, adv, mask, settings)
    loss.backward()
    return loss, metrics, logp.grad


def test_force_on_policy_ratio_uses_the_current_logprobs_as_prev():
    """Ratio 1 whatever prev_logprobs hold: the loss is -A (its value) and the gradient -A d logp / n tokens."""
    far_off = torch.full((2, 5), -9.0)  # prev_logprobs that would clip every token
    loss, metrics, grad = _pg(True, far_off)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([1.5, -0.5]).unsqueeze(-1)
    assert loss.item() == pytest.approx(float(-(adv * mask).sum() / 6))
    assert torch.allclose(grad, -adv * mask / 6)
    assert metrics["probs_ratio"] == 1.0 and metrics["clip_fraction"] == 0.0
    _, unforced, _ = _pg(False, far_off)
    assert unforced["clip_fraction"] == 1.0  # the same inputs without the option: every ratio clipped


def test_force_on_policy_ratio_weights_by_the_current_logprobs_against_the_rollout():
    """The IS weight compares sg(logp) with the rollout's logprobs (logp_gen = logp - 0.05): exp(0.05)."""
    is_cfg = {"use_importance_sampling_correction": True}
    _, metrics, _ = _pg(True, torch.full((2, 5), -9.0), **is_cfg)
    assert metrics["sampling_importance_ratio"] == pytest.approx(torch.exp(torch.tensor(0.05)).item(), rel=1e-6)


def test_reward_scaling_clamps_then_maps_linearly():
    cfg = RewardScalingConfig(enabled=True, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    rewards = torch.tensor([0.0, 1.0, 0.25, 2.0, -3.0])
    assert scale_rewards(rewards, cfg).tolist() == [-1.0, 1.0, -0.5, 1.0, -1.0]
    assert scale_rewards(rewards, RewardScalingConfig()) is rewards  # disabled: untouched
    with pytest.raises(ValidationError, match=r"source_min \(1\) must be < source_max \(1\)"):
        RewardScalingConfig(enabled=True, source_min=1.0, source_max=1.0)


@pytest.mark.parametrize(
    ("response", "reference", "correct", "pred"),
    [
        ("Let me think. 3 + 4 = 7.\nAnswer: 7", "7", True, "7"),
        ("... so the area is\nAnswer: $\\frac{1}{2}$ square units", "\\frac12", True, "\\frac{1}{2}"),
        ("Answer: 1,000 dollars", "1000", True, "1000"),
        ("x = 5, so\nanswer : x = 5", "5", True, "5"),
        ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # strings, not math: no symbolic equivalence
        ("The answer is \\boxed{7}", "7", False, "[INVALID]"),  # no "Answer:" line
        ("Answer: 8\n" + "x" * 400, "8", False, "[INVALID]"),  # only the last 300 characters are read
    ],
)
def test_dapo_answer_check(response, reference, correct, pred):
    assert dapo_check(response, reference) == (correct, pred)


def test_dapo_math_verify_in_the_math_environment():
    env = MathEnvironment(MathEnvConfig(math_verify_impl="dapo_math_verify", correct_reward=1.0, wrong_reward=-1.0))
    rewards = env.score(["Answer: 12", "Answer: 13", "no answer here"], ["12", "12", "12"])
    assert rewards.tolist() == [1.0, -1.0, -1.0]
    assert env.pop_metrics()["parse_failures"] == 1.0 and normalize_answer("\\text{(A)}") == "(A)"
