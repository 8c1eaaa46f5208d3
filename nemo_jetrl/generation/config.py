"""`policy.generation:` — the rollout engine's config section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from nemo_jetrl.config.section import FiniteFloat, NonNegativeInt, PositiveInt, Section
from nemo_jetrl.precision.config import Precision


class KvCacheCalibrationConfig(Section):
    percentile: Annotated[FiniteFloat, Field(gt=0, le=100)] = 99.9  # of per-micro-batch amax values
    margin: Annotated[FiniteFloat, Field(ge=1)] = 1.05  # scale = amax * margin / 448


class GenerationConfig(Section):
    """`precision: null` follows `policy.precision`; `max_new_tokens` may equal `policy.max_total_sequence_length`
    (NeMo-RL's `${policy.max_total_sequence_length}`): each row's prompt + response is capped at the total."""

    backend: Literal["native"] = "native"
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
    deterministic: bool = False  # rollout logprobs == trainer logprobs bitwise (batch-invariant path)
    cuda_graphs: bool = True  # capture the decode step on CUDA
