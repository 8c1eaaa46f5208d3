"""The permutation test of the accuracy study's report (examples/accuracy_stats.py): exact p-values worked out by
hand, relabeling within starts only, the sampled form against the exact one, and no test without a shared start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import accuracy_stats  # noqa: E402


def test_four_runs_against_four_separated_completely_give_the_smallest_p():
    t = accuracy_stats.permutation_test({"s": [1.0, 0.9, 0.8, 0.7]}, {"s": [0.1, 0.2, 0.0, 0.3]})
    assert t["diff"] == pytest.approx(0.7) and t["relabelings"] == 70 and t["exact"]
    assert t["p"] == pytest.approx(2 / 70)  # only the observed labeling and its mirror are as far from 0
    assert t["runs"] == [4, 4] and t["starts"] == 1


def test_equal_values_give_p_one_and_one_run_per_start_cannot_go_below_one_half():
    assert accuracy_stats.permutation_test({"s": [0.5, 0.5]}, {"s": [0.5, 0.5]})["p"] == 1.0
    # two starts, one run each: 4 relabelings (swap in x or not, in y or not); the two mixed ones give 0
    t = accuracy_stats.permutation_test({"x": [10.1], "y": [0.1]}, {"x": [10.0], "y": [0.0]})
    assert t["diff"] == pytest.approx(0.1) and t["relabelings"] == 4 and t["p"] == 0.5


def test_labels_are_exchanged_within_starts_only():
    """Start x is 10 higher than start y in both arms, and within each start the arm's three runs are all 0.5 above
    the other's. Within starts only the observed labeling and its mirror reach |0.5|: p = 2 / (20 * 20). Pooled as
    one start, relabelings that move x's runs from one arm to the other dwarf 0.5, and p is large."""
    a = {"x": [10.5, 10.6, 10.7], "y": [0.5, 0.6, 0.7]}
    b = {"x": [10.0, 10.1, 10.2], "y": [0.0, 0.1, 0.2]}
    t = accuracy_stats.permutation_test(a, b)
    assert t["diff"] == pytest.approx(0.5) and t["relabelings"] == 400 and t["p"] == pytest.approx(2 / 400)
    assert t["by_start"] == pytest.approx({"x": 0.5, "y": 0.5})
    pooled = accuracy_stats.permutation_test({"s": a["x"] + a["y"]}, {"s": b["x"] + b["y"]})
    assert pooled["diff"] == pytest.approx(0.5) and pooled["relabelings"] == 924 and pooled["p"] > 0.5


def test_starts_that_disagree_cancel_in_the_difference_and_show_in_by_start():
    """The arm is 0.2 ahead from start x and 0.2 behind from start y: no difference over both, p = 1."""
    t = accuracy_stats.permutation_test({"x": [0.8, 0.9], "y": [0.3, 0.4]}, {"x": [0.6, 0.7], "y": [0.5, 0.6]})
    assert t["diff"] == pytest.approx(0.0) and t["p"] == 1.0
    assert t["by_start"] == pytest.approx({"x": 0.2, "y": -0.2})


def test_the_sampled_test_agrees_with_the_exact_one(monkeypatch):
    a, b = {"s": [1.0, 0.9, 0.8, 0.7, 0.2]}, {"s": [0.1, 0.2, 0.0, 0.3, 0.9]}
    exact = accuracy_stats.permutation_test(a, b)
    monkeypatch.setattr(accuracy_stats, "MAX_EXACT", 10)
    sampled = accuracy_stats.permutation_test(a, b)
    assert exact["exact"] and not sampled["exact"] and sampled["relabelings"] == accuracy_stats.SAMPLES
    assert sampled["diff"] == exact["diff"] and sampled["p"] == pytest.approx(exact["p"], abs=0.01)
    assert accuracy_stats.permutation_test(a, b)["p"] == sampled["p"]  # a fixed seed: the same p again


def test_no_shared_start_gives_no_test():
    t = accuracy_stats.permutation_test({"x": [1.0]}, {"y": [0.0]})
    assert t["diff"] is None and t["p"] is None and t["runs"] == [0, 0] and t["starts"] == 0
