"""The exact mode under continuous batching on CPU (twins): with a KV budget that preempts and with GRPO groups
sharing prompt blocks, the rollout's tokens and logprobs equal the unbudgeted exact run's and the trainer's forward
logprobs bitwise, for BF16, unified FP8 and FP8 + KV; matched kernels run on the paged pool too."""

import pytest
import torch

from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.models.batch_invariant import enable_batch_invariant, match_kernels
from nemo_jetrl.models.scoring import sequence_logprobs
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.kv import QKVCalibrator, make_attn_hook

BF16 = torch.bfloat16
STOPS = [3, 5]


@pytest.fixture(scope="module")
def queue() -> list[list[int]]:
    """10 prompts of lengths 1..7, the last three repeated (a GRPO group of 4)."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 32, (n,), generator=gen).tolist() for n in (3, 7, 1, 5, 6, 2, 4)]
    return prompts + [prompts[-1]] * 3


def exact_model(preset: str, queue: list[list[int]]):
    """The tiny model in the exact mode under `preset`; the trainer's attn hook and KV scales (FP8 KV) or None."""
    model = random_tiny_qwen3(0)
    recipe = PrecisionRecipe.preset(preset)
    if recipe.any_fp8:
        convert_to_fp8(model, recipe)
    enable_batch_invariant(model)
    if not recipe.kv_fp8:
        return model, recipe, None, None
    calib = QKVCalibrator(model.config.num_hidden_layers)
    ids = torch.tensor([p[:3] for p in queue if len(p) >= 3])
    with torch.no_grad():
        sequence_logprobs(model, ids, torch.ones_like(ids), compute_dtype=BF16, attn_hook=calib)
    scales = calib.scales()
    return model, recipe, make_attn_hook(None, scales), scales.kv


def rollout(model, recipe, kv_scales, queue, **budget):
    eng = NativeGenerationEngine(
        model, max_new_tokens=24, stop_token_ids=STOPS, pad_token_id=0, compute_dtype=BF16,
        kv_cache_dtype=recipe.kv_cache_dtype, **budget,
    )  # fmt: skip
    if kv_scales is not None:
        eng.update_weights(kv_scales=kv_scales)
    return eng.generate(queue, generator=torch.Generator().manual_seed(3)), eng.last_rollout_stats


@pytest.mark.parametrize("preset", ["bf16", "jetrl", "jetrl_kv"])
def test_exact_mode_with_a_preempting_budget_is_bitwise_the_trainer_and_the_unbudgeted_run(preset, queue):
    model, recipe, hook, kv_scales = exact_model(preset, queue)
    whole, none = rollout(model, recipe, kv_scales, queue)
    assert none is None  # no budget: the one-batch path
    token = KVCache.token_bytes(model, torch.float8_e4m3fn if recipe.kv_fp8 else BF16)
    tight, stats = rollout(model, recipe, kv_scales, queue, kv_block_size=4, kv_cache_memory_bytes=9 * 4 * token)
    assert stats.num_blocks == 9 and stats.preemptions > 0 and stats.prefill_tokens_recomputed > 0
    grouped, shared = rollout(model, recipe, kv_scales, queue, max_num_seqs=3)
    assert shared.num_rows == 3 and shared.prefill_tokens_shared > 0  # a later group member shares the prompt
    mask = whole.response_mask.bool()
    assert int(mask.sum()) > 100
    for out in (tight, grouped):
        assert torch.equal(out.input_ids, whole.input_ids)
        assert torch.equal(out.attention_mask, whole.attention_mask)
        assert torch.equal(out.generation_logprobs, whole.generation_logprobs)
    with torch.no_grad():
        trainer = torch.cat(
            [
                sequence_logprobs(model, tight.input_ids[i : i + 4], tight.attention_mask[i : i + 4], compute_dtype=BF16,
                                  attn_hook=hook)
                for i in range(0, len(tight), 4)
            ]
        )  # fmt: skip
    exact = trainer[mask] == tight.generation_logprobs[mask]
    assert float(exact.float().mean()) == 1.0  # exact_token_fraction


def test_matched_kernels_run_on_the_paged_pool(queue, monkeypatch):
    """Matched kernels (attention and log-sum-exp exact, the linears the fast path's): the budgeted rollout's decode
    steps take the paged batch-invariant attention. BF16 linears, batch-invariant on this CPU, keep the unbudgeted
    run's bits through preemption (the emulated FP8 GEMMs round in FP32 by batch size here: not bitwise)."""
    from nemo_jetrl.generation.native.paged_kv_cache import PagedKVCache

    calls = []
    real = PagedKVCache.exact_decode_attention
    monkeypatch.setattr(PagedKVCache, "exact_decode_attention", lambda self, *a: calls.append(1) or real(self, *a))
    model = random_tiny_qwen3(0)
    match_kernels(model, torch.device("cpu"))
    recipe = PrecisionRecipe.preset("bf16")
    whole, _ = rollout(model, recipe, None, queue)
    assert not calls  # the one-batch path
    token = KVCache.token_bytes(model, BF16)
    tight, stats = rollout(model, recipe, None, queue, kv_block_size=4, kv_cache_memory_bytes=9 * 4 * token)
    assert stats.preemptions > 0 and len(calls) == stats.decode_steps * model.config.num_hidden_layers
    assert torch.equal(tight.input_ids, whole.input_ids)
    assert torch.equal(tight.generation_logprobs, whole.generation_logprobs)
