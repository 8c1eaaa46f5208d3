"""Run bookkeeping: `Logger` (metrics.jsonl / TensorBoard / W&B / MLflow), `Timer`, `RunProgress`, plots.

Plots live in `nemo_jetrl.utils.plots` (imported on demand: matplotlib is not needed to train).
"""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {
    "Logger": "logger",
    "LoggerConfig": "config",
    "console_summary": "logger",
    "read_metrics_jsonl": "metrics_jsonl",
    "RunProgress": "progress",
    "Timer": "timers",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
