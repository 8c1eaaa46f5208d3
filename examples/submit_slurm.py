#!/usr/bin/env python
"""Submit a GRPO config to Slurm through `ray.sub` (Ray head on the first node, workers on the rest).

    uv run examples/submit_slurm.py --config examples/configs/grpo_tiny.yaml --nodes 2 --gpus-per-node 8 \\
        -- grpo.max_num_steps=20 logger.log_dir=logs/run1

builds COMMAND="uv run examples/run_grpo.py --config ... cluster.backend=ray cluster.num_nodes=2
cluster.gpus_per_node=8 <overrides>" and runs `sbatch --nodes=2 --gres=gpu:8 ray.sub` with COMMAND and
GPUS_PER_NODE in the job's environment. `--dry-run` prints the sbatch line instead; `--wait` blocks until the job
ends and exits with its status. CPU workers (tests): `--gpus-per-node 0 --cpu-workers-per-node 2`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_command(args: argparse.Namespace) -> str:
    """The driver command ray.sub runs on the head node."""
    cluster = [
        "cluster.backend=ray",
        f"cluster.num_nodes={args.nodes}",
        f"cluster.gpus_per_node={args.gpus_per_node}",
    ]
    if args.gpus_per_node == 0:
        cluster.append(f"cluster.cpu_workers_per_node={args.cpu_workers_per_node}")
    driver = shlex.split(args.python) + ["examples/run_grpo.py", "--config", str(args.config)]
    return shlex.join(driver + cluster + list(args.overrides))


def build_sbatch(args: argparse.Namespace) -> list[str]:
    cmd = ["sbatch", "--parsable", f"--nodes={args.nodes}", f"--job-name={args.job_name}"]
    if args.gpus_per_node > 0:
        cmd.append(f"--gres=gpu:{args.gpus_per_node}")
    if args.exclusive:
        cmd.append("--exclusive")  # Ray offers the node's CPUs/GPUs as the job's: give it the whole node
    if args.wait:
        cmd.append("--wait")
    cmd += list(args.sbatch_arg)
    return [*cmd, str(ROOT / "ray.sub")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="GRPO YAML config")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8, help="0 = CPU workers")
    parser.add_argument("--cpu-workers-per-node", type=int, default=2, help="with --gpus-per-node 0")
    parser.add_argument("--container", help="pyxis image (CONTAINER); --mounts for MOUNTS")
    parser.add_argument("--mounts")
    parser.add_argument("--log-dir", help="BASE_LOG_DIR (default: <repo>/logs/slurm); the job writes <dir>/<job id>/")
    parser.add_argument("--python", default="uv run", help="how COMMAND runs python (default: %(default)s)")
    parser.add_argument("--job-name", default="nemo-jetrl")
    parser.add_argument(
        "--exclusive", action=argparse.BooleanOptionalAction, default=True, help="whole nodes (default: %(default)s)"
    )
    parser.add_argument("--sbatch-arg", action="append", default=[], help="extra sbatch argument (repeatable)")
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit with its status")
    parser.add_argument("--dry-run", action="store_true", help="print the command and environment, submit nothing")
    parser.add_argument("overrides", nargs="*", help="Hydra-style config overrides (after --)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 0 or args.cpu_workers_per_node < 1:
        parser.error("--nodes and --cpu-workers-per-node must be >= 1, --gpus-per-node >= 0")
    env = {"COMMAND": build_command(args), "GPUS_PER_NODE": str(args.gpus_per_node)}
    if args.container:
        env["CONTAINER"] = args.container
    if args.mounts:
        env["MOUNTS"] = args.mounts
    if args.log_dir:
        env["BASE_LOG_DIR"] = str(Path(args.log_dir).resolve())
    sbatch = build_sbatch(args)
    if args.dry_run:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(sbatch))
        return 0
    proc = subprocess.run(sbatch, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    job_id = proc.stdout.strip().split(";")[0]
    if job_id:
        log_root = env.get("BASE_LOG_DIR", str(ROOT / "logs" / "slurm"))
        print(f"submitted job {job_id}; logs: {log_root}/{job_id}/ and {ROOT}/slurm-{job_id}.out", file=sys.stderr)
        print(job_id)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
