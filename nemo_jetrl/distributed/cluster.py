"""`cluster.*` as a frozen spec: local single process, torchrun ranks, or a Ray group of colocated trainer + rollout
workers."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from nemo_jetrl.config.typed import typed_section

Backend = Literal["local", "ray", "torchrun"]
# Under `uv run`, Ray's uv hook makes every worker re-create the environment (and try to download Python): off.
RAY_ENV_DEFAULTS = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


@dataclass(frozen=True)
class ClusterSpec:
    """Where a GRPO run executes, with the values derived from the `cluster` section (worker counts, backends).

    backend "local": one process holds trainer and rollout (one device).
    backend "torchrun": one rank per process torchrun started (WORLD_SIZE of them), each a trainer shard and a
    rollout engine, the GRPO driver running on every rank (distributed/launch.py).
    backend "ray": one worker per GPU (`num_nodes * gpus_per_node`), or `num_nodes * cpu_workers_per_node` CPU
    workers when `gpus_per_node == 0`; each worker holds an FSDP2 shard of the trainer and a full rollout engine,
    or, with `tensor_parallel_size` T > 1 (`policy.dtensor_cfg`), consecutive groups of T workers hold one TP
    trainer + rollout each (`num_dp_groups` = W / T data-parallel groups).
    The fields are the validated section's (distributed/cluster_config.py: rules, defaults and the resolved
    `backend` live there), read as is: this module imports without pydantic.
    """

    backend: Backend
    num_nodes: int
    gpus_per_node: int
    cpu_workers_per_node: int
    device: Literal["auto", "cpu", "cuda"]
    num_cpu_threads: int | None
    ray_address: str | None
    rollout_seed_shards: int | None
    tensor_parallel_size: int = 1

    @classmethod
    def from_config(cls, cluster: Any, tensor_parallel_size: int = 1) -> ClusterSpec:
        """From the validated `cluster` section (a `ClusterConfig`, `backend` resolved; a dict is refused) and
        `policy.dtensor_cfg.tensor_parallel_size` (the schema checked that it divides the workers)."""
        cluster = typed_section(cluster, "ClusterConfig", "ClusterSpec.from_config")
        names = [f.name for f in dataclasses.fields(cls) if f.name != "tensor_parallel_size"]  # the section's fields
        return cls(**{name: getattr(cluster, name) for name in names}, tensor_parallel_size=int(tensor_parallel_size))

    @property
    def uses_gpus(self) -> bool:
        return self.backend == "ray" and self.gpus_per_node > 0

    @property
    def num_workers(self) -> int:
        if self.backend == "local":
            return 1
        if self.backend == "torchrun":
            return int(os.environ.get("WORLD_SIZE", "1"))
        per_node = self.gpus_per_node if self.gpus_per_node > 0 else self.cpu_workers_per_node
        return self.num_nodes * per_node

    @property
    def num_dp_groups(self) -> int:
        """Data-parallel groups: the workers / `tensor_parallel_size` (every rank of a group sees the same rows)."""
        return self.num_workers // self.tensor_parallel_size

    @property
    def torch_backend(self) -> Literal["nccl", "gloo"]:
        """torch.distributed backend of the worker group: NCCL on GPUs, gloo on CPU workers."""
        return "nccl" if self.uses_gpus else "gloo"

    @property
    def num_seed_shards(self) -> int:
        """Rollout seed shards per step (seed_shards.py): `rollout_seed_shards`, else one per data-parallel group."""
        return self.rollout_seed_shards if self.rollout_seed_shards is not None else self.num_dp_groups

    def worker_resources(self) -> dict[str, float]:
        """Ray resources of one worker (one bundle of the placement group)."""
        return {"CPU": 1.0, "GPU": 1.0} if self.uses_gpus else {"CPU": 1.0}


def ray_init_kwargs(spec: ClusterSpec) -> dict[str, Any]:
    """Arguments for `ray.init`: join `cluster.ray_address` / $RAY_ADDRESS (ray.sub sets it), else start locally."""
    address = spec.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        return {"address": address, "log_to_driver": True}
    cpus = spec.num_workers if not spec.uses_gpus else spec.num_workers + 1
    return {"num_cpus": max(cpus, os.cpu_count() or 1), "include_dashboard": False, "log_to_driver": True}
