"""The forward plan: `decoder_forward` takes the plan and the call's inputs (at most 6 parameters), both frozen,
built per side, the exact parts read off the model; the caches offer what the Protocol names."""

import dataclasses
import inspect

import pytest
import torch

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.paged_kv_cache import PagedKVCache
from nemo_jetrl.models.batch_invariant import ExactParts, enable_batch_invariant
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask
from nemo_jetrl.models.forward_plan import DecoderCache, ForwardInputs, ForwardPlan
from nemo_jetrl.models.tiny import random_tiny_qwen3


def test_decoder_forward_takes_at_most_six_parameters():
    params = list(inspect.signature(decoder_forward).parameters)
    assert len(params) <= 6, params
    assert params == ["model", "input_ids", "position_ids", "attention_mask", "plan", "inputs"]


def test_the_plan_and_the_inputs_are_frozen():
    plan = ForwardPlan.trainer(random_tiny_qwen3(), torch.bfloat16, fused_train=True, activation_checkpointing=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fused = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        ForwardInputs().cache_start = 3
    hook = lambda i, q, k, v: (q, k, v)  # noqa: E731
    hooked = plan.with_hook(hook)
    assert (hooked.attn_hook, plan.attn_hook) == (hook, None)  # a new plan; the side's own stays as built
    assert dataclasses.replace(hooked, attn_hook=None) == plan
    assert (plan.compute_dtype, plan.fused, plan.fused_train, plan.causal_attention) == (torch.bfloat16, 0, 1, 0)
    assert ForwardPlan.rollout(random_tiny_qwen3(), None, fused=True) == ForwardPlan(fused=True)


def test_the_rollout_engine_builds_its_plan_once():
    model = random_tiny_qwen3()
    engine = NativeGenerationEngine(model, max_new_tokens=2, stop_token_ids=[], pad_token_id=0)
    assert engine.forward_plan == ForwardPlan.rollout(model, None, fused=False)  # CPU: eager glue, masked attention


def test_the_plan_reaches_the_forward():
    model = random_tiny_qwen3()
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    seen = []
    with torch.no_grad():
        base = decoder_forward(model, ids, position_ids_from_mask(mask), mask)
        hooked = decoder_forward(
            model,
            ids,
            position_ids_from_mask(mask),
            mask,
            ForwardPlan(attn_hook=lambda i, q, k, v: seen.append(i) or (q, k, v)),
        )
    assert seen == [0, 1] and torch.equal(base, hooked)  # the plan's hook ran once per layer; identity: same bits


def test_the_caches_offer_what_decoder_forward_calls():
    calls = [name for name in vars(DecoderCache) if not name.startswith("_") and callable(vars(DecoderCache)[name])]
    assert sorted(calls) == ["decode_attention", "update", "uses_fused_decode"]
    model = random_tiny_qwen3()
    for cache in (KVCache.for_model(model, 1, 8, dtype=torch.float32), PagedKVCache.for_model(model, 4, 4, 1, 2)):
        assert isinstance(cache.max_seq_len, int)
        assert all(callable(getattr(cache, name, None)) for name in calls if name != "update" or not cache.is_paged)


def test_a_side_reads_the_models_exact_parts_once_and_the_forward_refuses_a_plan_that_differs():
    model = random_tiny_qwen3()
    before = ForwardPlan.trainer(model, None, fused_train=False)
    enable_batch_invariant(model, ExactParts.only("attention", "logsumexp"))
    after = ForwardPlan.trainer(model, None, fused_train=False)
    assert before.exact == ExactParts.none() and after.exact == ExactParts.only("attention", "logsumexp")
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad(), pytest.raises(ValueError, match="build the plan for the model"):
        decoder_forward(model, ids, position_ids_from_mask(mask), mask, before)
    with torch.no_grad():
        assert torch.isfinite(decoder_forward(model, ids, position_ids_from_mask(mask), mask, after)).all()
