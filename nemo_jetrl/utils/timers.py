"""`Timer`: named wall-clock intervals (perf_counter) for phase timing metrics.

timer = Timer(device=model_device)             # a CUDA device makes every start/stop synchronize it first
with timer.time("generation"):
    ...
with timer.time("train"):
    with timer.time("train/optimizer"):        # names are free-form; "a/b" reads as a sub-phase of "a"
        ...
logger.log_metrics(timer.get_timing_metrics(), step)   # {"timing/generation": s, "timing/train": s, ...}
timer.reset()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs) / len(xs)),
    "max": lambda xs: float(max(xs)),
    "min": lambda xs: float(min(xs)),
    "count": lambda xs: float(len(xs)),
}


class Timer:
    """Accumulates durations (seconds) per name until `reset()`; a name may be timed many times per step."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Timer device {self.device} requested but CUDA is not available")
        self._durations: dict[str, list[float]] = {}
        self._started: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # count queued kernels in the phase that launched them

    def start(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"timer name must be a non-empty string, got {name!r}")
        if name in self._started:
            raise ValueError(f"timer {name!r} is already running")
        self._sync()
        self._started[name] = time.perf_counter()

    def stop(self, name: str) -> float:
        """Stop `name` and return the interval just measured (seconds)."""
        if name not in self._started:
            raise ValueError(f"timer {name!r} was not started")
        self._sync()
        elapsed = time.perf_counter() - self._started.pop(name)
        self._durations.setdefault(name, []).append(elapsed)
        return elapsed

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        """Time the body as one interval of `name` (recorded even when the body raises)."""
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def durations(self, name: str) -> list[float]:
        """Every interval recorded for `name` since the last reset (empty if none)."""
        return list(self._durations.get(name, []))

    def get_timing_metrics(self, reduction: str = "sum") -> dict[str, float]:
        """`{"timing/<name>": reduce(intervals)}` for every name with at least one finished interval."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown timer reduction {reduction!r}; expected one of {sorted(REDUCTIONS)}")
        reduce = REDUCTIONS[reduction]
        return {f"timing/{name}": reduce(xs) for name, xs in self._durations.items()}

    def reset(self, name: str | None = None) -> None:
        """Forget the intervals of `name`, or of every name (running timers keep running)."""
        if name is None:
            self._durations.clear()
        else:
            self._durations.pop(name, None)
