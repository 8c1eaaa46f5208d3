"""`logger:` and `checkpointing:` config sections."""

from __future__ import annotations

from nemo_jetrl.config.section import NonEmptyStr, NonNegativeInt, PositiveInt, Section


class WandbConfig(Section):
    project: str = "nemo-jetrl"
    name: str = "grpo"


class MlflowConfig(Section):
    experiment_name: str = "nemo-jetrl"
    tracking_uri: str | None = None


class LoggerConfig(Section):
    """The `logger:` section (utils/logger.py's `Logger`)."""

    log_dir: NonEmptyStr = "logs/grpo"
    tensorboard_enabled: bool = True
    wandb_enabled: bool = False
    wandb: WandbConfig = WandbConfig()
    mlflow_enabled: bool = False
    mlflow: MlflowConfig = MlflowConfig()
    plot_period: NonNegativeInt | None = 5  # refresh PNG plots every N steps (0 = only at the end, null = never)


class CheckpointingConfig(Section):
    enabled: bool = False
    checkpoint_dir: str = "results/grpo"
    save_period: PositiveInt = 10
    keep_top_k: PositiveInt | None = 3  # null = keep all
    metric_name: NonEmptyStr | None = None  # "val:accuracy" / "val/accuracy" / "train:reward_mean": best K; null = newest K
    higher_is_better: bool = True  # for metric_name
