"""What the multi-process run tests share: a run's metrics.jsonl by step, the tiny config's 2-step overrides with one
16-row micro-batch per rank on 2 ranks, and why the local Slurm cluster cannot take a job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

STATUS_FILE = Path(os.environ.get("SLURM_SETUP_STATUS", "/tmp/nemo_jetrl_slurm/status"))


def slurm_down_reason() -> str | None:
    """Why no job can run on the local Slurm cluster (.ci/slurm_setup.sh), or None."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "Slurm is not installed (no sinfo/sbatch); CI installs it with .ci/slurm_setup.sh"
    try:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo timed out: slurmctld is not answering"
    states = state.stdout.split()
    if state.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed") for s in states):
        setup = STATUS_FILE.read_text().strip() if STATUS_FILE.is_file() else "no .ci/slurm_setup.sh status"
        return f"no idle Slurm node (sinfo: {state.stdout.strip() or state.stderr.strip()!r}; setup: {setup})"
    return None


# grpo_tiny for 2 steps, 4 prompts x 8 samples = 32 rows: one 16-row training micro-batch per rank on 2 ranks
TINY_TWO_STEPS = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "cluster.num_cpu_threads=1",
    "logger.tensorboard_enabled=false",
]


def metrics(path: Path) -> dict[int, dict[str, float]]:
    """{step: {key: value}} of a metrics.jsonl (`path`: the file, or the log directory holding it)."""
    path = path / "metrics.jsonl" if path.is_dir() else path
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    return rows
