"""megatron-core's OptimizerParamScheduler rule (policy/megatron_schedule.py): lr and weight decay per GRPO step, the
1-D parameters' weight-decay group, and the checks megatron-core asserts."""

import math

import pytest
import torch

from nemo_jetrl.policy.config import OptimizerConfig
from nemo_jetrl.policy.lr_scheduler import build_lr_scheduler
from nemo_jetrl.policy.megatron_schedule import megatron_lr
from nemo_jetrl.policy.trainer_setup import build_optimizer

NAME = "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler"
BASE = {
    "init_lr": 1.0e-7, "max_lr": 1.0e-5, "min_lr": 1.0e-6, "lr_warmup_steps": 2, "lr_decay_steps": 6,
    "lr_decay_style": "linear", "start_wd": 0.01, "end_wd": 0.01, "wd_incr_steps": 6, "wd_incr_style": "constant",
}  # fmt: skip
ADAMW = OptimizerConfig(lr=1.0e-5, weight_decay=0.01)


def lrs_and_wds(kwargs: dict, steps: int, decay_1d: bool = True) -> tuple[list[float], list[list[float]]]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model.parameters(), ADAMW.model_copy(update={"decay_1d_params": decay_1d}))
    scheduler = build_lr_scheduler(optimizer, {"name": NAME, "kwargs": kwargs})
    lrs, wds = [], []
    for _ in range(steps):  # what the trainer logs: the lr of the step, then one scheduler step per GRPO step
        lrs.append(optimizer.param_groups[0]["lr"])
        wds.append([g["weight_decay"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return lrs, wds


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        # warm-up 1e-7 -> 1e-5 over 2 steps (step 2 reaches max_lr), then decay to 1e-6 by step 6, min_lr after
        ("constant", [1e-7, 5.05e-6, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5]),
        ("linear", [1e-7, 5.05e-6, 1e-5, 7.75e-6, 5.5e-6, 3.25e-6, 1e-6, 1e-6]),
        ("cosine", [1e-7, 5.05e-6, 1e-5, 1e-6 + 9e-6 * (1 + math.cos(math.pi / 4)) / 2, 5.5e-6,
                    1e-6 + 9e-6 * (1 + math.cos(3 * math.pi / 4)) / 2, 1e-6, 1e-6]),  # fmt: skip
        ("inverse-square-root", [1e-7, 5.05e-6, 1e-5, 1e-5 * math.sqrt(2 / 3), 1e-5 * math.sqrt(2 / 4),
                                 1e-5 * math.sqrt(2 / 5), 1e-5 * math.sqrt(2 / 6), 1e-6]),  # fmt: skip
    ],
)
def test_lr_per_grpo_step_follows_megatron_core(style, expected):
    kwargs = {**BASE, "lr_decay_style": style}
    lrs, _ = lrs_and_wds(kwargs, len(expected))
    assert lrs == pytest.approx(expected, rel=1e-12, abs=0)
    assert lrs == [megatron_lr(kwargs, n) for n in range(len(expected))]  # bit for bit the rule


def test_weight_decay_ramp_and_no_decay_on_1d_parameters():
    kwargs = {**BASE, "start_wd": 0.0, "end_wd": 0.1, "wd_incr_steps": 4, "wd_incr_style": "linear"}
    _, wds = lrs_and_wds(kwargs, 6, decay_1d=False)
    assert [w[1] for w in wds] == [0.0] * 6  # biases and norm weights: wd_mult 0
    assert [w[0] for w in wds] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
    _, cosine = lrs_and_wds({**kwargs, "wd_incr_style": "cosine"}, 3)
    assert [w[0] for w in cosine] == pytest.approx([0.0, 0.1 * (1 + math.cos(math.pi * 0.75)) / 2, 0.05])
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = build_optimizer(model.parameters(), ADAMW.model_copy(update={"decay_1d_params": False})).param_groups
    assert [len(g["params"]) for g in groups] == [1, 3] and groups[1]["wd_mult"] == 0.0  # weight | bias, norm w, b


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"lr_warmup_steps": 6}, r"lr_warmup_steps \(6\) < lr_decay_steps \(6\)"),
        ({"min_lr": 2e-5}, r"min_lr \(2e-05\) <= max_lr"),
        ({"start_wd": 0.0}, r"equal for constant"),
        ({"lr_decay_style": "WSD"}, r"lr_decay_style: 'WSD' is not one of"),
        ({"lr_decay_steps": True}, r"lr_decay_steps must be an integer >= 0"),
    ],
)
def test_what_megatron_core_asserts_is_a_config_error(change, expected):
    with pytest.raises(ValueError, match=expected):
        lrs_and_wds({**BASE, **change}, 1)
