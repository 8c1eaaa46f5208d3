"""Build the task named by `data.dataset_name` from the `data` and `env` config sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_jetrl.environments.arithmetic import ArithmeticTask
from nemo_jetrl.environments.interfaces import VerifiableTask

KNOWN_TASKS = ("arithmetic",)


def _as_mapping(section: str, cfg: Any) -> Mapping[str, Any]:
    """Accept a dict, an OmegaConf DictConfig (a Mapping) or a pydantic model for a config section."""
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump()
    if isinstance(cfg, Mapping):
        return cfg
    raise ValueError(f"config section `{section}` must be a mapping, got {type(cfg).__name__}")


def make_task(data_cfg: Mapping[str, Any], env_cfg: Mapping[str, Any] | None = None) -> VerifiableTask:
    """`data` section (dataset_name, num_digits, val_size, seed) + `env` section (env.arithmetic rewards) -> task."""
    data = _as_mapping("data", data_cfg)
    env = _as_mapping("env", env_cfg)
    name = data.get("dataset_name")
    if name == "arithmetic":
        rewards = _as_mapping("env.arithmetic", env.get("arithmetic"))
        return ArithmeticTask(
            num_digits=data.get("num_digits", 2),
            val_size=data.get("val_size", 512),
            seed=data.get("seed", 1234),
            correct_reward=rewards.get("correct_reward", 1.0),
            wrong_reward=rewards.get("wrong_reward", 0.0),
        )
    raise ValueError(f"data.dataset_name={name!r} is not a known task; known: {list(KNOWN_TASKS)}")
