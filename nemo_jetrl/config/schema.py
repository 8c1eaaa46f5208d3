"""Pydantic schema of the master GRPO config (examples/configs/grpo_base.yaml): one model per section.

Every key of the master YAML is required (the YAML is the single place that holds defaults; recipes inherit it with
`defaults:`), unknown keys are errors, enums are `Literal`s. To add a key: add a field to its section class and the
key (with its default) to grpo_base.yaml. To add an environment: add an optional field to `EnvConfig`.

Cross-field rules are `model_validator`s; they raise `KeyedValueError` whose message names the full dotted keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_jetrl.config.errors import ConfigError, KeyedValueError, format_validation_error

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Precision = Literal["bf16", "fp8"]
SUPPORTED_BLOCK_SIZE = 128


class Section(BaseModel):
    """Base of every config section: unknown keys forbidden, assignments re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples stay tuples) for components that take dicts."""
        return self.model_dump()


class GrpoConfig(Section):
    num_prompts_per_step: PositiveInt
    num_generations_per_prompt: PositiveInt
    max_num_steps: NonNegativeInt
    normalize_rewards: bool
    use_leave_one_out_baseline: bool
    drop_zero_advantage_groups: bool
    val_period: NonNegativeInt  # 0 disables validation
    val_at_start: bool
    max_val_samples: PositiveInt
    seed: NonNegativeInt
    on_nonfinite: Literal["skip", "stop"]  # non-finite loss / grad / FP8 scale: skip the batch or stop the run


class LossConfig(Section):
    """Clipped policy-gradient loss (+ optional importance-sampling correction of the rollout/trainer mismatch).

    `truncated_importance_sampling_ratio_min` defaults (when null and a type is set) to 0.0 for `tis` (plain upper
    truncation of the IS weight) and to `1 / truncated_importance_sampling_ratio` for `icepop` / `seq-mask-tis`
    (a band symmetric in log space, e.g. [0.5, 2.0]). The validated config holds the filled-in value.
    """

    reference_policy_kl_penalty: NonNegativeFloat
    ratio_clip_min: Annotated[float, Field(ge=0, le=1)]
    ratio_clip_max: NonNegativeFloat
    ratio_clip_c: Annotated[float, Field(gt=1)] | None  # dual-clip constant
    token_level_loss: bool
    use_importance_sampling_correction: bool
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None
    truncated_importance_sampling_ratio: PositiveFloat | None
    truncated_importance_sampling_ratio_min: NonNegativeFloat | None

    @model_validator(mode="after")
    def _check_truncated_is(self) -> LossConfig:
        kind = self.truncated_importance_sampling_type
        if kind is None:
            return self
        prefix = "loss_fn.truncated_importance_sampling"
        if not self.use_importance_sampling_correction:
            raise KeyedValueError(f"{prefix}_type: '{kind}' requires loss_fn.use_importance_sampling_correction: true")
        upper = self.truncated_importance_sampling_ratio
        if upper is None:
            raise KeyedValueError(f"{prefix}_type: '{kind}' requires {prefix}_ratio (the upper bound, e.g. 2.0)")
        lower = self.truncated_importance_sampling_ratio_min
        if lower is None:
            lower = 0.0 if kind == "tis" else 1.0 / upper
            source = "default "
        else:
            source = ""
        if not lower < upper:
            raise KeyedValueError(f"{prefix}_ratio_min ({source}{lower:g}) must be < {prefix}_ratio ({upper:g})")
        # Fill the documented default without re-triggering validate_assignment.
        self.__dict__["truncated_importance_sampling_ratio_min"] = lower
        return self


class TokenizerConfig(Section):
    name: Annotated[str, Field(min_length=1)]


class OptimizerConfig(Section):
    name: Literal["adamw", "adam"]
    lr: PositiveFloat
    weight_decay: NonNegativeFloat
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]]
    eps: PositiveFloat


class Fp8Config(Section):
    """The one FP8 recipe shared by trainer and rollout (E4M3, 1x128 activations, 128x128 weights)."""

    block_size: int
    num_first_layers_in_bf16: NonNegativeInt
    num_last_layers_in_bf16: NonNegativeInt
    pow2_weight_scaling_factors: bool
    pow2_activation_scaling_factors: bool
    wgrad_x_blocks: Literal["1x128", "128x128"]
    train_kv_fake_quant: bool  # the trainer's attention sees the rollout's FP8 Q/K/V

    @field_validator("block_size")
    @classmethod
    def _only_supported_block(cls, value: int) -> int:
        if value != SUPPORTED_BLOCK_SIZE:
            raise ValueError(f"{value} is not supported; the FP8 recipe supports only {SUPPORTED_BLOCK_SIZE}")
        return value


class KvCacheCalibrationConfig(Section):
    percentile: Annotated[float, Field(gt=0, le=100)]  # of per-micro-batch amax values
    margin: Annotated[float, Field(ge=1)]  # scale = amax * margin / 448


class GenerationConfig(Section):
    backend: Literal["native", "vllm"]
    precision: Precision  # rollout linears
    kv_cache_dtype: Literal["auto", "fp8"]
    kv_cache_calibration: KvCacheCalibrationConfig
    kv_cache_calibration_pass: Literal["fused", "post_step"]  # fused: in the step's logprob forward (one step stale)
    max_new_tokens: PositiveInt
    temperature: NonNegativeFloat  # 0 = greedy
    top_p: Annotated[float, Field(gt=0, le=1)]
    top_k: PositiveInt | None
    stop_token_ids: list[NonNegativeInt] | None  # null = the tokenizer's eos
    deterministic: bool
    cuda_graphs: bool

    @model_validator(mode="after")
    def _kv_fp8_needs_fp8_rollout(self) -> GenerationConfig:
        if self.kv_cache_dtype == "fp8" and self.precision != "fp8":
            raise KeyedValueError(
                "policy.generation.kv_cache_dtype: 'fp8' requires policy.generation.precision: fp8 "
                f"(got '{self.precision}')"
            )
        return self


class PolicyConfig(Section):
    model_name: Annotated[str, Field(min_length=1)]
    tokenizer: TokenizerConfig
    precision: Precision  # training GEMMs (FProp, DGrad, WGrad)
    master_dtype: Literal["float32", "bfloat16"]
    compute_dtype: Literal["bfloat16", "float32"]
    train_global_batch_size: PositiveInt
    train_micro_batch_size: PositiveInt
    logprob_batch_size: PositiveInt
    max_total_sequence_length: PositiveInt
    max_grad_norm: PositiveFloat | None  # null = no clipping
    fused_train_kernels: bool = True  # CUDA trainer: RMSNorm / q-k-norm+RoPE / SiLU*up as fused fwd+bwd kernels
    train_causal_attention: bool = False  # trainer: causal SDPA on left-aligned rows (faster, not bit-exact)
    optimizer: OptimizerConfig
    fp8_cfg: Fp8Config
    generation: GenerationConfig

    @model_validator(mode="after")
    def _check_policy(self) -> PolicyConfig:
        problems = []
        if self.train_global_batch_size % self.train_micro_batch_size:
            problems.append(
                f"policy.train_global_batch_size ({self.train_global_batch_size}) must be divisible by "
                f"policy.train_micro_batch_size ({self.train_micro_batch_size})"
            )
        if self.max_total_sequence_length <= self.generation.max_new_tokens:
            problems.append(
                f"policy.max_total_sequence_length ({self.max_total_sequence_length}) must be greater than "
                f"policy.generation.max_new_tokens ({self.generation.max_new_tokens})"
            )
        if self.fp8_cfg.train_kv_fake_quant and self.generation.kv_cache_dtype != "fp8":
            problems.append(
                "policy.fp8_cfg.train_kv_fake_quant: true requires policy.generation.kv_cache_dtype: fp8 "
                f"(got '{self.generation.kv_cache_dtype}')"
            )
        if problems:
            raise KeyedValueError("; ".join(problems))
        return self


NonEmptyStr = Annotated[str, Field(min_length=1)]


class DataConfig(Section):
    """`arithmetic` (builtin) or a dataset: .jsonl / .json / .parquet file, datasets directory, cached HF name."""

    dataset_name: NonEmptyStr  # builtin task name, or a file / HF dataset
    num_digits: PositiveInt  # arithmetic only
    val_size: PositiveInt  # held-out problems (rows held out of the training data when val_dataset_name is null)
    seed: NonNegativeInt  # held-out split + shuffling
    val_dataset_name: NonEmptyStr | None
    dataset_config: NonEmptyStr | None  # HF datasets config (subset)
    train_split: NonEmptyStr | None
    val_split: NonEmptyStr | None
    input_key: NonEmptyStr
    output_key: NonEmptyStr
    prompt_template: str | None  # str.format template with one {} for the problem
    system_prompt: str | None
    use_chat_template: bool
    shuffle: bool
    max_input_seq_length: PositiveInt | None  # null = max_total_sequence_length - max_new_tokens


class ArithmeticEnvConfig(Section):
    correct_reward: float
    wrong_reward: float


class MathEnvConfig(Section):
    """math-verify rewards (environments/math_env.py)."""

    correct_reward: float
    wrong_reward: float
    no_answer_reward: float  # no extractable final answer (format penalty when < 0)
    format_reward: float  # bonus for a final answer in the required format, right or wrong
    answer_format: Literal["boxed", "any"]
    verify_timeout_s: PositiveFloat | None


class EnvConfig(Section):
    """One optional section per environment."""

    arithmetic: ArithmeticEnvConfig | None = None
    math: MathEnvConfig | None = None


class WandbConfig(Section):
    project: str
    name: str


class MlflowConfig(Section):
    experiment_name: str
    tracking_uri: str | None


class LoggerConfig(Section):
    log_dir: str
    tensorboard_enabled: bool
    wandb_enabled: bool
    wandb: WandbConfig
    mlflow_enabled: bool
    mlflow: MlflowConfig
    plot_period: NonNegativeInt  # 0 = plots only at the end


class CheckpointingConfig(Section):
    enabled: bool
    checkpoint_dir: str
    save_period: PositiveInt
    keep_top_k: PositiveInt | None  # null = keep all
    metric_name: str | None  # "val:accuracy" / "val/accuracy" / "train:reward_mean": keep the best K; null = newest K
    higher_is_better: bool  # for metric_name


class ClusterConfig(Section):
    num_nodes: PositiveInt
    gpus_per_node: NonNegativeInt  # 0 = CPU
    device: Literal["auto", "cpu", "cuda"]
    num_cpu_threads: PositiveInt | None  # null = leave torch's default (per process / per Ray worker)
    backend: Literal["local", "ray"]  # local = one process; ray = one trainer+rollout worker per GPU / CPU worker
    cpu_workers_per_node: PositiveInt  # Ray workers per node when gpus_per_node == 0
    ray_address: str | None  # null = $RAY_ADDRESS (set by ray.sub) or a fresh local Ray
    rollout_seed_shards: PositiveInt | None  # rollout RNG streams per step; null = one per worker

    @model_validator(mode="after")
    def _check_cluster(self) -> ClusterConfig:
        if self.backend == "local" and self.num_nodes > 1:
            raise KeyedValueError(
                f"cluster.num_nodes ({self.num_nodes}) > 1 requires cluster.backend: ray (local is one process)"
            )
        if self.backend == "ray" and self.gpus_per_node > 0 and self.device == "cpu":
            raise KeyedValueError(
                "cluster.device: 'cpu' contradicts cluster.gpus_per_node > 0 with cluster.backend: ray"
            )
        if self.backend == "ray" and self.gpus_per_node == 0 and self.device == "cuda":
            raise KeyedValueError("cluster.device: 'cuda' with cluster.backend: ray requires cluster.gpus_per_node > 0")
        return self


class MasterConfig(Section):
    """The whole validated config. `to_dict()` gives plain dicts; sections are attributes (`cfg.policy.fp8_cfg`)."""

    grpo: GrpoConfig
    loss_fn: LossConfig
    policy: PolicyConfig
    data: DataConfig
    env: EnvConfig
    logger: LoggerConfig
    checkpointing: CheckpointingConfig
    cluster: ClusterConfig

    @model_validator(mode="after")
    def _check_global_batch(self) -> MasterConfig:
        samples = self.grpo.num_prompts_per_step * self.grpo.num_generations_per_prompt
        if self.policy.train_global_batch_size != samples:
            raise KeyedValueError(
                f"policy.train_global_batch_size ({self.policy.train_global_batch_size}) must equal "
                f"grpo.num_prompts_per_step * grpo.num_generations_per_prompt "
                f"({self.grpo.num_prompts_per_step} * {self.grpo.num_generations_per_prompt} = {samples})"
            )
        return self


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> MasterConfig:
    """Validate a (resolved or resolvable) config against `MasterConfig`; one ConfigError naming every bad key."""
    if isinstance(cfg, ListConfig):
        raise ConfigError("config must be a mapping of sections, got a list")
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{exc.full_key}: {message}" if exc.full_key else message) from None
    elif isinstance(cfg, Mapping):
        data = dict(cfg)
    else:
        raise ConfigError(f"config must be a mapping of sections, got {type(cfg).__name__}")
    try:
        return MasterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, MasterConfig)) from None
