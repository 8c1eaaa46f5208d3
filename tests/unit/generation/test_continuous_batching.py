"""Continuous batching on CPU: the block pool and scheduler, the KV budget, equal tokens with and without continuous
batching, paging and preemption, prefix sharing on blocks."""

import time

import pytest
import torch

from nemo_jetrl.generation.native.block_scheduler import BlockPool, BlockScheduler, Prefix
from nemo_jetrl.generation.native.continuous import ContinuousRollout
from nemo_jetrl.generation.native.cuda_graph import bucket_for, bucket_sizes
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.generation.native.paged_kv_cache import gather_pages
from nemo_jetrl.generation.native.prompts import left_pad
from nemo_jetrl.generation.native.scheduler import engine_kv_budget, plan_kv_budget

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


def test_block_pool_counts_references_and_keeps_the_trash_block():
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert a == [1, 2] and pool.num_free == 1 and pool.num_used == 2
    pool.share([1])
    pool.release([1, 2])
    assert pool.refs[1] == 1 and pool.num_free == 2  # block 1 is still held by the sharer
    pool.release([1])
    assert pool.num_free == 3 and 0 not in pool.allocate(3)
    with pytest.raises(ValueError, match="4 blocks asked, 0 free"):
        pool.allocate(4)
    with pytest.raises(ValueError, match="block 2 is already free"):
        BlockPool(4).release([2])


def test_scheduler_admits_shares_grows_preempts_and_refills_under_a_tiny_pool():
    # 5 usable blocks of 4 tokens, 3 rows, 2 tokens of lookahead; requests 0 and 2 share a prompt of 5 tokens
    sched = BlockScheduler(
        BlockPool(6), 4, max_rows=3, lookahead=2, prompt_keys=["a", "b", "a", "c"], prompt_lens=[5, 3, 5, 6],
        max_tokens=[12, 6, 12, 9],
    )  # fmt: skip
    admitted = sched.admit()
    # 0: 7 tokens -> 2 blocks; 1: min(5, 6) -> 2 blocks; 2 shares 0's full prompt block and takes one of its own
    assert [(s.request, s.blocks) for s in admitted] == [(0, [1, 2]), (1, [3, 4]), (2, [1, 5])]
    assert admitted[2].prefix == Prefix(owner=0, full=[1], partial=2) and admitted[0].prefix is None
    assert sched.pool.refs[1] == 2 and sched.pool.num_free == 0 and list(sched.waiting) == [3]
    # rows hold 7, 5, 7 tokens: 0 and 2 need a third block each, the pool has none -> the latest (2) is preempted
    assert sched.grow([7, 5, 7]) == [2]
    assert [(s.request, s.blocks) for s in sched.rows] == [(0, [1, 2, 5]), (1, [3, 4])]
    assert list(sched.waiting) == [2, 3] and sched.resume_tokens == {2: 7}
    sched.finish([1])  # request 1 ended: blocks 3, 4 come back
    assert sched.grow([9]) == [] and sched.rows[0].blocks == [1, 2, 5]  # 9 + 2 tokens fit its 3 blocks
    assert sched.admit() == []  # 2 needs 3 blocks (7 tokens + 2), 2 are free; 3 waits behind it (FIFO)
    sched.finish([0])
    assert "a" not in sched.prefixes  # its owner left: the prompt is no longer shareable
    resumed, fresh = sched.admit()
    assert (resumed.request, resumed.prefill_tokens, len(resumed.blocks), resumed.prefix) == (2, 7, 3, None)
    assert (fresh.request, len(fresh.blocks)) == (3, 2) and sched.pool.num_free == 0 and sched.done is False
    assert sched.events == [
        ("admit", 0, 2), ("admit", 1, 4), ("admit", 2, 5), ("preempt", 2, 4), ("finish", 1, 3), ("finish", 0, 0),
        ("admit", 2, 3), ("admit", 3, 5),
    ]  # fmt: skip
    assert (sched.admissions, sched.preemptions, sched.peak_live, sched.peak_blocks) == (2, 1, 3, 5)


def test_a_later_group_member_shares_the_running_owners_prompt_blocks():
    sched = BlockScheduler(
        BlockPool(10), 4, max_rows=1, lookahead=1, prompt_keys=["g", "g", "g"], prompt_lens=[9] * 3,
        max_tokens=[20] * 3,
    )  # fmt: skip
    (owner,) = sched.admit()
    assert owner.blocks == [1, 2, 3] and sched.prefixes["g"] == Prefix(0, [1, 2], 3)
    sched.max_rows = 3
    member, other = sched.admit()  # a later round: 2 full blocks by reference, 1 own (the partial block's copy)
    assert member.blocks == [1, 2, 4] and other.blocks == [1, 2, 5] and member.prefix.owner == 0
    assert sched.pool.refs[1:6] == [3, 3, 1, 1, 1]
    sched.finish([0, 1, 2])
    assert sched.pool.num_used == 0 and sched.prefixes == {}


def test_kv_budget_counts_blocks_and_names_a_budget_too_small_for_one_sequence():
    plan = plan_kv_budget(seq_tokens=[10] * 100, bytes_per_token=64, block_size=4, budget_bytes=64 * 4 * 20 + 255)
    assert (plan.num_blocks, plan.max_blocks_per_seq, plan.num_rows, plan.whole_batch) == (20, 3, 19, False)
    assert plan.nbytes == 20 * 4 * 64
    capped = plan_kv_budget(seq_tokens=[10] * 100, bytes_per_token=64, block_size=4, max_num_seqs=3)
    assert (capped.num_rows, capped.num_blocks) == (3, 1 + 3 * 3)  # every row fits at its cap: no preemption
    whole = plan_kv_budget(seq_tokens=[10, 3], bytes_per_token=64, block_size=4, budget_bytes=10**9)
    assert whole.whole_batch and whole.num_blocks == 1 + 3 + 1  # never more than the whole batch holds
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 leaves .* one sequence of 10 tokens needs"):
        plan_kv_budget(
            seq_tokens=[10] * 4, bytes_per_token=64, block_size=4, budget_bytes=64 * 4 * 4 - 1,
            budget_source="gpu_memory_utilization=0.5",
        )  # fmt: skip


def test_engine_budget_from_bytes_and_fp8_holds_twice_the_blocks(tiny_model, queue):
    caps = [MAX_NEW] * len(queue)
    bf16_token = KVCache.token_bytes(tiny_model, torch.bfloat16)
    cfg = tiny_model.config
    assert bf16_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    budget = 9 * 4 * bf16_token + 1
    kw = dict(kv_cache_memory_bytes=budget, kv_block_size=4)
    bf16 = engine_kv_budget(engine(tiny_model, kv_cache_dtype=torch.bfloat16, **kw), queue, caps)
    fp8 = engine_kv_budget(engine(tiny_model, kv_cache_dtype="fp8", **kw), queue, caps)
    assert (bf16.num_blocks, bf16.block_size, bf16.max_blocks_per_seq) == (9, 4, 8)
    assert fp8.num_blocks == 18 and not fp8.whole_batch


@pytest.mark.parametrize("greedy", [True, False])
def test_tokens_equal_with_and_without_continuous_batching(tiny_model, queue, greedy):
    whole = engine(tiny_model).generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    cb_engine = engine(tiny_model, max_num_seqs=3)
    queued = cb_engine.generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    stats = cb_engine.last_rollout_stats
    assert stats is not None and stats.num_rows == 3 and stats.peak_live == 3 and stats.admissions > 3
    assert stats.prefill_tokens_shared > 0  # the group of 4 spans admission rounds and still shares its prompt
    assert torch.equal(queued.input_ids, whole.input_ids)
    assert torch.equal(queued.attention_mask, whole.attention_mask)
    assert torch.equal(queued.finished, whole.finished)
    assert 0 < (queued.generation_logprobs - whole.generation_logprobs).abs().max() < FP32_BATCH_TOL
    assert stats.generated_tokens == int(whole.response_lengths.sum())
    check_layout(queued, queue, STOPS)


def test_stats_count_the_keys_each_decode_step_read_and_split_the_rollout_time(tiny_model, queue):
    """A sequence of prompt P and T tokens feeds its first T - 1 tokens back, the j-th at column P + j - 1, so its
    decode steps read P + 1, ..., P + T - 1 keys; admissions (prefills) and decode split the rollout's time."""
    eng = engine(tiny_model, max_num_seqs=3)
    out = eng.generate(queue, greedy=True)
    stats = eng.last_rollout_stats
    assert stats.preemptions == 0
    lengths = out.response_lengths.tolist()
    expected = sum((t - 1) * len(p) + t * (t - 1) // 2 for p, t in zip(queue, lengths))
    assert stats.key_reads == expected > 0
    assert 0 < stats.admission_s < stats.rollout_s and stats.capture_s == 0.0  # no CUDA graphs on CPU
    timings = eng.rollout_timings()
    assert timings == {"cuda_graph_capture": 0.0, "admission": stats.admission_s, "decode": timings["decode"]}
    assert timings["decode"] == pytest.approx(stats.rollout_s - stats.admission_s) and timings["decode"] > 0


def test_one_static_batch_splits_its_rollout_time_into_prefill_and_decode(tiny_model, queue):
    """The whole-batch path reports its parts too: prefill and decode add up to the rollout, inside the call's
    wall time; a later continuous rollout replaces them with its own parts."""
    eng = engine(tiny_model)
    begin = time.perf_counter()
    eng.generate(queue, greedy=True)
    wall = time.perf_counter() - begin
    timings = eng.rollout_timings()
    assert eng.last_rollout_stats is None and set(timings) == {"prefill", "cuda_graph_capture", "decode"}
    assert timings["prefill"] > 0 and timings["decode"] > 0 and timings["cuda_graph_capture"] == 0.0
    assert timings["prefill"] + timings["decode"] < wall
    queued = engine(tiny_model, max_num_seqs=3)
    queued.generate(queue, greedy=True)
    assert set(queued.rollout_timings()) == {"cuda_graph_capture", "admission", "decode"}


def test_rows_are_compacted_into_smaller_buckets_as_the_queue_drains(tiny_model, queue):
    assert bucket_sizes(20) == [8, 16, 20] and bucket_sizes(8) == [8] and bucket_for(9, [8, 16, 20]) == 16
    batch = queue * 3  # 30 sequences over 20 rows
    whole = engine(tiny_model).generate(batch, greedy=True)
    eng = engine(tiny_model, max_num_seqs=20)
    out = eng.generate(batch, greedy=True)
    steps = eng.last_rollout_stats.bucket_steps
    assert set(steps) == {8, 16, 20} and sum(steps.values()) == eng.last_rollout_stats.decode_steps, steps
    assert torch.equal(out.input_ids, whole.input_ids)


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


@pytest.mark.parametrize("greedy", [True, False])
def test_preempted_sequences_recompute_and_give_the_unpreempted_tokens(tiny_model, queue, greedy):
    whole = engine(tiny_model).generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    token = KVCache.token_bytes(tiny_model, torch.float32)
    tight = engine(tiny_model, kv_block_size=4, kv_cache_memory_bytes=9 * 4 * token)  # 8 usable blocks of 4
    out = tight.generate(queue, greedy=greedy, generator=torch.Generator().manual_seed(3))
    stats = tight.last_rollout_stats
    assert stats.num_blocks == 9 and stats.peak_blocks_used == 8
    assert stats.preemptions > 0 and stats.prefill_tokens_recomputed > 0
    assert torch.equal(out.input_ids, whole.input_ids)
    assert torch.equal(out.finished, whole.finished)
    # a resumed sequence's keys come from a prefill instead of the decode steps: fp32 last bits
    assert (out.generation_logprobs - whole.generation_logprobs).abs().max() < FP32_BATCH_TOL


def test_group_prompt_blocks_are_shared_and_their_kv_equals_an_unshared_prefill(tiny_model, queue):
    eng = engine(tiny_model, max_num_seqs=len(queue), kv_block_size=3)
    caps = [MAX_NEW] * len(queue)
    rollout = ContinuousRollout(eng, queue, engine_kv_budget(eng, queue, caps), caps)
    rollout.plan = eng.forward_plan  # no attention hook
    with torch.no_grad():
        rollout._sync()
        group_len = len(queue[-1])  # 4 tokens: one full block of 3, one partial
        # 10 prompts, 7 distinct: the group's 3 extra rows cost no prefill
        assert rollout.stats.prefill_tokens == sum(len(p) for p in queue[:7])
        assert rollout.stats.prefill_tokens_shared == 3 * group_len
        alone = eng._new_cache(1, group_len)
        ids, mask = left_pad([queue[-1]], group_len, eng.pad_token_id, eng.device)
        logits = eng._prefill(alone, eng.forward_plan, ids, mask)
    seqs = rollout.scheduler.rows
    members = [r for r, s in enumerate(seqs) if s.request >= 6]
    assert len(members) == 4 and len({seqs[r].blocks[0] for r in members}) == 1  # one shared full block
    assert len({seqs[r].blocks[1] for r in members}) == 4  # each member's own copy of the partial block
    assert rollout.scheduler.pool.refs[seqs[members[0]].blocks[0]] == 4
    table = rollout.cache.table
    for layer in range(tiny_model.config.num_hidden_layers):
        keys = gather_pages(rollout.cache.k[layer], table)[:, :, :group_len]  # [rows, H_kv, 4, D]
        values = gather_pages(rollout.cache.v[layer], table)[:, :, :group_len]
        for row in members:
            # fp32 GEMMs of 7 rows vs 1 row: 1.1e-5 measured on an Intel Xeon host (|v| up to ~9), 0 elsewhere
            assert torch.allclose(keys[row], alone.k[layer, 0], atol=1e-5, rtol=1e-5)
            assert torch.allclose(values[row], alone.v[layer, 0], atol=1e-5, rtol=1e-5)
            assert torch.equal(keys[row], keys[members[0]])  # members hold one prefill
    for row in members:
        assert torch.allclose(rollout.logits[row], logits[0], atol=1e-5, rtol=1e-5)


def test_a_budget_below_one_sequence_is_an_error_before_any_work(tiny_model, queue):
    eng = engine(tiny_model, kv_cache_memory_bytes=100)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes leaves .* one sequence of 31 tokens needs"):
        eng.generate(queue)
    assert eng.last_rollout_stats is None
