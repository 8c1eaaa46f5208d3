"""`Logger`: one facade over metrics.jsonl, TensorBoard, W&B and MLflow, configured by the `logger:` config section.

    with Logger(cfg.logger) as logger:
        logger.log_config(resolved_cfg)
        logger.log_metrics({"reward_mean": 0.5}, step=1, prefix="train")   # -> "train/reward_mean"
        logger.maybe_plot(step=1)                                          # PNGs every `plot_period` steps

metrics.jsonl is always written (see `metrics_jsonl` for the format and its NaN/inf spelling); it is flushed line by
line, as are TensorBoard events, so a killed run keeps every complete step.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.utils.config import LoggerConfig
from nemo_jetrl.utils.logger_backends import (
    LocalFilesBackend,
    LoggerBackend,
    MlflowBackend,
    TensorBoardBackend,
    WandbBackend,
)
from nemo_jetrl.utils.metrics_jsonl import to_scalar

PLOTS_DIRNAME = "plots"


def to_plain_config(config: Any) -> Any:
    """Plain dicts/lists/scalars from a (possibly OmegaConf, resolved) config; Paths and enums become strings."""
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return {str(key): to_plain_config(value) for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [to_plain_config(value) for value in config]
    if config is None or isinstance(config, (bool, int, float, str)):
        return config
    if isinstance(config, enum.Enum):
        return to_plain_config(config.value)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return to_plain_config(dataclasses.asdict(config))
    return str(config)


class Logger:
    """Logs scalar metrics per step to every enabled sink; see the module docstring."""

    def __init__(self, cfg: LoggerConfig):
        """`cfg`: the validated `logger` section (utils/config.py's `LoggerConfig`; a dict is refused)."""
        self.cfg = typed_section(cfg, "LoggerConfig", "Logger")
        self.log_dir = Path(self.cfg.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._files = LocalFilesBackend(self.log_dir)
        self.metrics_path = self._files.metrics_path
        self.config_path = self._files.config_path
        self.plots_dir = self.log_dir / PLOTS_DIRNAME
        self._backends: list[LoggerBackend] = [self._files]
        if self.cfg.tensorboard_enabled:
            self._backends.append(TensorBoardBackend(self.log_dir))
        if (
            self.cfg.wandb_enabled
            and (wandb := WandbBackend.create(self.cfg.wandb.model_dump(), self.log_dir)) is not None
        ):
            self._backends.append(wandb)
        if self.cfg.mlflow_enabled and (mlflow := MlflowBackend.create(self.cfg.mlflow.model_dump())) is not None:
            self._backends.append(mlflow)
        self._closed = False
        self._num_logged = 0

    @property
    def backend_names(self) -> list[str]:
        """Class names of the active sinks, e.g. ["LocalFilesBackend", "TensorBoardBackend"]."""
        return [type(b).__name__ for b in self._backends]

    def log_metrics(self, metrics: Mapping[str, Any], step: int, prefix: str = "") -> dict[str, int | float]:
        """Log `metrics` at `step` as `prefix/key` (one metrics.jsonl line per call); returns what was logged."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step must be an int, got {step!r}")
        prefix = prefix.strip("/")
        scalars = {(f"{prefix}/{key}" if prefix else str(key)): to_scalar(str(key), v) for key, v in metrics.items()}
        for backend in self._backends:
            backend.log_metrics(scalars, step)
        self._num_logged += 1
        return scalars

    def log_config(self, resolved: Mapping[str, Any]) -> Path:
        """Write `<log_dir>/config.yaml` (and the config as TensorBoard text / W&B config / MLflow params)."""
        self._check_open()
        config = to_plain_config(resolved)
        if not isinstance(config, dict):
            raise ValueError(f"log_config expects a mapping, got {type(resolved).__name__}")
        for backend in self._backends:
            backend.log_config(config)
        return self.config_path

    def maybe_plot(self, step: int) -> list[Path]:
        """Redraw the PNGs in `<log_dir>/plots` when `plot_period` > 0 and `step` is a multiple of it."""
        period = self.cfg.plot_period
        if not period or step % period != 0:
            return []
        return self.plot()

    def plot(self) -> list[Path]:
        """Redraw the PNGs in `<log_dir>/plots` from metrics.jsonl now."""
        from nemo_jetrl.utils.plots import plot_run  # matplotlib only when plotting

        return plot_run(self.metrics_path, self.plots_dir)

    def close(self) -> None:
        """Draw the final plots (unless plot_period is null) and close every sink; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.cfg.plot_period is not None and self._num_logged > 0:
            try:
                self.plot()
            except Exception as exc:  # a plotting bug must not hide the run's own outcome
                warnings.warn(f"final plots failed: {exc!r}", RuntimeWarning, stacklevel=2)
        for backend in self._backends:
            backend.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"Logger for {self.log_dir} is closed")

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class NullLogger:
    """A `Logger` that writes nothing (the ranks of a torchrun run other than 0); `log_metrics` still returns
    the scalars it was given."""

    def log_metrics(self, metrics: Mapping[str, Any], step: int, prefix: str = "") -> dict[str, int | float]:
        prefix = prefix.strip("/")
        return {(f"{prefix}/{key}" if prefix else str(key)): to_scalar(str(key), v) for key, v in metrics.items()}

    def log_config(self, resolved: Mapping[str, Any]) -> None:
        return None

    def maybe_plot(self, step: int) -> list[Path]:
        return []

    def close(self) -> None:
        return None


DEFAULT_SUMMARY_KEYS = (
    "train/reward_mean",
    "validation/accuracy",
    "train/loss",
    "train/token_mult_prob_error",
    "timing/total_step_time",
)


def _matching_keys(metrics: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    selected: list[str] = []
    for key in keys:
        matches = [k for k in metrics if k.startswith(key)] if key.endswith("/") else [key] if key in metrics else []
        selected.extend(k for k in matches if k not in selected)
    return selected


def _short_label(key: str) -> str:
    if key.startswith("train/"):
        return key.removeprefix("train/")
    return key.replace("validation/", "val/", 1).replace("timing/", "t/", 1)


def _format_value(key: str, value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if key.startswith("timing/"):
        return f"{value:.2f}s"
    return f"{value:.4g}"


def console_summary(
    metrics: Mapping[str, Any],
    step: int,
    keys: Iterable[str] = DEFAULT_SUMMARY_KEYS,
    total_steps: int | None = None,
    console: Console | None = None,
) -> str:
    """Print one compact line for `step` with the `keys` present in `metrics` (others skipped); returns its text.

    A key ending in "/" selects every metric under it (e.g. "timing/").

    `step 12/100 │ reward_mean 0.531 │ val/accuracy 0.812 │ t/total_step_time 0.43s`
    """
    line = Text()
    line.append(f"step {step}" + (f"/{total_steps}" if total_steps else ""), style="bold cyan")
    for key in _matching_keys(metrics, keys):
        value = to_scalar(key, metrics[key])
        line.append(" │ ", style="dim")
        line.append(f"{_short_label(key)} ", style="dim")
        line.append(_format_value(key, float(value)), style="bold")
    (console or Console()).print(line, highlight=False, soft_wrap=True)
    return line.plain
