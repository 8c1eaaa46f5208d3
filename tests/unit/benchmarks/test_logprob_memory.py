"""benchmarks/logprob_memory.py: the allocator-trace replay that names what is alive at the peak, and the tool's CPU
run (the estimate's logprob term for the config's settings, the batch it measures)."""

from __future__ import annotations

import json

from benchmarks import logprob_memory


def _alloc(addr: int, size: int, where: str) -> dict:
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
                       {"filename": f"/r/nemo_jetrl/{where}", "line": 7, "name": "f"}]}  # fmt: skip


def _free(addr: int, size: int, action: str = "free_completed") -> dict:
    return {"action": action, "addr": addr, "size": size}


def test_the_replay_finds_the_peak_and_the_blocks_alive_then():
    trace = [
        _alloc(1, 100, "a.py"), _alloc(2, 50, "b.py"), _free(1, 100, "free_requested"), _free(1, 100),
        _alloc(3, 300, "c.py"), _alloc(4, 20, "d.py"), _free(3, 300), _alloc(5, 10, "e.py"),
    ]  # fmt: skip
    at_peak = logprob_memory.peak_allocations({"device_traces": [trace]}, 0)
    peak, top = at_peak["peak"], at_peak["largest"]
    assert peak == 370  # blocks 2, 3, 4: freed only at `free_completed`
    assert top == [(300, "c.py:7 f"), (50, "b.py:7 f"), (20, "d.py:7 f")]  # the package's frame, largest first
    requested = [e for e in trace if e["action"] != "free_requested"]  # a trace that records requests only
    requested = [{**e, "action": "free_requested"} if e["action"] == "free_completed" else e for e in requested]
    assert logprob_memory.peak_allocations({"device_traces": [requested]}, 0)["peak"] == 370


def test_the_cpu_run_reports_the_estimate_for_the_measured_batch(tmp_path):
    out = tmp_path / "lm.json"
    result = logprob_memory.main(["--shape", "tiny-test", "--config", "examples/configs/grpo_tiny.yaml", "--rows", "2",
                                  "--seq", "64", "--out", str(out)])  # fmt: skip
    assert result["tokens"] == 128 and "pass_peak_gib" not in result  # no allocator to read on the CPU
    assert result["estimate_per_token_bytes"] > 0 and json.loads(out.read_text())["rows"] == 2
    assert result["pass"] == "logprob"


def test_the_training_pass_runs_one_step_and_reports_the_training_term(tmp_path):
    result = logprob_memory.main(["--shape", "tiny-test", "--config", "examples/configs/grpo_tiny.yaml", "--rows", "2",
                                  "--seq", "64", "--pass", "train"])  # fmt: skip
    logprob = logprob_memory.main(["--shape", "tiny-test", "--config", "examples/configs/grpo_tiny.yaml", "--rows", "2",
                                   "--seq", "64"])  # fmt: skip
    assert result["pass"] == "train" and result["tokens"] == 128 and result["steps"] == 1
    assert result["estimate_per_token_bytes"] > logprob["estimate_per_token_bytes"] > 0  # training keeps more


def test_the_peak_by_site_sums_the_blocks_and_names_the_allocation_that_reached_it():
    trace = [
        _alloc(1, 100, "a.py"), _alloc(2, 50, "b.py"), _alloc(6, 40, "b.py"), _free(1, 100),
        _alloc(3, 300, "c.py"), _alloc(4, 20, "b.py"), _free(3, 300), _alloc(5, 10, "e.py"),
    ]  # fmt: skip
    sites = logprob_memory.peak_allocations({"device_traces": [trace]}, 0)
    assert sites["peak"] == 410 and sites["reached_by"] == "b.py:7 f"  # blocks 2, 6, 3, 4: reached at block 4
    assert sites["sites"] == [(300, 1, "c.py:7 f"), (110, 3, "b.py:7 f")]
    assert sites["at"] == 5 / 7


def test_blocks_from_before_the_trace_count_where_the_pass_frees_them():
    # blocks 90 (a cache, 200 bytes) and 91 (100) were allocated before the trace; the pass frees 90 early
    held = {90: (200, "layers.*.down_proj._qweight.data"), 91: (100, "layers.*.up_proj._qweight.data")}
    trace = [_alloc(1, 150, "a.py"), _free(90, 200), _alloc(2, 120, "b.py"), _alloc(3, 60, "c.py"), _free(2, 120)]
    at_peak = logprob_memory.peak_allocations({"device_traces": [trace]}, 0, held)
    # device: +150 (150), -200 (-50), +120 (70), +60 (130): the peak is the first allocation, before the free
    assert at_peak["peak"] == 150 and at_peak["freed_before"] == 0 and at_peak["reached_by"] == "a.py:7 f"
    assert at_peak["held"] == [(200, 1, "layers.*.down_proj._qweight.data"), (100, 1, "layers.*.up_proj._qweight.data")]
    trace[3] = _alloc(3, 140, "c.py")  # now +150 -200 +120 +140 = 210 > 150: the peak comes after the free
    at_peak = logprob_memory.peak_allocations({"device_traces": [trace]}, 0, held)
    assert at_peak["peak"] == 410 and at_peak["freed_before"] == 200
    assert at_peak["held"] == [(100, 1, "layers.*.up_proj._qweight.data")]


def test_held_tensors_names_the_fp8_caches_by_layer():
    from nemo_jetrl.models.tiny import random_tiny_qwen3
    from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8, fp8_layers

    model = random_tiny_qwen3(0, num_layers=2)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    assert logprob_memory.held_tensors(model) == {}  # nothing quantized yet
    for _, layer in fp8_layers(model):
        layer.quantized_weight()
    held = logprob_memory.held_tensors(model)
    names = {name for _, name in held.values()}
    assert "model.layers.*.mlp.down_proj._qweight.data" in names
    down = model.model.layers[1].mlp.down_proj._qweight.data
    assert held[down.untyped_storage().data_ptr()] == (down.numel(), "model.layers.*.mlp.down_proj._qweight.data")


def test_the_training_pass_can_measure_a_later_step(tmp_path, monkeypatch):
    from nemo_jetrl.policy.native import NativePolicy

    calls = []
    train = NativePolicy.train
    monkeypatch.setattr(NativePolicy, "train", lambda self, *a, **k: calls.append(1) or train(self, *a, **k))
    result = logprob_memory.main(["--shape", "tiny-test", "--config", "examples/configs/grpo_tiny.yaml", "--rows", "2",
                                  "--seq", "64", "--pass", "train", "--steps", "3"])  # fmt: skip
    assert result["steps"] == 3 and len(calls) == 3


def test_zero_steps_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        logprob_memory.main(["--shape", "tiny-test", "--pass", "train", "--steps", "0"])
    assert stop.value.code == 2 and "--steps must be at least 1, got 0" in capsys.readouterr().err
