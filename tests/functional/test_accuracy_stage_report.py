"""The long study's report (examples/accuracy_long_report.py, accuracy_long_plots.py) from synthetic metrics:
common steps, seeds against arms, repeats and pooled stages against BF16, the referee, plots, tables. (The stage
runner: test_accuracy_stage_runner.py.)"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_long_plots as long_plots  # noqa: E402
import accuracy_long_report as long_report  # noqa: E402
import accuracy_stage as stage  # noqa: E402
import accuracy_study  # noqa: E402
import accuracy_versus  # noqa: E402


def _write_metrics(path: Path, steps: int, reward: float, tmpe: float, late_reward: float | None = None) -> None:
    """Synthetic run_grpo metrics: constant reward and mismatch, validations at 0, 5, 10 (accuracy = reward)."""
    path.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(0, steps + 1, 5):
        rows.append({"step": step, "validation/accuracy": reward, "validation/sampled_accuracy": reward / 2})
    for step in range(1, steps + 1):
        r = late_reward if late_reward is not None and step > 10 else reward
        rows.append({"step": step, "train/reward_mean": r, "train/token_mult_prob_error": tmpe,
                     "train/mismatch_pos/00000": tmpe, "train/mismatch_pos/00128": 1 + 2 * (tmpe - 1),
                     "train/exact_token_fraction": 0.5, "train/mean_response_length": 1085.0})  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def synthetic_root(tmp_path):
    """Two stages x two seeds x three arms. 1k: seeds agree (offset 0.01), arms differ by 0.1, one arm stops at
    step 10 and the others run to 14 with a reward of 9 after step 10 (must not count). 4k: seeds differ by 0.3."""
    root = tmp_path / "root"
    base = {"bf16": (0.5, 1.0001), "fp8_rollout_only": (0.4, 1.002), "fp8": (0.45, 1.0005)}
    for name, offset in (("1k", 0.01), ("4k", 0.3)):
        for seed in (0, 1):
            for arm, (reward, tmpe) in base.items():
                steps = 10 if (name, seed, arm) == ("1k", 1, "fp8") else 14
                _write_metrics(root / name / f"seed{seed}" / "arms" / arm, steps, reward + seed * offset, tmpe, 9.0)
            sft = root / name / f"seed{seed}" / "sft"
            sft.mkdir(parents=True)
            (sft / "sft_meta.json").write_text(json.dumps({"steps": 400, "gate_greedy_accuracy": 0.31,
                                                           "gate_passed": True, "wall_time_s": 120.0}))  # fmt: skip
    return root


def test_long_report_compares_arms_at_common_steps_and_seeds_against_arms(synthetic_root, tmp_path):
    stage.pack([synthetic_root / "4k"], synthetic_root / "4k.tar.gz")  # the 4k stage arrives packed
    for path in sorted((synthetic_root / "4k").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (synthetic_root / "4k").rmdir()
    summary = long_report.write_long_report(synthetic_root, tmp_path / "assets")
    one, four = summary["stages"]
    assert (one["stage"], four["stage"]) == ("1k", "4k") and (synthetic_root / "4k" / "seed1").is_dir()
    assert one["common_step"] == 10 and four["common_step"] == 14
    # up to the common step only: the reward of 9 after step 10 is left out of the 1k stage
    assert one["runs"]["seed0"]["bf16"]["reward_last"] == pytest.approx(0.5)
    assert one["mean"]["bf16"]["reward_last"] == pytest.approx(0.505)
    assert four["mean"]["bf16"]["reward_last"] > 1.0  # the 4k stage's common step 14 includes them
    assert one["mean"]["fp8_rollout_only"]["token_mult_prob_error_mean"] == pytest.approx(1.002)
    assert one["mean"]["fp8_rollout_only"]["mismatch_by_position"] == pytest.approx({"00000": 1.002, "00128": 1.004})
    assert one["mean"]["bf16"]["heldout_accuracy_final"] == pytest.approx(0.505)  # validations at 5, 10 (not 0)
    verdict = one["seeds_vs_arms"]["reward_last"]
    assert verdict["arm_range"] == pytest.approx(0.1) and verdict["max_seed_spread"] == pytest.approx(0.01)
    assert verdict["seeds_disagree_more"] is False
    assert four["seeds_vs_arms"]["heldout_accuracy_final"]["seeds_disagree_more"] is True
    for name in ("reward.png", "heldout.png", "mismatch_position.png", "by_stage.png", "summary.json", "4k.tar.gz"):
        data = (tmp_path / "assets" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000 if name.endswith(".png") else len(data) > 500
    tables = long_report.format_long_tables(summary)
    assert (
        "### 1k: common step 10 (last steps" in tables
        and "| FP8 rollout only | 0.405 (0.400, 0.410) -> 0.405 (0.400, 0.410) |" in tables
    )
    assert "seeds disagree MORE than the arms" in tables and "arms differ more than the seeds" in tables
    assert "| pos 0+ | pos 128+ |" in tables
    # validations equal the reward: no run of 1k moved from its start; in 4k every run's final is its start
    assert "- runs that ended below 0.5 x their start (held-out greedy): BF16 0/2, FP8 rollout only 0/2, " in tables
    late = dict(four, runs={s: {a: dict(r, heldout_accuracy_final=0.1) for a, r in arms.items()}
                            for s, arms in four["runs"].items()})  # fmt: skip
    assert long_report.fallen_line(late)[0].endswith("BF16 2/2, FP8 rollout only 2/2, unified FP8 2/2")


def test_combine_makes_one_stage_of_the_seeds_two_calls_ran(synthetic_root, tmp_path):
    """One GPU runs a stage once per seed: 1k holds seed 0 (its SFT missed the gate) and seed 1, 1k-s0 seed 0 run
    again. The combined stage takes 1k-s0's seed 0 (passed) and 1k's seed 1, and compares them as one stage's."""
    again = synthetic_root / "1k-s0" / "seed0"
    shutil.copytree(synthetic_root / "1k" / "seed0", again)
    for arm in ("bf16", "fp8_rollout_only", "fp8"):
        _write_metrics(again / "arms" / arm, 14, 0.2, 1.0001)  # the rerun's reward: 0.2 in every arm
    failed = synthetic_root / "1k" / "seed0" / "sft" / "sft_meta.json"
    failed.write_text(json.dumps({"steps": 390, "gate_greedy_accuracy": None, "gate_passed": False}))
    summary = long_report.write_long_report(synthetic_root, None, {"1k-seeds": ["1k", "1k-s0"]})
    by_name = {st["stage"]: st for st in summary["stages"]}
    combined = by_name["1k-seeds"]
    assert combined["seeds"] == ["seed0", "seed1"] and combined["sft"]["seed0"]["gate_passed"] is True
    assert combined["runs"]["seed0"]["bf16"]["reward_last"] == pytest.approx(0.2)  # 1k-s0's, not 1k's failed seed
    assert combined["runs"]["seed1"]["bf16"]["reward_last"] == pytest.approx(0.51)
    assert by_name["1k"]["seeds"] == ["seed1"]  # the stage as it was: its failed seed left out
    assert (synthetic_root / "1k-seeds" / "seed0").resolve() == again.resolve()
    long_report.write_long_report(synthetic_root, None, {"1k-seeds": ["1k", "1k-s0"]})  # again: links replaced
    with pytest.raises(FileNotFoundError, match="no stage 'absent'"):
        long_report.write_long_report(synthetic_root, None, {"x": ["1k", "absent"]})
    with pytest.raises(SystemExit):
        accuracy_study.build_parser().parse_args(["report", "--combine", "1k-seeds"])  # no '='


def test_a_short_runs_first_and_last_reward_windows_do_not_overlap(tmp_path):
    import accuracy_report

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train/reward_mean": s / 20}) + "\n" for s in range(1, 21)))
    summary = accuracy_report.arm_summary(path)  # 20 steps: the first 10 against the last 10
    assert summary["reward_first"] == pytest.approx(0.275) and summary["reward_last"] == pytest.approx(0.775)


def test_each_arm_keeps_one_color_in_every_panel():
    """A panel with fewer arms must not shift the others' colors: one fixed, distinct color per arm."""
    arms = accuracy_study.LONG_ARMS + accuracy_study.LONG_OPTIONAL_ARMS
    assert set(arms) <= set(long_plots.ARM_COLORS)
    assert len(set(long_plots.ARM_COLORS.values())) == len(long_plots.ARM_COLORS)


def test_the_largest_step_shows_a_burst_that_the_mean_hides(tmp_path):
    """One step of 34 among ten of 1.001 (the 1k lr sweep's FP8-rollout-only burst): the mean says 4.0, the largest
    step says 34; across seeds the largest of them is kept, and the arm table prints it."""
    import accuracy_report

    _write_metrics(tmp_path / "arm", 10, 0.5, 1.001)
    with open(tmp_path / "arm" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 11, "train/reward_mean": 0.5, "train/token_mult_prob_error": 34.0}) + "\n")
    row = accuracy_report.arm_summary(tmp_path / "arm" / "metrics.jsonl")
    assert row["token_mult_prob_error_max"] == 34.0
    assert row["token_mult_prob_error_mean"] == pytest.approx((10 * 1.001 + 34.0) / 11)
    assert accuracy_report.across_seeds("token_mult_prob_error_max", [1.2, 34.0, None]) == 34.0
    assert accuracy_report.across_seeds("token_mult_prob_error_mean", [1.0, 3.0, None]) == 2.0
    table = accuracy_report.arm_table(["fp8_rollout_only"], lambda arm, key, digits: f"<{key}>")
    assert "| <token_mult_prob_error_mean> | <token_mult_prob_error_max> |" in table[2] and "its largest step" in table[0]
    assert "-> <heldout_accuracy_final> | <heldout_accuracy_mean> |" in table[2] and "mean after start" in table[0]


def test_final_held_out_accuracy_leaves_out_the_start(tmp_path):
    """A short run (validations at 0, 5, 10): "final" is the mean of 5 and 10; the start is the start, not part of
    the final figure (it was, for runs of fewer than four validations)."""
    import accuracy_report

    (tmp_path / "arm").mkdir()
    rows = [{"step": 0, "validation/accuracy": 0.9}, {"step": 5, "validation/accuracy": 0.1},
            {"step": 10, "validation/accuracy": 0.2}] + [{"step": i, "train/reward_mean": 0.5} for i in range(1, 12)]  # fmt: skip
    (tmp_path / "arm" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = accuracy_report.arm_summary(tmp_path / "arm" / "metrics.jsonl")
    assert row["heldout_accuracy_start"] == 0.9 and row["heldout_accuracy_final_steps"] == [5, 10]
    assert row["heldout_accuracy_final"] == pytest.approx(0.15)
    rows += [{"step": s, "validation/accuracy": a} for s, a in ((15, 0.6), (20, 0.7), (25, 0.8))]
    (tmp_path / "arm" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    row = accuracy_report.arm_summary(tmp_path / "arm" / "metrics.jsonl")  # final: the last three; mean: all five
    assert row["heldout_accuracy_final"] == pytest.approx(0.7) and row["heldout_accuracy_final_steps"] == [15, 20, 25]
    assert row["heldout_accuracy_mean"] == pytest.approx(0.48) and row["heldout_accuracy_start"] == 0.9


def test_a_seed_that_ran_past_the_common_step_is_also_summarized_to_its_own(synthetic_root, tmp_path, capsys):
    """1k: seed 1's fp8 arm stops at step 10, so the stage's common step is 10; seed 0's arms all reached 14 and are
    also summarized to 14 (the reward of 9 after step 10 counts there), with their per-seed curves plotted."""
    summary = long_report.write_long_report(synthetic_root, tmp_path / "assets", seed_curves=["1k"])
    one, four = summary["stages"]
    assert one["seed_common_steps"] == {"seed0": 14, "seed1": 10} and four["runs_own_step"] == {}
    assert list(one["runs_own_step"]) == ["seed0"]
    assert one["runs"]["seed0"]["bf16"]["reward_last"] == pytest.approx(0.5)  # to the common step
    assert one["runs_own_step"]["seed0"]["bf16"]["reward_last"] == pytest.approx((3 * 0.5 + 4 * 9.0) / 7)
    tables = long_report.format_long_tables(summary)
    assert "| arm | seed0 to step 14: greedy final / mean after start / reward last / token_mult_prob_error |" in tables
    assert "| BF16 | 0.500 / 0.500 / 5.357 / 1.00010 |" in tables and tables.count("to step 14") == 1
    png = (tmp_path / "assets" / "seeds_1k.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert not (tmp_path / "assets" / "seeds_4k.png").exists()
    png = (tmp_path / "assets" / "runs_1k.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rc = accuracy_study.main(["report", "--study", "long", "--out", str(synthetic_root), "--seed-curves", "9k"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "1k, 4k" in err[0]
    assert err[0].startswith("error: --seed-curves 9k: no such stage")


def test_the_runs_overlay_draws_every_run_thin_and_each_arms_mean_at_the_steps_all_runs_reached(
    synthetic_root, tmp_path, monkeypatch
):
    """runs_<stage>.png: per panel, a thin line per run and arm and a thick one per arm, the runs' mean; the 1k
    stage's fp8 arm stops at step 10 in seed 1, so its mean ends there while seed 0's line goes to 14."""
    st = long_report.stage_summary(synthetic_root / "1k")
    drawn = {}
    monkeypatch.setattr(long_plots, "save_figure", lambda fig, axes, path: drawn.update(axes=axes) or path)
    assert long_plots.plot_run_overlay(st, tmp_path) == tmp_path / "runs_1k.png"
    reward = drawn["axes"][1]  # SEED_PANELS: held-out greedy, train reward, mismatch
    thick = {ln.get_label(): ln for ln in reward.get_lines() if ln.get_linewidth() > 2}
    thin = [ln for ln in reward.get_lines() if ln.get_linewidth() < 1]
    assert len(thin) == len(st["arms"]) * 2 and set(thick) == {f"{long_plots.ARM_LABELS[a]}, mean of 2 runs"
                                                               for a in st["arms"]}  # fmt: skip
    fp8 = thick[f"{long_plots.ARM_LABELS['fp8']}, mean of 2 runs"]
    assert fp8.get_xdata()[-1] == 10 and max(ln.get_xdata()[-1] for ln in thin) == 14
    runs = [st["series"][run]["fp8"]["train/reward_mean"] for run in st["seeds"]]
    steps = sorted(set(runs[0][0].tolist()) & set(runs[1][0].tolist()))
    want = [(dict(zip(*map(list, runs[0])))[x] + dict(zip(*map(list, runs[1])))[x]) / 2 for x in steps]
    assert list(fp8.get_ydata()) == pytest.approx(list(long_plots.smooth(np.array(want))))


def test_the_report_counts_repeats_as_runs_of_their_seeds_start(tmp_path):
    """Three runs of each arm from seed 0's start (seed0, seed0r1, seed0r2): the report finds that start's SFT for
    each, lists the repeats once, and tests fp8 against BF16 over them."""
    root = tmp_path / "root"  # three runs of seed 0's start, its SFT found for each
    for label, reward in (("seed0", 0.5), ("seed0r1", 0.1), ("seed0r2", 0.3)):
        for arm in ("bf16", "fp8"):
            _write_metrics(root / "2k" / label / "arms" / arm, 10, reward, 1.0001)
    (root / "2k" / "seed0" / "sft").mkdir()
    meta = {"gate_passed": True, "steps": 1, "gate_greedy_accuracy": 0.4, "wall_time_s": 1.0,
            "init_from": {"path": "/x/1k/seed0/sft", "steps": 500}}  # a curriculum's SFT names its source
    (root / "2k" / "seed0" / "sft" / "sft_meta.json").write_text(json.dumps(meta))
    (st,) = long_report.write_long_report(root)["stages"]
    assert st["seeds"] == ["seed0", "seed0r1", "seed0r2"] and all(m["steps"] == 1 for m in st["sft"].values())
    assert st["seeds_vs_arms"]["reward_last"]["max_seed_spread"] == pytest.approx(0.4)
    tables = long_report.format_long_tables({"stages": [st]})
    assert tables.count("- SFT seed0") == 1
    assert "- SFT seed0: 1 steps, gate greedy 0.400 (passed: True), 1.0 s, from /x/1k/seed0/sft (500 steps)" in tables
    assert "- GRPO repeats from their seed's SFT (other GRPO seeds): seed0r1, seed0r2" in tables
    # 3 runs per arm from one start: C(6, 3) = 20 relabelings, p >= 0.10: one line says no arm can be told apart
    assert st["versus_bf16"]["fp8"]["heldout_accuracy_mean"]["relabelings"] == 20
    assert "- arms against BF16: 3 run(s) per arm from 1 start(s): a permutation test cannot go below p = 0.10" in (
        tables
    )
    for label, reward in (("seed0r3", 0.2), ("seed0r4", 0.4)):  # 5 runs per arm: 252 relabelings
        for arm, shift in (("bf16", 0.0), ("fp8", -0.3)):
            _write_metrics(root / "2k" / label / "arms" / arm, 10, reward + shift, 1.0001)
    for arm in ("seed0r1", "seed0r2"):
        _write_metrics(root / "2k" / arm / "arms" / "fp8", 10, {"seed0r1": 0.1, "seed0r2": 0.3}[arm] - 0.3, 1.0001)
    _write_metrics(root / "2k" / "seed0" / "arms" / "fp8", 10, 0.5 - 0.3, 1.0001)
    (st,) = long_report.write_long_report(root)["stages"]
    t = st["versus_bf16"]["fp8"]["heldout_accuracy_mean"]
    assert t["diff"] == pytest.approx(-0.3) and t["relabelings"] == 252 and t["exact"]
    assert t["p"] < 0.05  # fp8 = bf16 - 0.3 in every run: 0.2..0.5 against -0.2..0.2 overlap in few relabelings
    lines = long_report.format_long_tables({"stages": [st]}).splitlines()
    line = [x for x in lines if x.startswith("- unified FP8 - BF16")]
    assert len(line) == 1 and "over 5 and 5 runs from 1 start(s): heldout_accuracy_mean -0.300 (p = " in line[0]
    low, high = t["interval"]  # every fp8 run is bf16's minus 0.3: the shifts not rejected lie around -0.3
    assert low < -0.3 < high and f"; 95%: {low:+.3f} to {high:+.3f})" in line[0]
    assert accuracy_versus.interval_text([None, None]) == "95%: unbounded"  # runs too few for p < 0.05


def test_pool_tests_each_arm_over_several_stages_runs_keeping_each_stages_starts_apart(tmp_path, capsys):
    """--pool: stage "a" (one start, 2 runs per arm) and stage "b" (seed 0 of another SFT: one run per arm, and an
    arm "a" lacks) pooled: fp8 - bf16 over 3 + 3 runs from 2 starts, C(4, 2) x C(2, 1) = 12 relabelings; the start
    labels keep a's seed0 and b's seed0 apart (pooled as one start, C(6, 3) = 20)."""
    root = tmp_path / "root"
    for name, label, bf16, fp8 in (("a", "seed0", 0.6, 0.3), ("a", "seed0r1", 0.5, 0.2), ("b", "seed0", 0.7, 0.4)):
        _write_metrics(root / name / label / "arms" / "bf16", 10, bf16, 1.0001)
        _write_metrics(root / name / label / "arms" / "fp8", 10, fp8, 1.0003)
    _write_metrics(root / "b" / "seed0" / "arms" / "fp8_kv", 10, 0.65, 1.0003)
    summary = long_report.write_long_report(root, pool={"ab": ["a", "b"]})
    pooled = summary["pools"]["ab"]
    assert pooled["stages"] == ["a", "b"] and set(pooled["versus_bf16"]) == {"fp8", "fp8_kv"}
    t = pooled["versus_bf16"]["fp8"]["heldout_accuracy_final"]
    assert t["diff"] == pytest.approx(-0.3) and t["starts"] == 2 and t["relabelings"] == 12 and t["runs"] == [3, 3]
    # every relabeling within a start moves fp8's runs only among its own start's: the observed split is the most
    # extreme in both starts, and its mirror; 2 of 12
    assert t["p"] == pytest.approx(2 / 12)
    kv = pooled["versus_bf16"]["fp8_kv"]["heldout_accuracy_final"]
    assert kv["starts"] == 1 and kv["diff"] == pytest.approx(-0.05)  # only b's start has fp8_kv
    tables = long_report.format_long_tables(summary)
    assert "### pooled ab: a, b (each start's runs relabeled among themselves)" in tables
    # the spread within a's start: bf16 0.6 / 0.5 and fp8 0.3 / 0.2 (variance 0.005 each, 1 dof each); b's single
    # runs add nothing; 2 x 2.80^2 x 0.005 / gap^2 runs: 7.8 -> 8 for 0.1, 31.4 -> 32 for 0.05
    power = pooled["power"]["fp8"]
    assert power["dof"] == 2 and power["sd"] == pytest.approx(0.005**0.5) and power["runs"] == 3
    assert power["runs_needed"] == {"0.1": 8, "0.05": 32}
    assert ("- unified FP8 and BF16: runs of one start scatter by SD 0.071 in heldout_accuracy_mean (2 degrees of "
            "freedom); to find a gap of 0.1 / 0.05 with power 80% at p < 0.05 a test needs about 8 / 32 runs an arm "
            "(normal approximation; here 3)") in tables  # fmt: skip
    # 12 relabelings cannot give p < 0.05: the one line says so, with the pooled runs' smallest possible p
    assert "- arms against BF16: 3 run(s) per arm from 2 start(s): a permutation test cannot go below p = 0.17" in (
        tables.split("### pooled ab")[1]
    )
    # each start's own difference, one row a start: fp8 is 0.3 below bf16 in a's seed0 (2 runs) and in b's seed0
    assert pooled["versus_bf16"]["fp8"]["heldout_accuracy_final"]["by_start"] == pytest.approx(
        {"a/seed0": -0.3, "b/seed0": -0.3})
    rows = [x for x in tables.split("### pooled ab")[1].splitlines() if x.startswith("| unified FP8 | ")]
    assert len(rows) == 2 and rows[0].startswith("| unified FP8 | a/seed0 | -0.300 | -0.300 | ")
    assert "| unified FP8 + FP8 KV | " not in tables.split("### pooled ab")[1]  # one start: no table row
    # versus_ab.png's rows: each start's difference, then all runs' with the interval (none: 12 relabelings)
    rows = long_plots.versus_rows(pooled["versus_bf16"], "heldout_accuracy_final")
    assert [(r[0], r[1], round(r[2], 9), r[3], r[4]) for r in rows] == [
        ("a/seed0", "fp8", -0.3, None, None), ("b/seed0", "fp8", -0.3, None, None),
        ("all starts", "fp8", -0.3, None, None), ("b/seed0", "fp8_kv", -0.05, None, None),
        ("all starts", "fp8_kv", -0.05, None, None)]  # fmt: skip
    assert (root / "report" / "versus_ab.png").stat().st_size > 10_000
    assert long_plots.versus_panels(pooled["versus_bf16"]) == list(long_plots.VERSUS_PANELS)  # no referee series
    rc = accuracy_study.main(["report", "--study", "long", "--out", str(root), "--pool", "ab=a,zz"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["error: --pool zz: no such stage with arms (stages: a, b)"]


def test_the_report_puts_the_bf16_referee_beside_the_arms_own_validation(synthetic_root):
    """seed 0's bf16 arm was evaluated at its checkpoint of step 12 (accuracy_eval.py): its own greedy validation
    there is the one of step 10 (validations at 0, 5, 10), named with its step; arms without a referee result show
    '-'. With every run refereed, the referee's figures are tested against BF16's like the own validations."""

    def referee(stage: str, run: str, arm: str, step: int, greedy: float, pass1: float) -> None:
        ref = synthetic_root / stage / run / "arms" / arm / "reference_eval"
        ref.mkdir()
        (ref / "results.json").write_text(json.dumps({"checkpoint_step": step, "accuracy": greedy, "pass@1": pass1}))

    referee("1k", "seed0", "bf16", 12, 0.7, 0.6)
    summary = long_report.write_long_report(synthetic_root)
    one = summary["stages"][0]
    assert one["reference"]["seed0"]["bf16"]["own_accuracy"] == pytest.approx(0.5)
    assert one["reference"]["seed0"]["bf16"]["own_step"] == 10
    assert one["reference"]["seed0"]["fp8"] is None and one["reference"]["seed1"]["bf16"] is None
    assert summary["stages"][1]["reference"]["seed0"]["bf16"] is None  # the 4k stage: none evaluated
    assert one["versus_bf16"]["fp8"]["referee_greedy"]["diff"] is None  # no fp8 run refereed: nothing to test
    tables = long_report.format_long_tables(summary)
    assert "| arm | seed0: step / own rollout greedy / BF16 referee greedy / referee pass@1 |" in tables
    assert "| BF16 | 12 / 0.500 (step 10) / 0.700 / 0.600 |" in tables and "| unified FP8 | - |" in tables
    assert tables.count("BF16 referee greedy") == 1  # the one refereed stage's table (the overview names it too)
    referee("1k", "seed1", "bf16", 10, 0.9, 0.8)  # at a validation's own step: no step in brackets
    for run, greedy in (("seed0", 0.4), ("seed1", 0.5)):
        referee("1k", run, "fp8", 12, greedy, greedy - 0.2)
    one = long_report.write_long_report(synthetic_root)["stages"][0]
    test = one["versus_bf16"]["fp8"]
    # fp8 - bf16: (0.4 + 0.5) / 2 - (0.7 + 0.9) / 2 = -0.35; pass@1 (0.2 + 0.3) / 2 - (0.6 + 0.8) / 2 = -0.45
    assert test["referee_greedy"]["diff"] == pytest.approx(-0.35)
    assert test["referee_pass@1"]["diff"] == pytest.approx(-0.45)
    # one run per arm from 2 starts: 4 relabelings, two as far from 0 as the observed
    assert test["referee_greedy"]["relabelings"] == 4 and test["referee_greedy"]["p"] == pytest.approx(0.5)
    assert "| BF16 | 12 / 0.500 (step 10) / 0.700 / 0.600 | 10 / " in long_report.format_long_tables({"stages": [one]})


def test_the_referee_at_every_validation_is_summarized_and_tested_against_bf16(tmp_path):
    """grpo.val_reference's `validation/reference_accuracy`: its mean after the start per run, fp8 - bf16 over the
    runs, and a fourth panel in versus_<pool>.png."""
    root = tmp_path / "root"
    for label, reward in (("seed0", 0.5), ("seed0r1", 0.3)):
        for arm, ref in (("bf16", reward), ("fp8", reward - 0.2)):
            path = root / "2k" / label / "arms" / arm
            _write_metrics(path, 10, reward, 1.0001)
            rows = [{"step": step, "validation/reference_accuracy": ref} for step in (0, 5, 10)]
            with (path / "metrics.jsonl").open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    (root / "2k" / "seed0" / "sft").mkdir()
    meta = {"gate_passed": True, "steps": 1, "gate_greedy_accuracy": 0.4, "wall_time_s": 1.0}
    (root / "2k" / "seed0" / "sft" / "sft_meta.json").write_text(json.dumps(meta))
    (st,) = long_report.write_long_report(root)["stages"]
    assert st["runs"]["seed0r1"]["fp8"]["heldout_reference_accuracy_mean"] == pytest.approx(0.1)
    t = st["versus_bf16"]["fp8"]["heldout_reference_accuracy_mean"]
    assert t["diff"] == pytest.approx(-0.2) and t["relabelings"] == 6  # C(4, 2): one start, 2 + 2 runs
    assert t["by_start"] == pytest.approx({"seed0": -0.2})
    assert long_plots.versus_panels(st["versus_bf16"])[-1] == "heldout_reference_accuracy_mean"
