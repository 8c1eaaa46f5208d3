"""Build the task named by `data.dataset_name` from the `data` and `env` config sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_jetrl.environments.arithmetic import ArithmeticTask
from nemo_jetrl.environments.interfaces import VerifiableTask
from nemo_jetrl.environments.long_addition import LongAdditionTask

BUILTIN_TASKS = {"arithmetic": ArithmeticTask, "long_addition": LongAdditionTask}  # env.arithmetic rewards both
KNOWN_TASKS = (*BUILTIN_TASKS, "<a .jsonl/.json/.parquet file, datasets directory or HF datasets name>")


def _as_mapping(section: str, cfg: Any) -> Mapping[str, Any]:
    """Accept a dict, an OmegaConf DictConfig (a Mapping) or a pydantic model for a config section."""
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump()
    if isinstance(cfg, Mapping):
        return cfg
    raise ValueError(f"config section `{section}` must be a mapping, got {type(cfg).__name__}")


def make_task(
    data_cfg: Mapping[str, Any],
    env_cfg: Mapping[str, Any] | None = None,
    *,
    tokenizer: Any | None = None,
    max_prompt_tokens: int | None = None,
) -> VerifiableTask:
    """`data` section + `env` section -> task.

    `data.dataset_name: arithmetic` / `long_addition` are the builtin synthetic tasks (`data.num_digits`,
    env.arithmetic rewards; long_addition: a column-by-column scratchpad, environments/long_addition.py); any other
    value is a dataset (a .jsonl / .json / .parquet file, a local datasets directory or a cached HF datasets name) scored by
    the math environment (env.math, math-verify). `tokenizer` renders chat templates and measures prompt lengths;
    `max_prompt_tokens` is the prompt-length limit when `data.max_input_seq_length` is null.
    """
    data = _as_mapping("data", data_cfg)
    env = _as_mapping("env", env_cfg)
    name = data["dataset_name"]
    if isinstance(name, str) and name and name not in BUILTIN_TASKS:
        # imported here: the math environment (math-verify) and the dataset readers load for dataset runs only
        from nemo_jetrl.data import build_dataset_task
        from nemo_jetrl.environments.config import MathEnvConfig
        from nemo_jetrl.environments.math_env import MathEnvironment

        scorer = MathEnvironment(MathEnvConfig.model_validate(env["math"]))
        return build_dataset_task(data, scorer, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    if name in BUILTIN_TASKS:
        rewards = _as_mapping("env.arithmetic", env["arithmetic"])
        return BUILTIN_TASKS[name](
            num_digits=data["num_digits"],
            val_size=data["val_size"],
            seed=data["seed"],
            correct_reward=rewards["correct_reward"],
            wrong_reward=rewards["wrong_reward"],
        )
    raise ValueError(f"data.dataset_name={name!r} is not a known task; known: {list(KNOWN_TASKS)}")
