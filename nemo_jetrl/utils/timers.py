"""`Timer`: named wall-clock intervals (perf_counter) for phase timing metrics.

timer = Timer(device=model_device)             # a CUDA device makes every start/stop synchronize it first
with timer.time("generation"):
    ...
with timer.time("train"):
    with timer.time("train/optimizer"):        # names are free-form; "a/b" reads as a sub-phase of "a"
        ...
logger.log_metrics(timer.get_timing_metrics(), step)   # {"timing/generation": s, "timing/train": s, ...}
timer.reset()

`Timer(memory_device=cuda_device)` also records each name's peak allocated device memory while it runs
(`torch.cuda.max_memory_allocated`, nested names included: an inner start resets the counter after folding it into
the names still running), as `memory/<name>_peak_gib` in `get_memory_metrics()`, and its peak reserved memory (the
caching allocator's footprint, what nvidia-smi sees less the CUDA context) as `memory/<name>_reserved_peak_gib`,
and the largest free bytes in CUDA graphs' private pools at its stops as `memory/<name>_graph_pool_gib`
(`device_memory.graph_pool_free_bytes`: allocated + this is what the phase needed of the device), and how often the
caching allocator had to free its cache and retry an allocation while it ran (`memory/<name>_alloc_retries`: each
retry synchronizes the device; a phase that retries runs near the capacity, fragmented); other devices record
nothing. `Timer(profile=...)` (utils/phase_profile.py) profiles the phases it names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from nemo_jetrl.utils.device_memory import graph_pool_free_bytes
from nemo_jetrl.utils.phase_profile import PhaseProfiler

REDUCTIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs) / len(xs)),
    "max": lambda xs: float(max(xs)),
    "min": lambda xs: float(min(xs)),
    "count": lambda xs: float(len(xs)),
}


class Timer:
    """Accumulates durations (seconds) per name until `reset()`; a name may be timed many times per step."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        memory_device: torch.device | str | None = None,
        profile: PhaseProfiler | None = None,
    ):
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Timer device {self.device} requested but CUDA is not available")
        memory = torch.device(memory_device) if memory_device is not None else None
        self.memory_device = memory if memory is not None and memory.type == "cuda" else None
        self._durations: dict[str, list[float]] = {}
        self._started: dict[str, float] = {}
        self._peak_now: dict[str, tuple[int, int]] = {}  # running names: their peak (allocated, reserved) bytes so far
        self._peaks: dict[str, tuple[int, int]] = {}  # finished names: their largest peaks since the last reset
        self._pools: dict[str, int] = {}  # finished names: the most graph-pool bytes free at their stops
        self._retries_at_start: dict[str, int] = {}  # running names: the allocator's retry count at their start
        self._retries: dict[str, int] = {}  # finished names: allocator retries while they ran
        self.profile = profile

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # count queued kernels in the phase that launched them

    def start(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"timer name must be a non-empty string, got {name!r}")
        if name in self._started:
            raise ValueError(f"timer {name!r} is already running")
        self._sync()
        if self.memory_device is not None:
            self._fold_peak()
            torch.cuda.reset_peak_memory_stats(self.memory_device)
            dev = self.memory_device
            self._peak_now[name] = (torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev))
            self._retries_at_start[name] = _alloc_retries(dev)
        if self.profile is not None:
            self.profile.start(name)
        self._started[name] = time.perf_counter()

    def stop(self, name: str) -> float:
        """Stop `name` and return the interval just measured (seconds)."""
        if name not in self._started:
            raise ValueError(f"timer {name!r} was not started")
        self._sync()
        elapsed = time.perf_counter() - self._started.pop(name)
        self.add(name, elapsed)
        if self.profile is not None:
            self.profile.stop(name, elapsed)
        if self.memory_device is not None:
            self._fold_peak()
            self._peaks[name] = _larger(self._peaks.get(name, (0, 0)), self._peak_now.pop(name))
            self._pools[name] = max(self._pools.get(name, 0), graph_pool_free_bytes(self.memory_device))
            retries = _alloc_retries(self.memory_device) - self._retries_at_start.pop(name)
            self._retries[name] = self._retries.get(name, 0) + retries
        return elapsed

    def _fold_peak(self) -> None:
        """The device's peaks since the last reset, into every running name's."""
        dev = self.memory_device
        peak = (torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev))
        for running in self._peak_now:
            self._peak_now[running] = _larger(self._peak_now[running], peak)

    def get_memory_metrics(self) -> dict[str, float]:
        """`{"memory/<name>_peak_gib": GiB, "memory/<name>_reserved_peak_gib": GiB, "memory/<name>_graph_pool_gib":
        GiB, "memory/<name>_alloc_retries": count}`: each finished name's peak allocated and reserved memory, its graph
        pools' free bytes and the allocator's retries while it ran (with a CUDA memory_device)."""
        out = {}
        for name, (allocated, reserved) in self._peaks.items():
            out[f"memory/{name}_peak_gib"] = allocated / 1024**3
            out[f"memory/{name}_reserved_peak_gib"] = reserved / 1024**3
            out[f"memory/{name}_graph_pool_gib"] = self._pools.get(name, 0) / 1024**3
            out[f"memory/{name}_alloc_retries"] = float(self._retries.get(name, 0))
        return out

    def add(self, name: str, seconds: float) -> None:
        """Record an interval measured elsewhere (e.g. device time from CUDA events) as one of `name`."""
        self._durations.setdefault(name, []).append(float(seconds))

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
            self._peaks.clear()
            self._pools.clear()
            self._retries.clear()
        else:
            self._durations.pop(name, None)
            self._peaks.pop(name, None)
            self._pools.pop(name, None)
            self._retries.pop(name, None)


def _larger(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Element-wise max of two (allocated, reserved) byte pairs."""
    return max(a[0], b[0]), max(a[1], b[1])


def _alloc_retries(device: torch.device) -> int:
    """How often the caching allocator has freed its cache to retry a failed allocation on `device`."""
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
