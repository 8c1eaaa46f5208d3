"""The GRPO driver's view of a Ray worker group: a `PolicyInterface` and a `GenerationInterface` that only place and
fan out. Every worker holds the trainer of its rank (`NativePolicy` on the group's parallel plan) and a colocated
rollout engine, built as a torchrun rank builds them (`PolicyWorker`); each call runs on every worker with the
whole batch (stored once in Ray's object store), the workers cut and gather it among themselves, and rank 0's
result is the one-process result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.worker import worker_setup_payload
from nemo_jetrl.distributed.worker_group import RayWorkerGroup
from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.policy.auto_switches import announce
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.interfaces import LossFunction, PolicyInterface, TrainBatch
from nemo_jetrl.policy.nonfinite import NonFiniteError, NonFiniteStateError
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.kv import KVScales
from nemo_jetrl.utils.process_env import trainer_env

_ERRORS = {cls.__name__: cls for cls in (NonFiniteError, NonFiniteStateError)}


class RayPolicy(PolicyInterface):
    """The trainer spread over a `RayWorkerGroup`; `step` and `kv_scales` mirror rank 0's after every call."""

    def __init__(
        self,
        group: RayWorkerGroup,
        policy_cfg: PolicyConfig,
        setup_info: Mapping[str, Any],
        *,
        init_reference_model: bool = False,
    ) -> None:
        self.group = group
        self.recipe = PrecisionRecipe.from_config(policy_cfg)
        self.tokenizer = setup_info["tokenizer"]
        self.layer_map = dict(setup_info["layer_map"])
        self._has_reference = bool(init_reference_model)  # the frozen reference lives on the workers
        self._parameter_bytes = int(setup_info["parameter_bytes"])
        self.step = 0  # optimizer steps taken (as NativePolicy.step)
        self.kv_scales: KVScales | None = None  # the FP8 KV scales the next rollout runs with (CPU)

    @property
    def has_reference(self) -> bool:
        return self._has_reference

    def parameter_bytes(self) -> int:
        return self._parameter_bytes

    def _call(self, phase: str, method: str, *args: Any, worker_method: str = "call") -> Any:
        """`NativePolicy.<method>(*args)` on every worker (large arguments stored once); rank 0's result."""
        shared = tuple(self.group.put(a) if isinstance(a, TrainBatch | list | dict) else a for a in args)
        head = (method,) if worker_method == "call" else ()
        status, result, mirror = self.group.run(phase, worker_method, common=(*head, *shared))[0]
        if status == "nonfinite":
            name, tensor, step = result
            raise _ERRORS.get(name, NonFiniteError)(tensor, step)
        self.step, self.kv_scales = mirror["step"], mirror["kv_scales"]
        return result

    def get_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self._call("logprobs", "get_logprobs", batch)

    def calibrate_kv_scales(self, batch: TrainBatch) -> KVScales:
        return self._call("kv_calibration", "calibrate_kv_scales", batch)

    def get_reference_policy_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if not self._has_reference:
            raise RuntimeError("reference logprobs need loss_fn.reference_policy_kl_penalty > 0")
        return self._call("reference_logprobs", "get_reference_policy_logprobs", batch)

    def train(self, batch: TrainBatch | Sequence[TrainBatch], loss_fn: LossFunction) -> dict[str, float]:
        """As NativePolicy.train; prev_logprobs a training forward computed come back into the batches."""
        steps = [batch] if isinstance(batch, TrainBatch) else list(batch)
        metrics, prev = self._call("train", "train", steps, loss_fn, worker_method="train")
        for b, p in zip(steps, prev, strict=True):
            b.prev_logprobs = p
        return metrics

    def prepare_refit(self) -> dict[str, float]:
        return self._call("refit", "prepare_refit")

    def nonfinite_state(self) -> str | None:
        return self._call("nonfinite_state", "nonfinite_state")

    def state_dict(self) -> dict[str, Any]:
        """Full state in the single-process layout (checkpoints move between local and Ray runs)."""
        return self._call("checkpoint", "state_dict")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._call("load_checkpoint", "load_state_dict", dict(state))

    def shutdown(self) -> None:
        self.group.shutdown()


class RayGeneration(GenerationInterface):
    """The workers' rollout engines: every worker runs its group's block of the step's seed shards (seed_shards.py),
    the shards are gathered and rank 0 returns them merged in order."""

    def __init__(self, group: RayWorkerGroup, engine_changes: Mapping | None = None) -> None:
        self.group = group
        self.engine_changes = dict(engine_changes or {})
        self._kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The FP8 KV scales (k [L], v [L]) last handed to the workers' engines, or None."""
        return self._kv_scales

    def replace(self, **changes) -> RayGeneration:
        """The workers' engines with some constructor arguments changed for these calls (as
        `NativeGenerationEngine.replace`, e.g. `kv_cache_dtype=None` for the calibration rollout)."""
        engine = RayGeneration(self.group, {**self.engine_changes, **changes})
        engine._kv_scales = self._kv_scales
        return engine

    def generate(self, prompt_ids, *, greedy=False, generator=None) -> GenerationOutput:
        seed = generator.initial_seed() if generator is not None else torch.initial_seed()
        common = (self.group.put(list(prompt_ids)), greedy, seed, self.engine_changes)
        return self.group.run("generation", "generate", common=common)[0]

    def prepare_for_generation(self) -> bool:
        return True

    def finish_generation(self) -> bool:
        return True

    def update_weights(self, weights=None, *, kv_scales=None) -> None:
        """FP8 KV scales (k [L], v [L]) for every worker's engine; weights come with RayPolicy.prepare_refit."""
        if weights is not None:
            raise ValueError(
                "RayGeneration takes weights through RayPolicy.prepare_refit (FP8 all-gather on the workers), "
                "not through update_weights"
            )
        if kv_scales is not None:
            k, v = (t.detach().float().cpu().clone() for t in kv_scales)
            self.group.run("kv_scales", "set_engine_kv_scales", common=(k, v))
            self._kv_scales = (k, v)


def build_ray_policy_and_engine(
    policy_cfg: PolicyConfig, spec: ClusterSpec, seed: int, *, init_reference_model: bool = False
) -> tuple[RayPolicy, RayGeneration]:
    """Start the worker group, load + shard the policy on every worker, first refit; the driver's two handles.
    The workers get the validated `policy` section, the run's spec and `grpo.seed` (`worker_setup_payload`)."""
    if spec.tensor_parallel_size > 1:  # before any worker starts (the workers check the FP8 tiles per layer)
        from nemo_jetrl.policy.parallel.tensor_parallel import check_tp_model

        check_tp_model(policy_cfg.model_name, spec.tensor_parallel_size)
    group = RayWorkerGroup(spec, env_vars=trainer_env(policy_cfg.dtensor_cfg)[0])  # as NeMo-RL's policy workers'
    payload = group.put(worker_setup_payload(policy_cfg, spec, seed))
    info = group.run("setup", "setup", common=(payload, init_reference_model))[0]
    for line in info.get("startup_lines", ()):
        announce(line)  # rank 0's: the workers' `auto` switches as they resolved them
    return RayPolicy(group, policy_cfg, info, init_reference_model=init_reference_model), RayGeneration(group)
