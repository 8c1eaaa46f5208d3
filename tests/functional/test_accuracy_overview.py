"""The long study's one-table overview (examples/accuracy_overview.py) and the stage-name settings it reads
(accuracy_cli.variant_settings), from synthetic metrics through the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_cli  # noqa: E402
import accuracy_long_report as long_report  # noqa: E402
import accuracy_overview as overview  # noqa: E402


@pytest.mark.parametrize(
    "name, expected",
    [("2k-rep7_T0.7", ("2k", 0.7, 2e-5)), ("1k-lr_lr0.0001", ("1k", 1.0, 1e-4)), ("4k", ("4k", 1.0, 2e-5)),
     ("2k-temp_T1.3_lr5e-05", ("2k", 1.3, 5e-5)), ("quick-Tx_lrfast", ("quick", 1.0, 2e-5))],
)  # fmt: skip
def test_a_stage_name_gives_its_length_temperature_and_lr(name, expected):
    got = accuracy_cli.variant_settings(name)
    assert (got["length"], got["temperature"], got["lr"]) == expected


def _write(path: Path, val: list[float], ref: list[float] | None, tmpe: float, entropy: float) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, v in enumerate(val):
        row = {"step": 5 * i, "validation/accuracy": v}
        if ref is not None:
            row["validation/reference_accuracy"] = ref[i]
        rows.append(row)
    rows += [{"step": s, "train/reward_mean": 0.5, "train/token_mult_prob_error": tmpe, "train/approx_entropy": entropy}
             for s in range(1, 11)]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_overview_has_a_row_per_stage_with_its_tests_and_mismatch(tmp_path):
    """2k-a_T0.7: a start with two repeats, FP8 rollout only 0.1 below BF16 after the start in its own validation
    (p 2/6: two of six relabelings as low) and 0.05 below in the referee at every validation; 1k: one run, no
    referee; `1k-both` a combined view, left out."""
    root = tmp_path / "root"
    for run in ("seed0", "seed0r1"):
        arms = root / "2k-a_T0.7" / run / "arms"
        _write(arms / "bf16", [0.3, 0.6, 0.6], [0.3, 0.6, 0.6], 1.00001, 4e-4)
        _write(arms / "fp8_rollout_only", [0.3, 0.5, 0.5], [0.3, 0.55, 0.55], 1.0002, 6e-4)
    _write(root / "1k" / "seed1" / "arms" / "bf16", [0.4, 0.5], None, 1.00002, 2e-3)
    _write(root / "1k" / "seed1" / "arms" / "fp8_rollout_only", [0.4, 0.45], None, 1.001, 3e-3)
    stages = [long_report.stage_summary(p) for p in long_report.find_stages(root)]
    text = "\n".join(overview.overview_lines(stages + [dict(stages[0], stage="1k-both")], skip={"1k-both"}))
    assert (
        "| 2k-a_T0.7 | 2k | 0.7 | 2e-05 | 1 | 2 | 2 | 10 | -0.100 (p 0.33) | -0.050* (p 0.33) | 2.0e-04 | 6.0e-04 |"
        in text
    )
    assert "| 1k | 1k | 1 | 2e-05 | 1 | 1 | 2 | 10 | -0.050 (p 1.00) | - | 1.0e-03 | 3.0e-03 |" in text
    assert "1k-both" not in text
    summary = long_report.write_long_report(root, combine=None)
    assert long_report.format_long_tables(summary).startswith("### every stage at a glance")
