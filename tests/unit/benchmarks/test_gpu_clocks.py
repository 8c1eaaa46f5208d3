"""benchmarks/gpu_clocks.py: nvidia-smi lines parsed, samples given to the variant whose timed steps they fall in,
and the sampler's background process run and stopped (a stand-in nvidia-smi on PATH) or absent."""

from __future__ import annotations

import os
import stat
import time

from benchmarks import gpu_clocks
from benchmarks.gpu_clocks import ClockSampler, Sample, parse_line, per_variant


def test_lines_parse_and_unreadable_ones_are_skipped():
    assert parse_line("1980, 650.25, 61\n", 2.0) == Sample(2.0, 1980.0, 650.25, 61.0)
    assert parse_line("1755, [N/A], 60", 1.0) is None
    assert parse_line("1980, 650", 1.0) is None


def test_each_variant_gets_the_samples_inside_its_own_timed_steps():
    samples = [Sample(t, mhz, w, c) for t, mhz, w, c in
               [(0.5, 1980, 300, 50), (1.5, 1700, 690, 70), (2.5, 1600, 700, 72), (3.5, 1980, 400, 55)]]  # fmt: skip
    out = per_variant(samples, {"bf16": [(0.0, 1.0), (3.0, 4.0)], "fp8": [(1.0, 3.0)], "none": [(5.0, 6.0)]})
    assert out["bf16"] == {"sm_mhz_median": 1980, "sm_mhz_min": 1980, "power_w_median": 350, "temp_c_max": 55,
                           "clock_samples": 2}  # fmt: skip
    assert out["fp8"]["sm_mhz_median"] == 1650 and out["fp8"]["sm_mhz_min"] == 1600 and out["fp8"]["temp_c_max"] == 72
    assert "none" not in out


def test_the_sampler_reads_a_running_nvidia_smi_and_stops_it(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"  # prints a reading, an unreadable one, then a reading every 20 ms until killed
    fake.write_text("#!/bin/sh\necho '1980, 300.5, 50'\necho '[N/A], 1, 1'\n"
                    "while true; do echo '1700, 690, 70'; sleep 0.02; done\n")  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    with ClockSampler(0, period_ms=20) as sampler:
        time.sleep(0.3)
    proc = sampler._proc
    assert proc.poll() is not None  # stopped on exit
    assert sampler.samples[0].sm_mhz == 1980 and len(sampler.samples) >= 3
    assert all(s.sm_mhz in (1980, 1700) and s.t >= start for s in sampler.samples)
    assert "--query-gpu=" + gpu_clocks.QUERY in sampler.cmd


def test_without_nvidia_smi_the_sampler_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with ClockSampler() as sampler:
        pass
    assert sampler.samples == [] and per_variant(sampler.samples, {"bf16": [(0.0, 1e9)]}) == {}

