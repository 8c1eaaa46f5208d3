"""What the GRPO loop and the evaluator share around a rollout: prompts in, responses out, the per-step sampling
generator, and the first FP8 KV scales (before any training step has calibrated them: from a prefill of the
step's prompts through the trainer, docs/long_responses.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.generation.native.prompts import left_pad
from nemo_jetrl.policy.interfaces import TrainBatch

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.grpo_setup import GrpoSetup


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
    """FP8 KV scales for the first rollout (and after a resume): the trainer's calibration forward over this step's
    prompts, one prefill of them observing Q/K/V (no rollout); the rollout and, with train_kv_fake_quant, the trainer
    then run on these scales, and every step recalibrates them from its own sequences (prepare_refit)."""
    problems = run.task.train_batch(step, run.cfg.grpo.num_prompts_per_step)
    prompt_ids = encode_prompts(run.policy.tokenizer, [p.prompt for p in problems])
    width = max(len(p) for p in prompt_ids)
    ids, mask = left_pad(prompt_ids, width, run.policy.tokenizer.pad_token_id, torch.device("cpu"))  # [B, P] each
    zeros = torch.zeros(ids.shape)
    batch = TrainBatch(ids, mask, torch.zeros_like(mask), torch.zeros(len(ids)), zeros)  # no response tokens
    run.engine.update_weights(kv_scales=run.policy.calibrate_kv_scales(batch).kv)


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The sampling generator of `step` on `device`: a fresh stream per (seed, step), so a resumed run draws the same."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + step)
    return gen
