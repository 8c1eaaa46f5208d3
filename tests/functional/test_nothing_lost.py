"""Run-level checks of issue 46: a checkpoint the run must not trust stops it with one line before anything is
rewritten (a protocol-0 pickle payload, a state copied in from another step, a malformed data field), and a run
whose steps are skipped as non-finite several times in a row stops with one line before it saves again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import nemo_jetrl.algorithms.grpo as grpo_module
from nemo_jetrl.environments import make_task
from nemo_jetrl.utils.checkpoint import META_FILE, STATE_FILE, CheckpointManager

from .test_hardening import ConstantRewards, _one_line_error, _script
from .test_resume import SMALL_RUN

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "grpo_tiny.yaml"
SMALL = [*SMALL_RUN, "logger.plot_period=null", "checkpointing.enabled=true", "checkpointing.save_period=1"]


def _args(root: Path, *extra: str) -> list[str]:
    dirs = [f"logger.log_dir={root / 'logs'}", f"checkpointing.checkpoint_dir={root / 'ckpt'}"]
    return ["--config", str(TINY), *SMALL, *dirs, *extra]


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


class RunsCode:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _sign(path: Path) -> None:
    """A meta.json that matches whatever state.pt holds (a checksum proves integrity, not origin)."""
    data = (path / STATE_FILE).read_bytes()
    step = int(path.name.removeprefix("step_"))
    (path / META_FILE).write_text(
        json.dumps({"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    )


def _protocol0_payload(root: Path) -> None:
    path = root / "ckpt" / "step_2"
    path.mkdir(parents=True)
    torch.save({"step": 2, "policy": RunsCode(root / "pwned")}, path / STATE_FILE, pickle_protocol=0)
    _sign(path)


def _copied_from_step_1(root: Path) -> None:
    shutil.copytree(root / "ckpt" / "step_1", root / "ckpt" / "step_2")
    _sign(root / "ckpt" / "step_2")


def _malformed_data(root: Path) -> None:
    state = torch.load(root / "ckpt" / "step_1" / STATE_FILE, weights_only=True)
    CheckpointManager(root / "ckpt", keep_top_k=None).save(2, {**state, "step": 2, "data": [1, 2]})


@pytest.mark.parametrize(
    "plant, needle",
    [
        (_protocol0_payload, "refused, nothing in it ran"),
        (_copied_from_step_1, "'step' is 1, not 2"),
        (_malformed_data, "'data'"),
    ],
)
def test_an_untrusted_checkpoint_stops_the_run_and_is_kept(tmp_path, capsys, monkeypatch, plant, needle):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    good = {"policy": {"model": {}, "optimizer": {}, "step": 1}, "step": 1, "data": {"next_batch": 1}, "config": {}}
    CheckpointManager(tmp_path / "ckpt").save(1, good)
    plant(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n{"step": 2, "train/loss": 0.4}\n')
    before = _tree(tmp_path)
    assert _script("run_grpo")(_args(tmp_path, "grpo.max_num_steps=3")) == 1
    _one_line_error(capsys, "step_2", needle)
    after = {k: v for k, v in _tree(tmp_path).items() if not k.endswith(".nemo_jetrl.lock")}
    assert after == {k: v for k, v in before.items() if not k.endswith(".nemo_jetrl.lock")}
    assert not (tmp_path / "pwned").exists()


class NanRewards(ConstantRewards):
    """The arithmetic task whose environment returns NaN rewards: every step is skipped before training."""

    def score(self, responses, answers):
        return torch.full((len(responses),), float("nan"))


@pytest.mark.slow
def test_a_nonfinite_streak_stops_the_run_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NEMO_JETRL_TRACEBACK", raising=False)
    monkeypatch.setattr(grpo_module, "make_task", lambda data, env, **kw: NanRewards(make_task(data, env)))
    args = _args(tmp_path, "grpo.max_num_steps=6", "grpo.on_nonfinite=skip", "grpo.max_consecutive_nonfinite_skips=2")
    assert _script("run_grpo")(args) == 1
    _one_line_error(capsys, "2 steps in a row skipped as non-finite", "grpo.max_consecutive_nonfinite_skips")
    lines = [json.loads(s) for s in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "train/nonfinite_skipped" in x] == [1, 2]
    assert all(x["train/nonfinite_skipped"] == 1.0 for x in lines if "train/nonfinite_skipped" in x)
    assert [p.name for p in (tmp_path / "ckpt").glob("step_*")] == ["step_1"]  # stopped before saving step 2
