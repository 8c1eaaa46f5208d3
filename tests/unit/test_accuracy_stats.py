"""The permutation test of the accuracy study's report (examples/accuracy_stats.py): exact p-values worked out by
hand, relabeling within starts only, the sampled form against the exact one, no test without a shared start, and
the interval of shifts the test does not reject (worked out by hand, and against the test run on shifted runs)."""

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


def test_the_interval_of_four_runs_against_four_is_the_one_worked_out_by_hand():
    """a - d against b, a = 1.0..0.7, b = 0.3..0.0 (difference 0.7 - d): the test rejects (2 of 70 relabelings, the
    observed one and its mirror) until the nearest swap is as far from 0. Swapping a's 0.7 - d with b's 0.3 gives
    0.5 - d / 2, as far as 0.7 - d at d = 0.4; swapping a's 1.0 - d with b's 0.0 gives 0.2 - d / 2, as far at
    d = 1.0. So the 95% interval is [0.4, 1.0]."""
    t = accuracy_stats.permutation_test({"s": [1.0, 0.9, 0.8, 0.7]}, {"s": [0.1, 0.2, 0.0, 0.3]})
    assert t["interval"] == pytest.approx([0.4, 1.0], abs=1e-6)
    moved = accuracy_stats.permutation_test({"s": [1.25, 1.15, 1.05, 0.95]}, {"s": [0.1, 0.2, 0.0, 0.3]})
    assert moved["interval"] == pytest.approx([0.65, 1.25], abs=1e-6)  # the arm 0.25 higher: the interval too


def test_the_intervals_ends_are_where_the_test_on_shifted_runs_turns(monkeypatch):
    """Two starts, sampled relabelings (17,640 exist): just inside each end the test of the shifted runs keeps
    p >= 0.05, just outside it rejects; the interval holds the observed difference."""
    a = {"x": [0.61, 0.72, 0.55, 0.80, 0.66], "y": [0.31, 0.45, 0.38, 0.52]}
    b = {"x": [0.50, 0.58, 0.47, 0.69, 0.52], "y": [0.35, 0.29, 0.40, 0.33]}
    monkeypatch.setattr(accuracy_stats, "MAX_EXACT", 1000)
    t = accuracy_stats.permutation_test(a, b)
    assert not t["exact"] and t["relabelings"] == accuracy_stats.SAMPLES
    low, high = t["interval"]
    assert low < t["diff"] < high

    def p_shifted(d: float) -> float:
        return accuracy_stats.permutation_test({s: [v - d for v in runs] for s, runs in a.items()}, b)["p"]

    for end, outward in ((low, -1e-4), (high, 1e-4)):
        assert p_shifted(end - outward) >= 0.05 > p_shifted(end + outward)


def test_runs_too_few_for_any_p_below_alpha_leave_the_interval_unbounded():
    t = accuracy_stats.permutation_test({"s": [0.9, 0.8, 0.7]}, {"s": [0.1, 0.2, 0.0]})  # 20 relabelings: p >= 0.1
    assert t["p"] == pytest.approx(0.1) and t["interval"] == [None, None]


def test_the_spread_within_starts_pools_every_repeated_start_and_sizes_a_test():
    """[1, 3] (variance 2, 1 degree of freedom) and [2, 2, 5] (variance 3, 2): pooled (2 + 6) / 3; a start of one
    run adds nothing. Runs a test needs: 2 (1.96 + 0.84)^2 (sd / gap)^2, the "16 / effect^2" rule."""
    sd, dof = accuracy_stats.within_start_sd([{"a": [1.0, 3.0], "c": [7.0]}, {"b": [2.0, 2.0, 5.0]}])
    assert dof == 3 and sd == pytest.approx((8 / 3) ** 0.5)
    assert accuracy_stats.within_start_sd([{"a": [1.0]}]) == (None, 0)
    assert accuracy_stats.runs_needed(1.0, 1.0) == 16  # 15.7 rounded up
    assert accuracy_stats.runs_needed(0.05, 0.1) == 4 and accuracy_stats.runs_needed(0.1, 0.05) == 63
    assert accuracy_stats.runs_needed(1.0, 1.0, power=0.5) == 8  # z_0.5 = 0: 2 x 1.96^2
