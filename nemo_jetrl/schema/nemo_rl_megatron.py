"""`policy.megatron_cfg.enabled: true`: a NeMo-RL Megatron config trained by our FSDP2 trainer.

What has a meaning here is mapped before the key table runs (the keys below are consumed; the table's `megatron`
lines document them): tensor parallel -> DTensor TP (`policy.dtensor_cfg.tensor_parallel_size`), pipeline parallel
-> more FSDP sharding (its ranks join the data-parallel ones), activation recompute -> activation checkpointing,
`megatron_cfg.optimizer` -> `policy.optimizer` (+ `policy.max_grad_norm` from `clip_grad`), `megatron_cfg.scheduler`
-> megatron-core's OptimizerParamScheduler in GRPO steps (`policy.scheduler`, policy/megatron_schedule.py), the MoE
router switches -> `policy.freeze_moe_router` / `policy.router_aux_loss_coef` (no effect on dense models). As in
NeMo-RL, the DTensor keys (`policy.dtensor_cfg`, `policy.optimizer`, `policy.scheduler`) are not read then.
With `enabled: false` NeMo-RL reads nothing of megatron_cfg; we keep only `fp8_cfg` (FP8 training, the table).

Scheduler units, as NeMo-RL's Megatron worker: it steps megatron-core's scheduler once per train() call with
`increment=gbs` while Megatron-Bridge scales every `*_iters` by gbs, so warm-up / decay count GRPO steps, and
`lr_decay_iters: null` (and the weight-decay ramp) span `train_iters`, which NeMo-RL sets to `grpo.max_num_steps`
(capped by the epochs, which do not stop a run here).
"""

from __future__ import annotations

from typing import Any

from nemo_jetrl.config.errors import format_value
from nemo_jetrl.config.nemo_rl_rules import get_path
from nemo_jetrl.policy.megatron_schedule import DECAY_STYLES, MEGATRON, WD_STYLES

CONSUMED = {
    "": (
        "enabled", "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
        "activation_checkpointing", "recompute_granularity", "recompute_modules", "recompute_method",
        "recompute_num_layers", "freeze_moe_router", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
        "env_vars",
    ),
    "optimizer": ("optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad"),
    "scheduler": (
        "lr_warmup_iters", "lr_warmup_init", "lr_decay_style", "lr_decay_iters", "start_weight_decay",
        "end_weight_decay", "weight_decay_incr_style",
    ),
}  # fmt: skip
KEPT_WHEN_DISABLED = ("fp8_cfg",)


def map_megatron(tree: dict) -> tuple[dict, list[str], list[str]]:
    """(tree with megatron_cfg mapped onto our keys, start-up lines, errors)."""
    policy = tree.get("policy")
    mcfg = policy.get("megatron_cfg") if isinstance(policy, dict) else None
    if not isinstance(mcfg, dict):
        return tree, [], []
    if mcfg.get("enabled") is not True:
        kept = {k: v for k, v in mcfg.items() if k in KEPT_WHEN_DISABLED}
        return {**tree, "policy": {**policy, "megatron_cfg": kept}}, [], []
    errors: list[str] = []
    optimizer, clip = _optimizer(mcfg.get("optimizer") or {}, errors)
    max_steps = get_path(tree, "grpo.max_num_steps", 100)
    scheduler = _scheduler(mcfg.get("scheduler") or {}, optimizer, mcfg.get("optimizer") or {}, max_steps, errors)
    tp, pp = mcfg.get("tensor_model_parallel_size", 1), mcfg.get("pipeline_model_parallel_size", 1)
    recompute = mcfg.get("activation_checkpointing") is True
    dtensor = {"tensor_parallel_size": tp}
    if recompute:  # policy.dtensor_cfg.activation_checkpointing: the trainer's own switch (issue 43)
        dtensor["activation_checkpointing"] = True
    if mcfg.get("env_vars"):  # NeMo-RL: the Megatron workers' environment; here the trainer's (utils/process_env.py)
        dtensor["env_vars"] = mcfg["env_vars"]
    mapped = {k: v for k, v in policy.items() if k not in ("dtensor_cfg", "optimizer", "scheduler", "max_grad_norm")}
    mapped.update(dtensor_cfg=dtensor, optimizer=optimizer, scheduler=scheduler, max_grad_norm=clip)
    mapped.update(_moe_router(mcfg, policy, errors))
    mapped["megatron_cfg"] = _unconsumed(mcfg)
    notes = [_layout_line(tp, pp, mcfg.get("sequence_parallel") is True, recompute, mcfg)]
    notes += _value_lines(optimizer, clip, scheduler)
    return {**tree, "policy": mapped}, notes, errors


def _moe_router(mcfg: dict, policy: dict, errors: list[str]) -> dict:
    """`freeze_moe_router` -> `policy.freeze_moe_router`; `moe_router_load_balancing_type` `none` -> no load-balancing
    loss, `aux_loss` -> HF's (policy/moe_step.py) with `moe_aux_loss_coeff` or the model config's coefficient."""
    out: dict[str, Any] = {}
    if mcfg.get("freeze_moe_router") is not None and "freeze_moe_router" not in policy:
        out["freeze_moe_router"] = bool(mcfg["freeze_moe_router"])
    balancing = mcfg.get("moe_router_load_balancing_type")
    if balancing is None or "router_aux_loss_coef" in policy:
        return out
    if balancing in ("none", ["none"]):
        out["router_aux_loss_coef"] = 0.0
    elif balancing in ("aux_loss", ["aux_loss"]):
        out["router_aux_loss_coef"] = mcfg.get("moe_aux_loss_coeff")
    else:
        errors.append(
            f"policy.megatron_cfg.moe_router_load_balancing_type: {format_value(balancing)} is not supported here "
            "(Megatron's per-sequence / global-batch balancing losses); set aux_loss (HF's load-balancing loss) or none"
        )
    return out


def _unconsumed(mcfg: dict) -> dict:
    out = {k: v for k, v in mcfg.items() if k not in CONSUMED[""]}
    for section in ("optimizer", "scheduler"):
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in CONSUMED[section]}
    return out


def _optimizer(opt: dict, errors: list[str]) -> tuple[dict, float | None]:
    """Megatron's `adam` is AdamW (decoupled weight decay, not on biases and norm weights); clip_grad 0 = none."""
    key = "policy.megatron_cfg.optimizer"
    if opt.get("optimizer", "adam") != "adam":
        errors.append(
            f"{key}.optimizer: {format_value(opt['optimizer'])} is not supported here (Megatron's adam = AdamW "
            "only); set adam"
        )
    out = {
        "name": "adamw",
        "lr": opt.get("lr", 5.0e-5),
        "weight_decay": opt.get("weight_decay", 0.01),
        "betas": [opt.get("adam_beta1", 0.9), opt.get("adam_beta2", 0.999)],
        "eps": opt.get("adam_eps", 1.0e-8),
        "decay_1d_params": False,
    }
    clip = opt.get("clip_grad", 1.0)
    return out, (None if clip == 0 else clip)


def _scheduler(sched: dict, optimizer: dict, opt: dict, max_steps: Any, errors: list[str]) -> dict:
    """megatron-core's OptimizerParamScheduler arguments, in GRPO steps (NeMo-RL's increment=gbs cancels Bridge's
    scaling of every `*_iters` by the global batch)."""
    key = "policy.megatron_cfg.scheduler"
    lr, wd = optimizer["lr"], optimizer["weight_decay"]
    decay_iters = sched.get("lr_decay_iters")
    kwargs = {
        "init_lr": sched.get("lr_warmup_init", 0.0),
        "max_lr": lr,
        "min_lr": opt.get("min_lr", 0.0),
        "lr_warmup_steps": sched.get("lr_warmup_iters", 0),
        "lr_decay_steps": max_steps if decay_iters is None else decay_iters,
        "lr_decay_style": sched.get("lr_decay_style", "linear"),
        "start_wd": sched.get("start_weight_decay", wd),
        "end_wd": sched.get("end_weight_decay", wd),
        "wd_incr_steps": max_steps,
        "wd_incr_style": sched.get("weight_decay_incr_style", "constant"),
    }
    if kwargs["lr_decay_style"] not in DECAY_STYLES:
        errors.append(
            f"{key}.lr_decay_style: {format_value(kwargs['lr_decay_style'])} is not supported here (one of "
            f"{', '.join(DECAY_STYLES)})"
        )
    if kwargs["wd_incr_style"] not in WD_STYLES:
        errors.append(
            f"{key}.weight_decay_incr_style: {format_value(kwargs['wd_incr_style'])} is not supported here (one of "
            f"{', '.join(WD_STYLES)})"
        )
    return {"name": MEGATRON, "kwargs": kwargs}


def _layout_line(tp: Any, pp: Any, sp: bool, recompute: bool, mcfg: dict) -> str:
    parts = [f"TP {tp} -> DTensor TP {tp}"]
    if pp != 1:
        parts.append(f"PP {pp} -> FSDP sharding (its ranks join data parallelism)")
    if sp:
        parts.append("sequence_parallel -> TP without it (activation memory only, same numbers)")
    if recompute:
        granularity = mcfg.get("recompute_granularity", "full")
        parts.append(f"recompute ({granularity}) -> activation checkpointing")
    parts.append("optimizer/scheduler from megatron_cfg")
    moe = [
        *(["routers frozen"] if mcfg.get("freeze_moe_router") else []),
        *(["no load-balancing loss"] if mcfg.get("moe_router_load_balancing_type") in ("none", ["none"]) else []),
    ]
    if moe:
        parts.append(f"MoE: {', '.join(moe)}")
    return "megatron_cfg: trained by nemo-jetrl's FSDP2 trainer: " + ", ".join(parts)


def _value_lines(optimizer: dict, clip: Any, scheduler: dict) -> list[str]:
    k = scheduler["kwargs"]
    betas = ", ".join(format_value(b) for b in optimizer["betas"])
    decay = (
        f"then {k['lr_decay_style']} at max_lr"
        if k["lr_decay_style"] == "constant"
        else f"then {k['lr_decay_style']} decay to min_lr {format_value(k['min_lr'])} by step {k['lr_decay_steps']}"
    )
    wd = (
        f"weight decay {format_value(k['end_wd'])}"
        if k["wd_incr_style"] == "constant"
        else f"weight decay {format_value(k['start_wd'])} -> {format_value(k['end_wd'])} ({k['wd_incr_style']}, "
        f"{_steps(k['wd_incr_steps'])})"
    )
    return [
        f"megatron_cfg.optimizer -> policy.optimizer: adamw lr={format_value(optimizer['lr'])} betas=({betas}) "
        f"eps={format_value(optimizer['eps'])} weight_decay={format_value(optimizer['weight_decay'])} (not on "
        f"biases / norm weights), policy.max_grad_norm={format_value(clip)}",
        f"megatron_cfg.scheduler -> policy.scheduler (per GRPO step): warm-up {_steps(k['lr_warmup_steps'])} from "
        f"{format_value(k['init_lr'])} to max_lr {format_value(k['max_lr'])}, {decay}; {wd}",
    ]


def _steps(n: Any) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"
