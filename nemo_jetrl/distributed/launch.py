"""`cluster.backend: torchrun`: one process per device started by PyTorch's launcher (`torchrun`, or `srun` +
torchrun's rendezvous under Slurm: torchrun.sub), every rank running the GRPO driver SPMD.

    uv run torchrun --nproc-per-node 2 examples/run_grpo.py --config examples/configs/grpo_tiny.yaml

The backend is detected from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) when `cluster.backend` is null.
NCCL on CUDA devices (`cuda:LOCAL_RANK`), gloo on CPU; NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its
PyTorch / NVSHMEM twins default to off before the process group starts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# NVLink multicast off unless the environment says otherwise (docs/cluster.md: it can take a shared host's GPUs out)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT_S = 1800.0


def torchrun_env(environ: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """{"rank", "world_size", "local_rank"} when this process was started by torchrun (or anything that sets its
    variables, e.g. srun + torchrun), else None."""
    env = os.environ if environ is None else environ
    if not all(v in env for v in TORCHRUN_VARS):
        return None
    return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]), "local_rank": int(env["LOCAL_RANK"])}


def init_torchrun(device_name: str):
    """Start the default process group of this torchrun rank; returns its device (`cluster.device`: auto = CUDA
    where present). One line naming the fix when torchrun's environment is missing or the device cannot be had."""
    import torch
    import torch.distributed as dist

    env = torchrun_env()
    if env is None:
        raise ValueError(
            "cluster.backend: torchrun needs torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK): launch with "
            "`torchrun --nproc-per-node N examples/run_grpo.py ...`, or set cluster.backend: local"
        )
    cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if cuda:
        if env["local_rank"] >= torch.cuda.device_count():
            raise ValueError(
                f"cluster.device: rank {env['rank']} has LOCAL_RANK {env['local_rank']} but this node shows "
                f"{torch.cuda.device_count()} CUDA devices: start at most that many processes per node"
            )
        for key, value in MULTICAST_OFF.items():
            os.environ.setdefault(key, value)
        device = torch.device("cuda", env["local_rank"])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if cuda else "gloo", timeout=timedelta(seconds=TIMEOUT_S), device_id=device if cuda else None
        )
    return device


def startup_line(world_size: int, tp: int, device) -> str:
    """What the run is spread over, printed once by rank 0."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    nvls = f", NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}" if device.type == "cuda" else ""
    layout = f"{world_size // tp} data-parallel x {tp} tensor-parallel" if tp > 1 else f"{world_size} data-parallel"
    return (
        f"cluster: torchrun, {world_size} rank(s) ({layout}) on {device.type}, {backend}{nvls} (cluster.backend: "
        "torchrun, or null under torchrun's RANK / WORLD_SIZE / LOCAL_RANK); rank 0 logs and checkpoints"
    )
