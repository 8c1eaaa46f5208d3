"""The master GRPO config: the sections each component owns, composed (examples/configs/grpo_base.yaml lists them).

Every key has its default in its section type (a partial config is valid; grpo_base.yaml shows the same values),
unknown keys are errors, enums are `Literal`s. To add a key: one field in its section type (and the line in
grpo_base.yaml). NeMo-RL's spellings and keys that have no effect here are translated first (schema/nemo_rl.py,
applied by `validate_config` in schema/validate.py).

Cross-section rules are `model_validator`s raising `KeyedValueError`, whose message names the full dotted keys.
"""

from __future__ import annotations

from pydantic import PrivateAttr, model_validator

from nemo_jetrl.algorithms.config import GrpoConfig, LossConfig
from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import Section
from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.cluster_config import ClusterConfig
from nemo_jetrl.environments.config import EnvConfig
from nemo_jetrl.policy.auto_switches import matched_by_default
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.precision.config import recipe_problems
from nemo_jetrl.utils.config import CheckpointingConfig, LoggerConfig


class MasterConfig(Section):
    """The whole validated config, handed to the run as is (`grpo.run_grpo`): sections are attributes
    (`cfg.policy.fp8_cfg`); `model_dump()` gives plain dicts where the config crosses a process boundary."""

    grpo: GrpoConfig = GrpoConfig()
    loss_fn: LossConfig = LossConfig()
    policy: PolicyConfig = PolicyConfig()
    data: DataConfig = DataConfig()
    env: EnvConfig = EnvConfig()
    logger: LoggerConfig = LoggerConfig()
    checkpointing: CheckpointingConfig = CheckpointingConfig()
    cluster: ClusterConfig = ClusterConfig()
    # what the NeMo-RL translation said (schema/nemo_rl.py): mapping lines for stdout, ignored keys for stderr
    _notes: tuple[str, ...] = PrivateAttr(default=())
    _warnings: tuple[str, ...] = PrivateAttr(default=())
    _prev_logprobs_auto: bool = PrivateAttr(default=False)  # policy.prev_logprobs_source: auto was resolved here

    @property
    def startup_notes(self) -> tuple[str, ...]:
        """Lines announcing how NeMo-RL keys are run here (`megatron_cfg: trained by ...`), printed once at start-up."""
        return self._notes

    @property
    def ignored_key_warnings(self) -> tuple[str, ...]:
        """`<key>: not known to this version of nemo-jetrl: ignored`, one per key (print with `warning: `)."""
        return self._warnings

    @model_validator(mode="after")
    def _check_global_batch(self) -> MasterConfig:
        """Each step's samples split into whole optimizer steps of `train_global_batch_size` (default: one)."""
        samples = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        batch = self.policy.train_global_batch_size
        if batch is None:
            self.policy.__dict__["train_global_batch_size"] = samples
        elif samples % batch:
            raise KeyedValueError(
                f"grpo.num_prompts_per_step * grpo.num_generations_per_prompt "
                f"({self.grpo.num_prompts_per_step} * {self.grpo.num_generations_per_prompt} = {samples}) must be "
                f"divisible by policy.train_global_batch_size ({batch})"
            )
        one_step = self.policy.train_global_batch_size == samples
        if self.policy.prev_logprobs_source == "auto":
            self.policy.__dict__["prev_logprobs_source"] = "train_forward" if one_step else "logprob_forward"
            self._prev_logprobs_auto = True
        if self.policy.prev_logprobs_source == "train_forward" and not one_step:
            raise KeyedValueError(
                f"policy.prev_logprobs_source: train_forward needs one optimizer step per GRPO step "
                f"(policy.train_global_batch_size = grpo.num_prompts_per_step * grpo.num_generations_per_prompt "
                f"= {samples}), got policy.train_global_batch_size {self.policy.train_global_batch_size}"
            )
        return self

    def prev_logprobs_line(self) -> str | None:
        """The start-up line where `policy.prev_logprobs_source: auto` resolved to train_forward (no logprob pass,
        unlike NeMo-RL), else None (logprob_forward is NeMo-RL's own way)."""
        if not self._prev_logprobs_auto or self.policy.prev_logprobs_source != "train_forward":
            return None
        return (
            "policy.prev_logprobs_source: auto -> train_forward: one optimizer step per GRPO step, so prev_logprobs "
            "and the mismatch metrics come from the training forward (no logprob pass)"
        )

    @model_validator(mode="after")
    def _default_matched_kernels(self) -> MasterConfig:
        """`policy.generation.matched_kernels: null` (the default) is `auto` (bitwise on-policy where the start-up
        self-check passes) where `matched_by_default` says, else false."""
        gen = self.policy.generation
        if gen.matched_kernels is None:
            gen.__dict__["matched_kernels"] = "auto" if matched_by_default(self.policy, self.cluster.device) else False
        return self

    @model_validator(mode="after")
    def _check_fp8_recipe(self) -> MasterConfig:
        """A rowwise / tensorwise FP8 recipe runs on the paths that derive every cast from it; others refuse it."""
        ranks = ClusterSpec.from_config(self.cluster).num_workers
        problems = recipe_problems(self.policy, self.cluster.backend if ranks > 1 else "local")
        if problems:
            raise KeyedValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _check_tensor_parallel(self) -> MasterConfig:
        """T-way TP runs on groups of T ranks (trainer and colocated rollout): T divides the ranks."""
        tp = self.policy.dtensor_cfg.tensor_parallel_size
        if tp == 1:
            return self
        key = f"policy.dtensor_cfg.tensor_parallel_size: {tp}"
        if self.cluster.backend == "local":
            raise KeyedValueError(
                f"{key} needs several ranks (each tensor-parallel rank is a torchrun rank or a Ray worker), got "
                "cluster.backend: 'local'; launch with torchrun, or set cluster.backend: ray"
            )
        workers = ClusterSpec.from_config(self.cluster).num_workers
        if self.cluster.backend == "torchrun" and workers % tp:
            raise KeyedValueError(f"{key} must divide torchrun's ranks (WORLD_SIZE = {workers})")
        if workers % tp:
            per_node = "gpus_per_node" if self.cluster.gpus_per_node else "cpu_workers_per_node"
            count = getattr(self.cluster, per_node)
            raise KeyedValueError(
                f"{key} must divide the Ray workers (cluster.num_nodes * cluster.{per_node} = "
                f"{self.cluster.num_nodes} * {count} = {workers})"
            )
        return self
