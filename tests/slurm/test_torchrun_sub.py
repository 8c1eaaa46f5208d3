"""`torchrun.sub`: torchrun under Slurm (one srun task per node, c10d rendezvous on the first node).

- Everywhere: the script itself with `scontrol` / `srun` stand-ins on PATH (one node, srun runs its command here),
  2 CPU ranks of `rank_probe.py`: both join the rendezvous and see torchrun's environment and NVLink multicast off.
- Where the single-node cluster of `.ci/slurm_setup.sh` runs: the tiny GRPO config for 2 steps on 2 ranks through
  sbatch; its metrics equal a one-process run of the same config with 2 rollout seed shards, as in
  tests/functional/test_torchrun_matrix.py (one 16-row micro-batch per rank: bitwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jetrl_testkit.runs import TINY_TWO_STEPS
from jetrl_testkit.runs import metrics as _metrics
from jetrl_testkit.runs import slurm_down_reason as _slurm_down_reason

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = TINY_TWO_STEPS


def _shims(bin_dir: Path) -> None:
    """`scontrol show hostnames` -> localhost; `srun [options] CMD...` -> CMD... run here."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    for name in ("scontrol", "srun"):
        (bin_dir / name).chmod(0o755)


def test_torchrun_sub_starts_every_rank_on_one_rendezvous(tmp_path):
    _shims(tmp_path / "bin")
    out = tmp_path / "ranks"
    out.mkdir()
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "NPROC_PER_NODE": "2",
        "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
        "COMMAND": f"tests/slurm/rank_probe.py {out} --config x.yaml a.b=1",
        "BASE_LOG_DIR": str(tmp_path / "logs"),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("NCCL_NVLS_ENABLE", None)
    env.pop("PYTHONFAULTHANDLER", None)
    proc = subprocess.run(["bash", str(ROOT / "torchrun.sub")], env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 node(s) [localhost] x 2 process(es) = 2 rank(s), rendezvous" in proc.stdout
    assert proc.stdout.rstrip().endswith("torchrun.sub: exited with status 0")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, seen in enumerate(ranks):
        assert seen == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "NCCL_NVLS_ENABLE": "0",
                        "PYTHONFAULTHANDLER": "1", "sum": 3, "argv": ["--config", "x.yaml", "a.b=1"]}  # fmt: skip
    assert (tmp_path / "logs" / "4242" / "torchrun.log").is_file()


@pytest.mark.slurm
@pytest.mark.slow
def test_tiny_grpo_through_torchrun_sub_matches_single_process(tmp_path):
    reason = _slurm_down_reason()
    if reason:
        pytest.skip(reason)
    config = ROOT / "examples" / "configs" / "grpo_tiny.yaml"
    command = " ".join(
        ["examples/run_grpo.py", "--config", str(config), *OVERRIDES, f"logger.log_dir={tmp_path / 'job'}"]
    )
    env = {**os.environ, "COMMAND": command, "NPROC_PER_NODE": "2", "BASE_LOG_DIR": str(tmp_path / "slurm_logs")}
    submit = ["sbatch", "--wait", "--nodes=1", f"--output={tmp_path}/slurm-%j.out", "--time=10", "torchrun.sub"]
    proc = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, timeout=660)
    job_out = next(iter(tmp_path.glob("slurm-*.out")), None)
    detail = f"{proc.stderr[-2000:]}\n{job_out.read_text()[-4000:] if job_out else 'no job output'}"
    assert proc.returncode == 0, detail
    from nemo_jetrl.algorithms.grpo import run_grpo
    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    local = [*OVERRIDES, "cluster.rollout_seed_shards=2", f"logger.log_dir={tmp_path / 'local'}"]
    run_grpo(validate_config(load_config(config, local)))
    job, one = _metrics(tmp_path / "job" / "metrics.jsonl"), _metrics(tmp_path / "local" / "metrics.jsonl")
    assert sorted(job) == sorted(one) == [1, 2]
    for step in (1, 2):
        for key, value in one[step].items():
            if not (key.startswith("timing/") or key.endswith("_s") or key == "step"):
                assert job[step][key] == value, (step, key)
