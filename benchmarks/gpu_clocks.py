"""The GPU's SM clock, power draw and temperature while each benchmark variant's timed steps run.

A variant's figure can carry a clock drop: FP8 tensor cores at full load may hold the card at its power limit,
and a step timed at a lower clock is slower for a reason no kernel change removes. `ClockSampler` runs
`nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu -lms PERIOD` in the background for the whole run and
stamps each line with the host's monotonic clock as it arrives. The timing loop records each timed step's
(start, end) on the same clock (`alternating_timings(..., intervals=)`), and `per_variant` gives each variant the
median SM clock and power, and the highest temperature, over the samples inside its own timed steps. Where
nvidia-smi is absent the sampler stays empty and nothing is reported.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

QUERY = "clocks.sm,power.draw,temperature.gpu"


@dataclass(frozen=True)
class Sample:
    t: float  # host monotonic seconds when the line arrived
    sm_mhz: float
    power_w: float
    temp_c: float


def parse_line(line: str, t: float) -> Sample | None:
    """One `--format=csv,noheader,nounits` line of QUERY -> Sample; None for '[N/A]' fields or a partial line."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        sm, power, temp = (float(p) for p in parts)
    except ValueError:
        return None
    return Sample(t, sm, power, temp)


class ClockSampler:
    """Context manager: nvidia-smi sampling GPU `index` every `period_ms` while the block runs (`samples`)."""

    def __init__(self, index: int = 0, period_ms: int = 50) -> None:
        self.cmd = ["nvidia-smi", "-i", str(index), f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                    f"-lms={period_ms}"]  # fmt: skip
        self.samples: list[Sample] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        try:
            self._proc = subprocess.Popen(
                self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
            )
        except OSError:  # no nvidia-smi here: an empty record
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            sample = parse_line(line, time.monotonic())
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)


def per_variant(samples: Sequence[Sample], intervals: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, dict]:
    """{variant: {sm_mhz_median, sm_mhz_min, power_w_median, temp_c_max, clock_samples}} over the samples taken
    inside that variant's timed steps; variants no sample fell into are left out."""
    out = {}
    for name, spans in intervals.items():
        inside = [s for s in samples if any(start <= s.t <= end for start, end in spans)]
        if inside:
            out[name] = {
                "sm_mhz_median": statistics.median(s.sm_mhz for s in inside),
                "sm_mhz_min": min(s.sm_mhz for s in inside),
                "power_w_median": statistics.median(s.power_w for s in inside),
                "temp_c_max": max(s.temp_c for s in inside),
                "clock_samples": len(inside),
            }
    return out
