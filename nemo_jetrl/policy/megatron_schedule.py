"""megatron-core's OptimizerParamScheduler rule as a torch LR scheduler, stepped once per GRPO step.

    policy:
      scheduler:
        name: megatron.core.optimizer_param_scheduler.OptimizerParamScheduler
        kwargs: {init_lr: 5.0e-8, max_lr: 5.0e-7, min_lr: 5.0e-8, lr_warmup_steps: 2, lr_decay_steps: 1000,
                 lr_decay_style: constant, start_wd: 0.0, end_wd: 0.0, wd_incr_steps: 500, wd_incr_style: constant}

The arguments are megatron-core's, in GRPO steps (schema/nemo_rl_megatron.py writes them from a NeMo-RL
`megatron_cfg`). After n steps (n = 0 for the first GRPO step):
- lr: warm-up `init_lr + (max_lr - init_lr) * n / lr_warmup_steps` while n <= lr_warmup_steps (when > 0); then
  `max_lr` for `constant`; `min_lr` past `lr_decay_steps`; `inverse-square-root`: max(min_lr,
  max_lr * sqrt(max(warmup, 1) / max(n, 1))); otherwise `min_lr + c * (max_lr - min_lr)` with r = (n - warmup) /
  (decay - warmup), c = 1 - r (`linear`) or (cos(pi r) + 1) / 2 (`cosine`);
- weight decay: `end_wd` past `wd_incr_steps` or for `constant`; else start_wd + c * (end_wd - start_wd) with
  r = n / wd_incr_steps, c = r (`linear`) or (cos(pi (1 - r)) + 1) / 2 (`cosine`); times each group's `wd_mult`
  (0 for the 1-D parameters when `policy.optimizer.decay_1d_params: false`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

MEGATRON = "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler"  # the `policy.scheduler` name
KWARGS = (
    "init_lr", "max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style", "start_wd", "end_wd",
    "wd_incr_steps", "wd_incr_style",
)  # fmt: skip
DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")
WD_STYLES = ("constant", "linear", "cosine")


def check_megatron_schedule(kwargs: Mapping[str, Any]) -> None:
    """megatron-core's own assertions, as one ValueError naming `policy.scheduler.kwargs`."""
    where = "policy.scheduler.kwargs"
    if not isinstance(kwargs, Mapping) or set(kwargs) != set(KWARGS):
        got = sorted(kwargs) if isinstance(kwargs, Mapping) else kwargs
        raise ValueError(f"{where} of {MEGATRON} needs exactly {', '.join(KWARGS)}; got {got}")
    k = dict(kwargs)
    if k["lr_decay_style"] not in DECAY_STYLES:
        raise ValueError(f"{where}.lr_decay_style: {k['lr_decay_style']!r} is not one of {', '.join(DECAY_STYLES)}")
    if k["wd_incr_style"] not in WD_STYLES:
        raise ValueError(f"{where}.wd_incr_style: {k['wd_incr_style']!r} is not one of {', '.join(WD_STYLES)}")
    for name in ("init_lr", "max_lr", "min_lr", "start_wd", "end_wd"):
        if isinstance(k[name], bool) or not isinstance(k[name], int | float) or not math.isfinite(k[name]):
            raise ValueError(f"{where}.{name} must be a finite number, got {k[name]!r}")
    for name in ("lr_warmup_steps", "lr_decay_steps", "wd_incr_steps"):
        if isinstance(k[name], bool) or not isinstance(k[name], int) or k[name] < 0:
            raise ValueError(f"{where}.{name} must be an integer >= 0, got {k[name]!r}")
    problems = []
    if not 0 <= k["min_lr"] <= k["max_lr"] or k["init_lr"] > k["max_lr"]:
        problems.append(f"0 <= min_lr ({k['min_lr']:g}) <= max_lr ({k['max_lr']:g}) and init_lr ({k['init_lr']:g}) "
                        "<= max_lr")  # fmt: skip
    if not 0 <= k["lr_warmup_steps"] < k["lr_decay_steps"]:
        problems.append(
            f"lr_warmup_steps ({k['lr_warmup_steps']}) < lr_decay_steps ({k['lr_decay_steps']}) (NeMo-RL: "
            "megatron_cfg.scheduler.lr_warmup_iters < lr_decay_iters, a null lr_decay_iters = grpo.max_num_steps)"
        )
    if not 0 <= k["start_wd"] <= k["end_wd"] or (k["wd_incr_style"] == "constant" and k["start_wd"] != k["end_wd"]):
        problems.append(f"0 <= start_wd ({k['start_wd']:g}) <= end_wd ({k['end_wd']:g}), equal for constant")
    if k["wd_incr_style"] != "constant" and k["wd_incr_steps"] == 0:
        problems.append("wd_incr_steps > 0 for a weight-decay ramp")
    if problems:
        raise ValueError(f"{where} of {MEGATRON} needs " + "; ".join(problems))


def megatron_lr(k: Mapping[str, Any], n: int) -> float:
    """The learning rate after `n` scheduler steps (megatron-core's get_lr)."""
    warmup, decay, max_lr, min_lr = k["lr_warmup_steps"], k["lr_decay_steps"], k["max_lr"], k["min_lr"]
    if warmup > 0 and n <= warmup:
        return k["init_lr"] + (max_lr - k["init_lr"]) * n / warmup
    if k["lr_decay_style"] == "constant":
        return max_lr
    if n > decay:
        return min_lr
    if k["lr_decay_style"] == "inverse-square-root":
        return max(min_lr, max_lr * math.sqrt(max(warmup, 1)) / math.sqrt(max(n, 1)))
    ratio = (n - warmup) / (decay - warmup)
    coeff = 1.0 - ratio if k["lr_decay_style"] == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (max_lr - min_lr)


def megatron_wd(k: Mapping[str, Any], n: int) -> float:
    """The weight decay after `n` scheduler steps (megatron-core's get_wd)."""
    if n > k["wd_incr_steps"] or k["wd_incr_style"] == "constant":
        return k["end_wd"]
    ratio = n / k["wd_incr_steps"]
    coeff = ratio if k["wd_incr_style"] == "linear" else 0.5 * (math.cos(math.pi * (1.0 - ratio)) + 1.0)
    return k["start_wd"] + coeff * (k["end_wd"] - k["start_wd"])


class MegatronParamScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Sets every group's lr and weight decay from `megatron_lr` / `megatron_wd` at `last_epoch` (= GRPO steps
    taken; construction applies step 0, as megatron-core's `step(0)`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs: Any):
        check_megatron_schedule(kwargs)
        self.megatron_kwargs = dict(kwargs)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [megatron_lr(self.megatron_kwargs, self.last_epoch)] * len(self.optimizer.param_groups)

    def step(self, epoch: None = None) -> None:
        super().step(epoch)
        wd = megatron_wd(self.megatron_kwargs, self.last_epoch)
        for group in self.optimizer.param_groups:
            group["weight_decay"] = wd * group.get("wd_mult", 1.0)
