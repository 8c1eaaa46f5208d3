"""Twin runs in the long study's report (examples/accuracy_twins.py, `report --twins`): two stages that ran one
deterministic start under one GRPO config, compared pair by pair and against runs of other GRPO seeds; anything that
is not a twin is refused by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import accuracy_long_report as long_report  # noqa: E402
import accuracy_study  # noqa: E402
import accuracy_twins as twins  # noqa: E402

SFT_META = {"steps": 550, "gate_greedy_accuracy": 0.344, "gate_passed": True, "deterministic": True, "seed": 3}
CONFIG = """grpo:
  seed: {seed}
policy:
  generation:
    temperature: {temperature}
  memory_preflight:
    capacity_gib: {capacity}
logger:
  log_dir: /tmp/acc_long/{stage}/{run}/arms/bf16
"""


def _run(root: Path, stage: str, run: str, val: list[float], rewards: list[float], *, seed: int = 44,
         temperature: float = 0.7, capacity: float = 23.3) -> None:  # fmt: skip
    """One BF16 run: validations at steps 0, 5, 10 and one train reward (grad norm 0.1) a step."""
    arm = root / stage / run / "arms" / "bf16"
    arm.mkdir(parents=True)
    rows = [{"step": 5 * i, "validation/accuracy": v, "validation/sampled_accuracy": v} for i, v in enumerate(val)]
    rows += [{"step": i + 1, "train/reward_mean": r, "train/grad_norm": 0.1} for i, r in enumerate(rewards)]
    (arm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (arm / "config.yaml").write_text(CONFIG.format(seed=seed, temperature=temperature, capacity=capacity,
                                                   stage=stage, run=run))  # fmt: skip


def _sft(root: Path, base: str, **changes) -> None:
    sft = root / base / "seed0" / "sft"
    sft.mkdir(parents=True)
    (sft / "sft_meta.json").write_text(json.dumps({**SFT_META, **changes}))


@pytest.fixture
def twin_root(tmp_path):
    """Stages 2k-a_T0.7 and 2k-b_T0.7 from one deterministic SFT (other wall time and calls; b's GPU share and
    stage names differ): seed0's twins part at step 4 in reward and at step 10 in held-out accuracy (0.7 vs 0.9),
    seed0r1's are the same run."""
    root = tmp_path / "root"
    _sft(root, "2k-a", wall_time_s=351.9, calls=2)
    _sft(root, "2k-b", wall_time_s=289.9, calls=1)
    _run(root, "2k-a_T0.7", "seed0", [0.5, 0.6, 0.7], [0.5] * 10)
    _run(root, "2k-b_T0.7", "seed0", [0.5, 0.6, 0.9], [0.5] * 3 + [0.6] * 7, capacity=35.0)
    for stage in ("2k-a_T0.7", "2k-b_T0.7"):
        _run(root, stage, "seed0r1", [0.5, 0.4, 0.4], [0.3] * 10, seed=1044)
    return root


def test_twins_are_compared_pair_by_pair_and_against_runs_of_other_seeds(twin_root):
    summary = long_report.write_long_report(twin_root, twins={"t": ["2k-a_T0.7", "2k-b_T0.7"]})
    tw = summary["twins"]["t"]
    assert tw["stages"] == ["2k-a_T0.7", "2k-b_T0.7"]
    first, same = tw["pairs"]
    assert (first["run"], first["arm"], first["step"], first["first_difference"]) == ("seed0", "bf16", 10, 4)
    assert first["heldout_accuracy_mean"] == pytest.approx([0.65, 0.75])  # validations 5 and 10
    assert first["max_validation_gap"] == pytest.approx(0.2) and first["start"] == [0.5, 0.5]
    assert first["reward_last"] == pytest.approx([0.5, 0.6])  # the last 5 of 10 steps
    assert same["first_difference"] is None and same["max_validation_gap"] == 0.0
    row = tw["by_arm"]["bf16"]
    assert row["step"] == 10
    assert row["twins"]["heldout_accuracy_mean"] == pytest.approx(0.05)  # (0.1 + 0) / 2
    # seed0 against seed0r1 (another GRPO seed, the same start): 0.65 vs 0.40 in a, 0.75 vs 0.40 in b
    assert row["seeds"]["heldout_accuracy_mean"] == pytest.approx([0.25, 0.35])
    lines = long_report.format_long_tables(summary).split("### twins t: ")[1].splitlines()
    assert lines[0] == "2k-a_T0.7 and 2k-b_T0.7 (the same start and GRPO config, run twice)"
    assert "| seed0 | BF16 | 10 | 4 | 0.500 / 0.500 | 0.650 / 0.750 | 0.650 / 0.750 | 0.200 |" in lines
    assert "| seed0r1 | BF16 | 10 | - | 0.500 / 0.500 | 0.400 / 0.400 | 0.400 / 0.400 | 0.000 |" in lines
    assert any(x.startswith("- BF16 to step 10, mean |difference| between twins: heldout_accuracy_mean 0.050")
               and "(in 2k-a_T0.7 / 2k-b_T0.7): heldout_accuracy_mean 0.250 / 0.350" in x for x in lines)  # fmt: skip
    assert (twin_root / "report" / "twins_t.png").stat().st_size > 10_000


def test_runs_that_are_not_twins_are_refused_by_name(twin_root, capsys):
    a, b = "2k-a_T0.7", "2k-b_T0.7"
    assert twins.twin_mismatch(twin_root, a, b, "seed0", "bf16") == []  # wall time, calls, GPU share: ignored
    config = twin_root / b / "seed0" / "arms" / "bf16" / "config.yaml"
    config.write_text(config.read_text().replace("temperature: 0.7", "temperature: 1.0"))
    assert twins.twin_mismatch(twin_root, a, b, "seed0", "bf16") == [
        "their GRPO configs differ in policy.generation.temperature (0.7 vs 1.0)"
    ]
    meta = twin_root / "2k-b" / "seed0" / "sft" / "sft_meta.json"
    meta.write_text(json.dumps({**SFT_META, "steps": 575}))
    assert twins.twin_mismatch(twin_root, a, b, "seed0r1", "bf16") == ["their SFTs differ in steps"]
    meta.write_text(json.dumps({**SFT_META, "deterministic": False}))
    assert twins.twin_mismatch(twin_root, a, b, "seed0r1", "bf16") == [
        "2k-b_T0.7's SFT of seed0 is not a deterministic one (--sft-deterministic)"
    ]
    rc = accuracy_study.main(["report", "--study", "long", "--out", str(twin_root), "--twins", f"t={a},{b}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: {a} and {b} are not twins: seed0/bf16: ")
    assert "policy.generation.temperature (0.7 vs 1.0)" in err[0] and "seed0r1/bf16: 2k-b_T0.7's SFT" in err[0]


def test_twins_take_exactly_two_stages(twin_root, capsys):
    with pytest.raises(SystemExit):
        accuracy_study.main(["report", "--study", "long", "--out", str(twin_root), "--twins", "t=2k-a_T0.7"])
    assert "two stages" in capsys.readouterr().err
    rc = accuracy_study.main(["report", "--study", "long", "--out", str(twin_root), "--twins", "t=2k-a_T0.7,zz"])
    assert rc == 2 and "error: --twins zz: no such stage with arms" in capsys.readouterr().err
