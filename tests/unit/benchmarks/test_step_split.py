"""benchmarks/step_split.py: per-layer / per-step parts from two depths, the step at full depth and the FP8 ceiling,
checked on hand-made profiles whose answers are known."""

from __future__ import annotations

import pytest

from benchmarks import step_split


def _profile(per_layer: dict, per_step: dict, layers: int) -> dict:
    return {f: per_layer.get(f, 0.0) * layers + per_step.get(f, 0.0) for f in {*per_layer, *per_step}}


BF16_LAYER = {"bf16 gemm": 24.0, "attention": 4.0, "glue": 2.0, "copy/cat": 0.5}
BF16_STEP = {"bf16 gemm": 70.0, "optimizer": 5.0}
FP8_LAYER = {"fp8 gemm": 16.0, "quantize": 4.0, "attention": 4.0, "glue": 2.0, "copy/cat": 1.5}
FP8_STEP = {"bf16 gemm": 70.0, "optimizer": 5.0, "quantize": 1.0}


def _profiles():
    return {
        depth: {"bf16": _profile(BF16_LAYER, BF16_STEP, depth), "fp8": _profile(FP8_LAYER, FP8_STEP, depth)}
        for depth in (8, 4)
    }


def test_split_recovers_the_per_layer_and_per_step_parts():
    parts = step_split.split(_profile(FP8_LAYER, FP8_STEP, 4), 4, _profile(FP8_LAYER, FP8_STEP, 8), 8)
    assert parts["fp8 gemm"] == pytest.approx((16.0, 0.0))
    assert parts["quantize"] == pytest.approx((4.0, 1.0))
    assert parts["bf16 gemm"] == pytest.approx((0.0, 70.0))
    assert step_split.at_depth(parts, 36)["quantize"] == pytest.approx(145.0)


def test_report_projects_the_step_the_linears_and_the_ceiling():
    _, record = step_split.report(_profiles(), 36)
    bf16, fp8 = record["variants"]["bf16"], record["variants"]["fp8"]
    assert bf16["step_ms"] == pytest.approx(36 * 30.5 + 75.0)
    assert fp8["step_ms"] == pytest.approx(36 * 27.5 + 76.0)
    assert fp8["x_bf16"] == pytest.approx((36 * 30.5 + 75.0) / (36 * 27.5 + 76.0))
    # linears: BF16 24 ms against FP8 16 + 4 (quantize) + 1 (copies beyond BF16's 0.5)
    assert fp8["linears_ms_per_layer"] == pytest.approx(21.0)
    assert fp8["linears_x_bf16"] == pytest.approx(24.0 / 21.0)
    # ceiling: GEMMs 24 / 2 per layer, no quantizers, BF16's own copies; lm_head, attention, glue, optimizer as is
    ceiling = 36 * (12.0 + 4.0 + 2.0 + 0.5) + 75.0
    assert fp8["ceiling_ms"] == pytest.approx(ceiling)
    assert fp8["ceiling_x_bf16"] == pytest.approx((36 * 30.5 + 75.0) / ceiling)


def test_report_refuses_one_depth_twice_and_a_missing_baseline():
    with pytest.raises(ValueError, match="a < b"):
        step_split.split({}, 8, {}, 8)
    profiles = {d: {"fp8": _profile(FP8_LAYER, FP8_STEP, d)} for d in (4, 8)}
    with pytest.raises(ValueError, match="'bf16' variant"):
        step_split.report(profiles, 36)


def test_profile_variants_are_presets_with_recipe_fields():
    from benchmarks import profile_train_step

    recipe = profile_train_step.recipe_from_spec("jetrl:wgrad_x_blocks=128x128+cache_dgrad_weight=true")
    assert (recipe.granularity, recipe.wgrad_x_blocks, recipe.cache_dgrad_weight) == ("blockwise", "128x128", True)
    assert profile_train_step.recipe_from_spec("tensorwise").granularity == "tensorwise"
    with pytest.raises(ValueError, match="key=value"):
        profile_train_step.recipe_from_spec("jetrl:cache_dgrad_weight")


def test_a_saved_split_is_drawn_and_a_one_depth_profile_is_refused(tmp_path, capsys):
    import json

    _, record = step_split.report(_profiles(), 36)
    saved = tmp_path / "split.json"
    saved.write_text(json.dumps({"device": "test", "split": record}))
    assert step_split.main([str(saved), "--plot", str(tmp_path / "split.png")]) == 0
    assert (tmp_path / "split.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_depth = tmp_path / "one.json"
    one_depth.write_text(json.dumps({"device": "test", "depths": {}}))
    with pytest.raises(SystemExit):
        step_split.main([str(one_depth), "--plot", str(tmp_path / "x.png")])
    assert "no per-layer split" in capsys.readouterr().err
