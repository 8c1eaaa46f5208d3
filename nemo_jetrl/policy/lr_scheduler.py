"""`policy.scheduler`: NeMo-RL's LR schedule spelling, built onto a torch optimizer.

    scheduler:
      - {name: torch.optim.lr_scheduler.LinearLR, kwargs: {start_factor: 0.1, end_factor: 1.0, total_iters: 50}}
      - {name: torch.optim.lr_scheduler.ConstantLR, kwargs: {factor: 1.0, total_iters: 10000000000}}
      - {milestones: [50]}

Several named schedulers are chained by `torch.optim.lr_scheduler.SequentialLR` at the milestones (one fewer
milestone than schedulers); one named scheduler (a list of one, or a bare mapping) is used as is; null = no
scheduler (constant lr). As in NeMo-RL, the trainer steps the scheduler once per GRPO step (once per `train()`
call, after all of that step's optimizer steps), so `total_iters` and milestones count GRPO steps.
`{name: megatron.core.optimizer_param_scheduler.OptimizerParamScheduler, kwargs: {...}}` is megatron-core's rule
(lr and weight decay; policy/megatron_schedule.py), what a NeMo-RL `megatron_cfg.scheduler` maps to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where schedulers are built: the config schema imports the checks alone
    import torch

PREFIX = "torch.optim.lr_scheduler."
KEY = "policy.scheduler"


def _is_megatron(cfg: Any) -> bool:
    """A bare mapping naming megatron-core's scheduler (its module imports torch: only a mapping pays for it)."""
    if not isinstance(cfg, Mapping):
        return False
    from nemo_jetrl.policy.megatron_schedule import MEGATRON

    return cfg.get("name") == MEGATRON


def _entries(cfg: Any) -> list[Mapping[str, Any]]:
    if isinstance(cfg, Mapping):
        return [cfg]
    if isinstance(cfg, Sequence) and not isinstance(cfg, str):
        return list(cfg)
    raise ValueError(f"{KEY} must be a list of {{name, kwargs}} entries (+ {{milestones}}) or null, got {cfg!r}")


def check_scheduler_config(cfg: Any) -> None:
    """Structure checks without building anything; ValueError naming `policy.scheduler[i]`."""
    if cfg is None:
        return
    if _is_megatron(cfg):
        from nemo_jetrl.policy.megatron_schedule import MEGATRON, check_megatron_schedule

        if set(cfg) - {"name", "kwargs"}:
            raise ValueError(f"{KEY} ({MEGATRON}) holds name and kwargs only, got keys {sorted(cfg)}")
        check_megatron_schedule(cfg.get("kwargs") or {})
        return
    named, milestones = 0, None
    for i, entry in enumerate(_entries(cfg)):
        where = f"{KEY}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a mapping, got {entry!r}")
        keys = set(entry)
        if "milestones" in keys:
            ms = entry["milestones"]
            if keys != {"milestones"} or not isinstance(ms, Sequence) or isinstance(ms, str):
                raise ValueError(f"{where}: a milestones entry holds only `milestones: [int, ...]`, got {dict(entry)}")
            if not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in ms) or list(ms) != sorted(ms):
                raise ValueError(f"{where}.milestones must be increasing positive ints, got {list(ms)}")
            milestones = list(ms)
            continue
        if not keys <= {"name", "kwargs"} or "name" not in keys:
            raise ValueError(f"{where} needs `name` (and optional `kwargs`), got keys {sorted(keys)}")
        name = entry["name"]
        if not isinstance(name, str) or not name.startswith(PREFIX) or not name[len(PREFIX) :].isidentifier():
            raise ValueError(f"{where}.name must be {PREFIX}<Class>, got {name!r}")
        if not isinstance(entry.get("kwargs") or {}, Mapping):
            raise ValueError(f"{where}.kwargs must be a mapping, got {entry['kwargs']!r}")
        named += 1
    if named == 0:
        raise ValueError(f"{KEY} names no scheduler (an entry needs name: {PREFIX}<Class>)")
    if named > 1 and (milestones is None or len(milestones) != named - 1):
        got = "none" if milestones is None else len(milestones)
        raise ValueError(f"{KEY}: {named} schedulers need a {{milestones: [...]}} entry with {named - 1}, got {got}")


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: Any) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The configured scheduler on `optimizer` (None for null); unknown classes or kwargs are one-line errors."""
    import torch

    check_scheduler_config(cfg)
    if cfg is None:
        return None
    if _is_megatron(cfg):
        from nemo_jetrl.policy.megatron_schedule import MegatronParamScheduler

        return MegatronParamScheduler(optimizer, **cfg["kwargs"])
    schedulers, milestones = [], []
    for i, entry in enumerate(_entries(cfg)):
        if "milestones" in entry:
            milestones = list(entry["milestones"])
            continue
        cls_name = entry["name"][len(PREFIX) :]
        cls = getattr(torch.optim.lr_scheduler, cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.lr_scheduler.LRScheduler)):
            raise ValueError(f"{KEY}[{i}].name: {entry['name']!r} is not a torch LR scheduler")
        try:
            schedulers.append(cls(optimizer, **dict(entry.get("kwargs") or {})))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{KEY}[{i}] ({cls_name}): {exc}") from None
    if len(schedulers) == 1:
        return schedulers[0]
    return torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones)
