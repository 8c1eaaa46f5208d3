"""`logger:` and `checkpointing:` config sections."""

from __future__ import annotations

from pydantic import field_validator

from nemo_jetrl.config.errors import keyed_check
from nemo_jetrl.config.section import NonNegativeInt, PathStr, PositiveInt, Section
from nemo_jetrl.utils.checkpoint_files import normalize_metric_name
from nemo_jetrl.utils.save_deadline import parse_must_save_by


class WandbConfig(Section):
    project: str = "nemo-jetrl"
    name: str = "grpo"


class MlflowConfig(Section):
    experiment_name: str = "nemo-jetrl"
    tracking_uri: str | None = None


class LoggerConfig(Section):
    """The `logger:` section (utils/logger.py's `Logger`)."""

    log_dir: PathStr = "logs/grpo"
    tensorboard_enabled: bool = True
    wandb_enabled: bool = False
    wandb: WandbConfig = WandbConfig()
    mlflow_enabled: bool = False
    mlflow: MlflowConfig = MlflowConfig()
    plot_period: NonNegativeInt | None = 5  # refresh PNG plots every N steps (0 = only at the end, null = never)


class CheckpointingConfig(Section):
    enabled: bool = False
    checkpoint_dir: PathStr = "results/grpo"
    save_period: PositiveInt = 10
    keep_top_k: PositiveInt | None = 3  # null = keep all
    metric_name: str | None = None  # "val:accuracy" / "val/accuracy" / "train:reward_mean": best K; null = newest K
    higher_is_better: bool = True  # for metric_name
    # 'DD:HH:MM:SS' from the process's start: save and stop before the next step would pass it (utils/save_deadline.py)
    checkpoint_must_save_by: str | None = None

    @field_validator("metric_name")
    @classmethod
    def _check_metric_name(cls, value: str | None) -> str | None:
        """The spelling the checkpoint ranking reads (checked here so --validate-only finds it too)."""
        return value if value is None else keyed_check(normalize_metric_name, value)

    @field_validator("checkpoint_must_save_by")
    @classmethod
    def _check_must_save_by(cls, value: str | None) -> str | None:
        """NeMo-RL's 'DD:HH:MM:SS' (checked here so --validate-only finds a bad one)."""
        return value if value is None else keyed_check(parse_must_save_by, value)
