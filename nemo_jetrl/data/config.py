"""`data:` — the prompts: the builtin `arithmetic` task or a dataset (.jsonl / .json / .parquet, datasets dir, HF)."""

from __future__ import annotations

from typing import Any

from nemo_jetrl.config.section import NonEmptyStr, PositiveInt, Section, Seed


class DataConfig(Section):
    dataset_name: NonEmptyStr = "arithmetic"  # builtin task name, or a file / HF dataset
    num_digits: PositiveInt = 2  # builtin tasks only (arithmetic, long_addition, long_multiplication)
    val_size: PositiveInt = 512  # held-out problems (rows held out of the training data when val_dataset_name is null)
    seed: Seed = 1234  # held-out split + shuffling
    val_dataset_name: NonEmptyStr | None = None
    dataset_config: NonEmptyStr | None = None  # HF datasets config (subset)
    train_split: NonEmptyStr | None = None
    val_split: NonEmptyStr | None = None
    input_key: NonEmptyStr = "problem"
    output_key: NonEmptyStr = "answer"
    prompt_template: str | None = None  # str.format template with one {} for the problem
    system_prompt: str | None = None
    use_chat_template: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # passed to apply_chat_template (Qwen3: enable_thinking)
    shuffle: bool = True
    max_input_seq_length: PositiveInt | None = None  # null = max_total_sequence_length - max_new_tokens
