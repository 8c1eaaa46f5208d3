"""Build the task named by `data.dataset_name` from the `data` and `env` config sections."""

from __future__ import annotations

from typing import Any

from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.environments.arithmetic import ArithmeticTask
from nemo_jetrl.environments.coin_flip import CoinFlipRewards
from nemo_jetrl.environments.config import EnvConfig
from nemo_jetrl.environments.interfaces import VerifiableTask
from nemo_jetrl.environments.long_addition import LongAdditionTask
from nemo_jetrl.environments.long_multiplication import LongMultiplicationTask

BUILTIN_TASKS = {  # env.arithmetic rewards all three
    "arithmetic": ArithmeticTask,
    "long_addition": LongAdditionTask,
    "long_multiplication": LongMultiplicationTask,
}
KNOWN_TASKS = (*BUILTIN_TASKS, "<a .jsonl/.json/.parquet file, datasets directory or HF datasets name>")


def make_task(
    data: DataConfig,
    env: EnvConfig | None = None,
    *,
    tokenizer: Any | None = None,
    max_prompt_tokens: int | None = None,
) -> VerifiableTask:
    """The validated `data` section + `env` section (default values when None) -> task.

    `data.dataset_name: arithmetic` / `long_addition` / `long_multiplication` are the builtin synthetic tasks
    (`data.num_digits`, env.arithmetic rewards; long_addition: a column-by-column scratchpad, long_multiplication: a
    row-by-row one of 1K-4K tokens, environments/long_*.py); any other
    value is a dataset (a .jsonl / .json / .parquet file, a local datasets directory or a cached HF datasets name) scored by
    the math environment (env.math, math-verify). `tokenizer` renders chat templates and measures prompt lengths;
    `max_prompt_tokens` is the prompt-length limit when `data.max_input_seq_length` is null. `env.coin_flip_rewards`
    keeps the task's prompts and replaces its rewards by seeded coin flips (speed runs on random weights).
    """
    data = typed_section(data, "DataConfig", "make_task")
    env = EnvConfig() if env is None else typed_section(env, "EnvConfig", "make_task")
    task = _task(data, env, tokenizer, max_prompt_tokens)
    if not env.coin_flip_rewards:
        return task
    rewards = env.arithmetic if data.dataset_name in BUILTIN_TASKS else env.math
    return CoinFlipRewards(task, data.seed, rewards.correct_reward, rewards.wrong_reward)


def _task(data: DataConfig, env: EnvConfig, tokenizer: Any | None, max_prompt_tokens: int | None) -> VerifiableTask:
    name = data.dataset_name
    if name not in BUILTIN_TASKS:
        # imported here: the math environment (math-verify) and the dataset readers load for dataset runs only
        from nemo_jetrl.data import build_dataset_task
        from nemo_jetrl.environments.math_env import MathEnvironment

        scorer = MathEnvironment(env.math)
        return build_dataset_task(data, scorer, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    return BUILTIN_TASKS[name](
        num_digits=data.num_digits,
        val_size=data.val_size,
        seed=data.seed,
        correct_reward=env.arithmetic.correct_reward,
        wrong_reward=env.arithmetic.wrong_reward,
    )
