"""Datasets for the real-model path: read jsonl / parquet / HF datasets, render prompts, split, shuffle by seed."""

from nemo_jetrl.data.dataset_task import BadRowsWarning, DatasetTask, build_dataset_task
from nemo_jetrl.data.prompts import PromptFormatter
from nemo_jetrl.data.readers import DataSource, RowReport, read_rows

__all__ = [
    "BadRowsWarning",
    "DataSource",
    "DatasetTask",
    "PromptFormatter",
    "RowReport",
    "build_dataset_task",
    "read_rows",
]
