"""Body of one Ray worker: a torch.distributed rank holding the trainer (`NativePolicy` on the group's parallel plan:
an FSDP2 shard) and its colocated rollout engine, built as a torchrun rank builds them.

Plain class; `RayWorkerGroup` makes it a Ray actor. Ray gives each GPU worker one visible GPU (`cuda:0` here).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.utils.cpu_runtime import configure_cpu_process

if TYPE_CHECKING:  # imported in setup(): an actor starts in ~torch's import time (failure paths stay cheap)
    from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
    from nemo_jetrl.policy.config import PolicyConfig
    from nemo_jetrl.policy.interfaces import LossFunction, TrainBatch
    from nemo_jetrl.policy.native import NativePolicy


class PolicyWorker:
    """One rank. `call` runs a `NativePolicy` method, `generate` the rollout; both are collective (every worker)."""

    def __init__(self, rank: int, world_size: int, *, use_gpu: bool, num_cpu_threads: int | None) -> None:
        self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
        configure_cpu_process(num_cpu_threads, cpu_compute=not use_gpu)
        if use_gpu:
            if not torch.cuda.is_available():
                raise RuntimeError(f"worker {rank}: a GPU was assigned but torch sees no CUDA device")
            torch.cuda.set_device(0)
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.policy: NativePolicy | None = None
        self.engine: GenerationInterface | None = None

    def info(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "node": _node_ip(), "device": str(self.device)}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port for torch.distributed's TCP store (called on rank 0)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return _node_ip(), int(s.getsockname()[1])

    def init_distributed(self, addr: str, port: int, backend: str, timeout_s: float) -> bool:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return True

    def setup(self, payload: Mapping[str, Any], init_reference_model: bool = False) -> dict[str, Any]:
        """The trainer of this rank (`NativePolicy` on the plan over the worker group, as a torchrun rank builds
        it) and its colocated rollout engine; the trainer's first refit fills the engine's replica. `payload`:
        the driver's `worker_setup_payload`. The `auto` switches' start-up lines (the matched kernels' self-check,
        run by the workers together) go back to the driver, which prints rank 0's."""
        from nemo_jetrl.generation.build import build_local_engine
        from nemo_jetrl.policy.native import NativePolicy
        from nemo_jetrl.policy.parallel.plan import ParallelPlan
        from nemo_jetrl.precision import PrecisionRecipe

        policy_cfg, spec, seed = worker_sections(payload)
        plan = ParallelPlan.from_process_group(self.device, spec.tensor_parallel_size)
        self.policy = NativePolicy(
            policy_cfg, PrecisionRecipe.from_config(policy_cfg), self.device, plan=plan,
            init_reference_model=init_reference_model, seed=seed, announce_lines=False,
        )  # fmt: skip
        self.engine = build_local_engine(
            policy_cfg.generation, self.policy, spec, self.device,
            max_total_length=policy_cfg.max_total_sequence_length, seed=seed,
        )  # fmt: skip
        info = {"layer_map": self.policy.layer_map, "tokenizer": self.policy.tokenizer}
        return {**info, "parameter_bytes": self.policy.parameter_bytes(), "startup_lines": self.policy.startup_lines}

    def call(self, method: str, *args: Any) -> tuple[str, Any, dict[str, Any] | None]:
        """Collective: `NativePolicy.<method>(*args)` on every worker -> ("ok", result, what the driver mirrors:
        step and KV scales) on rank 0 (the others return no payload; every rank computed the same), or
        ("nonfinite", (error class name, tensor, step), None) when the step was skipped on every rank."""
        from nemo_jetrl.policy.nonfinite import NonFiniteError

        policy = self._policy()
        try:
            result = getattr(policy, method)(*args)
        except NonFiniteError as err:
            return "nonfinite", (type(err).__name__, err.tensor, err.step), None
        if self.rank != 0:
            return "ok", None, None
        kv = policy.kv_scales.to("cpu") if policy.kv_scales is not None else None
        return "ok", result, {"step": policy.step, "kv_scales": kv}

    def train(self, batches: Sequence[TrainBatch], loss_fn: LossFunction) -> tuple[str, Any, dict | None]:
        """`call("train", ...)`, with the prev_logprobs a training forward filled in (the driver reads them)."""
        status, result, mirror = self.call("train", list(batches), loss_fn)
        if status == "ok" and result is not None:
            result = (result, [b.prev_logprobs for b in batches])
        return status, result, mirror

    def generate(
        self, prompt_ids: list[list[int]], greedy: bool, seed: int, engine_changes: Mapping | None = None
    ) -> GenerationOutput | None:
        """Collective: this rank's rollout seed shards on its engine, every shard gathered; rank 0 returns them."""
        engine = self.engine.replace(**engine_changes) if engine_changes else self.engine
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        out = engine.generate(prompt_ids, greedy=greedy, generator=gen)
        return out.to("cpu") if self.rank == 0 else None

    def set_engine_kv_scales(self, k_scales: torch.Tensor, v_scales: torch.Tensor) -> bool:
        self.engine.update_weights(kv_scales=(k_scales.to(self.device), v_scales.to(self.device)))
        return True

    def shutdown(self) -> bool:
        if dist.is_initialized():
            dist.destroy_process_group()
        return True

    def _policy(self) -> NativePolicy:
        if self.policy is None:
            raise RuntimeError(f"worker {self.rank}: setup() has not run")
        return self.policy


def worker_setup_payload(policy_cfg: PolicyConfig, spec: ClusterSpec, seed: int) -> dict[str, Any]:
    """What the driver hands `PolicyWorker.setup` across the process boundary, as plain data: the `policy`
    section (`model_dump`), the run's `ClusterSpec` fields (derived on the driver: the `cluster` section's checks
    read the driver's environment, not the worker's) and `grpo.seed`; `worker_sections` rebuilds them."""
    return {"policy": policy_cfg.model_dump(), "spec": dataclasses.asdict(spec), "seed": int(seed)}


def worker_sections(payload: Mapping[str, Any]) -> tuple[PolicyConfig, ClusterSpec, int]:
    """A `worker_setup_payload` back on the worker: the typed `policy` section (`model_validate`), the spec, the
    seed."""
    from nemo_jetrl.policy.config import PolicyConfig

    policy_cfg = PolicyConfig.model_validate(payload["policy"])
    return policy_cfg, ClusterSpec(**payload["spec"]), int(payload["seed"])


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests)
        return "127.0.0.1"
