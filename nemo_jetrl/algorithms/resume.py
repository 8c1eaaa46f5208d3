"""Resume and checkpoint contents of a GRPO run (the state `run_grpo` saves every `save_period` steps)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from nemo_jetrl.utils.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state, truncate_metrics_jsonl
from nemo_jetrl.utils.logger_backends import METRICS_FILENAME

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.grpo import GrpoSetup

console = Console(stderr=True)


# settings whose change makes a resumed run a different run than the checkpointed one
_RESUME_KEYS = (("policy", "model_name"), ("policy", "precision"), ("data",), ("grpo", "seed"))


def load_resume_state(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The latest valid checkpoint, or None; trims metrics.jsonl to its step (call before the Logger opens it)."""
    ckpt = cfg["checkpointing"]
    if not ckpt["enabled"]:
        return None
    state = CheckpointManager(ckpt["checkpoint_dir"], keep_top_k=ckpt["keep_top_k"]).load_latest()
    if state is None:
        return None
    dropped = truncate_metrics_jsonl(Path(cfg["logger"]["log_dir"]) / METRICS_FILENAME, int(state["step"]))
    if dropped:
        console.print(f"metrics.jsonl: dropped {dropped} line(s) logged after step {state['step']} (resuming)")
    return state


def restore(run: GrpoSetup, state: dict[str, Any]) -> int:
    """Load model + optimizer + RNG states of a checkpoint into the run; returns its step."""
    run.policy.load_state_dict(state["policy"])
    if "rng" in state:
        restore_rng_state(state["rng"])
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
    step = int(state["step"])
    run.next_batch = int(state.get("data", {}).get("next_batch", step))
    console.print(f"resumed from step {step} ({run.cfg['checkpointing']['checkpoint_dir']}), data {state.get('data')}")
    return step


def checkpoint_state(run: GrpoSetup, step: int) -> dict[str, Any]:
    """What a checkpoint after `step` completed steps holds: model + optimizer, RNG, data position, step, config."""
    g = run.cfg["grpo"]
    n = int(g["num_prompts_per_step"] * (g["batch_multiplier"] if g["use_dynamic_sampling"] else 1))
    position = getattr(run.task, "data_position", None)
    batch = run.next_batch
    data = position(batch, n) if position is not None else {"prompts_consumed": batch * n}
    return {
        "policy": run.policy.state_dict(),
        "step": step,
        "rng": capture_rng_state(),
        "data": {"next_step": step, "next_batch": batch, **data},
        "config": run.cfg,
    }
