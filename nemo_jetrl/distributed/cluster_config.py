"""`cluster:` config section. Devices mean what they mean in NeMo-RL: `num_nodes * gpus_per_node` GPUs in total;
more than one device runs on Ray (one trainer + rollout worker per GPU); the local backend is one process on one
device. Kept apart from cluster.py, which imports without pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import NonNegativeInt, PositiveInt, Section


class ClusterConfig(Section):
    num_nodes: PositiveInt = 1
    gpus_per_node: NonNegativeInt = 0  # 0 = CPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_cpu_threads: PositiveInt | None = None  # null = leave torch's default (per process / per Ray worker)
    # null = from the device count: local (one process) for one device, ray for more; `local` with more is an error
    backend: Literal["local", "ray"] | None = None
    cpu_workers_per_node: PositiveInt = 2  # Ray workers per node when gpus_per_node == 0
    ray_address: str | None = None  # null = $RAY_ADDRESS (set by ray.sub) or a fresh local Ray
    rollout_seed_shards: PositiveInt | None = None  # rollout RNG streams per step; null = one per data-parallel group

    @model_validator(mode="after")
    def _check_cluster(self) -> ClusterConfig:
        devices = self.num_nodes * max(self.gpus_per_node, 1)
        if self.backend is None:
            self.__dict__["backend"] = "ray" if devices > 1 else "local"
        elif self.backend == "local" and devices > 1:
            raise KeyedValueError(
                f"cluster.backend: 'local' is one process on one device, but cluster.num_nodes ({self.num_nodes}) * "
                f"cluster.gpus_per_node ({self.gpus_per_node}) asks for {devices} devices; use cluster.backend: ray "
                "(or null), or cluster.gpus_per_node: 1"
            )
        if self.backend == "ray" and self.gpus_per_node > 0 and self.device == "cpu":
            raise KeyedValueError(
                "cluster.device: 'cpu' contradicts cluster.gpus_per_node > 0 with cluster.backend: ray"
            )
        if self.backend == "ray" and self.gpus_per_node == 0 and self.device == "cuda":
            raise KeyedValueError("cluster.device: 'cuda' with cluster.backend: ray requires cluster.gpus_per_node > 0")
        return self
