"""One device call = one stage of the long-response accuracy study (docs/accuracy.md): the runner.

A stage directory holds one `seed<S>/` per seed, each with `sft/` (the SFT checkpoint) and `arms/<arm>/` (one
run_grpo.py log dir), and `stage.json`, the status of every job. `run_stage` does, within one deadline:

1. the SFT of every seed that still has an arm to run and no checkpoint, in parallel (seed i on GPU i mod #GPUs);
2. then every pending arm of every seed at once, one process each, spread round-robin over the GPUs
   (`CUDA_VISIBLE_DEVICES` per process), each told its share of the GPU's memory for its memory preflight; arms
   still running at the deadline are stopped (SIGTERM) and keep the steps their metrics.jsonl holds;
3. with `pack`, one tar.gz of everything small (metrics, logs, SFT metadata and curve; no weights).

Resumable: an arm whose status says `finished` or `time_limit` and whose metrics.jsonl exists is skipped, and a
seed with no arm left skips its SFT. A 104M-parameter checkpoint (416 MB) cannot leave the device machine (files
back: 16 MiB each), so a fresh machine re-runs the SFT of the seeds it needs. `inline` runs every job in this
process, one after another (the CPU tests).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl

DONE_REASONS = ("finished", "time_limit")
LOG_TAIL_BYTES = 1 << 20  # the packed copy of a log keeps its last MiB
PACK_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
PACK_SKIP_NAMES = ("sft_corpus_sample.jsonl", ".nemo_jetrl.lock")  # the sample: reproducible, ~1 MB at 4K tokens
STOP_GRACE_S = 20.0


@dataclass
class Job:
    """One process of a stage: `argv` for `script` (a subprocess), or `inline` (the same work in this process)."""

    name: str  # "sft/seed0", "seed0/bf16"
    script: Path
    argv: list[str]
    log: Path
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES of the process (None: left as is)
    inline: Callable[[], int] | None = None
    result: dict = field(default_factory=dict)  # rc, reason, wall_s


def arm_dir(stage_dir: Path, seed: int, arm: str) -> Path:
    return stage_dir / f"seed{seed}" / "arms" / arm


def sft_dir(stage_dir: Path, seed: int) -> Path:
    return stage_dir / f"seed{seed}" / "sft"


def sft_done(stage_dir: Path, seed: int) -> bool:
    d = sft_dir(stage_dir, seed)
    return (d / "sft_meta.json").is_file() and (d / "config.json").is_file() and any(d.glob("*.safetensors"))


def load_status(stage_dir: Path) -> dict:
    path = stage_dir / "stage.json"
    return json.loads(path.read_text()) if path.is_file() else {"jobs": {}}


def save_status(stage_dir: Path, status: dict) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "stage.json").write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")


def metrics_steps(metrics: Path) -> int:
    """Training steps logged in a metrics.jsonl (rows with a train/reward_mean), 0 when absent."""
    if not metrics.is_file():
        return 0
    return len(read_metrics_jsonl(metrics).get("train/reward_mean", ((), ()))[0])


def arm_done(stage_dir: Path, status: dict, seed: int, arm: str) -> bool:
    entry = status["jobs"].get(f"seed{seed}/{arm}", {})
    return entry.get("reason") in DONE_REASONS and (arm_dir(stage_dir, seed, arm) / "metrics.jsonl").is_file()


def _popen(job: Job) -> tuple[subprocess.Popen, object]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = job.gpu
    job.log.parent.mkdir(parents=True, exist_ok=True)
    log = job.log.open("w")
    cmd = [sys.executable, str(job.script), *job.argv]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True), log


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM the job's process group, SIGKILL after a grace period; its exit code."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    except ProcessLookupError:
        return proc.wait()


def run_jobs(
    jobs: list[Job], deadline: float, inline: bool = False, parallel: int | None = None, poll_s: float = 1.0
) -> None:
    """Run `jobs`, `parallel` at a time (None: all at once), or one after another in this process with `inline`,
    until each ends or `deadline` (time.monotonic()); fills each job's `result`: rc, reason (finished | failed |
    time_limit | not_started), wall_s (from the start of the run)."""
    start = time.monotonic()
    if inline:
        for job in jobs:
            if time.monotonic() >= deadline:
                job.result = {"rc": None, "reason": "not_started", "wall_s": 0.0}
                continue
            rc = job.inline()
            job.result = {"rc": rc, "reason": "finished" if rc == 0 else "failed",
                          "wall_s": round(time.monotonic() - start, 1)}  # fmt: skip
        return
    pending, running = list(jobs), {}
    while pending or running:
        while pending and len(running) < (parallel or len(jobs)) and time.monotonic() < deadline:
            job = pending.pop(0)
            running[job.name] = (job, *_popen(job))
            print(f"stage: started {job.name} (pid {running[job.name][1].pid}, gpu {job.gpu})", flush=True)
        over = time.monotonic() >= deadline
        for job in pending if over else ():
            job.result = {"rc": None, "reason": "not_started", "wall_s": 0.0}
        pending = [] if over else pending
        for name, (job, proc, log) in list(running.items()):
            if proc.poll() is None and not over:
                continue
            stopped = proc.poll() is None
            rc = _stop(proc) if stopped else proc.returncode
            log.close()
            reason = "time_limit" if stopped else ("finished" if rc == 0 else "failed")
            job.result = {"rc": rc, "reason": reason, "wall_s": round(time.monotonic() - start, 1)}
            del running[name]
            print(f"stage: {name} {reason} (exit {rc}) after {job.result['wall_s']:.0f} s", flush=True)
        if running:
            time.sleep(poll_s)


def gpu_of(index: int, gpus: list[str]) -> str | None:
    return gpus[index % len(gpus)] if gpus else None


def run_stage(
    stage_dir: Path,
    seeds: list[int],
    arms: list[str],
    gpus: list[str],
    deadline: float,
    sft_job: Callable[[int, str | None], Job],
    arm_job: Callable[[int, str, str | None, int], Job],
    inline: bool = False,
    poll_s: float = 1.0,
) -> dict:
    """The stage (module docstring). `sft_job(seed, gpu)`; `arm_job(seed, arm, gpu, processes on that GPU)`.
    Returns the status written to stage.json."""
    status = load_status(stage_dir)
    pending = [(s, a) for s in seeds for a in arms if not arm_done(stage_dir, status, s, a)]
    need = sorted({s for s, _ in pending if not sft_done(stage_dir, s)})
    skipped = [f"seed{s}/{a}" for s in seeds for a in arms if (s, a) not in pending]
    if skipped:
        print(f"stage: {len(skipped)} arms already done: {', '.join(skipped)}", flush=True)
    sft_jobs = [sft_job(s, gpu_of(i, gpus)) for i, s in enumerate(need)]
    run_jobs(sft_jobs, deadline, inline, poll_s=poll_s)
    for job in sft_jobs:
        status["jobs"][job.name] = job.result
    save_status(stage_dir, status)
    ready = [(s, a) for s, a in pending if sft_done(stage_dir, s)]
    per_gpu = -(-len(ready) // max(1, len(gpus)))  # processes on the busiest GPU
    arm_jobs = [arm_job(s, a, gpu_of(i, gpus), per_gpu) for i, (s, a) in enumerate(ready)]
    for s, a in ready:  # a failed or unfinished earlier run: start it afresh
        shutil.rmtree(arm_dir(stage_dir, s, a), ignore_errors=True)
    run_jobs(arm_jobs, deadline, inline, poll_s=poll_s)
    for job, (s, a) in zip(arm_jobs, ready):
        status["jobs"][job.name] = {**job.result, "steps": metrics_steps(arm_dir(stage_dir, s, a) / "metrics.jsonl")}
    for s, a in pending:
        if (s, a) not in ready:
            status["jobs"][f"seed{s}/{a}"] = {"rc": None, "reason": "no_sft", "steps": 0}
    save_status(stage_dir, status)
    return status


def pack(stage_dir: Path, out_file: Path) -> Path:
    """A tar.gz of the stage's small files (module docstring), paths relative to the stage's parent."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out_file, "w:gz") as tar:
        for path in sorted(stage_dir.rglob("*")):
            if not path.is_file() or path.suffix in PACK_SKIP_SUFFIXES or path.name in PACK_SKIP_NAMES:
                continue
            arcname = str(path.relative_to(stage_dir.parent))
            if path.suffix == ".log" and path.stat().st_size > LOG_TAIL_BYTES:
                tail = path.read_bytes()[-LOG_TAIL_BYTES:]
                tmp = path.with_suffix(".log.tail")
                tmp.write_bytes(tail)
                tar.add(tmp, arcname=arcname)
                tmp.unlink()
            else:
                tar.add(path, arcname=arcname)
    return out_file


def status_table(status: dict) -> str:
    """One line per job: name, reason, exit code, steps, wall seconds."""
    lines = []
    for name, r in sorted(status["jobs"].items()):
        lines.append(f"  {name:32s} {r.get('reason')!s:12s} exit {r.get('rc')!s:5s} steps {r.get('steps', '-')!s:5s} "
                     f"{r.get('wall_s', 0):7.1f} s")  # fmt: skip
    return "\n".join(lines)
