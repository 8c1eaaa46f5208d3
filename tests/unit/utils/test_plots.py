"""plots: PNGs from a hand-built metrics.jsonl, skipped figures, comparison, smoothing and parsing helpers."""

import json
import math
import struct

import numpy as np
import pytest

from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl
from nemo_jetrl.utils.plots import ema_smooth, plot_comparison, plot_run, split_timing_names

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    return len(data), width, height


def _write_run(path, steps=12, keys="all"):
    lines = []
    for s in range(1, steps + 1):
        train = {"step": s, "train/reward_mean": "nan" if s == 5 else 0.1 + 0.05 * s}
        if keys == "all":
            train.update(
                {
                    "train/token_mult_prob_error": 1.0 + 0.01 * (s % 3),
                    "train/gen_kl_error": -1e-4 if s == 3 else 1e-3 * s,
                    "train/policy_kl_error": 1e-3,
                    "train/js_divergence_error": "inf" if s == 4 else 2e-4,
                    "sampling_importance_ratio": 1.0 + 1e-3 * (-1) ** s,
                }
            )
            lines.append(
                json.dumps(
                    {
                        "step": s,
                        "timing/generation": 0.1,
                        "timing/train": 0.3,
                        "timing/train/optimizer": 0.05,
                        "timing/total_step_time": 0.41,
                    }
                )
            )
        lines.append(json.dumps(train))
        if s % 4 == 0:
            lines.append(json.dumps({"step": s, "validation/accuracy": 0.2 * s / 4}))
    path.write_text("\n".join(lines) + '\n{"step": 13, "train/rew')  # a killed writer's half line
    return path


def test_plot_run_writes_three_pngs(tmp_path):
    metrics = _write_run(tmp_path / "metrics.jsonl")
    paths = plot_run(metrics, tmp_path / "plots")
    assert [p.name for p in paths] == ["reward_accuracy.png", "mismatch.png", "timing.png"]
    for path in paths:
        nbytes, width, height = _png_size(path)
        assert nbytes > 10_000, path.name
        assert 500 <= width <= 2500 and 300 <= height <= 2000, (path.name, width, height)


def test_plot_run_skips_figures_without_keys(tmp_path):
    metrics = _write_run(tmp_path / "metrics.jsonl", keys="reward")
    assert [p.name for p in plot_run(metrics, tmp_path / "plots")] == ["reward_accuracy.png"]
    assert not (tmp_path / "plots" / "mismatch.png").exists()
    assert not (tmp_path / "plots" / "timing.png").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"step": 1, "something_else": 1.0}\n')
    assert plot_run(empty, tmp_path / "plots2") == []


def test_plot_run_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics file not found"):
        plot_run(tmp_path / "nope.jsonl", tmp_path)
    metrics = _write_run(tmp_path / "metrics.jsonl", keys="reward")
    with pytest.raises(ValueError, match="smoothing"):
        plot_run(metrics, tmp_path, smoothing=1.0)


def test_plot_comparison(tmp_path):
    runs = {
        "bf16": _write_run(tmp_path / "a.jsonl"),
        "fp8": _write_run(tmp_path / "b.jsonl", keys="reward"),
    }
    out = plot_comparison(runs, tmp_path / "cmp" / "comparison.png")
    nbytes, width, height = _png_size(out)
    assert nbytes > 10_000 and width > height > 300
    with pytest.raises(ValueError, match="none of the keys"):
        plot_comparison(runs, tmp_path / "x.png", keys=["absent/key"])
    with pytest.raises(ValueError, match="at least one run"):
        plot_comparison({}, tmp_path / "x.png")


def test_read_metrics_jsonl_decodes_non_finite_and_sorts(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"step": 2, "a": "nan", "b": null, "c": "inf", "d": "text"}\n'
        "not json\n"
        '{"step": 1, "a": 1.5, "c": "-inf"}\n'
        '{"a": 3.0}\n'  # no step: skipped
    )
    series = read_metrics_jsonl(path)
    assert sorted(series) == ["a", "b", "c"]
    steps, values = series["a"]
    assert steps.tolist() == [1, 2] and values[0] == 1.5 and math.isnan(values[1])
    assert math.isnan(series["b"][1][0])
    assert series["c"][1].tolist() == [-math.inf, math.inf]


def test_ema_smooth_exact_values_and_nan_gaps():
    out = ema_smooth(np.array([1.0, 2.0, np.nan, 3.0]), weight=0.5)
    # debiased EMA: 1, (0.25+1)/0.75, gap, (0.625+1.5)/0.875
    np.testing.assert_allclose(out[[0, 1, 3]], [1.0, 5.0 / 3.0, 2.125 / 0.875], rtol=1e-12)
    assert math.isnan(out[2])
    np.testing.assert_array_equal(ema_smooth(np.array([4.0, 5.0]), weight=0.0), [4.0, 5.0])


def test_split_timing_names_never_double_counts():
    stacked, nested, totals = split_timing_names(
        ["generation", "train", "train/optimizer", "train/optimizer/step", "sync/a", "total_step_time"]
    )
    assert stacked == ["generation", "train", "sync/a"]
    assert nested == ["train/optimizer", "train/optimizer/step"]
    assert totals == ["total_step_time"]


def test_mismatch_by_position_at_16k_positions_is_averaged_and_plotted(tmp_path):
    """grpo.mismatch_position_bin=1024 over 16K-token responses: 16 bins per step, their mean over the steps after
    the first, one line per run on the position plot."""
    from nemo_jetrl.utils.metrics_jsonl import position_curve
    from nemo_jetrl.utils.plots import plot_mismatch_position

    runs = {}
    for label, slope in (("bf16", 1e-4), ("fp8_kv", 1e-3)):
        lines = [json.dumps({"step": s, **{f"train/mismatch_pos/{b * 1024:05d}": 1.0 + slope * b * s
                                           for b in range(16)}}) for s in range(1, 4)]  # fmt: skip
        (tmp_path / f"{label}.jsonl").write_text("\n".join(lines) + "\n")
        runs[label] = read_metrics_jsonl(tmp_path / f"{label}.jsonl")
    curve = position_curve(runs["fp8_kv"], skip=1)  # steps 2 and 3
    assert list(curve) == [b * 1024 for b in range(16)]
    assert curve[15360] == pytest.approx(1.0 + 1e-3 * 15 * 2.5) and curve[0] == 1.0
    path = plot_mismatch_position(runs, tmp_path / "mismatch_position.png", skip=1)
    assert _png_size(path)[0] > 10_000
    assert plot_mismatch_position({"none": {}}, tmp_path / "none.png") is None
