"""Policy entropy against rollout mismatch over the long study's runs (examples/accuracy_entropy.py): the points,
the power-law fit, the table and mismatch_entropy.png, from synthetic metrics and through the whole report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_entropy as entropy  # noqa: E402
import accuracy_long_plots as long_plots  # noqa: E402
import accuracy_long_report as long_report  # noqa: E402

# per run: (policy entropy, token_mult_prob_error - 1 of FP8 rollout only); BF16's mismatch is a tenth of it
RUNS = {"1k": [(1e-2, 4e-3), (4e-3, 6.4e-4)], "2k-rep": [(1e-3, 4e-5), (5e-4, 1e-5)], "4k-cur": [(2e-3, 1.6e-4)]}


def _write(path: Path, entropy_value: float, excess: float, exact: float) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "validation/accuracy": 0.5}]
    rows += [{"step": step, "train/reward_mean": 0.5, "train/approx_entropy": entropy_value,
              "train/token_mult_prob_error": 1 + excess, "train/exact_token_fraction": exact}
             for step in range(1, 6)]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def root(tmp_path):
    """Three stages whose FP8-rollout-only runs follow excess = 40 * entropy^2 exactly, BF16's 4 * entropy^2."""
    root = tmp_path / "root"
    for stage, runs in RUNS.items():
        for k, (ent, excess) in enumerate(runs):
            run = root / stage / f"seed{k}" / "arms"
            _write(run / "fp8_rollout_only", ent, excess, 0.8)
            _write(run / "bf16", ent, excess / 10, 0.95)
    return root


def test_the_fit_recovers_the_power_law_and_the_table_averages_each_stage(root):
    stages = [long_report.stage_summary(p) for p in long_report.find_stages(root)]
    points = entropy.entropy_points(stages)
    assert len(points) == 10 and {p["length"] for p in points} == {"1k", "2k", "4k"}
    fits = entropy.entropy_fit(points)
    assert fits["fp8_rollout_only"]["runs"] == 5
    assert fits["fp8_rollout_only"]["slope"] == pytest.approx(2.0, abs=1e-9)
    assert 10 ** fits["fp8_rollout_only"]["intercept"] == pytest.approx(40.0, rel=1e-9)
    assert fits["fp8_rollout_only"]["r"] == pytest.approx(1.0, abs=1e-12)
    assert 10 ** fits["bf16"]["intercept"] == pytest.approx(4.0, rel=1e-9)
    assert entropy.entropy_fit(points, "inexact") == {}  # every run of an arm at one exact fraction: no spread
    text = "\n".join(entropy.entropy_lines(points))
    assert "FP8 rollout only: token_mult_prob_error - 1 ~ entropy^2.00 over 5 runs (log-log r = 1.00)" in text
    assert "| 2k-rep | 2 | 7.50e-04 | 7.50e-04 | 2.50e-05 | 0.200 |" in text  # the two runs' means
    # a combined view of other stages' runs is skipped, so no run counts twice
    assert len(entropy.entropy_points(stages, skip={"1k"})) == 6


def test_too_few_runs_or_one_entropy_give_no_line():
    one = [{"arm": "fp8", "entropy": 1e-3, "tmpe_excess": 1e-4, "stage": "1k", "length": "1k", "inexact": 0.1}]
    assert entropy.entropy_fit(one * 2) == {}  # fewer than MIN_FIT_RUNS
    assert entropy.entropy_fit(one * 3) == {}  # three runs at one entropy: no slope
    spread = [dict(one[0], entropy=e, tmpe_excess=v) for e, v in ((1e-3, 1e-4), (1e-2, 1e-3), (1e-1, 1e-2))]
    assert entropy.entropy_fit(spread)["fp8"]["slope"] == pytest.approx(1.0)


def test_the_report_writes_the_plot_and_the_section(root, tmp_path):
    summary = long_report.write_long_report(root, assets=tmp_path / "assets")
    assert len(summary["entropy_points"]) == 10
    png = (tmp_path / "assets" / "mismatch_entropy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    text = long_report.format_long_tables(summary)
    assert "### policy entropy and rollout mismatch" in text and "| 4k-cur | 1 |" in text
    assert long_plots.LENGTH_MARKERS.keys() >= {p["length"] for p in summary["entropy_points"]}
