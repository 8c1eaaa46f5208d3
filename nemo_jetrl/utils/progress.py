"""`RunProgress`: a one-line rich progress display for a training run (step i/N, phase, latest metrics).

    with RunProgress(total_steps=100) as progress:
        for step in range(1, 101):
            with progress.phase("generation"):
                ...
            progress.advance(metrics={"train/reward_mean": 0.53})

Disabled (`enabled=False`, or `enabled=None` and stdout is not a terminal) it prints NOTHING: logs and CI output
stay clean, and per-step numbers are already in metrics.jsonl and `console_summary`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from nemo_jetrl.utils.metrics_jsonl import to_scalar

# shown label -> metric key
DEFAULT_PROGRESS_METRICS: Mapping[str, str] = {"reward": "train/reward_mean", "acc": "validation/accuracy"}


class _PhaseScope:
    """Returned by `RunProgress.phase`: the phase is already set; leaving a `with` restores the previous one."""

    def __init__(self, progress: RunProgress, previous: str):
        self._progress, self._previous = progress, previous

    def __enter__(self) -> _PhaseScope:
        return self

    def __exit__(self, *exc_info) -> None:
        self._progress.phase(self._previous)


class RunProgress:
    """Step counter with the current phase and a few latest metrics; see the module docstring."""

    def __init__(
        self,
        total_steps: int,
        enabled: bool | None = None,
        console: Console | None = None,
        metric_keys: Mapping[str, str] = DEFAULT_PROGRESS_METRICS,
        description: str = "GRPO",
    ):
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 0:
            raise ValueError(f"total_steps must be an integer >= 0, got {total_steps!r}")
        console = console or Console()
        self.enabled = console.is_terminal if enabled is None else bool(enabled)
        self.total_steps = total_steps
        self.metric_keys = dict(metric_keys)
        self.completed = 0
        self.current_phase = ""
        self.latest: dict[str, float] = {}
        self._progress: Progress | None = None
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn(f"[bold]{description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("[cyan]{task.fields[phase]}"),
                TextColumn("{task.fields[metrics]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._progress.add_task(description, total=total_steps, phase="", metrics="")

    def start(self) -> None:
        if self._progress is not None:
            self._progress.start()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, name: str) -> _PhaseScope:
        """Show `name` as the current phase; as a context manager, restore the previous phase on exit."""
        previous, self.current_phase = self.current_phase, name
        self._refresh()
        return _PhaseScope(self, previous)

    def update_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Remember the latest value of each watched metric present in `metrics`."""
        for label, key in self.metric_keys.items():
            if key in metrics:
                self.latest[label] = float(to_scalar(key, metrics[key]))
        self._refresh()

    def advance(self, step: int | None = None, metrics: Mapping[str, Any] | None = None) -> None:
        """Mark a step finished (`step` = steps completed so far; default one more), optionally with its metrics."""
        self.completed = self.completed + 1 if step is None else int(step)
        if metrics:
            self.update_metrics(metrics)
        self._refresh()

    def metrics_text(self) -> str:
        """e.g. "reward 0.531  acc 0.812" (watched metrics seen so far)."""
        return "  ".join(f"{label} {_fmt(value)}" for label, value in self.latest.items())

    def _refresh(self) -> None:
        if self._progress is not None:
            self._progress.update(
                self._task, completed=self.completed, phase=self.current_phase, metrics=self.metrics_text()
            )

    def __enter__(self) -> RunProgress:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _fmt(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else str(value)


def run_summary(history: list[dict[str, float]], val_history: list[dict[str, float]], wall: float) -> str:
    """The one line a GRPO run ends with: reward and validation accuracy first -> last, mean mismatch."""

    def first_last(rows, key, n=3):
        vals = [r[key] for r in rows if key in r and math.isfinite(r[key])]
        if not vals:
            return "n/a"
        head, tail = vals[:n], vals[-n:]
        return f"{sum(head) / len(head):.3f} -> {sum(tail) / len(tail):.3f}"

    tmpe = [r["token_mult_prob_error"] for r in history if math.isfinite(r.get("token_mult_prob_error", math.nan))]
    mean_tmpe = sum(tmpe) / len(tmpe) if tmpe else math.nan
    return (
        f"GRPO done: {len(history)} steps in {wall:.0f}s | reward {first_last(history, 'reward_mean')} | "
        f"val accuracy {first_last(val_history, 'accuracy', 1)} | mean token_mult_prob_error {mean_tmpe:.4f}"
    )
