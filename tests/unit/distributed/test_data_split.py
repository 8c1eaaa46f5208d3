"""How a global batch is cut across workers and merged back (pure functions, hand-built inputs)."""

from __future__ import annotations

import time

import pytest
import torch

from nemo_jetrl.distributed.data_split import assign_contiguous
from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.generation.seed_shards import (
    ShardedGeneration,
    merge_generation_outputs,
    seed_shards,
    shard_seed,
    split_evenly,
)
from nemo_jetrl.policy.micro_batches import fixed_micro_batches


def test_split_evenly_sizes_and_order():
    assert split_evenly(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_evenly(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert split_evenly(0, 2) == [(0, 0), (0, 0)]
    with pytest.raises(ValueError, match="parts must be >= 1"):
        split_evenly(3, 0)


def test_shard_seed_keeps_base_for_shard_zero_and_differs_otherwise():
    assert shard_seed(1234, 0) == 1234
    seeds = {shard_seed(1234, s) for s in range(1, 50)}
    assert len(seeds) == 49 and 1234 not in seeds
    assert all(0 <= s < 2**63 for s in seeds)
    assert shard_seed(1234, 3) == shard_seed(1234, 3)  # a pure function of (base, shard)
    with pytest.raises(ValueError, match="shard must be >= 0"):
        shard_seed(1, -1)


def test_seed_shards_are_contiguous_and_drop_empty():
    prompts = [[i] for i in range(5)]
    shards = seed_shards(prompts, 2, base_seed=7)
    assert [p for p, _ in shards] == [[[0], [1], [2]], [[3], [4]]]
    assert [s for _, s in shards] == [7, shard_seed(7, 1)]
    assert len(seed_shards(prompts[:1], 3, base_seed=7)) == 1


def test_micro_batches_match_single_process_cut_and_go_contiguously_to_workers():
    def spans(parts):
        return [(int(p.rows[0]), int(p.rows[-1]) + 1) for p in parts]

    parts = fixed_micro_batches(136, 64, 10)
    assert spans(parts) == [(0, 64), (64, 128), (128, 136)]
    assert all(torch.equal(p.rows, torch.arange(*s)) for p, s in zip(parts, spans(parts)))  # contiguous rows
    assert [spans(b) for b in assign_contiguous(parts, 2)] == [[(0, 64), (64, 128)], [(128, 136)]]
    assert [spans(b) for b in assign_contiguous(parts[:1], 2)] == [[(0, 64)], []]  # the second runs a dummy step


def _out(ids: list[list[int]], prompt_len: int, pad: int = 0) -> GenerationOutput:
    input_ids = torch.tensor(ids)
    attn = (input_ids != pad).long()
    resp = attn.clone()
    resp[:, :prompt_len] = 0
    return GenerationOutput(
        input_ids=input_ids,
        attention_mask=attn,
        response_mask=resp,
        generation_logprobs=-resp.float() * 0.5,
        prompt_length=prompt_len,
        response_lengths=resp.sum(-1),
        finished=torch.ones(len(ids), dtype=torch.bool),
    )


def test_merge_pads_prompts_left_and_responses_right():
    a = _out([[0, 5, 6, 7]], prompt_len=2)  # prompt [_, 5], response [6, 7]
    b = _out([[3, 4, 5, 8], [0, 4, 5, 9]], prompt_len=3)  # prompt width 3, response 1
    m = merge_generation_outputs([a, b], pad_token_id=0)
    assert m.prompt_length == 3
    assert m.input_ids.tolist() == [[0, 0, 5, 6, 7], [3, 4, 5, 8, 0], [0, 4, 5, 9, 0]]
    assert m.attention_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [0, 1, 1, 1, 0]]
    assert m.response_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]]
    assert m.generation_logprobs.tolist() == [[0, 0, 0, -0.5, -0.5], [0, 0, 0, -0.5, 0], [0, 0, 0, -0.5, 0]]
    assert m.response_lengths.tolist() == [2, 1, 1]
    # positions (cumsum(mask) - 1) of real tokens are unchanged by the extra left pad
    pos = (m.attention_mask.cumsum(-1) - 1)[0][m.attention_mask[0].bool()]
    assert pos.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="no outputs"):
        merge_generation_outputs([], 0)


class _RecordingEngine(GenerationInterface):
    """Echoes prompts; the response token is the first draw of the generator (so seeds are visible)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, *, greedy=False, generator=None):
        self.calls.append((len(prompt_ids), generator.initial_seed()))
        draw = int(torch.randint(1, 100, (1,), generator=generator))
        return _out([[*p, draw] for p in prompt_ids], prompt_len=len(prompt_ids[0]))

    def prepare_for_generation(self):
        return True

    def finish_generation(self):
        return True

    def update_weights(self, weights=None, *, kv_scales=None):
        pass

    kv_scales = None

    def rollout_timings(self):
        return {"admission": float(len(self.calls))}

    def replace(self, **changes):
        engine = _RecordingEngine()
        engine.changes = changes
        return engine


def test_sharded_generation_uses_one_generator_per_shard():
    engine = _RecordingEngine()
    gen = torch.Generator().manual_seed(99)
    prompts = [[1], [2], [3], [4], [5]]
    out = ShardedGeneration(engine, 2, pad_token_id=0).generate(prompts, generator=gen)
    assert engine.calls == [(3, 99), (2, shard_seed(99, 1))]
    first = int(torch.randint(1, 100, (1,), generator=torch.Generator().manual_seed(99)))
    second = int(torch.randint(1, 100, (1,), generator=torch.Generator().manual_seed(shard_seed(99, 1))))
    assert out.input_ids[:, 1].tolist() == [first] * 3 + [second] * 2
    # one shard is a pass-through: the caller's generator object itself
    engine.calls.clear()
    ShardedGeneration(engine, 1, pad_token_id=0).generate(prompts, generator=torch.Generator().manual_seed(5))
    assert engine.calls == [(5, 5)]
    with pytest.raises(ValueError, match="rollout_seed_shards must be >= 1"):
        ShardedGeneration(engine, 0, pad_token_id=0)


def test_sharded_generation_replace_keeps_the_sharding():
    replaced = ShardedGeneration(_RecordingEngine(), 2, pad_token_id=0).replace(kv_cache_dtype=None)
    assert isinstance(replaced, ShardedGeneration) and replaced.num_seed_shards == 2
    assert replaced.engine.changes == {"kv_cache_dtype": None}


def test_rollout_timings_pass_through_only_where_the_rollout_was_one_engine_call():
    engine = _RecordingEngine()
    one = ShardedGeneration(engine, 1, pad_token_id=0)
    one.generate([[1], [2]], generator=torch.Generator().manual_seed(1))
    assert one.rollout_timings() == {"admission": 1.0}
    two = ShardedGeneration(engine, 2, pad_token_id=0)
    two.generate([[1], [2]], generator=torch.Generator().manual_seed(1))
    assert two.rollout_timings() == {}  # the engine's would be its last shard's alone


class _TwoGroupPlan:
    """Data-parallel group 0 of two: runs the first block of shards; the gather waits `wait` s for group 1."""

    distributed = True

    def __init__(self, wait: float) -> None:
        self.wait = wait

    def share(self, pieces):
        lo, hi = split_evenly(len(pieces), 2)[0]
        return list(pieces[lo:hi]), hi - lo

    def gather(self, mine):
        time.sleep(self.wait)
        return [*mine, *mine]  # group 1's block stands in for itself: same sizes


def test_rollout_timings_on_ranks_are_the_ranks_engine_call_and_its_gather_wait():
    engine = _RecordingEngine()
    ranks = ShardedGeneration(engine, 2, pad_token_id=0, plan=_TwoGroupPlan(0.05))
    ranks.generate([[1], [2]], generator=torch.Generator().manual_seed(1))
    timings = ranks.rollout_timings()
    assert set(timings) == {"admission", "rank_gather"} and timings["admission"] == 1.0
    assert 0.05 <= timings["rank_gather"] < 5.0
    engine.calls.clear()  # two shards on this group: the engine's parts would be its last shard's alone
    four = ShardedGeneration(engine, 4, pad_token_id=0, plan=_TwoGroupPlan(0.0))
    four.generate([[1], [2], [3], [4]], generator=torch.Generator().manual_seed(1))
    assert len(engine.calls) == 2 and set(four.rollout_timings()) == {"rank_gather"}
