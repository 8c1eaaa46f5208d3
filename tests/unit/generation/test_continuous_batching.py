"""Continuous batching on CPU: the slot scheduler, the KV budget, equal tokens with and without it, prefix sharing."""

import pytest
import torch

from nemo_jetrl.generation.native.continuous import ContinuousRollout
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.scheduler import SlotScheduler, engine_kv_budget, plan_kv_budget

from .test_engine import check_layout

PAD, MAX_NEW, STOPS = 0, 24, [3, 5]
# fp32 on CPU: MKL picks GEMM kernels by batch size, so a row's logits move in the last bits with the batch around
# it (measured max 1.05e-5 over these prompts); bf16 compute is bitwise batch-invariant here.
FP32_BATCH_TOL = 5e-5


def engine(model, **kw) -> NativeGenerationEngine:
    return NativeGenerationEngine(model, max_new_tokens=MAX_NEW, stop_token_ids=STOPS, pad_token_id=PAD, **kw)


@pytest.fixture(scope="module")
def queue() -> list[list[int]]:
    """10 prompts of lengths 1..7, the last three repeated (a GRPO group of 3)."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 32, (n,), generator=gen).tolist() for n in (3, 7, 1, 5, 6, 2, 4)]
    return prompts + [prompts[-1]] * 3


def test_scheduler_admits_in_order_and_refills_freed_slots():
    sched = SlotScheduler(num_requests=5, num_slots=2)
    assert sched.admit() == [(0, 0), (1, 1)]
    assert sched.admit() == []  # no free slot
    assert sched.release([1]) == [1]
    assert sched.admit() == [(1, 2)]
    assert sched.release([0, 1]) == [0, 2]
    assert sched.admit() == [(0, 3), (1, 4)]
    assert not sched.done and sched.num_live == 2
    sched.release([0, 1])
    assert sched.done and sched.admissions == 3 and sched.peak_live == 2
    with pytest.raises(ValueError, match="slot 0 is already free"):
        sched.release([0])


def test_kv_budget_counts_whole_slots_and_names_a_budget_too_small_for_one_sequence():
    plan = plan_kv_budget(num_sequences=100, slot_tokens=10, bytes_per_token=64, budget_bytes=64 * 10 * 7 + 639)
    assert (plan.num_slots, plan.nbytes) == (7, 7 * 640)
    assert plan_kv_budget(num_sequences=100, slot_tokens=10, bytes_per_token=64, max_num_seqs=3).num_slots == 3
    assert plan_kv_budget(num_sequences=2, slot_tokens=10, bytes_per_token=64, budget_bytes=10**9).num_slots == 2
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 leaves .* one sequence of 10 tokens needs"):
        plan_kv_budget(
            num_sequences=4,
            slot_tokens=10,
            bytes_per_token=64,
            budget_bytes=639,
            budget_source="gpu_memory_utilization=0.5",
        )


def test_engine_budget_from_bytes_and_fp8_admits_twice_the_sequences(tiny_model, queue):
    caps = [MAX_NEW] * len(queue)
    slot_tokens = max(len(p) for p in queue) + MAX_NEW
    bf16_token = KVCache.token_bytes(tiny_model, torch.bfloat16)
    cfg = tiny_model.config
    assert bf16_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    budget = 3 * slot_tokens * bf16_token + 1
    bf16 = engine_kv_budget(
        engine(tiny_model, kv_cache_dtype=torch.bfloat16, kv_cache_memory_bytes=budget), queue, caps
    )
    fp8 = engine_kv_budget(engine(tiny_model, kv_cache_dtype="fp8", kv_cache_memory_bytes=budget), queue, caps)
    assert (bf16.num_slots, bf16.slot_tokens) == (3, slot_tokens)
    assert fp8.num_slots == 6


@pytest.mark.parametrize("greedy", [True, False])
def test_tokens_equal_with_and_without_continuous_batching(tiny_model, queue, greedy):
    whole = engine(tiny_model).generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    cb_engine = engine(tiny_model, max_num_seqs=3)
    queued = cb_engine.generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    stats = cb_engine.last_rollout_stats
    assert stats is not None and stats.num_slots == 3 and stats.peak_live == 3 and stats.admissions > 3
    assert torch.equal(queued.input_ids, whole.input_ids)
    assert torch.equal(queued.attention_mask, whole.attention_mask)
    assert torch.equal(queued.finished, whole.finished)
    assert 0 < (queued.generation_logprobs - whole.generation_logprobs).abs().max() < FP32_BATCH_TOL
    assert stats.generated_tokens == int(whole.response_lengths.sum())
    check_layout(queued, queue, STOPS)


def test_a_sequence_does_not_depend_on_its_batch_in_bf16(tiny_model, queue):
    outs = [
        engine(tiny_model, compute_dtype=torch.bfloat16, max_num_seqs=k, continuous_batching=True).generate(
            queue, generator=torch.Generator().manual_seed(9)
        )
        for k in (1, 4, len(queue))
    ]
    for out in outs[1:]:
        assert torch.equal(out.input_ids, outs[0].input_ids)
        assert torch.equal(out.generation_logprobs, outs[0].generation_logprobs)


def test_fp8_kv_cache_under_continuous_batching_equals_the_static_batch(tiny_model, queue):
    scales = (torch.full((2,), 0.02), torch.full((2,), 0.03))
    whole, queued = engine(tiny_model, kv_cache_dtype="fp8"), engine(tiny_model, kv_cache_dtype="fp8", max_num_seqs=4)
    for eng in (whole, queued):
        eng.update_weights(kv_scales=scales)
    a = whole.generate(queue, greedy=True)
    b = queued.generate(queue, greedy=True)
    assert torch.equal(a.input_ids, b.input_ids)
    # one cached K/V element whose e4m3 rounding flips under the other batch's fp32 GEMM rounding moves later
    # logprobs by more than FP32_BATCH_TOL: 2e-4 measured on an Intel Xeon host (0 on others); tokens stay equal
    assert (a.generation_logprobs - b.generation_logprobs).abs().max() < 1e-3


def test_group_prompt_is_prefilled_once_and_its_kv_equals_its_own_prefill(tiny_model, queue):
    eng = engine(tiny_model, max_num_seqs=len(queue))
    caps = [MAX_NEW] * len(queue)
    rollout = ContinuousRollout(eng, queue, engine_kv_budget(eng, queue, caps), caps)
    rollout.hook = None
    with torch.no_grad():
        rollout._admit()
        group_len = len(queue[-1])
        # 10 prompts, 7 distinct: the group's 3 rows cost one prefill
        assert rollout.stats.prefill_tokens == sum(len(p) for p in queue[:7])
        assert rollout.stats.prefill_tokens_shared == 3 * group_len
        alone = eng._new_cache(1, group_len)
        ids, mask = eng._left_pad([queue[-1]], group_len)
        logits = eng._prefill(alone, None, ids, mask)
    for slot in (6, 7, 8, 9):
        # fp32 GEMMs of 10 rows vs 1 row: 1.1e-5 measured on an Intel Xeon host (|v| up to ~9), 0 elsewhere
        assert torch.allclose(rollout.cache.k[:, slot, :, :group_len], alone.k[:, 0], atol=1e-5, rtol=1e-5)
        assert torch.allclose(rollout.cache.v[:, slot, :, :group_len], alone.v[:, 0], atol=1e-5, rtol=1e-5)
        assert torch.equal(rollout.cache.k[:, slot], rollout.cache.k[:, 6])  # members hold copies of one prefill
        assert torch.allclose(rollout.logits[slot], logits[0], atol=1e-5, rtol=1e-5)
        assert rollout.mask[slot].tolist() == [1] * group_len + [0] * (rollout.mask.shape[1] - group_len)


def test_a_budget_below_one_sequence_is_an_error_before_any_work(tiny_model, queue):
    eng = engine(tiny_model, kv_cache_memory_bytes=100)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes leaves .* one sequence of 31 tokens needs"):
        eng.generate(queue)
    assert eng.last_rollout_stats is None
