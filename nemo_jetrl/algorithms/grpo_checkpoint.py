"""GRPO run state on disk: resume from the newest valid checkpoint, what a checkpoint holds, the log directory.

A resume checks the checkpoint's fields (`resume_state_problem`) before anything is rewritten, then trims
metrics.jsonl to its step (the dropped lines are kept beside it). A fresh start (no checkpoint loaded) never
appends to or overwrites an earlier run's outputs: they are moved aside first (`utils/run_outputs.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from nemo_jetrl.utils.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from nemo_jetrl.utils.logger_backends import METRICS_FILENAME
from nemo_jetrl.utils.run_outputs import move_earlier_outputs, trim_metrics_for_resume

console = checkpoint_console = Console(stderr=True)

# settings whose change makes a resumed run a different run than the checkpointed one
_MAX_DETAIL = 400  # characters of a load error kept in the one-line message
_RESUME_KEYS = (("policy", "model_name"), ("policy", "precision"), ("data",), ("grpo", "seed"))


def checkpoint_manager(ckpt_cfg: dict[str, Any]) -> CheckpointManager:
    """The `checkpointing` section's manager (best-K by `metric_name` when set)."""
    return CheckpointManager(
        ckpt_cfg["checkpoint_dir"],
        keep_top_k=ckpt_cfg["keep_top_k"],
        metric_name=ckpt_cfg["metric_name"],
        higher_is_better=ckpt_cfg["higher_is_better"],
    )


def load_resume_state(cfg: dict[str, Any], writer: bool = True) -> dict[str, Any] | None:
    """The latest valid checkpoint, or None; call before the Logger opens its files. A checkpoint whose fields
    cannot be resumed from is a ValueError of one line (nothing rewritten); a resume trims metrics.jsonl to the
    checkpoint's step, a fresh start moves an earlier run's outputs aside (only the `writer`: the ranks of a
    torchrun run other than 0 just read the checkpoint)."""
    ckpt = cfg["checkpointing"]
    log_dir = Path(cfg["logger"]["log_dir"])
    found = checkpoint_manager(ckpt).latest() if ckpt["enabled"] else None
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
    fit this run (missing keys, other shapes) is a ValueError with one line."""
    where = run.cfg["checkpointing"]["checkpoint_dir"]
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
    changed = []
    for path in _RESUME_KEYS:
        old, new = saved, run.cfg
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
    """What a checkpoint after `step` completed steps holds: model + optimizer, RNG, data position, step, config."""
    g = run.cfg["grpo"]
    n = int(g["num_prompts_per_step"] * (g["batch_multiplier"] if g["use_dynamic_sampling"] else 1))
    position = getattr(run.task, "data_position", None)
    batch = run.next_batch  # generation batches drawn so far (= step without dynamic sampling)
    data = position(batch, n) if position is not None else {"prompts_consumed": batch * n}
    return {
        "policy": run.policy.state_dict(),
        "step": step,
        "rng": capture_rng_state(),
        "data": {"next_step": step, "next_batch": batch, **data},
        "config": run.cfg,
    }


def checkpoint_metrics(train: dict[str, float], val_history: list[dict[str, float]]) -> dict[str, float]:
    """meta.json metrics of a checkpoint: this step's `train/...` and the latest `validation/...` values."""
    out = {f"train/{k}": float(v) for k, v in train.items() if isinstance(v, (int, float))}
    if val_history:
        out.update({f"validation/{k}": float(v) for k, v in val_history[-1].items() if isinstance(v, (int, float))})
    return out
