"""`checkpointing.checkpoint_must_save_by` (NeMo-RL's key): a wall-clock budget 'DD:HH:MM:SS' after which the run
saves a checkpoint and stops, so that a job's time limit (Slurm, a lent machine) ends it between steps with nothing
lost, and the next run with the same `checkpoint_dir` continues it.

As NeMo-RL's `TimeoutChecker(fit_last_save_time=True)`: after each step, the run stops when the time spent plus the
mean step time so far reaches the budget (the next step would not fit), saving first when `checkpointing.enabled`.
One difference: the budget counts from the process's start (imports, model load, compilation and the first
validation included; `run_grpo`'s start where /proc is absent), where NeMo-RL counts from its training loop's start:
a job's time limit covers those too. On torchrun, rank 0's clock decides and every rank follows it (one broadcast a
step), so no rank saves or stops alone.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FORMAT = "DD:HH:MM:SS"


def parse_must_save_by(value: str) -> int:
    """Seconds of a 'DD:HH:MM:SS' budget (four non-negative integers, as NeMo-RL reads them; fields may exceed
    their clock range, '00:00:90:00' is 90 minutes). A ValueError of one line otherwise."""
    parts = str(value).split(":")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(
            f"checkpointing.checkpoint_must_save_by must be '{FORMAT}' (e.g. '00:03:45:00'), got {value!r}"
        )
    days, hours, minutes, seconds = (int(p) for p in parts)
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def format_must_save_by(seconds: float) -> str:
    """'DD:HH:MM:SS' of a budget in seconds (rounded down, at least 0)."""
    s = max(0, int(seconds))
    return f"{s // 86400:02d}:{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


class SaveDeadline:
    """The budget of one run: `step_done()` after each step returns whether to save and stop now."""

    def __init__(self, must_save_by: str | None, clock=time.monotonic, age_s: float | None = None):
        """`age_s`: how long ago the budget started (default: this process's age)."""
        self.budget_s = None if must_save_by is None else parse_must_save_by(must_save_by)
        self._clock = clock
        self._start = clock() - (process_age_s() if age_s is None else age_s)
        self._last = None  # the end of the previous step (None: no step yet)
        self._step_times: list[float] = []

    def start_steps(self) -> None:
        """The training loop starts: the first step's time counts from here (start-up is not a step)."""
        self._last = self._clock()

    def due(self) -> bool:
        """This rank's verdict: the time spent, plus the mean step time when steps have run, reaches the budget."""
        if self.budget_s is None:
            return False
        spent = self._clock() - self._start
        mean_step = sum(self._step_times) / len(self._step_times) if self._step_times else 0.0
        return spent + mean_step >= self.budget_s

    def step_done(self, device: torch.device | None = None) -> bool:
        """Record a step's end; True when the run should save and stop (rank 0's verdict on every rank)."""
        if self.budget_s is None:
            return False
        now = self._clock()
        if self._last is not None:
            self._step_times.append(now - self._last)
        self._last = now
        return _rank0_verdict(self.due(), device)

    def stop_line(self, step: int, saved: bool) -> str:
        """The line a run prints when it stops here after `step`."""
        what = f"saved step {step}" if saved else "not saved (checkpointing.enabled is false)"
        return (f"checkpointing.checkpoint_must_save_by ({format_must_save_by(self.budget_s)}) reached after step "
                f"{step}: {what}; stopping training early (a run with the same checkpoint_dir continues)")  # fmt: skip


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc: its start in clock ticks after boot against the uptime);
    0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22; fields after the name start at 3
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _rank0_verdict(flag: bool, device: torch.device | None) -> bool:
    """`flag` as rank 0 sees it, on every rank of a process group (unchanged without one)."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())
