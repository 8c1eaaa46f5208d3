"""Run bookkeeping: `Logger` (metrics.jsonl / TensorBoard / W&B / MLflow), `Timer`, `RunProgress`, plots.

Plots live in `nemo_jetrl.utils.plots` (imported on demand: matplotlib is not needed to train).
"""

from nemo_jetrl.utils.logger import Logger, LoggerConfig, console_summary
from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

__all__ = ["Logger", "LoggerConfig", "RunProgress", "Timer", "console_summary", "read_metrics_jsonl"]
