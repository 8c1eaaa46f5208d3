"""The rollout engine a validated config asks for: `policy.generation.backend` native (default) or vllm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nemo_jetrl.config.typed import typed_section
from nemo_jetrl.generation.interfaces import GenerationInterface
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.scheduler import engine_budget_kwargs
from nemo_jetrl.generation.seed_shards import ShardedGeneration
from nemo_jetrl.models.moe import is_moe

if TYPE_CHECKING:  # the section type imports pydantic: the engines import without it (the GPU box)
    from nemo_jetrl.generation.config import GenerationConfig


def stop_token_ids(gen: GenerationConfig, tokenizer: Any) -> list[int]:
    """`policy.generation.stop_token_ids`, or the tokenizer's EOS when null."""
    return list(gen.stop_token_ids) if gen.stop_token_ids is not None else [tokenizer.eos_token_id]


def engine_kwargs(
    gen: GenerationConfig, max_total_length: int, stop_ids: list[int], pad_token_id: int, compute_dtype: torch.dtype
) -> dict[str, Any]:
    """The keyword arguments every rollout engine takes from the validated `policy.generation` section and
    `policy.max_total_sequence_length` (lengths, sampling, KV)."""
    return dict(
        max_new_tokens=gen.max_new_tokens,
        max_total_length=int(max_total_length),
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        stop_token_ids=list(stop_ids),
        pad_token_id=int(pad_token_id),
        compute_dtype=compute_dtype,
        kv_cache_dtype=gen.kv_cache_dtype,
    )


def build_local_engine(
    gen: GenerationConfig, policy: Any, spec: Any, device: torch.device, *, max_total_length: int, seed: int
) -> GenerationInterface:
    """The rollout engine `gen` (the validated `policy.generation` section; a dict is refused) asks for, colocated
    with `policy` (its `rollout_model`: the trainer's own modules in one process, the refit replica on a rank of a
    sharded trainer), in the run's rollout seed shards (`ShardedGeneration`: on several ranks, each data-parallel
    group rolls out its block of them). `spec` is the run's `distributed.ClusterSpec`, of which only
    `num_seed_shards` is read (generation/ sits below distributed/); `max_total_length`:
    `policy.max_total_sequence_length`; `seed`: `grpo.seed` (vLLM's sampler)."""
    gen, tok = typed_section(gen, "GenerationConfig", "build_local_engine"), policy.tokenizer
    plan = policy.plan
    common = engine_kwargs(gen, max_total_length, stop_token_ids(gen, tok), tok.pad_token_id, policy.compute_dtype)
    if gen.backend == "vllm" and is_moe(policy.model):
        raise ValueError(
            "policy.generation.backend: vllm does not run MoE models here (its refit takes dense weights only); set "
            "policy.generation.backend=native (the native engine records each token's experts: docs/moe.md)"
        )
    if gen.backend == "vllm":
        if plan.distributed:  # refused first when the run is placed (cluster_config.multi_rank_problems)
            raise ValueError("policy.generation.backend: vllm runs in one process; several ranks roll out natively")
        from nemo_jetrl.generation.vllm_engine import VllmGenerationEngine

        if gen.max_model_len is not None:
            common["max_total_length"] = min(common["max_total_length"], gen.max_model_len)
        return VllmGenerationEngine(
            policy.model,
            tok,
            policy.recipe,
            enforce_eager=not gen.cuda_graphs,
            seed=int(seed),
            max_num_seqs=gen.max_num_seqs,
            kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
            gpu_memory_utilization=gen.gpu_memory_utilization,
            weights_version=lambda: policy.step,  # optimizer steps taken (restored with a checkpoint)
            **common,
        )
    engine = NativeGenerationEngine(
        policy.rollout_model,
        cuda_graphs=gen.cuda_graphs,
        device=device,
        **common,
        **engine_budget_kwargs(gen),
    )
    if spec.num_seed_shards > 1 or plan.distributed:  # a sharded run's seed shards (or one process running them)
        return ShardedGeneration(engine, spec.num_seed_shards, tok.pad_token_id, plan)
    return engine
