"""bench_dynamic_batching.py --quick on the CPU: the three variants run on one policy; the dynamic one computes fewer
padding positions in fewer micro-batches over the same real tokens, the packed one fewer still."""

from __future__ import annotations

import importlib
import json

import torch


def test_quick_run_reports_occupancy_and_micro_batches(tmp_path):
    module = importlib.import_module("benchmarks.bench_dynamic_batching")
    out = tmp_path / "dyn.json"
    assert module.main(["--quick", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    rows = {r["variant"]: r for r in payload["results"]}
    assert set(rows) == {"fixed", "dynamic", "packed"} and len(rows["fixed"]["times_s"]) == 2
    assert {r["preset"] for r in payload["results"]} == {"bf16"}
    lengths = payload["lengths"]
    real = len(lengths) * 8 + sum(lengths)  # prompts of 8 + responses
    width = 8 + 48
    assert rows["fixed"]["occupancy"] == real / (len(lengths) * width) and rows["fixed"]["micro_batches"] == 4
    assert rows["dynamic"]["occupancy"] > 2 * rows["fixed"]["occupancy"]
    assert rows["dynamic"]["micro_batches"] < rows["fixed"]["micro_batches"]
    # packed: the budget's real tokens per row, each row rounded up to 8 slots
    assert rows["packed"]["occupancy"] > rows["dynamic"]["occupancy"] and rows["packed"]["occupancy"] > 0.9
    assert rows["packed"]["micro_batches"] == -(-real // (4 * width))


def test_unknown_variants_and_captured_packing_without_cuda_are_refused(capsys):
    module = importlib.import_module("benchmarks.bench_dynamic_batching")
    cases = [("packed,graphs", "unknown ['graphs']")]
    if not torch.cuda.is_available():
        cases.append(("packed+graphs", "needs a CUDA device"))
    for variants, message in cases:
        try:
            module.main(["--quick", "--variants", variants])
        except SystemExit as exit_:
            assert exit_.code == 2
        else:
            raise AssertionError(f"--variants {variants} was accepted")
        assert message in capsys.readouterr().err
