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
    StrictInt,
    UnitFloat,
)


class GrpoConfig(Section):
    num_prompts_per_step: PositiveInt = 32
    num_generations_per_prompt: PositiveInt = 8
    max_num_steps: NonNegativeInt = 100
    normalize_rewards: bool = True  # divide group-centred rewards by the group std
    use_leave_one_out_baseline: bool = False
    drop_zero_advantage_groups: bool = True  # all-equal groups give no signal
    val_period: Annotated[StrictInt, Field(ge=-1)] = 10  # 0 or -1 disables validation (as in NeMo-RL)
    val_at_start: bool = True
    max_val_samples: PositiveInt = 512
    seed: NonNegativeInt = 42
    on_nonfinite: Literal["skip", "stop"] = "skip"  # non-finite loss / grad / FP8 scale: skip the batch or stop


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
