"""Sinks behind `Logger`: local files (metrics.jsonl + config.yaml), TensorBoard, W&B, MLflow.

Every backend has the same three methods: `log_metrics(metrics, step)` with plain int/float scalars (already
prefixed), `log_config(config)` with a plain nested dict, and `close()`. W&B and MLflow are optional packages: their
`create(...)` returns None after one warning when the package is missing, and the run goes on without them.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import yaml

from nemo_jetrl.utils.aside import move_aside
from nemo_jetrl.utils.metrics_jsonl import encode_metrics_line

METRICS_FILENAME = "metrics.jsonl"
CONFIG_FILENAME = "config.yaml"
TENSORBOARD_DIRNAME = "tensorboard"
MLFLOW_PARAM_MAX_CHARS = 500  # the smallest limit MLflow servers have enforced on a param value


class MissingBackendWarning(UserWarning):
    """A logger backend is enabled in the config but its package is not installed."""


class LoggerBackend(Protocol):
    def log_metrics(self, metrics: Mapping[str, int | float], step: int) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def import_optional_backend(module_name: str, config_key: str) -> ModuleType | None:
    """`import module_name`, or None after one MissingBackendWarning naming the config key that asked for it."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        warnings.warn(
            f"logger.{config_key} is true but the '{module_name}' package is not installed "
            f"(`uv pip install {module_name}`); continuing without {module_name} logging.",
            MissingBackendWarning,
            stacklevel=3,
        )
        return None


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


class LocalFilesBackend:
    """`<log_dir>/metrics.jsonl` (appended, flushed per line) and `<log_dir>/config.yaml` (an earlier, different
    config.yaml is moved aside as `config.<its mtime>.yaml`, never overwritten)."""

    def __init__(self, log_dir: Path):
        self.metrics_path = log_dir / METRICS_FILENAME
        self.config_path = log_dir / CONFIG_FILENAME
        # line-buffered append: every complete line reaches the OS before log_metrics returns
        self._file = self.metrics_path.open("a", encoding="utf-8", buffering=1)

    def log_metrics(self, metrics: Mapping[str, int | float], step: int) -> None:
        self._file.write(encode_metrics_line(metrics, step) + "\n")
        self._file.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)
        if self.config_path.is_file() and self.config_path.read_bytes() != text.encode("utf-8"):
            move_aside(self.config_path)
        tmp = self.config_path.with_suffix(".yaml.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.config_path)  # atomic: a reader never sees half a config

    def close(self) -> None:
        self._file.close()


class TensorBoardBackend:
    """Scalars (and the config as a text summary) into `<log_dir>/tensorboard`, flushed after every call."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: seconds, so only when enabled

        self.event_dir = log_dir / TENSORBOARD_DIRNAME
        self._writer = SummaryWriter(log_dir=str(self.event_dir))

    def log_metrics(self, metrics: Mapping[str, int | float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = yaml.safe_dump(dict(config), sort_keys=False)
        self._writer.add_text("config", "    " + text.replace("\n", "\n    "))  # indented = markdown code block
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend:
    """One W&B run; `wandb_cfg` (project, name, and any other `wandb.init` keyword) is passed to `wandb.init`."""

    def __init__(self, wandb_module: ModuleType, wandb_cfg: Mapping[str, Any], log_dir: Path):
        self._run = wandb_module.init(**{"dir": str(log_dir), **dict(wandb_cfg)})

    @classmethod
    def create(cls, wandb_cfg: Mapping[str, Any], log_dir: Path) -> WandbBackend | None:
        module = import_optional_backend("wandb", "wandb_enabled")
        return None if module is None else cls(module, wandb_cfg, log_dir)

    def log_metrics(self, metrics: Mapping[str, int | float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self._run.finish()


class MlflowBackend:
    """One MLflow run in `experiment_name` (at `tracking_uri` when set); the config goes in as flattened params."""

    def __init__(self, mlflow_module: ModuleType, mlflow_cfg: Mapping[str, Any]):
        self._mlflow = mlflow_module
        cfg = dict(mlflow_cfg)
        tracking_uri = cfg.pop("tracking_uri", None)
        experiment_name = cfg.pop("experiment_name", None)
        if tracking_uri:
            mlflow_module.set_tracking_uri(tracking_uri)
        if experiment_name:
            mlflow_module.set_experiment(experiment_name)
        self._run = mlflow_module.start_run(**cfg)  # e.g. run_name

    @classmethod
    def create(cls, mlflow_cfg: Mapping[str, Any]) -> MlflowBackend | None:
        module = import_optional_backend("mlflow", "mlflow_enabled")
        return None if module is None else cls(module, mlflow_cfg)

    def log_metrics(self, metrics: Mapping[str, int | float], step: int) -> None:
        self._mlflow.log_metrics({key: float(value) for key, value in metrics.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        params = {key: str(value)[:MLFLOW_PARAM_MAX_CHARS] for key, value in flatten_config(config).items()}
        self._mlflow.log_params(params)

    def close(self) -> None:
        self._mlflow.end_run()
