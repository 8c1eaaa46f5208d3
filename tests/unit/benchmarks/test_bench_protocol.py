"""The benchmarks' timing protocol (benchmarks/common.alternating_timings): variants alternate round by round,
warm-up steps are run but not timed, and the summary is the median and min-max of the timed steps."""

from __future__ import annotations

import importlib
import time

import pytest
import torch


def _load(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def test_variants_alternate_and_warmup_is_not_timed():
    common = _load("common")
    calls = []
    sleeps = {"a": [0.01, 0.02, 0.03, 0.04, 0.05, 0.06], "b": [0.0] * 6}  # b: far below a, even on a loaded CPU

    def variant(name):
        def step():
            time.sleep(sleeps[name][sum(c == name for c in calls)])
            calls.append(name)

        return step

    out = common.alternating_timings({"a": variant("a"), "b": variant("b")}, 1, 5, torch.device("cpu"))
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    a = out["a"]
    assert len(a["times_s"]) == 5 and a["min_s"] <= a["median_s"] <= a["max_s"]
    assert a["min_s"] >= 0.02 and a["median_s"] >= 0.04  # the 10 ms warm-up step is left out; median of 20..60 ms
    assert out["b"]["max_s"] < 0.02


def test_train_step_benchmark_reports_median_and_range_per_variant(tmp_path, capsys):
    bench = _load("bench_train_step")
    assert bench.main(["--quick", "--out", str(tmp_path / "t.json")]) == 0
    table = capsys.readouterr().out
    assert "variants alternating" in table and "min-max s" in table
    import json

    results = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [r["variant"] for r in results] == ["bf16", "fp8"]
    for r in results:
        assert len(r["times_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["state_gb"] == pytest.approx(results[0]["state_gb"])  # same weights + AdamW state, both BF16
        assert r["state_gb"] > 0
    assert results[0]["speedup_vs_bf16"] == 1.0


def test_train_step_benchmark_runs_every_fp8_recipe_side_by_side(tmp_path):
    bench = _load("bench_train_step")
    argv = ["--quick", "--fp8-recipe", "rowwise", "tensorwise", "--wgrad-tiles", "--out", str(tmp_path / "t.json")]
    assert bench.main(argv) == 0
    import json

    payload = json.loads((tmp_path / "t.json").read_text())
    variants = ["bf16", "fp8_rowwise", "fp8_tensorwise", "fp8 wgrad 128x128"]
    assert [r["variant"] for r in payload["results"]] == variants
    assert all(len(r["times_s"]) == 2 and r["median_s"] > 0 for r in payload["results"])


def test_checkpointed_train_step_benchmark_adds_the_cached_weights_ablation(tmp_path, monkeypatch):
    """--activation-checkpointing: the trainers checkpoint, the FP8 one with transient weights, and the ablation
    'fp8 cached weights' keeps its cache (the only difference between the two FP8 variants)."""
    bench = _load("bench_train_step")
    seen = {}
    step = bench.NativePolicy.train

    def record(self, *args, **kwargs):
        transient = frozenset(m.transient_weight for m in self.model.modules() if isinstance(m, bench.Fp8Linear))
        seen.setdefault(self.recipe.train, []).append((self.kernels["activation_checkpointing"], transient))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(bench.NativePolicy, "train", record)
    assert bench.main(["--quick", "--activation-checkpointing", "--out", str(tmp_path / "t.json")]) == 0
    import json

    results = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [r["variant"] for r in results] == ["bf16", "fp8", "fp8 cached weights"]
    assert set(seen["bf16"]) == {(True, frozenset())}
    assert set(seen["fp8"]) == {(True, frozenset({False})), (True, frozenset({True}))}  # one transient, one cached


def test_one_resident_variant_at_a_time_alternates_rounds_and_adds_up_timed_steps(tmp_path, monkeypatch):
    bench = _load("bench_train_step")
    built = []
    make = bench.NativePolicy.__init__

    def record(self, cfg, recipe, *args, **kwargs):
        built.append(recipe.train)
        make(self, cfg, recipe, *args, **kwargs)

    monkeypatch.setattr(bench.NativePolicy, "__init__", record)
    argv = ["--quick", "--rounds", "3", "--out", str(tmp_path / "t.json")]
    assert bench.main(argv) == 0
    import json

    results = json.loads((tmp_path / "t.json").read_text())["results"]
    assert built == ["bf16", "fp8", "fp8", "bf16", "bf16", "fp8"]  # one policy per visit, order alternating
    for r in results:  # --quick: 1 warm-up + 2 timed steps per visit
        assert len(r["times_s"]) == 6 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["state_gb"] > 0
    assert results[1]["fp8_cache_gb"] > 0 and results[0]["fp8_cache_gb"] == 0


def test_grpo_step_benchmark_alternates_and_train_forward_skips_the_logprob_pass(tmp_path):
    bench = _load("bench_grpo_step")
    out = tmp_path / "g.json"
    assert bench.main(["--quick", "--variants", "fp8+kv", "fp8+kv train_forward", "--out", str(out)]) == 0
    import json

    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    fused, separate = results["fp8+kv train_forward"], results["fp8+kv"]
    assert fused["logprobs"] == 0.0 < separate["logprobs"]
    for r in results.values():
        assert r["min_s"] <= r["median_s"] <= r["max_s"]
        assert 1.0 <= r["token_mult_prob_error"] < 1.5  # prev_logprobs filled in both modes (0 would read exp|gen|)


def test_rollout_benchmark_times_every_variant_repeatedly_and_derives_the_decode_step(tmp_path):
    bench = _load("bench_rollout")
    assert bench.main(["--quick", "--out", str(tmp_path / "r.json")]) == 0
    import json

    payload = json.loads((tmp_path / "r.json").read_text())
    results = payload["results"]
    assert [r["variant"] for r in results] == ["bf16", "fp8", "fp8+kv"]
    args = payload["args"]
    for r in results:
        assert len(r["total_times_s"]) == len(r["prefill_times_s"]) == args["repeats"] == 2
        assert r["total_s"] == pytest.approx(sorted(r["total_times_s"])[0] / 2 + sorted(r["total_times_s"])[1] / 2)
        assert r["decode_step_ms"] == pytest.approx(1e3 * (r["total_s"] - r["prefill_s"]) / (args["gen_len"] - 1))
        assert r["output_tokens_per_s"] == pytest.approx(args["batch"] * args["gen_len"] / r["total_s"])
        assert r["speedup_vs_bf16"] == pytest.approx(results[0]["total_s"] / r["total_s"])
    # FP8 weights: e4m3 bytes + fp32 scales < half of bf16's; FP8 KV halves the cache bytes read
    assert results[1]["bytes_per_step_gb"] < results[0]["bytes_per_step_gb"]
    assert results[2]["bytes_per_step_gb"] < results[1]["bytes_per_step_gb"]


def test_rounds_alternate_the_variant_order():
    common = _load("common")
    rounds = list(common.alternating_rounds(["a", "b", "c"], 3))
    assert rounds == [(0, ["a", "b", "c"]), (1, ["c", "b", "a"]), (2, ["a", "b", "c"])]


def test_cold_graph_timings_alternate_and_give_us_per_call(monkeypatch):
    """`alternating_cold_times` (bench_quantizers / bench_sampler / bench_transpose): each round times every
    variant's whole call list, the order alternating (A, B, then B, A), in us (time_in_graph's ms x 1e3)."""
    from nemo_jetrl.precision.kernels import device

    common = _load("common")
    seen = []

    def fake_time_in_graph(calls):
        seen.append(calls[0]())
        return 0.001 * len(calls)

    monkeypatch.setattr(device, "time_in_graph", fake_time_in_graph)
    variants = {"a": [lambda: "a"] * 2, "b": [lambda: "b"] * 3}
    times = common.alternating_cold_times(variants, 3)
    assert seen == ["a", "b", "b", "a", "a", "b"]
    assert times == {"a": [pytest.approx(2.0)] * 3, "b": [pytest.approx(3.0)] * 3}
    # the result row's fields the three benchmarks build from one variant's figures
    assert common.cold_time_fields([3.0, 1.25, 2.0]) == {"us": 2.0, "min_max_us": "1.2-3.0"}


def test_exact_rollout_benchmark_times_each_mode_against_the_fast_path(tmp_path):
    import json

    bench = _load("bench_exact_rollout")
    out = tmp_path / "e.json"
    assert bench.main(["--quick", "--shape", "qwen3-1.7b", "--layers", "0", "--presets", "jetrl", "--modes",
                       "attention", "--out", str(out)]) == 0  # fmt: skip
    payload = json.loads(out.read_text())
    names = [r["variant"] for r in payload["results"]]
    assert names == ["jetrl fast", "jetrl fast prefill", "jetrl attention", "jetrl attention prefill"]
    for r in payload["results"]:
        assert len(r["times_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        base = payload["results"][names.index("jetrl fast" + (" prefill" if "prefill" in r["variant"] else ""))]
        assert r["exact_over_fast"] == pytest.approx(r["median_s"] / base["median_s"])
    with pytest.raises(SystemExit):  # a shape it does not know
        bench.main(["--quick", "--shape", "qwen3-9b"])
