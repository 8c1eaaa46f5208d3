"""What the GRPO loop and the evaluator share around a rollout: prompts in, responses out, the per-step sampling
generator, and the first FP8 KV scales (before any training step has calibrated them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nemo_jetrl.generation.interfaces import GenerationOutput, rollout_phase
from nemo_jetrl.policy.interfaces import TrainBatch

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.grpo import GrpoSetup


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """The token ids of each prompt."""
    return [tokenizer(p)["input_ids"] for p in prompts]


def decode_responses(tokenizer, out: GenerationOutput) -> list[str]:
    """Decoded text of each row's generated tokens (stop token and padding dropped)."""
    texts = []
    for ids, mask in zip(out.input_ids, out.response_mask):
        texts.append(tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True))
    return texts


def needs_kv_bootstrap(run: GrpoSetup) -> bool:
    """FP8 KV without scales yet; scales the policy holds (e.g. from a checkpoint) go to the engine here."""
    if not run.policy.recipe.kv_fp8:
        return False
    if run.policy.kv_scales is not None and run.engine.kv_scales is None:
        run.engine.update_weights(kv_scales=run.policy.kv_scales.kv)
    return run.policy.kv_scales is None


def bootstrap_kv_scales(run: GrpoSetup, step: int) -> None:
    """FP8 KV scales for the first rollout (and after a resume): one rollout of this step's prompts with a
    high-precision cache, observed by the trainer's calibration forward; later steps recalibrate (prepare_refit)."""
    g = run.cfg["grpo"]
    problems = run.task.train_batch(step, int(g["num_prompts_per_step"]))
    prompt_ids = encode_prompts(run.policy.tokenizer, [p.prompt for p in problems])
    with rollout_phase(run.engine.replace(kv_cache_dtype=None)) as engine:
        out = engine.generate(prompt_ids, generator=step_generator(g["seed"] + 13, step, run.device))
    batch = TrainBatch(
        input_ids=out.input_ids.cpu(),
        attention_mask=out.attention_mask.cpu(),
        response_mask=out.response_mask.cpu(),
        advantages=torch.zeros(len(out)),
        generation_logprobs=out.generation_logprobs.float().cpu(),
    )
    run.engine.update_weights(kv_scales=run.policy.calibrate_kv_scales(batch).kv)


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The sampling generator of `step` on `device`: a fresh stream per (seed, step), so a resumed run draws the same."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + step)
    return gen
