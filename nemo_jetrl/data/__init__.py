"""Datasets for the real-model path: read jsonl / parquet / HF datasets, render prompts, split, shuffle by seed."""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {
    "BadRowsWarning": "dataset_task",
    "DatasetTask": "dataset_task",
    "build_dataset_task": "dataset_task",
    "PromptFormatter": "prompts",
    "DataSource": "readers",
    "RowReport": "readers",
    "read_rows": "readers",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
