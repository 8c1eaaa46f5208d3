"""Start-up checks of a GRPO run: every path and data problem found before the first training step.

- `check_output_dirs`: `logger.log_dir` and `checkpointing.checkpoint_dir` can be created and written (a probe file
  is written, fsynced and removed) and have free space (`MIN_FREE_BYTES`; the checkpoint dir one checkpoint's worth,
  `check_checkpoint_space`, once the model is built).
- `check_validation_set`: validation is on but no validation prompt is left (e.g. every prompt too long).
Each failure is a ValueError of one line naming the config key.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.run_config import RunConfig

MIN_FREE_BYTES = 64 << 20
_CHECKPOINT_MARGIN = 1.25  # model + AdamW moments, plus pickle framing and config


def output_dirs(cfg: RunConfig) -> dict[str, str]:
    """{config key: directory} of what the run writes."""
    dirs = {"logger.log_dir": cfg.logger.log_dir}
    if cfg.checkpointing.enabled:
        dirs["checkpointing.checkpoint_dir"] = cfg.checkpointing.checkpoint_dir
    return dirs


def _describe(err: OSError) -> str:
    return err.strerror or type(err).__name__


def check_output_dirs(cfg: RunConfig) -> None:
    """Create each output directory and prove it writable with a probe file; check free space."""
    for key, directory in output_dirs(cfg).items():
        path = Path(directory).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write_probe.{os.getpid()}"
            with open(probe, "wb") as f:
                f.write(b"ok")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as err:
            raise ValueError(f"{key}={directory!r} is not writable ({_describe(err)})") from None
        _check_free(key, path, MIN_FREE_BYTES, "")


def _check_free(key: str, path: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(path).free
    if free < need:
        raise ValueError(
            f"{key}={str(path)!r} has {free / 2**20:.0f} MiB free, {need / 2**20:.0f} MiB needed{what}; free space "
            "or pick another directory"
        )


def check_checkpoint_space(cfg: RunConfig, param_bytes: int) -> None:
    """The checkpoint dir holds at least one checkpoint of a model of `param_bytes` master weights (+ two AdamW
    moments)."""
    if not cfg.checkpointing.enabled:
        return
    need = int(param_bytes * 3 * _CHECKPOINT_MARGIN) + MIN_FREE_BYTES
    path = Path(cfg.checkpointing.checkpoint_dir).expanduser()
    _check_free("checkpointing.checkpoint_dir", path, need, " for one checkpoint")


def check_validation_set(cfg: RunConfig, task: Any) -> None:
    """Validation on (grpo.val_period > 0) needs at least one validation prompt."""
    g = cfg.grpo
    if g.val_period <= 0:
        return
    if not task.validation(g.max_val_samples):
        raise ValueError(
            "the validation set is empty (every validation prompt was skipped, e.g. longer than the prompt limit "
            "policy.max_total_sequence_length - policy.generation.max_new_tokens, or data.val_size is 0); fix "
            "the data or set grpo.val_period=0"
        )
