"""GRPO run state on disk: resume from the newest valid checkpoint, what a checkpoint holds, the log directory, the
export of a checkpoint's policy. A checkpoint saves the config as a plain dict (`checkpoint_state`); a resume
compares it key by key, an export validates its `policy` section back (`saved_policy_config`).

A resume checks the checkpoint's fields (`resume_state_problem`) before anything is rewritten, then trims
metrics.jsonl to its step (the dropped lines are kept beside it). A fresh start (no checkpoint loaded) never
appends to or overwrites an earlier run's outputs: they are moved aside first (`utils/run_outputs.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console

from nemo_jetrl.utils.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from nemo_jetrl.utils.logger_backends import METRICS_FILENAME
from nemo_jetrl.utils.run_outputs import move_earlier_outputs, trim_metrics_for_resume

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.run_config import RunConfig
    from nemo_jetrl.policy.config import PolicyConfig
    from nemo_jetrl.utils.config import CheckpointingConfig

console = checkpoint_console = Console(stderr=True)

# settings whose change makes a resumed run a different run than the checkpointed one
_MAX_DETAIL = 400  # characters of a load error kept in the one-line message
_RESUME_KEYS = (("policy", "model_name"), ("policy", "precision"), ("data",), ("grpo", "seed"))


def checkpoint_manager(ckpt_cfg: CheckpointingConfig) -> CheckpointManager:
    """The `checkpointing` section's manager (best-K by `metric_name` when set)."""
    return CheckpointManager(
        ckpt_cfg.checkpoint_dir,
        keep_top_k=ckpt_cfg.keep_top_k,
        metric_name=ckpt_cfg.metric_name,
        higher_is_better=ckpt_cfg.higher_is_better,
    )


def load_resume_state(cfg: RunConfig, writer: bool = True) -> dict[str, Any] | None:
    """The latest valid checkpoint, or None; call before the Logger opens its files. A checkpoint whose fields
    cannot be resumed from is a ValueError of one line (nothing rewritten); a resume trims metrics.jsonl to the
    checkpoint's step, a fresh start moves an earlier run's outputs aside (only the `writer`: the ranks of a
    torchrun run other than 0 just read the checkpoint)."""
    log_dir = Path(cfg.logger.log_dir)
    found = checkpoint_manager(cfg.checkpointing).latest() if cfg.checkpointing.enabled else None
    if not writer:
        return found[1] if found is not None else None
    if found is None:
        moved = move_earlier_outputs(log_dir)
        if moved:
            names = ", ".join(f"{old.name} -> {new.name}" for old, new in moved)
            console.print(f"outputs of an earlier run in {log_dir} moved aside: {names} (fresh start)", soft_wrap=True)
        return None
    path, state = found
    problem = resume_state_problem(state)
    if problem is not None:
        raise ValueError(
            f"checkpoint {path} passes its checksum but {problem}; move it aside (or delete it) to resume from the "
            "checkpoint before it; nothing was changed"
        )
    step = state["step"]
    line = trim_metrics_for_resume(log_dir / METRICS_FILENAME, step).line(log_dir / METRICS_FILENAME, step)
    if line is not None:
        console.print(line, soft_wrap=True, highlight=False)
    return state


def resume_state_problem(state: dict[str, Any]) -> str | None:
    """What in a loaded checkpoint a GRPO run cannot resume from (`step`, `policy`, `data`, `rng`, `config`)."""
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"its 'step' is {step!r}, not a step count"
    for key in ("policy", "data", "rng", "config"):  # a missing policy: `restore` names what the model lacks
        if key in state and not isinstance(state[key], dict):
            return f"its '{key}' is {type(state[key]).__name__}, not a dict"
    next_batch = state.get("data", {}).get("next_batch", step)
    if isinstance(next_batch, bool) or not isinstance(next_batch, int) or next_batch < 0:
        return f"its data.next_batch is {next_batch!r}, not a batch count"
    return None


def restore(run: Any, state: dict[str, Any]) -> int:
    """Load model + optimizer + RNG states of a checkpoint into the run; returns its step. A checkpoint that does not
    fit this run (missing keys, other shapes) is a ValueError with one line. The checkpoint's config (the plain
    dict `checkpoint_state` saved) is compared key by key with this run's, not validated back: a checkpoint of an
    earlier version, whose config this schema would refuse, still resumes."""
    where = run.cfg.checkpointing.checkpoint_dir
    try:
        run.policy.load_state_dict(state["policy"])
        if "rng" in state:
            restore_rng_state(state["rng"])
        step = int(state["step"])
    except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or repr(err)
        detail = detail if len(detail) <= _MAX_DETAIL else detail[:_MAX_DETAIL] + "..."
        raise ValueError(
            f"the checkpoint in {where} does not fit this run ({type(err).__name__}: {detail}); point "
            "checkpointing.checkpoint_dir at this model's checkpoints or disable checkpointing"
        ) from err
    saved = state.get("config") or {}
    current = run.cfg.model_dump()
    changed = []
    for path in _RESUME_KEYS:
        old, new = saved, current
        for key in path:
            old, new = (old or {}).get(key), (new or {}).get(key)
        if saved and old != new:
            changed.append(".".join(path))
    if changed:
        console.print(f"[yellow]warning: resuming with changed {', '.join(changed)} (checkpoint config differs)[/]")
    run.next_batch = state.get("data", {}).get("next_batch", step)  # checked by resume_state_problem
    console.print(f"resumed from step {step} ({where}), data {state.get('data')}")
    return step


def checkpoint_state(run: Any, step: int) -> dict[str, Any]:
    """What a checkpoint after `step` completed steps holds: model + optimizer, RNG, data position, step, and the
    config as a plain dict (`model_dump`: a checkpoint loads without the section types)."""
    g = run.cfg.grpo
    n = int(g.num_prompts_per_step * (g.batch_multiplier if g.use_dynamic_sampling else 1))
    position = getattr(run.task, "data_position", None)
    batch = run.next_batch  # generation batches drawn so far (= step without dynamic sampling)
    data = position(batch, n) if position is not None else {"prompts_consumed": batch * n}
    return {
        "policy": run.policy.state_dict(),
        "step": step,
        "rng": capture_rng_state(),
        "data": {"next_step": step, "next_batch": batch, **data},
        "config": run.cfg.model_dump(),
    }


def saved_policy_config(state: dict[str, Any], checkpoint: str | Path) -> PolicyConfig:
    """The `policy` section a GRPO checkpoint saved (the plain dict `checkpoint_state` wrote), validated back; a
    ValueError of one line where the checkpoint holds none or its section does not validate in this version."""
    from pydantic import ValidationError

    from nemo_jetrl.config.errors import format_validation_error
    from nemo_jetrl.policy.config import PolicyConfig

    saved = state.get("config") or {}
    policy = saved.get("policy") if isinstance(saved, dict) else None
    if not policy or not isinstance(state.get("policy"), dict) or "model" not in state["policy"]:
        raise ValueError(f"checkpoint {checkpoint} holds no policy config / model weights (not a GRPO checkpoint?)")
    try:
        return PolicyConfig.model_validate(policy)
    except ValidationError as exc:
        problem = format_validation_error(exc, PolicyConfig)
        raise ValueError(f"checkpoint {checkpoint}: its saved policy config does not validate here ({problem})") from None


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    fp8: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
) -> Path:
    """Export the policy of a GRPO checkpoint (a `step_<N>` directory or a checkpoint root: its newest valid one)
    with its base model's tokenizer: the architecture and tokenizer of its saved `policy.model_name` (it must still
    exist), the trained weights of the checkpoint, the FP8 layer map of its saved precision recipe. Neither the base
    model's directory nor the checkpoint's is written to."""
    from nemo_jetrl.models.export import export_policy_weights, load_policy_checkpoint
    from nemo_jetrl.models.export_dir import check_shard_size, earlier_export_files
    from nemo_jetrl.models.loading import resolve_model_dir
    from nemo_jetrl.precision import PrecisionRecipe

    check_shard_size(max_shard_size)
    earlier_export_files(out_dir, overwrite=overwrite, protected=[checkpoint])  # refuse before the slow load
    state, _ = load_policy_checkpoint(checkpoint)
    policy_cfg = saved_policy_config(state, checkpoint)
    protected = [checkpoint, resolve_model_dir(policy_cfg.model_name)]
    earlier_export_files(out_dir, overwrite=overwrite, protected=protected)
    return export_policy_weights(
        state["policy"]["model"], out_dir, model_name=policy_cfg.model_name,
        config_overrides=policy_cfg.hf_config_overrides, recipe=PrecisionRecipe.from_config(policy_cfg),
        protected=protected, fp8=fp8, dtype=dtype,
        max_shard_size=max_shard_size, overwrite=overwrite,
    )  # fmt: skip


def checkpoint_metrics(train: dict[str, float], val_history: list[dict[str, float]]) -> dict[str, float]:
    """meta.json metrics of a checkpoint: this step's `train/...` and the latest `validation/...` values."""
    out = {f"train/{k}": float(v) for k, v in train.items() if isinstance(v, (int, float))}
    if val_history:
        out.update({f"validation/{k}": float(v) for k, v in val_history[-1].items() if isinstance(v, (int, float))})
    return out
