"""`policy:` — the trainer's config section (model, batch sizes, optimizer); it holds `fp8_cfg` and `generation`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from nemo_jetrl.config.errors import KeyedValueError, keyed_check
from nemo_jetrl.config.section import (
    AutoBool,
    FiniteFloat,
    NonEmptyStr,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Section,
)
from nemo_jetrl.generation.config import GenerationConfig
from nemo_jetrl.policy.lr_scheduler import check_scheduler_config
from nemo_jetrl.policy.sequence_packing import check_algorithm
from nemo_jetrl.precision.config import Fp8Config, Precision

Beta = Annotated[FiniteFloat, Field(ge=0, lt=1)]


class TokenizerConfig(Section):
    name: NonEmptyStr | None = None  # null = policy.model_name


class OptimizerConfig(Section):
    """AdamW / Adam. NeMo-RL's spelling (`name: torch.optim.AdamW` + `kwargs:`) is read by schema/nemo_rl.py."""

    name: Literal["adamw", "adam"] = "adamw"
    lr: PositiveFloat = 5.0e-5
    weight_decay: NonNegativeFloat = 0.0
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    eps: PositiveFloat = 1.0e-8
    decay_1d_params: bool = True  # false: biases and norm weights take no weight decay (Megatron's rule)
    allow_large_lr: bool = False  # lr > 1 is refused as a typo unless this is true

    @model_validator(mode="after")
    def _check_lr(self) -> OptimizerConfig:
        if self.lr > 1 and not self.allow_large_lr:
            raise KeyedValueError(
                f"policy.optimizer.lr: {self.lr:g} > 1 would blow the weights up in one step (a typo?); use a "
                "learning rate <= 1, or set policy.optimizer.allow_large_lr=true to force it"
            )
        return self


class DTensorConfig(Section):
    """NeMo-RL's `policy.dtensor_cfg`: the FSDP2 (DTensor) trainer's layout. Its other NeMo-RL keys are mapped,
    accepted without effect or refused in config/nemo_rl_keys.py."""

    # T ranks per tensor-parallel group (trainer and its colocated rollout); the Ray workers form W / T
    # data-parallel groups (policy/parallel/tensor_parallel.py, docs/cluster.md)
    tensor_parallel_size: PositiveInt = 1
    # each decoder layer keeps only its inputs and recomputes its activations in the backward (models/recompute.py):
    # same loss and gradients bit for bit, about one forward more per training pass, far less activation memory
    activation_checkpointing: bool = False
    # environment variables of the trainer's process (NeMo-RL: its policy workers'), e.g. PYTORCH_CUDA_ALLOC_CONF:
    # expandable_segments:True against the allocator's fragmentation at long sequences (utils/process_env.py)
    env_vars: dict[str, str] | None = None

    @field_validator("env_vars", mode="before")
    @classmethod
    def _env_values_as_text(cls, value: Any) -> Any:
        """YAML scalars (1, true) become the strings an environment holds ('1', 'true'); nested values are refused."""
        if not isinstance(value, dict):
            return value
        bad = [k for k, v in value.items() if isinstance(v, (dict, list)) or v is None]
        if bad:
            raise KeyedValueError(f"policy.dtensor_cfg.env_vars.{bad[0]}: an environment variable takes one value")
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


class DynamicBatchingConfig(Section):
    """NeMo-RL's `policy.dynamic_batching`: the trainer's micro-batches cut by a token budget over length-sorted rows,
    each trimmed to the columns its rows use (policy/micro_batches.py; Ray runs hand the same micro-batches to their
    data-parallel groups); the rollout is unaffected."""

    enabled: bool = False
    train_mb_tokens: PositiveInt | None = None  # null = train_micro_batch_size * max_total_sequence_length
    logprob_mb_tokens: PositiveInt | None = None  # null = logprob_batch_size * max_total_sequence_length
    sequence_length_round: PositiveInt = 64  # window widths are multiples of this (fewer distinct kernel shapes)


class SequencePackingConfig(Section):
    """NeMo-RL's `policy.sequence_packing`: each trainer micro-batch is a bin of sequences within the token budget
    whose real tokens run as one packed row with varlen causal attention (policy/sequence_packing.py,
    models/packed.py; in the exact mode and with matched kernels the rollout's batch-invariant kernel in its
    varlen form); the rollout is unaffected. Excludes dynamic batching."""

    enabled: bool = False
    train_mb_tokens: PositiveInt | None = None  # null = train_micro_batch_size * max_total_sequence_length
    logprob_mb_tokens: PositiveInt | None = None  # null = logprob_batch_size * max_total_sequence_length
    algorithm: NonEmptyStr = "modified_first_fit_decreasing"  # | first_fit_decreasing | concatenative
    sequence_length_round: PositiveInt = 64  # packed rows are a multiple of this long (fewer distinct shapes)

    @field_validator("algorithm")
    @classmethod
    def _check_algorithm(cls, value: str) -> str:
        return keyed_check(check_algorithm, value)


class MemoryPreflightConfig(Section):
    """`policy.memory_preflight`: at start-up, the training step's peak device memory estimated from the model shape
    and this section (algorithms/memory_preflight.py, docs/long_responses.md): printed with the device's capacity;
    null token budgets of packing / dynamic batching derived so that the step fits; a config that cannot fit
    refused before any rollout, naming the keys to change."""

    enabled: bool = True
    capacity_gib: PositiveFloat | None = None  # null = the CUDA device's memory (on a CPU: report only, no refusal)
    usable_fraction: Annotated[FiniteFloat, Field(gt=0, le=1)] = 0.9  # of the capacity (CUDA context, fragmentation)


class PolicyConfig(Section):
    """`train_global_batch_size: null` = grpo.num_prompts_per_step * grpo.num_generations_per_prompt."""

    model_name: NonEmptyStr = "tiny-arith"  # builtin tiny model, or a local HF causal-LM directory
    hf_config_overrides: dict[str, Any] | None = None  # config.json values replaced at load (NeMo-RL's key)
    tokenizer: TokenizerConfig = TokenizerConfig()
    precision: Precision = "fp8"  # training GEMMs (FProp, DGrad, WGrad)
    master_dtype: Literal["float32", "bfloat16"] = "float32"  # master weights + optimizer state
    compute_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # activations / non-FP8 math
    train_global_batch_size: PositiveInt | None = None
    train_micro_batch_size: PositiveInt = 64
    logprob_batch_size: PositiveInt = 64
    max_total_sequence_length: PositiveInt = 32  # prompt + response
    max_grad_norm: PositiveFloat | None = 1.0  # null = no clipping
    fused_train_kernels: bool = True  # CUDA trainer: RMSNorm / q-k-norm+RoPE / SiLU*up as fused fwd+bwd kernels
    train_causal_attention: bool = False  # trainer: causal SDPA on left-aligned rows (faster, not bit-exact)
    # CUDA trainer (local backend): each micro-batch shape's forward + loss + backward captured in a CUDA graph and
    # replayed (policy/train_graphs.py): far fewer host launches (the FP8 trainer is host-bound at small widths);
    # one micro-batch's activations stay reserved between steps. auto: on where correct (a CUDA device, the local
    # backend, not the exact mode), else off with one start-up line (policy/auto_switches.py)
    train_cuda_graphs: AutoBool = "auto"
    # prev_logprobs (the trainer's logprobs of the rollout tokens): a separate no-grad forward before training, or the
    # training forward itself (one forward less per step; needs one optimizer step per GRPO step); auto (the
    # default): train_forward where that holds, else logprob_forward (resolved at validation)
    prev_logprobs_source: Literal["logprob_forward", "train_forward", "auto"] = "auto"
    # MoE models (policy/moe_step.py): the routers' gate weights are not trained (Megatron's freeze_moe_router); the
    # load-balancing loss coefficient, null = the model config's router_aux_loss_coef, 0 = off
    freeze_moe_router: bool = False
    router_aux_loss_coef: NonNegativeFloat | None = None
    optimizer: OptimizerConfig = OptimizerConfig()
    # NeMo-RL's LR schedule: [{name: torch.optim.lr_scheduler.X, kwargs: {...}}, ..., {milestones: [...]}] or one
    # {name, kwargs}; null = constant lr. Stepped once per GRPO step (policy/lr_scheduler.py).
    scheduler: list[dict[str, Any]] | dict[str, Any] | None = None
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    sequence_packing: SequencePackingConfig = SequencePackingConfig()
    dtensor_cfg: DTensorConfig = DTensorConfig()
    memory_preflight: MemoryPreflightConfig = MemoryPreflightConfig()
    fp8_cfg: Fp8Config = Fp8Config()
    generation: GenerationConfig = GenerationConfig()

    @field_validator("scheduler")
    @classmethod
    def _check_scheduler(cls, value: Any) -> Any:
        return keyed_check(check_scheduler_config, value)

    @model_validator(mode="after")
    def _check_policy(self) -> PolicyConfig:
        # Fill the documented defaults without re-triggering validate_assignment.
        if self.tokenizer.name is None:
            self.tokenizer.__dict__["name"] = self.model_name
        if self.generation.precision is None:
            self.generation.__dict__["precision"] = self.precision
        problems = []
        if self.generation.kv_cache_dtype == "fp8" and self.generation.precision != "fp8":
            problems.append(
                "policy.generation.kv_cache_dtype: 'fp8' requires policy.generation.precision: fp8 "
                f"(got '{self.generation.precision}')"
            )
        if self.generation.max_new_tokens > self.max_total_sequence_length:
            problems.append(
                f"policy.generation.max_new_tokens ({self.generation.max_new_tokens}) must be <= "
                f"policy.max_total_sequence_length ({self.max_total_sequence_length})"
            )
        if self.train_global_batch_size is not None and self.train_global_batch_size % self.train_micro_batch_size:
            problems.append(
                f"policy.train_global_batch_size ({self.train_global_batch_size}) must be divisible by "
                f"policy.train_micro_batch_size ({self.train_micro_batch_size})"
            )
        if self.fp8_cfg.train_kv_fake_quant and self.generation.kv_cache_dtype != "fp8":
            problems.append(
                "policy.fp8_cfg.train_kv_fake_quant: true requires policy.generation.kv_cache_dtype: fp8 "
                f"(got '{self.generation.kv_cache_dtype}')"
            )
        if self.sequence_packing.enabled and self.dynamic_batching.enabled:
            problems.append(
                "policy.sequence_packing.enabled and policy.dynamic_batching.enabled exclude each other (as in "
                "NeMo-RL): set one of them false"
            )
        problems += self._exact_mode_problems() + self._train_graph_problems()
        if problems:
            raise KeyedValueError("; ".join(problems))
        return self

    def _train_graph_problems(self) -> list[str]:
        """What `train_cuda_graphs: true` cannot capture (it would run eagerly: refused instead of ignored)."""
        if self.train_cuda_graphs is not True:  # auto resolves to off where graphs cannot run
            return []
        problems = []
        if self.generation.deterministic:
            problems.append("policy.train_cuda_graphs: true is not supported with policy.generation.deterministic: "
                            "true (the exact mode's trainer runs eagerly)")  # fmt: skip
        return problems

    def _exact_mode_problems(self) -> list[str]:
        """What `policy.generation.deterministic: true` (batch-invariant kernels, trainer == rollout bitwise) or
        `matched_kernels: true` (its cheap parts on the fast path) cannot honour."""
        gen = self.generation
        if gen.deterministic and gen.matched_kernels is True:
            return ["policy.generation.deterministic: true already runs every kernel matched_kernels would: set "
                    "policy.generation.matched_kernels: false"]  # fmt: skip
        if gen.matched_kernels is True:  # auto: resolved at start-up (off where this would refuse it)
            return self._shared_kernel_problems("policy.generation.matched_kernels: true")
        if not gen.deterministic:
            return []
        problems = []
        if self.generation.precision != self.precision:
            problems.append(
                "policy.generation.deterministic: true needs one precision for trainer and rollout "
                f"(policy.precision '{self.precision}', policy.generation.precision '{self.generation.precision}')"
            )
        if self.generation.kv_cache_dtype == "fp8" and not self.fp8_cfg.train_kv_fake_quant:
            problems.append(
                "policy.generation.deterministic: true with kv_cache_dtype fp8 needs "
                "policy.fp8_cfg.train_kv_fake_quant: true (the trainer must read the K/V the cache held)"
            )
        return problems + self._shared_kernel_problems("policy.generation.deterministic: true")

    def _shared_kernel_problems(self, mode: str) -> list[str]:
        """What a mode running the rollout's attention and glue kernels in the trainer too cannot honour."""
        problems = []
        if self.train_causal_attention:
            problems.append(
                f"{mode} runs one attention for rollout and trainer: set policy.train_causal_attention: false"
            )
        if not self.fused_train_kernels:
            problems.append(
                f"{mode} runs the rollout's per-row fused glue kernels in the trainer too: set "
                "policy.fused_train_kernels: true"
            )
        return problems
