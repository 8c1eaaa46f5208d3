"""`policy.megatron_cfg.enabled: true` resolves to the optimizer, scheduler, parallel layout and FP8 recipe NeMo-RL's
Megatron worker would use, announced in start-up lines (schema/nemo_rl_megatron.py)."""

from pathlib import Path

import pytest
from jetrl_testkit.cli import load_script, run_main

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.precision.config import precision_line
from nemo_jetrl.schema import MasterConfig, validate_config

ROOT = Path(__file__).resolve().parents[3]
MEGATRON_FP8 = Path(__file__).resolve().parent / "nemo_rl_yaml" / "grpo_megatron_fp8.yaml"
LAYOUT = (
    "megatron_cfg: trained by nemo-jetrl's FSDP2 trainer: TP 4 -> DTensor TP 4, PP 2 -> FSDP sharding (its ranks "
    "join data parallelism), sequence_parallel -> TP without it (activation memory only, same numbers), recompute "
    "(full) -> activation checkpointing, optimizer/scheduler from megatron_cfg"
)
VALUES = (
    "megatron_cfg.optimizer -> policy.optimizer: adamw lr=2e-06 betas=(0.9, 0.98) eps=1e-06 weight_decay=0.01 (not on "
    "biases / norm weights), policy.max_grad_norm=0.5",
    "megatron_cfg.scheduler -> policy.scheduler (per GRPO step): warm-up 1 step from 2e-08 to max_lr 2e-06, then "
    "cosine decay to min_lr 2e-07 by step 3; weight decay 0.0 -> 0.01 (linear, 3 steps)",
)


def resolved(*overrides: str) -> MasterConfig:
    return validate_config(load_config(MEGATRON_FP8, overrides))


def test_megatron_fp8_recipe_resolves_to_what_nemo_rl_runs():
    cfg = resolved()
    assert cfg.policy.optimizer.model_dump() == {
        "name": "adamw",  # Megatron's adam: decoupled weight decay
        "lr": 2.0e-6,
        "weight_decay": 0.01,
        "betas": (0.9, 0.98),
        "eps": 1.0e-6,
        "decay_1d_params": False,  # Megatron: no weight decay on biases / norm weights
        "allow_large_lr": False,
    }
    assert cfg.policy.max_grad_norm == 0.5  # clip_grad
    assert cfg.policy.scheduler == {
        "name": "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler",
        "kwargs": {
            "init_lr": 2.0e-8,
            "max_lr": 2.0e-6,
            "min_lr": 2.0e-7,
            "lr_warmup_steps": 1,
            "lr_decay_steps": 3,
            "lr_decay_style": "cosine",
            "start_wd": 0.0,
            "end_wd": 0.01,
            "wd_incr_steps": 3,  # train_iters = grpo.max_num_steps
            "wd_incr_style": "linear",
        },
    }
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 4 and cfg.cluster.backend == "ray"
    assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (2, 8)  # PP ranks join the 4 data-parallel groups
    assert precision_line(cfg.policy) == (
        "precision: train=fp8 rollout=fp8 kv=fp8 bf16_first=0 bf16_last=0 "
        "recipe=blockwise-e4m3(w128x128,a1x128,wgrad_x=1x128)"
    )
    assert cfg.startup_notes == (LAYOUT, *VALUES)  # the rollout's vLLM TP 4 equals the trainer's: no line
    assert cfg.ignored_key_warnings == ()


def test_null_lr_decay_iters_spans_max_num_steps_and_the_dtensor_keys_are_not_read():
    cfg = resolved(
        "policy.megatron_cfg.scheduler.lr_decay_iters=null",
        "grpo.max_num_steps=40",
        "policy.optimizer={name: torch.optim.SGD}",  # NeMo-RL does not read policy.optimizer with Megatron
        "policy.megatron_cfg.optimizer.clip_grad=0.0",
    )
    assert cfg.policy.scheduler["kwargs"]["lr_decay_steps"] == 40 and cfg.policy.max_grad_norm is None


def test_megatron_disabled_reads_only_fp8_cfg():
    cfg = resolved("policy.megatron_cfg.enabled=false", "++policy.optimizer={name: torch.optim.AdamW}")
    assert cfg.policy.dtensor_cfg.tensor_parallel_size == 1 and cfg.policy.scheduler is None
    assert cfg.policy.precision == "fp8" and cfg.startup_notes[0].startswith(
        "policy.generation.vllm_cfg.tensor_parallel_size: 4 -> 1"
    )


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "policy.megatron_cfg.optimizer.optimizer=sgd",
            "policy.megatron_cfg.optimizer.optimizer: 'sgd' is not supported",
        ),
        ("policy.megatron_cfg.scheduler.lr_decay_style=WSD", "lr_decay_style: 'WSD' is not supported here (one of"),
        ("policy.megatron_cfg.scheduler.lr_warmup_iters=3", "lr_warmup_steps (3) < lr_decay_steps (3)"),
        ("policy.megatron_cfg.expert_model_parallel_size=8", "expert_model_parallel_size: 8 is not supported"),
        (
            "policy.megatron_cfg.peft.enabled=true",
            "policy.megatron_cfg.peft.enabled: true is not supported here (LoRA)",
        ),
    ],
)
def test_what_the_megatron_mapping_cannot_honour_is_refused_in_one_line(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        resolved("++" + override)


def test_validate_only_prints_the_start_up_lines_once():
    main = load_script(ROOT / "examples" / "run_grpo.py", "run_grpo_megatron").main
    rc, out, err = run_main(main, ["--config", str(MEGATRON_FP8), "--validate-only"])
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines.count(LAYOUT) == 1 and all(lines.count(v) == 1 for v in VALUES)
    assert lines[-1].startswith("precision: train=fp8 rollout=fp8")


def test_megatron_moe_router_switches_map_onto_the_policy():
    cfg = resolved(
        "++policy.megatron_cfg.freeze_moe_router=true", "++policy.megatron_cfg.moe_router_load_balancing_type=none"
    )
    assert cfg.policy.freeze_moe_router is True and cfg.policy.router_aux_loss_coef == 0.0
    assert cfg.startup_notes[0].endswith(
        "optimizer/scheduler from megatron_cfg, MoE: routers frozen, no load-balancing loss"
    )
    aux = resolved(
        "++policy.megatron_cfg.moe_router_load_balancing_type=aux_loss", "++policy.megatron_cfg.moe_aux_loss_coeff=0.01"
    )
    assert aux.policy.router_aux_loss_coef == 0.01 and aux.policy.freeze_moe_router is False
    model_coef = resolved("++policy.megatron_cfg.moe_router_load_balancing_type=aux_loss")
    assert model_coef.policy.router_aux_loss_coef is None  # the model config's router_aux_loss_coef
    with pytest.raises(ConfigError, match="moe_router_load_balancing_type: 'seq_aux_loss' is not supported here"):
        resolved("++policy.megatron_cfg.moe_router_load_balancing_type=seq_aux_loss")
