"""benchmarks/schedule_bound.py: the fewest decode steps a first-come-first-served schedule takes, checked by hand,
against the documented GPU rollout, and against the native engine itself (which takes exactly that many on CPU)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import draw_lengths
from benchmarks.schedule_bound import fcfs_decode_steps, main, occupancy_bound
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.tiny import random_tiny_qwen3


def test_the_list_schedule_by_hand():
    # rows 2: [5] and [3] start at 0; 1 goes on the row free at 3 (ends 4), 9 on the row free at 4 (ends 13)
    assert fcfs_decode_steps([5, 3, 1, 9], 2) == 13
    # refills every 4: 1 starts at 4 (ends 5), 9 at 8 (ends 17), and the end is seen at the next sync, 20
    assert fcfs_decode_steps([5, 3, 1, 9], 2, refill_every=4) == 20
    assert fcfs_decode_steps([4] * 6, 3) == 8 and occupancy_bound([4] * 6, 3) == 1.0
    assert occupancy_bound([5, 3, 1, 9], 2) == pytest.approx(18 / 26)
    with pytest.raises(ValueError, match=">= 1"):
        fcfs_decode_steps([1], 0)


def test_the_documented_h100_queue_rollout_ran_the_best_fcfs_schedule():
    """docs/performance_history.md: 256 lognormal lengths (mean 256, max 1,024) at 64 rows took 1,472 decode steps on the
    GPU (host sync every 16 steps); 1,431 with a refill at every step; occupancy bound 0.68."""
    lengths = draw_lengths("lognormal", 256, 256, 1024, 1.0, seed=2)
    assert fcfs_decode_steps(lengths, 64, 16) == 1472 and fcfs_decode_steps(lengths, 64) == 1431
    assert occupancy_bound(lengths, 64) == pytest.approx(0.683, abs=1e-3)


@pytest.mark.parametrize("rows,sync_every", [(3, 1), (4, 2), (4, 5), (2, 3)])
def test_the_engine_takes_exactly_the_fewest_steps_any_fcfs_schedule_can(rows, sync_every):
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 32, (n,), generator=gen).tolist() for n in (3, 7, 1, 5, 6, 2, 4, 4, 4, 4)]
    lengths = [5, 3, 9, 1, 12, 2, 6, 6, 2, 14]
    engine = NativeGenerationEngine(random_tiny_qwen3(0), max_new_tokens=16, stop_token_ids=[], pad_token_id=0,
                                    max_num_seqs=rows, sync_every=sync_every)  # fmt: skip
    out = engine.generate(prompts, greedy=True, max_new_tokens=lengths)
    assert out.response_lengths.tolist() == lengths and engine.last_rollout_stats.preemptions == 0
    assert engine.last_rollout_stats.decode_steps == fcfs_decode_steps(lengths, rows, sync_every)


def test_the_bound_table_of_the_issue_16_workloads(capsys):
    assert main(["--queue", "512", "--concurrency", "128", "--length-dist", "lognormal"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[:3] == ["lognormal", "512", "128"] and float(row[4]) == pytest.approx(0.56, abs=0.01)
