"""benchmarks/bench_rollout_queue.py --quick on the CPU: every case and variant generates exactly the drawn lengths,
an FP8 KV pool holds twice the blocks and admits twice the sequences of a BF16 one under one byte budget, the length draws have their means."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_rollout_queue


@pytest.fixture(scope="module")
def module():
    return bench_rollout_queue


def test_quick_run_generates_the_drawn_lengths_and_fp8_kv_admits_twice_the_sequences(module, tmp_path):
    out = tmp_path / "queue.json"
    assert module.main(["--quick", "--kv-budget-gb", "0.0001", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {(r["case"], r["variant"]) for r in rows} == {
        (case, v)
        for case in ("cb fixed", "cb lognormal", "static lognormal", "budget lognormal")
        for v in module.VARIANTS
    }
    drawn = module.draw_lengths("lognormal", 12, 6, 16, 1.0, seed=2)
    for r in rows:
        assert r["tokens"] == (12 * 6 if r["case"] == "cb fixed" else sum(drawn)), r
        assert r["x_bf16"] == pytest.approx(
            r["tokens_per_s"]
            / next(x["tokens_per_s"] for x in rows if x["case"] == r["case"] and x["variant"] == "bf16")
        )
    budget = {r["variant"]: r for r in rows if r["case"] == "budget lognormal"}
    # 100 KB: 3 BF16 blocks of 16 tokens (one is the trash block), 6 FP8 ones
    assert budget["fp8+kv"]["pool"] == 2 * budget["bf16"]["pool"] == 2 * budget["fp8"]["pool"] == 6
    assert budget["fp8+kv"]["peak_live"] >= 2 * budget["bf16"]["peak_live"] > 0  # FP8 KV admits twice the sequences
    assert all(r["preempt"] == 0 for r in rows if r["case"].startswith("cb"))  # rows sized at their caps
    assert all(r["slots"] == 4 for r in rows if r["case"].startswith(("cb", "static")))
    cb = [r for r in rows if r["case"] == "cb lognormal"]
    assert all(0 < r["occupancy"] < 1 for r in cb)  # long-tailed lengths leave rows idle between CPU syncs
    for r in rows:  # the engine's schedule is the best first-come-first-served one (schedule_bound.py)
        assert (r["decode_steps"] == r["fcfs_steps"]) if r["case"].startswith("cb") else ("fcfs_steps" not in r), r


@pytest.mark.parametrize("dist", ["fixed", "lognormal", "geometric"])
def test_length_draws_have_the_requested_mean_and_cap(module, dist):
    lengths = module.draw_lengths(dist, 20_000, 100, 10_000, 1.0, seed=0)
    assert min(lengths) >= 1 and max(lengths) <= 10_000
    assert sum(lengths) / len(lengths) == pytest.approx(100, rel=0.03)
    capped = module.draw_lengths(dist, 1000, 100, 50, 1.0, seed=0)
    assert max(capped) == 50
