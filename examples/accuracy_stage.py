"""One device call = one stage of the long-response accuracy study (docs/accuracy_long.md): the runner.

A stage is one response length and its sweep variants. The length's directory holds `seed<S>/sft/` (the SFT
checkpoint every variant starts from); each variant's directory (the length's own for the base settings, e.g.
`2k`, or `2k_T0.7`) holds `seed<S>/arms/<arm>/` (one run_grpo.py log dir each) and `stage.json`, the status of its
jobs (the length's also of the SFT jobs). With `repeats` R > 1 every arm also runs R - 1 more times from the same
SFT start, in `seed<S>r<k>/arms/<arm>/` (k = 1..R-1, its own GRPO seed): runs that differ only in GRPO's sampling,
to tell what an arm does from what chance does. `run_stage` does, within one deadline:

1. the SFT of every seed that still has an arm to run and no checkpoint that passed its held-out gate, in parallel
   (seed i on GPU i mod #GPUs); a seed whose SFT fails the gate runs no arm (`sft_gate_failed`: RL from a model
   that cannot yet do the task measures nothing) and, in the next call, continues that SFT where it stopped if the
   machine still holds its resume file (`SFT_RESUME_FILE`, examples/accuracy_sft.py), else redoes it, unless it
   ran the `sft_fixed_steps` asked for again (`--sft-steps`): the same flags would train the same model again;
2. then every pending arm of every variant and seed at once, one process each, spread over the GPUs
   (`CUDA_VISIBLE_DEVICES` per process; `arm_gpus`: each run's arms round-robin, the next run's shifted by one
   GPU, so that an arm does not sit on the same GPU in every seed and the GPUs hold the same mix of arms), each
   told how many processes share its GPU (its memory preflight's
   share); each arm saves its state and stops itself before the deadline (`arm_checkpoint_overrides`: NeMo-RL's
   `checkpointing.checkpoint_must_save_by`), and arms still running at the deadline are stopped (SIGTERM) and keep
   the steps their metrics.jsonl holds;
3. with `pack`, one tar.gz of everything small (metrics, logs, SFT metadata and curve; no weights).

Resumable: an arm that saved a checkpoint before its last step continues from it in the next call on the same
machine (its metrics.jsonl goes on from that step: back-to-back calls give an arm more steps); any other arm whose
status says `finished` or `time_limit` and whose metrics.jsonl exists is skipped, and a seed with no arm left skips
its SFT. A 104M-parameter checkpoint (416 MB) cannot leave the device machine (files
back: 16 MiB each), so a fresh machine re-runs the SFT of the seeds it needs. `inline` runs every job in this
process, one after another (the CPU tests).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl
from nemo_jetrl.utils.save_deadline import format_must_save_by

DONE_REASONS = ("finished", "time_limit")
LOG_TAIL_BYTES = 1 << 20  # the packed copy of a log keeps its last MiB
PACK_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
PACK_SKIP_NAMES = ("sft_corpus_sample.jsonl", ".nemo_jetrl.lock")  # the sample: reproducible, ~1 MB at 4K tokens
STOP_GRACE_S = 20.0
SFT_RESUME_FILE = "sft_resume.pt"  # an SFT stopped before its gate: its state, continued by the next call
ARM_CHECKPOINTS = "checkpoints"  # an arm's run_grpo checkpoint_dir, in its log dir
ARM_SAVE_MARGIN_S = 30.0  # an arm's checkpoint save and exit, before the stage's deadline


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


def run_label(seed: int, repeat: int = 0) -> str:
    """The directory of one GRPO run per arm from seed `seed`'s SFT: `seed<S>`, or `seed<S>r<k>` for repeat k."""
    return f"seed{seed}" + (f"r{repeat}" if repeat else "")


def sft_label(label: str) -> str:
    """The seed whose SFT a run label's arms start from: `seed1r2` -> `seed1`."""
    return re.sub(r"r\d+$", "", label)


def arm_dir(stage_dir: Path, seed: int, arm: str, repeat: int = 0) -> Path:
    return stage_dir / run_label(seed, repeat) / "arms" / arm


def sft_dir(stage_dir: Path, seed: int) -> Path:
    return stage_dir / f"seed{seed}" / "sft"


def sft_done(stage_dir: Path, seed: int) -> bool:
    d = sft_dir(stage_dir, seed)
    return (d / "sft_meta.json").is_file() and (d / "config.json").is_file() and any(d.glob("*.safetensors"))


def sft_meta(stage_dir: Path, seed: int) -> dict | None:
    """A finished SFT's sft_meta.json; None where the SFT has not finished."""
    return json.loads((sft_dir(stage_dir, seed) / "sft_meta.json").read_text()) if sft_done(stage_dir, seed) else None


def sft_passed(stage_dir: Path, seed: int) -> bool:
    """A finished SFT whose held-out gate passed (sft_meta.json's `gate_passed`): the only start its arms take."""
    meta = sft_meta(stage_dir, seed)
    return meta is not None and bool(meta["gate_passed"])


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


def arm_done(stage_dir: Path, status: dict, seed: int, arm: str, repeat: int = 0) -> bool:
    entry = status["jobs"].get(f"{run_label(seed, repeat)}/{arm}", {})
    directory = arm_dir(stage_dir, seed, arm, repeat)
    logged = (directory / "metrics.jsonl").is_file()
    return entry.get("reason") in DONE_REASONS and logged and not arm_continues(directory)


def arm_checkpoint_overrides(directory: Path, budget_s: float) -> list[str]:
    """run_grpo overrides of an arm with its log dir `directory` that saves its state and stops within `budget_s`
    seconds of its process's start (none when infinite), in `directory`/ARM_CHECKPOINTS, newest only."""
    if not math.isfinite(budget_s):
        return []
    return [
        "checkpointing.enabled=true", f"checkpointing.checkpoint_dir={directory / ARM_CHECKPOINTS}",
        "checkpointing.keep_top_k=1", "checkpointing.save_period=1000000",
        f"++checkpointing.checkpoint_must_save_by='{format_must_save_by(budget_s)}'",
    ]  # fmt: skip


def checkpoint_steps(directory: Path) -> list[int]:
    """The steps of an arm's saved checkpoints (`directory`/ARM_CHECKPOINTS/step_N with its meta.json)."""
    return [int(m.group(1)) for p in (directory / ARM_CHECKPOINTS).glob("step_*/meta.json")
            if (m := re.fullmatch(r"step_(\d+)", p.parent.name))]  # fmt: skip


def arm_continues(directory: Path) -> bool:
    """An arm whose newest checkpoint is before its `grpo.max_num_steps` (its logged config.yaml): it stopped at a
    stage's deadline, and its next run continues from there."""
    steps = checkpoint_steps(directory)
    if not steps:
        return False
    config = directory / "config.yaml"
    max_steps = OmegaConf.select(OmegaConf.load(config), "grpo.max_num_steps") if config.is_file() else None
    return max_steps is None or max(steps) < max_steps


def _popen(job: Job) -> tuple[subprocess.Popen, object]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if job.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = job.gpu
    job.log.parent.mkdir(parents=True, exist_ok=True)
    log = job.log.open("w")
    cmd = [sys.executable, str(job.script), *job.argv]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True), log


def _stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process group at once, SIGKILL those still alive after one shared grace period."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    grace_end = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, grace_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
            running[id(job)] = (job, *_popen(job))
            print(f"stage: started {job.name} (pid {running[id(job)][1].pid}, gpu {job.gpu})", flush=True)
        over = time.monotonic() >= deadline
        for job in pending if over else ():
            job.result = {"rc": None, "reason": "not_started", "wall_s": 0.0}
        pending = [] if over else pending
        stopped = {key for key, (_, proc, _) in running.items() if over and proc.poll() is None}
        _stop_all([running[key][1] for key in stopped])
        for key, (job, proc, log) in list(running.items()):
            if proc.poll() is None:
                continue
            rc = proc.returncode
            log.close()
            reason = "time_limit" if key in stopped else ("finished" if rc == 0 else "failed")
            job.result = {"rc": rc, "reason": reason, "wall_s": round(time.monotonic() - start, 1)}
            del running[key]
            print(f"stage: {job.name} {reason} (exit {rc}) after {job.result['wall_s']:.0f} s", flush=True)
        if running:
            time.sleep(poll_s)


def sft_settled(stage_dir: Path, seed: int, fixed_steps: int | None) -> bool:
    """A finished SFT that ran `fixed_steps` steps (sft_meta.json's `fixed_steps` and `steps`): redoing it with the
    same steps would train the same model, so its gate's verdict stands."""
    meta = sft_meta(stage_dir, seed) if fixed_steps is not None else None
    return meta is not None and meta.get("fixed_steps") == fixed_steps and meta.get("steps", 0) >= fixed_steps


def gpu_of(index: int, gpus: list[str]) -> str | None:
    return gpus[index % len(gpus)] if gpus else None


def arm_gpus(ready: list[tuple], arms_of: dict[Path, list[str]], gpus: list[str]) -> list[str | None]:
    """The GPU of each `(variant, seed, arm, repeat)` of `ready` (module docstring, 2.): the arm's index in its
    variant plus the index of its (variant, seed, repeat) run, modulo the GPUs."""
    groups: dict[tuple, int] = {}
    for d, s, _, r in ready:
        groups.setdefault((d, s, r), len(groups))
    return [gpu_of(arms_of[d].index(a) + groups[(d, s, r)], gpus) for d, s, a, r in ready]


def run_stage(
    sft_root: Path,
    arms_of: dict[Path, list[str]],
    seeds: list[int],
    gpus: list[str],
    deadline: float,
    sft_job: Callable[[int, str | None], Job],
    arm_job: Callable[[Path, int, str, str | None, int, int], Job],
    inline: bool = False,
    poll_s: float = 1.0,
    sft_fixed_steps: int | None = None,
    repeats: int = 1,
) -> dict[Path, dict]:
    """The stage (module docstring): `arms_of` maps each variant directory to its arms; `sft_job(seed, gpu)`,
    `arm_job(variant dir, seed, arm, gpu, processes on that GPU, repeat)`; `sft_fixed_steps`: the SFT's
    --sft-steps; `repeats`: GRPO runs per arm and seed. Returns each directory's stage.json status."""
    status = {d: load_status(d) for d in (sft_root, *arms_of)}
    runs = [(d, s, a, r) for d, arms in arms_of.items() for s in seeds for r in range(repeats) for a in arms]
    pending = [(d, s, a, r) for d, s, a, r in runs if not arm_done(d, status[d], s, a, r)]
    done = [f"{d.name}/{run_label(s, r)}/{a}" for d, s, a, r in runs if (d, s, a, r) not in pending]
    if done:
        print(f"stage: {len(done)} arms already done: {', '.join(done)}", flush=True)
    seeds_pending = sorted({s for _, s, _, _ in pending})
    unpassed = [s for s in seeds_pending if not sft_passed(sft_root, s)]
    settled = [s for s in unpassed if sft_settled(sft_root, s, sft_fixed_steps)]
    for s in settled:
        print(f"stage: seed {s}'s SFT ran its {sft_fixed_steps} steps and failed its gate: not redone (change "
              "--sft-steps or the gate)", flush=True)  # fmt: skip
    need = [s for s in unpassed if s not in settled]
    for s in need:  # an SFT that failed its gate continues from its resume file, else starts again from scratch
        if not (sft_dir(sft_root, s) / SFT_RESUME_FILE).is_file():
            shutil.rmtree(sft_dir(sft_root, s), ignore_errors=True)
    sft_jobs = [sft_job(s, gpu_of(i, gpus)) for i, s in enumerate(need)]
    run_jobs(sft_jobs, deadline, inline, poll_s=poll_s)
    for job in sft_jobs:
        status[sft_root]["jobs"][job.name] = job.result
    save_status(sft_root, status[sft_root])
    passed = {s for s in seeds_pending if sft_passed(sft_root, s)}
    ready = [run for run in pending if run[1] in passed]
    placed = arm_gpus(ready, arms_of, gpus)
    per_gpu = max((placed.count(g) for g in set(placed)), default=0)  # processes on the busiest GPU
    arm_jobs = [arm_job(d, s, a, gpu, per_gpu, r) for gpu, (d, s, a, r) in zip(placed, ready)]
    continuing = [run for run in ready if arm_continues(arm_dir(*run))]
    if continuing:
        names = ", ".join(f"{d.name}/{run_label(s, r)}/{a}" for d, s, a, r in continuing)
        print(f"stage: {len(continuing)} arms continue from their checkpoints: {names}", flush=True)
    for run in ready:  # a failed or unfinished earlier run without a checkpoint: start it afresh
        if run not in continuing:
            shutil.rmtree(arm_dir(*run), ignore_errors=True)
    run_jobs(arm_jobs, deadline, inline, poll_s=poll_s)
    for job, (d, s, a, r) in zip(arm_jobs, ready):
        steps = metrics_steps(arm_dir(d, s, a, r) / "metrics.jsonl")
        status[d]["jobs"][f"{run_label(s, r)}/{a}"] = {**job.result, "steps": steps}
    for d, s, a, r in pending:
        if (d, s, a, r) not in ready:
            reason = "sft_gate_failed" if sft_done(sft_root, s) else "no_sft"
            status[d]["jobs"][f"{run_label(s, r)}/{a}"] = {"rc": None, "reason": reason, "steps": 0}
    for d in arms_of:
        save_status(d, status[d])
    return status


def pack(stage_dirs: list[Path], out_file: Path) -> Path:
    """A tar.gz of the stage directories' small files (module docstring), paths relative to each one's parent."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out_file, "w:gz") as tar:
        for stage_dir in stage_dirs:
            for path in sorted(stage_dir.rglob("*")):
                if not path.is_file() or path.suffix in PACK_SKIP_SUFFIXES or path.name in PACK_SKIP_NAMES:
                    continue
                data = path.read_bytes()[-LOG_TAIL_BYTES:] if path.suffix == ".log" else path.read_bytes()
                info = tarfile.TarInfo(str(path.relative_to(stage_dir.parent)))
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
    return out_file


def status_table(status: dict) -> str:
    """One line per job: name, reason, exit code, steps, wall seconds."""
    lines = []
    for name, r in sorted(status["jobs"].items()):
        lines.append(f"  {name:32s} {r.get('reason')!s:12s} exit {r.get('rc')!s:5s} steps {r.get('steps', '-')!s:5s} "
                     f"{r.get('wall_s', 0):7.1f} s")  # fmt: skip
    return "\n".join(lines)
