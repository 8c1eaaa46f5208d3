"""What the Slurm tests share: why the local Slurm cluster cannot take a job, and a run's metrics.jsonl by step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

STATUS_FILE = Path(os.environ.get("SLURM_SETUP_STATUS", "/tmp/nemo_jetrl_slurm/status"))


def slurm_down_reason() -> str | None:
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


def metrics(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    return rows
