"""`cluster.*` as a frozen spec: local single process, or a Ray group of colocated trainer + rollout workers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Backend = Literal["local", "ray"]
# Under `uv run`, Ray's uv hook makes every worker re-create the environment (and try to download Python): off.
RAY_ENV_DEFAULTS = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


@dataclass(frozen=True)
class ClusterSpec:
    """Where a GRPO run executes.

    backend "local": one process holds trainer and rollout (the tiny config's default).
    backend "ray": one worker per GPU (`num_nodes * gpus_per_node`), or `num_nodes * cpu_workers_per_node` CPU
    workers when `gpus_per_node == 0`; each worker holds an FSDP2 shard of the trainer and a full rollout engine.
    """

    backend: Backend = "local"
    num_nodes: int = 1
    gpus_per_node: int = 0
    cpu_workers_per_node: int = 2
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_cpu_threads: int | None = None
    ray_address: str | None = None
    rollout_seed_shards: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise ValueError(f"cluster.backend must be 'local' or 'ray', got {self.backend!r}")
        for key in ("num_nodes", "cpu_workers_per_node"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"cluster.{key} must be >= 1, got {getattr(self, key)}")
        if self.gpus_per_node < 0:
            raise ValueError(f"cluster.gpus_per_node must be >= 0, got {self.gpus_per_node}")
        if self.rollout_seed_shards is not None and self.rollout_seed_shards < 1:
            raise ValueError(f"cluster.rollout_seed_shards must be >= 1 or null, got {self.rollout_seed_shards}")
        if self.backend == "local" and self.num_nodes > 1:
            raise ValueError(f"cluster.num_nodes={self.num_nodes} needs cluster.backend: ray (local is one process)")
        if self.backend == "ray" and self.gpus_per_node > 0 and self.device == "cpu":
            raise ValueError("cluster.device: 'cpu' contradicts cluster.gpus_per_node > 0 with cluster.backend: ray")
        if self.backend == "ray" and self.gpus_per_node == 0 and self.device == "cuda":
            raise ValueError("cluster.device: 'cuda' with cluster.backend: ray needs cluster.gpus_per_node > 0")

    @classmethod
    def from_config(cls, cluster: Mapping[str, Any]) -> ClusterSpec:
        """From the `cluster` section (plain mapping); keys absent from an older config take the defaults."""
        fields = cls.__dataclass_fields__
        unknown = set(cluster) - set(fields)
        if unknown:
            raise ValueError(f"cluster: unknown keys {sorted(unknown)}")
        return cls(**{k: cluster[k] for k in fields if k in cluster})

    @property
    def uses_gpus(self) -> bool:
        return self.backend == "ray" and self.gpus_per_node > 0

    @property
    def num_workers(self) -> int:
        if self.backend == "local":
            return 1
        per_node = self.gpus_per_node if self.gpus_per_node > 0 else self.cpu_workers_per_node
        return self.num_nodes * per_node

    @property
    def torch_backend(self) -> Literal["nccl", "gloo"]:
        """torch.distributed backend of the worker group: NCCL on GPUs, gloo on CPU workers."""
        return "nccl" if self.uses_gpus else "gloo"

    @property
    def num_seed_shards(self) -> int:
        """Rollout seed shards per step (see data_split): `rollout_seed_shards`, else one per worker."""
        return self.rollout_seed_shards if self.rollout_seed_shards is not None else self.num_workers

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
