"""`cluster:` config section. Devices mean what they mean in NeMo-RL: `num_nodes * gpus_per_node` GPUs in total;
more than one device runs on Ray (one trainer + rollout worker per GPU); the local backend is one process on one
device; under torchrun (its RANK / WORLD_SIZE / LOCAL_RANK set) every process is one rank of the run
(`cluster.backend: torchrun`, detected when null). Kept apart from cluster.py, which imports without pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import NonNegativeInt, PositiveInt, Section
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.launch import torchrun_env
from nemo_jetrl.policy.config import PolicyConfig


class ClusterConfig(Section):
    num_nodes: PositiveInt = 1
    gpus_per_node: NonNegativeInt = 0  # 0 = CPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_cpu_threads: PositiveInt | None = None  # null = leave torch's default (per process / per Ray worker)
    # null = torchrun under torchrun's environment, else from the device count: local (one process) for one device,
    # ray for more; `local` with more is an error
    backend: Literal["local", "ray", "torchrun"] | None = None
    cpu_workers_per_node: PositiveInt = 2  # Ray workers per node when gpus_per_node == 0
    ray_address: str | None = None  # null = $RAY_ADDRESS (set by ray.sub) or a fresh local Ray
    rollout_seed_shards: PositiveInt | None = None  # rollout RNG streams per step; null = one per data-parallel group

    @model_validator(mode="after")
    def _check_cluster(self) -> ClusterConfig:
        devices = self.num_nodes * max(self.gpus_per_node, 1)
        launched = torchrun_env()
        if self.backend is None:
            self.__dict__["backend"] = "torchrun" if launched else "ray" if devices > 1 else "local"
        if launched and launched["world_size"] > 1 and self.backend != "torchrun":
            raise KeyedValueError(
                f"cluster.backend: '{self.backend}' under torchrun (WORLD_SIZE={launched['world_size']}) would run "
                "one independent trainer per process; set cluster.backend: torchrun (or null), or start one process"
            )
        if self.backend == "torchrun":
            self._check_torchrun(launched)
            return self
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

    def _check_torchrun(self, launched: dict[str, int] | None) -> None:
        """The ranks come from torchrun; `num_nodes * gpus_per_node`, where given, must say the same."""
        if launched is None:
            raise KeyedValueError(
                "cluster.backend: torchrun needs torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK): launch with "
                "`torchrun --nproc-per-node N examples/run_grpo.py ...` (or srun + torchrun: torchrun.sub), or set "
                "cluster.backend: local"
            )
        if self.gpus_per_node and self.num_nodes * self.gpus_per_node != launched["world_size"]:
            raise KeyedValueError(
                f"cluster.num_nodes * cluster.gpus_per_node ({self.num_nodes} * {self.gpus_per_node}) != torchrun's "
                f"WORLD_SIZE {launched['world_size']}: set cluster.gpus_per_node: 0 (from torchrun) or match them"
            )


def multi_rank_problems(policy: PolicyConfig, spec: ClusterSpec) -> list[str]:
    """What a run over several ranks (Ray workers or torchrun ranks) cannot do, each with its reason and fix: the
    one place these refusals live (checked when the run is placed, `algorithms.placement`: a NeMo-RL recipe naming
    vLLM on 16 GPUs still validates and translates).
    Everything else the one-process trainer does runs on several ranks (docs/cluster.md, the feature table)."""
    gen, ranks = policy.generation, spec.num_workers
    problems = []
    if gen.deterministic and (ranks > 1 or spec.num_seed_shards > 1):
        problems.append(
            "policy.generation.deterministic: true needs one process and one rollout batch (its batch-invariant "
            "kernels make the trainer equal the rollout bitwise within one process): set cluster.backend: local and "
            "cluster.rollout_seed_shards: 1"
        )
    if spec.backend == "ray" or ranks > 1:
        from nemo_jetrl.models.loading import is_moe_checkpoint  # transformers: only where a run is placed

        if is_moe_checkpoint(policy.model_name):
            problems.append(
                f"cluster.backend: {spec.backend} does not train MoE models yet ({ranks} rank(s): the sharded trainer "
                "shards and refits dense weights only; expert parallelism is not built): use cluster.backend: local "
                "on one device (docs/moe.md)"
            )
    if ranks == 1:
        return problems
    where = f"cluster.backend: {spec.backend} with {ranks} ranks"
    if policy.train_cuda_graphs is True:
        problems.append(
            f"policy.train_cuda_graphs: true is not supported with {where}: a captured micro-batch cannot hold the "
            "sharded trainer's collectives (FSDP2 all-gathers, gradient reduce-scatters); set it false"
        )
    if gen.backend == "vllm":
        problems.append(
            f"policy.generation.backend: vllm is not supported with {where}: the vLLM adapter runs in one process "
            "on the trainer's unsharded weights; several ranks roll out on the native engine (backend: native)"
        )
    return problems
