"""Kernel profile of chosen GRPO phases in one chosen step (`NEMO_JETRL_PROFILE`): where a phase's time goes.

    NEMO_JETRL_PROFILE="training,logprobs@3" uv run examples/run_grpo.py --config X.yaml

profiles the `training` and `logprobs` phases (the `timing/<phase>` names) of step 3 (the step number the metrics
carry) under torch.profiler and writes `<logger.log_dir>/profile/step3_<phase>.json`: the phase's wall time, its CUDA
kernels by device time (`rows`: name, ms, calls) and their sum per kernel family (`families`), and prints one line
per phase (kernel time against wall time: far below it means the host or the allocator is the bound). The JSON also
lists the host ops by self CPU time (`host_rows`); `NEMO_JETRL_PROFILE_TRACE=1` writes the chrome trace beside it
(`step3_<phase>.trace.json.gz`; `python3 -m benchmarks.trace_gaps FILE` charges the device's idle gaps to the host
ops that ran in them). Only rank 0 profiles: under torchrun its own GPU's kernels; under Ray the driver, whose
phases run in the workers (no kernels in the file). The profiled step runs slower than the others (the profiler's
own overhead and a device sync at each profiled phase's ends); its timings are logged like any step's.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "NEMO_JETRL_PROFILE"
TRACE_ENV = "NEMO_JETRL_PROFILE_TRACE"
PROFILE_DIR = "profile"  # under logger.log_dir: step<N>_<phase>.json per profiled phase

FAMILIES = (  # (family, regex on the kernel name), first match wins
    ("attention", r"flash|fmha|attention|cudnn|sdpa"),
    ("fp8 gemm", r"qqtst|sm90_xmma_gemm.*e4m3|f8f6f4|fp8.*gemm|gemm.*e4m3|cutlass.*float_e4m3|blockwise"),
    ("bf16 gemm", r"gemm|cutlass|xmma|nvjet|ampere|sm90"),
    ("quantize", r"_quant_groups|_quant_tiles|quant|_amax_kernel|_row_cast"),
    ("glue", r"rms_norm|qk_norm|rope|silu"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("reduce/finite", r"reduce|isfinite|all_kernel|norm"),
    ("copy/cat", r"copy|cat|Copy|elementwise_kernel.*direct_copy|transpose"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
)


def kernel_family(name: str) -> str:
    """The family of a CUDA kernel's name (`FAMILIES`; "other" when none matches)."""
    return next((fam for fam, pattern in FAMILIES if re.search(pattern, name, re.I)), "other")


def family_totals(rows: list[dict]) -> dict[str, float]:
    """{kernel family: ms} of kernel rows ({"name", "ms", ...})."""
    out: dict[str, float] = {}
    for row in rows:
        fam = kernel_family(row["name"])
        out[fam] = out.get(fam, 0.0) + row["ms"]
    return out


def kernel_rows(events: Sequence, divide: int = 1) -> list[dict]:
    """The CUDA kernels (and memcpys / memsets) of a finished profile's `key_averages()` by device time: [{"name",
    "ms", "calls"}], largest first, totals divided by `divide` (the number of profiled repetitions). User
    annotations are left out; kernel names with '#' (PyTorch's `{lambda()#1}` elementwise and copy kernels) are
    kept."""
    rows = []
    for event in events:
        device_us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        annotation = getattr(event, "is_user_annotation", False) or event.key.startswith("ProfilerStep#")
        if device_us > 0 and event.device_type == torch.autograd.DeviceType.CUDA and not annotation:
            rows.append({"name": event.key, "ms": device_us / 1e3 / divide, "calls": event.count / divide})
    return sorted(rows, key=lambda row: -row["ms"])


def host_rows(events: Sequence, top: int = 40) -> list[dict]:
    """The host ops of a finished profile's `key_averages()` by self CPU time: [{"name", "ms", "calls"}], the `top`
    largest."""
    largest = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return [{"name": e.key, "ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in largest]


def write_trace_gz(prof: torch.profiler.profile, path: str | os.PathLike) -> Path:
    """A finished profile's chrome trace, gzipped, as `path` + ".gz" (the form `benchmarks.trace_gaps` reads)."""
    raw = Path(path)
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return Path(f"{raw}.gz")


def profiled_steps(log_dir: str | os.PathLike) -> set[int]:
    """The steps of a run's log directory that ran a phase under the profiler (their times are not step times:
    the profiler's launches, syncs and record writing are in them)."""
    steps = set()
    for path in (Path(log_dir) / PROFILE_DIR).glob("step*_*.json"):
        head = path.name.removeprefix("step").partition("_")[0]
        if head.isdigit():
            steps.add(int(head))
    return steps


def _sync_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@dataclass(frozen=True)
class ProfileRequest:
    """Which phases of which step to profile, and where the results go."""

    phases: frozenset[str]
    step: int  # the logged step number (1-based)
    out_dir: Path
    trace: bool = False  # also write the chrome trace (NEMO_JETRL_PROFILE_TRACE=1)

    @classmethod
    def from_env(cls, log_dir: str | os.PathLike, environ: dict[str, str] | None = None) -> ProfileRequest | None:
        """`NEMO_JETRL_PROFILE="phase[,phase...]@step"`; None where it is unset or empty."""
        environ = os.environ if environ is None else environ
        spec = environ.get(ENV, "").strip()
        if not spec:
            return None
        phases, sep, step = spec.rpartition("@")
        names = frozenset(p.strip() for p in phases.split(",") if p.strip())
        if not sep or not names or not step.strip().isdigit() or int(step) < 1:
            raise ValueError(f'{ENV}={spec!r}: expected "phase[,phase...]@step", e.g. "training,logprobs@3"')
        trace = environ.get(TRACE_ENV, "").strip().lower() in ("1", "true", "yes")
        return cls(names, int(step), Path(log_dir) / PROFILE_DIR, trace)

    def for_step(self, step: int) -> PhaseProfiler | None:
        """A profiler for logged step `step` when it is the requested one."""
        return PhaseProfiler(self) if step == self.step else None


class PhaseProfiler:
    """Profiles the requested phases of one step; a `Timer` calls `start` / `stop` with every phase name, and only
    the requested ones are profiled, one at a time, between device syncs (the kernels queued before the phase stay
    out of its profile, its own finish inside it)."""

    def __init__(self, request: ProfileRequest):
        self.request = request
        self._running: tuple[str, torch.profiler.profile] | None = None

    def start(self, name: str) -> None:
        if name not in self.request.phases or self._running is not None:
            return
        _sync_device()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        prof.__enter__()
        self._running = (name, prof)

    def stop(self, name: str, wall_s: float) -> Path | None:
        """Ends the profile of `name` (when it is the one running; `wall_s`: the phase's timed interval) and writes
        its JSON; returns the file."""
        if self._running is None or self._running[0] != name:
            return None
        _, prof = self._running
        self._running = None
        wall_ms = wall_s * 1e3
        _sync_device()
        prof.__exit__(None, None, None)
        events = prof.key_averages()  # computed once: slow on a long phase's events
        rows = kernel_rows(events)
        kernels_ms = sum(row["ms"] for row in rows)
        record = {
            "phase": name,
            "step": self.request.step,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "wall_ms": wall_ms,
            "kernels_ms": kernels_ms,
            "families": dict(sorted(family_totals(rows).items(), key=lambda kv: -kv[1])),
            "rows": rows[:300],
            "host_rows": host_rows(events),
        }
        self.request.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.request.out_dir / f"step{self.request.step}_{name.replace('/', '_')}.json"
        path.write_text(json.dumps(record, indent=1))
        if self.request.trace:
            write_trace_gz(prof, path.with_suffix(".trace.json"))
        top = ", ".join(f"{fam} {ms:.0f}" for fam, ms in list(record["families"].items())[:5])
        step = self.request.step
        print(f"profile: step {step} {name}: {kernels_ms:.0f} ms of kernels in {wall_ms:.0f} ms ({top}) -> {path}")
        return path
