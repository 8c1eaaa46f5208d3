"""pass@k / accuracy of a policy on the held-out prompts of the configured task (NeMo-RL's `run_eval.py`).

The eval YAML is a GRPO config (`defaults:` a GRPO recipe: model, precision, generation, data and env sections mean
the same) plus an `eval:` section with NeMo-RL's keys. For each of the task's first `max_samples` held-out prompts:
one greedy completion (`accuracy`, the number `validate()` of the GRPO loop reports) and `num_tests_per_prompt`
samples at the rollout temperature, scored into the unbiased pass@k (Chen et al. 2021; NeMo-RL's `eval_pass_k`):
`1 - C(n - c, k) / C(n, k)` per prompt with c correct of n, averaged over prompts. A response counts as correct
when its reward is > 0.5 (as `validate()`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import Section

RESULTS_FILE = "results.json"


class EvalConfig(Section):
    """The `eval:` section (NeMo-RL's keys + where the weights come from)."""

    metric: Literal["pass@k"] = "pass@k"
    num_tests_per_prompt: int = Field(1, gt=0)  # samples per prompt
    k_value: int = Field(1, gt=0)
    seed: int = Field(42, ge=0)
    save_path: str | None = None  # directory for results.json; null = not saved
    checkpoint_dir: str | None = None  # a GRPO checkpoint root (latest valid step) or one step_N dir
    max_samples: int = Field(512, gt=0)  # held-out prompts evaluated
    num_prompts_per_step: int = Field(-1, ge=-1)  # prompts per generation call; -1 = all at once

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if self.k_value > self.num_tests_per_prompt:
            raise KeyedValueError(
                f"eval.k_value ({self.k_value}) must be <= eval.num_tests_per_prompt ({self.num_tests_per_prompt})"
            )
        if self.num_prompts_per_step == 0:
            raise KeyedValueError("eval.num_prompts_per_step must be -1 (all) or > 0")
        return self


def pass_at_k(correct: torch.Tensor, k: int) -> float:
    """Unbiased pass@k averaged over prompts. correct: [N, n] bool (n samples per prompt)."""
    n = correct.shape[1]
    scores = []
    for c in correct.sum(-1).tolist():
        scores.append(1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
    return sum(scores) / len(scores)


def load_checkpoint_policy(run: Any, checkpoint_dir: str) -> int:
    """Load a GRPO checkpoint (root: the latest valid step; or a step dir) into `run.policy`; returns its step."""
    from nemo_jetrl.utils.checkpoint import CheckpointManager

    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"eval.checkpoint_dir: {checkpoint_dir} is not a directory")
    if path.name.startswith("step_"):
        state = CheckpointManager(path.parent, keep_top_k=None).load(path)
    else:
        state = CheckpointManager(path, keep_top_k=None).load_latest()
        if state is None:
            raise FileNotFoundError(f"eval.checkpoint_dir: no valid checkpoint under {checkpoint_dir}")
    run.policy.load_state_dict(state["policy"])
    run.policy.prepare_refit()  # FP8 weights for the rollout, as after a training step
    if run.policy.kv_scales is not None:
        run.engine.update_weights(kv_scales=run.policy.kv_scales.kv)
    return int(state["step"])


def evaluate(run: Any, eval_cfg: EvalConfig, progress: Any = None) -> dict[str, Any]:
    """Greedy accuracy and pass@k of `run` (a `GrpoSetup`) on its task's held-out prompts."""
    from nemo_jetrl.algorithms.rollout_io import (
        bootstrap_kv_scales,
        decode_responses,
        encode_prompts,
        needs_kv_bootstrap,
        step_generator,
    )

    if needs_kv_bootstrap(run):
        bootstrap_kv_scales(run, 0)
    problems = run.task.validation(eval_cfg.max_samples)
    if not problems:
        raise ValueError("the task has no held-out prompts (data.val_size / data.val_dataset_name)")
    tok = run.policy.tokenizer
    prompt_ids = encode_prompts(tok, [p.prompt for p in problems])
    answers = [p.answer for p in problems]
    greedy = run.engine.generate(prompt_ids, greedy=True, generator=step_generator(eval_cfg.seed + 7, 0, run.device))
    accuracy = float((run.task.score(decode_responses(tok, greedy), answers) > 0.5).float().mean())
    n, chunk = eval_cfg.num_tests_per_prompt, eval_cfg.num_prompts_per_step
    chunk = len(problems) if chunk == -1 else chunk
    correct = []
    for i, start in enumerate(range(0, len(problems), chunk)):
        ids = [p for p in prompt_ids[start : start + chunk] for _ in range(n)]
        ans = [a for a in answers[start : start + chunk] for _ in range(n)]
        out = run.engine.generate(ids, generator=step_generator(eval_cfg.seed, i, run.device))
        correct.append((run.task.score(decode_responses(tok, out), ans) > 0.5).view(-1, n))  # [c, n]
        if progress is not None:
            progress.advance(step=min(start + chunk, len(problems)))
    correct_all = torch.cat(correct)  # [N, n]
    return {
        "metric": eval_cfg.metric,
        "k_value": eval_cfg.k_value,
        "num_tests_per_prompt": n,
        "num_prompts": len(problems),
        "score": pass_at_k(correct_all, eval_cfg.k_value),
        "pass@1": pass_at_k(correct_all, 1),
        "accuracy": accuracy,
    }


def save_results(results: dict[str, Any], save_path: str) -> Path:
    path = Path(save_path)
    path.mkdir(parents=True, exist_ok=True)
    (path / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    return path / RESULTS_FILE
