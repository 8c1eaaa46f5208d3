"""policy.scheduler (NeMo-RL's list form), several optimizer steps per GRPO step, scheduler state in checkpoints."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.config import load_config
from nemo_jetrl.policy.interfaces import TrainBatch, split_global_batches
from nemo_jetrl.policy.lr_scheduler import build_lr_scheduler
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.schema import validate_config

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
LOSS_FN = ClippedPGLossFn(validate_config(load_config(CONFIGS / "grpo_tiny_base.yaml")).loss_fn)
WARMUP = [
    {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 3}},
    {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": 10_000_000_000}},
    {"milestones": [3]},
]


def _lrs(cfg, steps: int, lr: float = 1.0) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = build_lr_scheduler(opt, cfg)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_linear_warmup_then_constant():
    # LinearLR: factor 0.1 + 0.9 k / 3 for k < 3, then ConstantLR(1.0) from milestone 3 on.
    assert _lrs(WARMUP, 6) == pytest.approx([0.1, 0.4, 0.7, 1.0, 1.0, 1.0], rel=1e-12)


def test_single_scheduler_without_milestones():
    cosine = [{"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 4, "eta_min": 0.0}}]
    expected = [(1 + math.cos(math.pi * k / 4)) / 2 for k in range(5)]
    assert _lrs(cosine, 5) == pytest.approx(expected, abs=1e-12)
    assert _lrs(cosine[0], 5) == pytest.approx(expected, abs=1e-12)  # a bare mapping, as NeMo-RL accepts


@pytest.mark.parametrize(
    "cfg, message",
    [
        ([{"name": "torch.optim.lr_scheduler.NoSuchLR"}], r"policy.scheduler\[0\].name: .* is not a torch LR"),
        (
            [{"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"bogus": 1}}],
            r"policy.scheduler\[0\] \(LinearLR\)",
        ),
        (WARMUP[:2], r"2 schedulers need a \{milestones"),
        ([{"name": "LinearLR"}], r"policy.scheduler\[0\].name must be torch.optim.lr_scheduler.<Class>"),
        ([{"milestones": [3]}], "names no scheduler"),
    ],
)
def test_bad_scheduler_configs_are_one_line_errors(cfg, message):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message) as err:
        build_lr_scheduler(opt, cfg)
    assert "\n" not in str(err.value)


def test_split_global_batches_is_contiguous_and_keeps_rows():
    batch = _rows(8)
    chunks = split_global_batches(batch, 4, keep=torch.tensor([1, 0, 1, 1, 0, 0, 0, 0]).bool())
    assert [c.advantages.tolist() for c in chunks] == [[0.0, 2.0, 3.0]]  # the all-dropped chunk is no step
    assert [c.advantages.tolist() for c in split_global_batches(batch, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="does not split"):
        split_global_batches(batch, 3)


def _rows(n: int) -> TrainBatch:
    z = torch.zeros(n, 2)
    return TrainBatch(z.long(), z.long(), z.long(), torch.arange(n).float(), z)


def _policy(scheduler) -> NativePolicy:
    overrides = [
        "policy.precision=bf16",
        "policy.generation.precision=bf16",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "policy.train_micro_batch_size=4",
        "policy.optimizer.lr=1e-3",
    ]
    cfg = validate_config(load_config(CONFIGS / "grpo_tiny_base.yaml", overrides))
    policy_cfg = cfg.policy.model_copy(update={"scheduler": scheduler})
    return NativePolicy(policy_cfg, PrecisionRecipe.from_config(policy_cfg), torch.device("cpu"))


def _batch(policy: NativePolicy, n: int = 8) -> TrainBatch:
    prompts = [f"{a:02d}+{b:02d}={a + b}" for a, b in zip(range(10, 10 + n), range(50, 50 + n))]
    enc = policy.tokenizer(prompts, padding=True, return_tensors="pt")
    response = torch.zeros_like(enc["attention_mask"])
    response[:, -3:] = 1
    zeros = torch.zeros(enc["input_ids"].shape)
    return TrainBatch(enc["input_ids"], enc["attention_mask"], response, torch.linspace(-1, 1, n), zeros, zeros.clone())


def test_two_optimizer_steps_then_one_scheduler_step_and_checkpointed_state():
    policy = _policy(WARMUP)
    fresh = copy.deepcopy(policy)
    batch = _batch(policy)
    metrics = policy.train(split_global_batches(batch, 4), LOSS_FN)
    assert policy.step == 2 and metrics["num_optimizer_steps"] == 2.0 and metrics["num_micro_batches"] == 2.0
    assert metrics["lr"] == pytest.approx(1e-4, rel=1e-9)  # both steps ran at the warm-up's first lr
    assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(4e-4, rel=1e-9)  # one scheduler step
    # The same as the two chunks' optimizer steps one by one (contiguous rows, no shuffle).
    one_by_one = copy.deepcopy(fresh)
    for chunk in split_global_batches(batch, 4):
        one_by_one._optimizer_step(chunk, LOSS_FN)
    for (name, p), q in zip(policy.model.named_parameters(), one_by_one.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    # The scheduler state travels with the checkpoint: a restored policy continues the warm-up at 0.7e-3.
    state = copy.deepcopy(policy.state_dict())
    policy.train(batch, LOSS_FN)
    fresh.load_state_dict(state)
    fresh.train(batch, LOSS_FN)
    assert fresh.optimizer.param_groups[0]["lr"] == policy.optimizer.param_groups[0]["lr"]
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(7e-4, rel=1e-9)
