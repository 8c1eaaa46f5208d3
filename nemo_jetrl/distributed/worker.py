"""Body of one Ray worker: a torch.distributed rank holding a `DataParallelPolicy` (trainer shard + rollout engine).

Plain class; `RayWorkerGroup` makes it a Ray actor. Ray gives each GPU worker one visible GPU (`cuda:0` here).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nemo_jetrl.utils.cpu_runtime import configure_cpu_process

if TYPE_CHECKING:  # imported in setup(): an actor starts in ~torch's import time (failure paths stay cheap)
    from nemo_jetrl.distributed.dp_policy import DataParallelPolicy
    from nemo_jetrl.generation.interfaces import GenerationOutput
    from nemo_jetrl.policy.interfaces import LossFunction, TrainBatch


class PolicyWorker:
    """One rank. Methods mirror `DataParallelPolicy`; the collective ones must run on every worker."""

    def __init__(self, rank: int, world_size: int, *, use_gpu: bool, num_cpu_threads: int | None) -> None:
        self.rank, self.world_size, self.use_gpu = rank, world_size, use_gpu
        configure_cpu_process(num_cpu_threads, cpu_compute=not use_gpu)
        if use_gpu:
            if not torch.cuda.is_available():
                raise RuntimeError(f"worker {rank}: a GPU was assigned but torch sees no CUDA device")
            torch.cuda.set_device(0)
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.policy: DataParallelPolicy | None = None

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

    def setup(self, cfg: Mapping[str, Any], init_reference_model: bool = False) -> dict[str, Any]:
        """Load the policy as the single-process trainer does, shard it, build the rollout replica, first refit."""
        from nemo_jetrl.distributed.dp_policy import DTYPES, DataParallelPolicy
        from nemo_jetrl.generation.build import stop_token_ids
        from nemo_jetrl.models.loading import load_model_and_tokenizer
        from nemo_jetrl.precision import PrecisionRecipe

        policy_cfg = cfg["policy"]
        torch.manual_seed(int(cfg["grpo"]["seed"]))
        model, tokenizer = load_model_and_tokenizer(
            policy_cfg["model_name"],
            device=self.device,
            dtype=DTYPES[policy_cfg["master_dtype"]],
            config_overrides=policy_cfg.get("hf_config_overrides"),
        )
        stop_ids = stop_token_ids(policy_cfg["generation"], tokenizer)
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # before sharding
        self.policy = DataParallelPolicy(
            model,
            policy_cfg=policy_cfg,
            init_reference_model=init_reference_model,
            recipe=PrecisionRecipe.from_config(policy_cfg),
            device=self.device,
            pad_token_id=tokenizer.pad_token_id,
            stop_token_ids=stop_ids,
        )
        refit = self.policy.refit()
        info = {"layer_map": self.policy.layer_map, "tokenizer": tokenizer, "refit": refit}
        return {**info, "parameter_bytes": parameter_bytes}

    def generate(
        self, shards: Sequence[tuple[list[list[int]], int]], greedy: bool, engine_changes: Mapping | None = None
    ) -> list[GenerationOutput]:
        return self._policy().generate(shards, greedy, engine_changes)

    def logprobs(
        self, chunks: Sequence[TrainBatch], num_steps: int, dummy: TrainBatch, calibrate: bool = False
    ) -> list[torch.Tensor] | None:
        return self._policy().logprobs(chunks, num_steps, dummy, calibrate)

    def calibrate_kv(self, chunks: Sequence[TrainBatch], num_steps: int, dummy: TrainBatch) -> Any:
        return self._policy().calibrate_kv(chunks, num_steps, dummy).to("cpu")

    def set_kv_scales(self, scales: Any) -> bool:
        self._policy().set_kv_scales(scales)
        return True

    def set_engine_kv_scales(self, k_scales: torch.Tensor, v_scales: torch.Tensor) -> bool:
        self._policy().set_engine_kv_scales(k_scales, v_scales)
        return True

    def reference_logprobs(self, rows: TrainBatch | None) -> torch.Tensor | None:
        return None if rows is None else self._policy().reference_logprobs(rows)

    def train(
        self,
        micro_batches: Sequence[TrainBatch],
        num_steps: int,
        normalizer: float,
        dummy: TrainBatch,
        loss_fn: LossFunction,
    ) -> dict[str, Any]:
        return self._policy().train(micro_batches, num_steps, normalizer, dummy, loss_fn)

    def step_lr_scheduler(self) -> float:
        return self._policy().step_lr_scheduler()

    def refit(self) -> dict[str, Any]:
        return self._policy().refit()

    def full_state_dict(self) -> dict[str, Any] | None:
        """Collective; rank 0 returns the state, the others None (saves shipping W copies)."""
        state = self._policy().full_state_dict()
        return state if self.rank == 0 else None

    def load_full_state_dict(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return self._policy().load_full_state_dict(state)

    def shutdown(self) -> bool:
        if dist.is_initialized():
            dist.destroy_process_group()
        return True

    def _policy(self) -> DataParallelPolicy:
        if self.policy is None:
            raise RuntimeError(f"worker {self.rank}: setup() has not run")
        return self.policy


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests)
        return "127.0.0.1"
