"""Native rollout engine: `decoder_forward` + static KV cache (optionally FP8) + device sampling."""

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache, resolve_kv_cache_dtype
from nemo_jetrl.generation.native.sampler import SamplingParams, filter_logits, sample, token_logprobs

__all__ = [
    "KVCache",
    "NativeGenerationEngine",
    "SamplingParams",
    "filter_logits",
    "resolve_kv_cache_dtype",
    "sample",
    "token_logprobs",
]
