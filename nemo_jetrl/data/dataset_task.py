"""A `VerifiableTask` over a prompt/answer dataset (jsonl / parquet / HF datasets) scored by an environment.

- Rows are read by `readers.read_rows`; bad rows (malformed, missing or empty field, invalid UTF-8, prompt too
  long) are dropped and reported in ONE warning with counts per reason; the run goes on. Prompt length is measured
  on at most `max tokens * MAX_CHARS_PER_TOKEN` characters, so a huge row costs no more than a long one.
- Validation: `data.val_dataset_name` when set, else `val_size` rows held out of the training data (a seeded draw).
- Training order: the remaining rows in source order, reshuffled every epoch by `(seed, epoch)` when `shuffle`.
  `train_batch(step, n)` returns the rows at positions `[step*n, (step+1)*n)` of that endless epoch sequence, a pure
  function of (data, seed, step): a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nemo_jetrl.data.problem import Problem
from nemo_jetrl.data.prompts import PromptFormatter
from nemo_jetrl.data.readers import DataSource, RowReport, read_rows

if TYPE_CHECKING:
    from nemo_jetrl.data.config import DataConfig

_HOLDOUT_STREAM, _SHUFFLE_STREAM = 0, 1
_TOKENIZE_CHUNK = 4096  # prompts per tokenizer call when measuring lengths (bounded memory on large datasets)
MAX_CHARS_PER_TOKEN = 32  # prompts beyond max tokens * this many characters are too long without full tokenization


class BadRowsWarning(UserWarning):
    """Some dataset rows were skipped (counts per reason in the message)."""


class DatasetTask:
    """Implements `VerifiableTask` (+ `pop_metrics`) over prepared train / validation problems."""

    def __init__(
        self,
        train: Sequence[Problem],
        validation: Sequence[Problem],
        scorer: Any,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if not train:
            raise ValueError("DatasetTask: the training set is empty")
        self.train_problems = list(train)
        self.val_problems = list(validation)
        self.scorer = scorer
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._epoch_cache: dict[int, np.ndarray] = {}

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """Row order of one epoch: [num_train] int64 (source order when not shuffling)."""
        if epoch not in self._epoch_cache:
            n = len(self.train_problems)
            order = np.random.default_rng([self.seed, _SHUFFLE_STREAM, epoch]).permutation(n) if self.shuffle else None
            if len(self._epoch_cache) > 4:
                self._epoch_cache.clear()
            self._epoch_cache[epoch] = order if order is not None else np.arange(n)
        return self._epoch_cache[epoch]

    def data_position(self, step: int, n: int) -> dict[str, int]:
        """Where batch `step` of size `n` starts: epoch and row offset within it (for checkpoints and logs)."""
        epoch, offset = divmod(step * n, len(self.train_problems))
        return {"epoch": epoch, "offset": offset, "prompts_consumed": step * n}

    def train_batch(self, step: int, n: int) -> list[Problem]:
        """`n` training problems at positions `[step*n, (step+1)*n)` of the epoch sequence."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"train_batch step must be an int >= 0, got {step!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"train_batch n must be an int >= 0, got {n!r}")
        size = len(self.train_problems)
        out = []
        for position in range(step * n, (step + 1) * n):
            epoch, offset = divmod(position, size)
            out.append(self.train_problems[int(self._epoch_order(epoch)[offset])])
        return out

    def validation(self, max_n: int | None = None) -> list[Problem]:
        """The fixed held-out problems (the first `max_n` of them when given)."""
        return self.val_problems if max_n is None else self.val_problems[: int(max_n)]

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """Rewards of decoded responses: float32 `[n]` (from the environment)."""
        return self.scorer.score(responses, answers)

    def pop_metrics(self) -> dict[str, float]:
        """The environment's counters since the last call (e.g. parse_failures)."""
        pop = getattr(self.scorer, "pop_metrics", None)
        return pop() if pop is not None else {}


def _token_lengths(prompts: list[str], tokenizer, limit: int) -> list[int]:
    """Token count of each prompt, exact up to `limit`; a prompt of more than `limit * MAX_CHARS_PER_TOKEN`
    characters is measured on that prefix only (tokenizing a 20 MB row in full costs gigabytes)."""
    bound = limit * MAX_CHARS_PER_TOKEN
    clipped = [p if len(p) <= bound else p[:bound] for p in prompts]
    lengths: list[int] = []
    for start in range(0, len(clipped), _TOKENIZE_CHUNK):
        lengths += [len(ids) for ids in tokenizer(clipped[start : start + _TOKENIZE_CHUNK])["input_ids"]]
    # a clipped prompt whose prefix still fits is longer than any prompt this bound admits: too long all the same
    return [n if len(p) <= bound else max(n, limit + 1) for n, p in zip(lengths, prompts)]


def _render(rows, formatter: PromptFormatter, tokenizer, max_prompt_tokens: int | None, report: RowReport):
    """Problems from (problem, answer, row number) rows; prompts longer than `max_prompt_tokens` tokens are skipped."""
    prompts = [formatter.render(problem) for problem, _, _ in rows]
    keep = [True] * len(rows)
    if max_prompt_tokens is not None and tokenizer is not None and prompts:
        for i, length in enumerate(_token_lengths(prompts, tokenizer, int(max_prompt_tokens))):
            if length > max_prompt_tokens:
                keep[i] = False
                report.kept -= 1
                report.skip(f"prompt longer than {max_prompt_tokens} tokens", rows[i][2])
    return [Problem(prompt=p, answer=row[1]) for p, row, k in zip(prompts, rows, keep) if k]


def build_dataset_task(
    data: DataConfig,
    scorer: Any,
    *,
    tokenizer: Any | None = None,
    max_prompt_tokens: int | None = None,
) -> DatasetTask:
    """Read, render, split and report a dataset from the validated `data` section; see the module docstring.

    `max_prompt_tokens`: the prompt-length limit (the GRPO loop passes `generation.interfaces.max_prompt_length`,
    which folds in `data.max_input_seq_length`); None = `data.max_input_seq_length`.
    """
    keys = {"input_key": data.input_key, "output_key": data.output_key}
    train_source = DataSource(data.dataset_name, split=data.train_split, config_name=data.dataset_config, **keys)
    rows, train_report = read_rows(train_source)
    formatter = PromptFormatter(
        tokenizer,
        template=data.prompt_template,
        system_prompt=data.system_prompt,
        use_chat_template=data.use_chat_template,
        chat_template_kwargs=data.chat_template_kwargs,
    )
    limit = max_prompt_tokens if max_prompt_tokens is not None else data.max_input_seq_length
    problems = _render(rows, formatter, tokenizer, limit, train_report)
    if not problems:
        raise ValueError(f"data source {train_source.name}: no usable row left ({train_report.summary()})")
    reports = [train_report]
    if data.val_dataset_name:
        val_source = DataSource(
            data.val_dataset_name,
            split=data.val_split,
            config_name=data.dataset_config,
            config_key="data.val_dataset_name",
            **keys,
        )
        val_rows, val_report = read_rows(val_source)
        validation = _render(val_rows, formatter, tokenizer, limit, val_report)
        reports.append(val_report)
        train = problems
    else:
        if data.val_size >= len(problems):
            raise ValueError(
                f"data.val_size ({data.val_size}) must be smaller than the {len(problems)} usable rows of "
                f"{train_source.name} (or set data.val_dataset_name)"
            )
        order = np.random.default_rng([data.seed, _HOLDOUT_STREAM]).permutation(len(problems))
        held_out = set(order[: data.val_size].tolist())
        validation = [problems[i] for i in order[: data.val_size]]
        train = [p for i, p in enumerate(problems) if i not in held_out]
    bad = [r for r in reports if r.skipped]
    if bad:
        warnings.warn("; ".join(r.summary() for r in bad), BadRowsWarning, stacklevel=2)
    return DatasetTask(train, validation, scorer, seed=data.seed, shuffle=data.shuffle)
