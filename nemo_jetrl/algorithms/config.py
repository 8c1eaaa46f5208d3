"""Config sections of the GRPO algorithm: `grpo:` (the loop) and `loss_fn:` (clipped PG + IS correction)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import (
    FiniteFloat,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
    Seed,
    StrictInt,
    UnitFloat,
)


class RewardShapingConfig(Section):
    """DAPO overlong reward shaping (NeMo-RL `grpo.reward_shaping`; algorithms/dapo.py)."""

    enabled: bool = False
    overlong_buffer_length: PositiveInt | None = 128  # tokens before max_response_length where the penalty ramps
    overlong_buffer_penalty: NonNegativeFloat | None = 1.0  # penalty at max_response_length
    max_response_length: PositiveInt | None = None  # response tokens; null needs stop_properly_penalty_coef
    stop_properly_penalty_coef: UnitFloat | None = None  # truncated rewards x coef

    @model_validator(mode="after")
    def _check_overlong(self) -> RewardShapingConfig:
        if not self.enabled or self.stop_properly_penalty_coef is not None:
            return self
        keys = ("overlong_buffer_length", "overlong_buffer_penalty", "max_response_length")
        unset = [k for k in keys if getattr(self, k) is None]
        if unset:
            names = ", ".join(f"grpo.reward_shaping.{k}" for k in unset)
            raise KeyedValueError(f"grpo.reward_shaping.enabled: true needs {names} (or stop_properly_penalty_coef)")
        return self


class RewardScalingConfig(Section):
    """NeMo-RL's `grpo.reward_scaling`: each reward clamped to [source_min, source_max], then mapped linearly onto
    [target_min, target_max], before reward shaping (algorithms/dapo.py)."""

    enabled: bool = False
    source_min: FiniteFloat = 0.0
    source_max: FiniteFloat = 1.0
    target_min: FiniteFloat = 0.0
    target_max: FiniteFloat = 1.0

    @model_validator(mode="after")
    def _check_range(self) -> RewardScalingConfig:
        if self.enabled and not self.source_min < self.source_max:
            raise KeyedValueError(
                f"grpo.reward_scaling.source_min ({self.source_min:g}) must be < source_max ({self.source_max:g})"
            )
        return self


class GrpoConfig(Section):
    num_prompts_per_step: PositiveInt = 32
    num_generations_per_prompt: PositiveInt = 8
    max_num_steps: NonNegativeInt = 100
    normalize_rewards: bool = True  # divide group-centred rewards by the group std
    use_leave_one_out_baseline: bool = False
    drop_zero_advantage_groups: bool = True  # all-equal groups give no signal
    val_period: Annotated[StrictInt, Field(ge=-1)] = 10  # 0 or -1 disables validation (as in NeMo-RL)
    val_at_start: bool = True
    val_at_end: bool = False  # one more validation after the last step (when the period did not just run one)
    # also validate greedy through a BF16 referee of the same weights (plain linears, BF16 KV):
    # validation/reference_accuracy, comparable across precisions (algorithms/validation.py)
    val_reference: bool = False
    max_val_samples: PositiveInt = 512
    seed: Seed = 42
    on_nonfinite: Literal["skip", "stop"] = "skip"  # non-finite loss / grad / FP8 scale: skip the batch or stop
    max_consecutive_nonfinite_skips: PositiveInt | None = 3  # that many steps skipped in a row stop the run; null: never
    mismatch_position_bin: NonNegativeInt = 0  # > 0: train/mismatch_pos/<start> per bin of this many positions
    # DAPO (NeMo-RL keys; algorithms/dapo.py)
    use_dynamic_sampling: bool = False  # generate until the step holds enough groups with reward std > 0
    batch_multiplier: Annotated[FiniteFloat, Field(ge=1)] = 1.0  # prompts per generation batch = num_prompts x this
    dynamic_sampling_max_gen_batches: PositiveInt = 10  # generation batches per step before giving up
    overlong_filtering: bool = False  # truncated responses are left out of the loss
    reward_shaping: RewardShapingConfig = RewardShapingConfig()
    reward_scaling: RewardScalingConfig = RewardScalingConfig()

    @model_validator(mode="after")
    def _multiplier_needs_dynamic_sampling(self) -> GrpoConfig:
        if self.batch_multiplier != 1 and not self.use_dynamic_sampling:
            raise KeyedValueError(
                f"grpo.batch_multiplier ({self.batch_multiplier:g}) != 1 requires grpo.use_dynamic_sampling: true"
            )
        return self


class LossConfig(Section):
    """Clipped policy-gradient loss (+ optional importance-sampling correction of the rollout/trainer mismatch).

    `truncated_importance_sampling_ratio_min` defaults (when null and a type is set) to 0.0 for `tis` (plain upper
    truncation of the IS weight) and to `1 / truncated_importance_sampling_ratio` for `icepop` / `seq-mask-tis`
    (a band symmetric in log space, e.g. [0.5, 2.0]). The validated config holds the filled-in value.
    """

    reference_policy_kl_penalty: NonNegativeFloat = 0.0
    ratio_clip_min: UnitFloat = 0.2
    ratio_clip_max: NonNegativeFloat = 0.2
    ratio_clip_c: Annotated[FiniteFloat, Field(gt=1)] | None = None  # dual-clip constant
    token_level_loss: bool = True
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    truncated_importance_sampling_ratio: PositiveFloat | None = None
    truncated_importance_sampling_ratio_min: NonNegativeFloat | None = None
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"  # Schulman's KL estimators
    kl_input_clamp_value: PositiveFloat | None = 20.0  # clamp of log(ref / cur) before the estimator
    kl_output_clamp_value: PositiveFloat | None = 10.0  # clamp of the per-token KL
    use_on_policy_kl_approximation: bool = False  # KL weighted by exp(logp - logp_gen) (rollout samples)
    sequence_level_importance_ratios: bool = False  # GSPO: one PPO ratio per sequence; needs token_level_loss false
    force_on_policy_ratio: bool = False  # prev_logprobs := the current logprobs, detached: PPO ratio 1 (NeMo-RL)

    @model_validator(mode="after")
    def _check_sequence_ratios(self) -> LossConfig:
        if not self.sequence_level_importance_ratios:
            return self
        if self.token_level_loss:
            raise KeyedValueError(
                "loss_fn.sequence_level_importance_ratios: true requires loss_fn.token_level_loss: false"
            )
        if self.truncated_importance_sampling_type == "seq-mask-tis":
            raise KeyedValueError(
                "loss_fn.sequence_level_importance_ratios: true does not combine with "
                "loss_fn.truncated_importance_sampling_type: 'seq-mask-tis' (token-level IS weights)"
            )
        return self

    @model_validator(mode="after")
    def _check_truncated_is(self) -> LossConfig:
        kind = self.truncated_importance_sampling_type
        prefix = "loss_fn.truncated_importance_sampling"
        if kind is None:  # a lone ratio_min is ignored (as NeMo-RL); a lone upper ratio would be silently unused
            if self.truncated_importance_sampling_ratio is not None:
                raise KeyedValueError(
                    f"{prefix}_ratio ({self.truncated_importance_sampling_ratio:g}) is set but {prefix}_type is "
                    "null; set the type (tis|icepop|seq-mask-tis) or the ratio to null"
                )
            return self
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
