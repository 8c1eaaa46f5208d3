"""`env:` — one section per environment (reward values of the arithmetic task, math-verify settings)."""

from __future__ import annotations

from typing import Literal

from nemo_jetrl.config.section import FiniteFloat, PositiveFloat, Section


class ArithmeticEnvConfig(Section):
    correct_reward: FiniteFloat = 1.0
    wrong_reward: FiniteFloat = 0.0


class MathEnvConfig(Section):
    """math-verify rewards (environments/math_env.py)."""

    correct_reward: FiniteFloat = 1.0
    wrong_reward: FiniteFloat = 0.0
    no_answer_reward: FiniteFloat = 0.0  # no extractable final answer (format penalty when < 0)
    format_reward: FiniteFloat = 0.0  # bonus for a final answer in the required format, right or wrong
    answer_format: Literal["boxed", "any"] = "boxed"
    verify_timeout_s: PositiveFloat | None = 5.0
    # hf_math_verify: math-verify on the final answer (the rules above); dapo_math_verify: DAPO's rule, the last
    # "Answer: ..." of the response's final 300 characters equal to the reference after Minerva's normalisation,
    # reward correct_reward / wrong_reward (environments/dapo_verify.py)
    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify"] = "hf_math_verify"


class EnvConfig(Section):
    arithmetic: ArithmeticEnvConfig = ArithmeticEnvConfig()
    math: MathEnvConfig = MathEnvConfig()
    # speed runs on random weights: seeded coin-flip rewards (the task's correct / wrong values) so that groups
    # have reward variance and the trainer's gradients are not all zero (environments/coin_flip.py); timing only
    coin_flip_rewards: bool = False
