"""benchmarks/bench_mismatch.py --quick on the CPU: every preset measured against the trainer's own forward, binned
by response position, the ordering that the Jet-RL argument rests on (rollout-only FP8 worst), and the exact mode
(FP8 + FP8 KV) bitwise on-policy."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_mismatch


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    module = bench_mismatch
    out = tmp_path_factory.mktemp("bench") / "mismatch.json"
    variants = [label for label, _, mode in module.VARIANTS if mode != "exact"] + ["jetrl_kv, exact"]
    assert len(module.VARIANTS) == 12  # the other exact presets (bf16, jetrl) run in test_batch_invariant_mode.py
    argv = ["--quick", "--out", str(out), "--plot", str(out.with_suffix(".png")), "--variants", *variants]
    assert module.main(argv) == 0
    assert out.with_suffix(".png").stat().st_size > 10_000
    return {r["variant"]: r for r in json.loads(out.read_text())["results"]}


def test_every_variant_is_measured_on_every_generated_token(results):
    assert list(results) == [
        "bf16", "fp8 rollout only", "unified fp8 (jetrl)", "unified fp8 + kv (jetrl_kv)", "unified fp8 rowwise",
        "unified fp8 tensorwise", "jetrl_kv, SDPA decode", "jetrl, matched", "jetrl_kv, matched", "jetrl_kv, exact",
    ]  # fmt: skip
    for r in results.values():
        assert r["num_valid_tokens"] == 2 * 8 * 8  # 2 steps x 8 sequences x 8 generated tokens
        assert [b["positions"] for b in r["by_position"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
        assert 0.0 <= r["exact_token_fraction"] <= 1.0 and r["token_mult_prob_error"] >= 1.0


def test_rollout_only_fp8_mismatches_most(results):
    tmpe = {k: r["token_mult_prob_error"] for k, r in results.items()}
    assert tmpe["fp8 rollout only"] > max(tmpe["unified fp8 (jetrl)"], tmpe["bf16"])
    # measured 1.0 (unified: the same bits on both sides) / 1.0002 (bf16) and 1.02 (rollout-only FP8)
    assert max(tmpe["bf16"], tmpe["unified fp8 (jetrl)"]) < 1.005 < 1.01 < tmpe["fp8 rollout only"]
    assert results["fp8 rollout only"]["exact_token_fraction"] == 0.0
    exact = results["jetrl_kv, exact"]
    assert exact["exact_token_fraction"] == 1.0 and exact["token_mult_prob_error"] == 1.0 and exact["gen_kl_error"] == 0
    assert results["unified fp8 + kv (jetrl_kv)"]["exact_token_fraction"] < 1.0  # the fast path is not, at this size
    # rowwise shares jetrl's unified flow; tensorwise's activation scale spans each tensor's tokens (a decode step
    # vs the trainer's whole batch), so its rollout sits between unified and rollout-only FP8
    assert tmpe["unified fp8 rowwise"] < tmpe["fp8 rollout only"]
    assert tmpe["unified fp8 rowwise"] < tmpe["unified fp8 tensorwise"]
    # the bins partition the tokens: their mean error, weighted by tokens per bin (equal here), is the total
    for r in results.values():
        mean_bins = sum(b["token_mult_prob_error"] for b in r["by_position"]) / len(r["by_position"])
        assert mean_bins == pytest.approx(r["token_mult_prob_error"], rel=1e-6)
