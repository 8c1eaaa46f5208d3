"""Held-out validation of a GRPO run: greedy and sampled accuracy through the run's own rollout, and with
`grpo.val_reference` the greedy accuracy through a BF16 referee of the same weights.

An FP8 run validates through its FP8 rollout, so its held-out accuracy carries the rollout's numerics (E4M3
weights, E4M3 K/V) on top of what training did to its weights; two runs of different precisions then differ in
their evaluators as well as in their weights. `validation/reference_accuracy` removes that: the same prompts,
greedy, through the native engine over the trainer's own modules with every FP8 layer in its plain linear on the
master weights (`Fp8Linear` mode "reference") and a BF16 KV cache, at every validation. A rollout that is already
that (no FP8 rollout layer, no FP8 KV) reports its own greedy accuracy again instead of running twice.
"""

from __future__ import annotations

from typing import Any

from nemo_jetrl.algorithms.grpo_setup import GrpoSetup
from nemo_jetrl.algorithms.rollout_io import (
    bootstrap_kv_scales,
    decode_responses,
    encode_prompts,
    needs_kv_bootstrap,
    step_generator,
)
from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.generation.interfaces import rollout_phase

REFERENCE_KEY = "grpo.val_reference"


def env_metrics(task: Any) -> dict[str, float]:
    """The task's environment counters since the last call (`env/parse_failures`, ...); {} for tasks without any."""
    pop = getattr(task, "pop_metrics", None)
    return {f"env/{k}": v for k, v in pop().items()} if pop is not None else {}


def validate(run: GrpoSetup, step: int) -> dict[str, float]:
    """Held-out accuracy: greedy (deterministic) and sampled at the rollout temperature; with `grpo.val_reference`
    also greedy through the BF16 referee (`reference_accuracy`)."""
    if needs_kv_bootstrap(run):  # validation before the first step: FP8 KV scales from the step's prompts
        bootstrap_kv_scales(run, step)
    problems = run.task.validation(run.cfg.grpo.max_val_samples)
    prompt_ids = encode_prompts(run.policy.tokenizer, [p.prompt for p in problems])
    answers = [p.answer for p in problems]
    metrics = {}
    with rollout_phase(run.engine) as engine:
        for name, greedy in (("accuracy", True), ("sampled_accuracy", False)):
            gen = step_generator(run.cfg.grpo.seed + 7, step, run.device)
            metrics[name] = _accuracy(run, engine.generate(prompt_ids, greedy=greedy, generator=gen), answers)
            counters = env_metrics(run.task)
            if greedy:
                metrics.update(counters)
        if run.cfg.grpo.val_reference:
            referee = reference_engine(run)
            if referee is None:  # the rollout is the referee already
                metrics["reference_accuracy"] = metrics["accuracy"]
            else:
                metrics["reference_accuracy"] = _accuracy(run, referee.generate(prompt_ids, greedy=True), answers)
                env_metrics(run.task)  # the referee's parse failures are not the run's
    return metrics


def _accuracy(run: GrpoSetup, out: Any, answers: list) -> float:
    """The fraction of a validation rollout's responses the task scores correct (reward > 0.5)."""
    rewards = run.task.score(decode_responses(run.policy.tokenizer, out), answers)
    return float((rewards > 0.5).float().mean())


def _native(engine: Any) -> Any:
    """The native engine a run's engine is or wraps (seed shards), else None (vLLM)."""
    from nemo_jetrl.generation.native.engine import NativeGenerationEngine

    inner = getattr(engine, "engine", engine)
    return inner if isinstance(inner, NativeGenerationEngine) else None


def check_reference(run: GrpoSetup) -> None:
    """Refuse `grpo.val_reference` where no BF16 referee of the trainer's weights can run (ConfigError)."""
    from nemo_jetrl.precision.rollout_layers import Fp8RolloutLinear

    native = _native(run.engine)
    if native is None:
        raise ConfigError(
            f"{REFERENCE_KEY}: true needs the native rollout engine (its referee runs the trainer's own modules); "
            "set policy.generation.backend=native or grpo.val_reference=false"
        )
    if any(isinstance(m, Fp8RolloutLinear) for m in native.model.modules()):
        raise ConfigError(
            f"{REFERENCE_KEY}: true on a rank whose rollout replica holds only FP8 weights (a sharded trainer's "
            "refit): no master weights to referee; set grpo.val_reference=false"
        )


def reference_engine(run: GrpoSetup) -> Any:
    """The run's BF16 referee engine (made once, kept on `run`), or None where the rollout is one already."""
    from nemo_jetrl.precision.linear import Fp8Linear

    if run.reference_engine is None:
        check_reference(run)
        native = _native(run.engine)
        fp8_layers = any(isinstance(m, Fp8Linear) and m.rollout_fp8 for m in native.model.modules())
        fp8_kv = native.kv_cache_dtype.itemsize == 1  # E4M3 / E5M2
        run.reference_engine = (
            run.engine.replace(linear_mode="reference", kv_cache_dtype=None) if fp8_layers or fp8_kv else False
        )
    return run.reference_engine or None
