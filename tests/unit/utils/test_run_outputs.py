"""What a run finds in its directories at start (issue 46): a resume validates the checkpoint's fields before it
rewrites anything, a fresh start moves every output of an earlier run aside (config.yaml, plots, event files with
metrics.jsonl), odd metrics.jsonl lines are skipped with a count naming the file, and nothing dropped is lost."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from nemo_jetrl.algorithms.grpo_checkpoint import load_resume_state
from nemo_jetrl.config import load_config
from nemo_jetrl.schema import MasterConfig, validate_config
from nemo_jetrl.utils.checkpoint import STATE_FILE, CheckpointManager
from nemo_jetrl.utils.logger import Logger

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "configs" / "grpo_tiny.yaml"


def _cfg(root: Path, *extra: str) -> MasterConfig:
    overrides = [
        f"logger.log_dir={root / 'logs'}",
        f"checkpointing.checkpoint_dir={root / 'ckpt'}",
        "checkpointing.enabled=true",
        "logger.tensorboard_enabled=false",
        *extra,
    ]
    return validate_config(load_config(TINY, overrides))


def _state(at: int, **fields) -> dict:
    step = at
    state = {
        "policy": {"model": {"w": torch.ones(2)}, "optimizer": {}, "step": step},
        "step": step,
        "data": {"next_step": step, "next_batch": step, "prompts_consumed": 4 * step},
        "config": {},
    }
    return {**state, **fields}


def _tree(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under `root`."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _metrics_lines(steps) -> bytes:
    return b"".join(json.dumps({"step": s, "train/loss": 0.1 * s}).encode() + b"\n" for s in steps)


# ------------------------------------------------------------------------ 3: a signed state's fields are checked
@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"step": -1}, "'step'"),
        ({"data": [1, 2]}, "'data'"),
        ({"data": {"next_batch": "x"}}, "data.next_batch"),
        ({"data": {"next_batch": -3}}, "data.next_batch"),
        ({"policy": [1]}, "'policy'"),
    ],
)
def test_a_checkpoint_with_bad_fields_stops_before_anything_is_rewritten(tmp_path, fields, needle):
    cfg = _cfg(tmp_path)
    manager = CheckpointManager(tmp_path / "ckpt", keep_top_k=None)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    manager.save(3, _state(3, **fields))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.jsonl").write_bytes(_metrics_lines([0, 1, 2, 3]))
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match=rf"step_3.*{needle}") as err:
        load_resume_state(cfg)
    assert "\n" not in str(err.value)
    assert _tree(tmp_path) == before  # metrics.jsonl and every checkpoint as they were


# ------------------------------------------------------------------------ 6: a fresh start moves everything aside
def test_a_fresh_start_moves_every_earlier_output_aside(tmp_path):
    cfg = _cfg(tmp_path, "checkpointing.enabled=false", "logger.plot_period=0")
    logs = tmp_path / "logs"
    (logs / "plots").mkdir(parents=True)
    (logs / "tensorboard").mkdir()
    (logs / "metrics.jsonl").write_bytes(_metrics_lines([1, 2]))
    (logs / "config.yaml").write_text("earlier: run\n")
    (logs / "plots" / "reward_accuracy.png").write_bytes(b"earlier plot")
    (logs / "tensorboard" / "events.out.tfevents.1.host.1.0").write_bytes(b"earlier events")
    (logs / "notes.txt").write_text("the user's")
    earlier = set(_tree(logs).values())
    assert load_resume_state(cfg) is None
    with Logger(cfg.logger) as logger:
        logger.log_config({"this": "run"})
        logger.log_metrics({"loss": 0.5}, step=1, prefix="train")
    assert earlier <= set(_tree(logs).values())  # every earlier file's bytes are still there
    assert (logs / "notes.txt").read_text() == "the user's"
    assert [json.loads(s)["step"] for s in (logs / "metrics.jsonl").read_text().splitlines()] == [1]
    assert "this: run" in (logs / "config.yaml").read_text()


def test_a_resume_with_another_config_keeps_the_earlier_config_yaml(tmp_path):
    cfg = _cfg(tmp_path, "logger.plot_period=null")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "config.yaml").write_text("grpo: {max_num_steps: 4}\n")
    with Logger(cfg.logger) as logger:
        logger.log_config({"grpo": {"max_num_steps": 8}})
    yamls = {p.name: p.read_text() for p in logs.glob("config*.yaml")}
    assert "grpo: {max_num_steps: 4}\n" in yamls.values() and len(yamls) == 2
    assert "max_num_steps: 8" in (logs / "config.yaml").read_text()


# ------------------------------------------------------------------------ 7: odd metrics.jsonl lines
def test_odd_metrics_lines_are_skipped_with_a_count_and_kept(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    CheckpointManager(tmp_path / "ckpt").save(2, _state(2))
    logs = tmp_path / "logs"
    logs.mkdir()
    odd = [b'{"train/loss": 1.0}\n', b'\xff\xfe{"step": 1}\n', b'{"step": true}\n']
    (logs / "metrics.jsonl").write_bytes(_metrics_lines([0, 1]) + b"".join(odd) + _metrics_lines([2, 3]))
    state = load_resume_state(cfg)
    assert state["step"] == 2
    kept = [json.loads(s)["step"] for s in (logs / "metrics.jsonl").read_text().splitlines()]
    assert kept == [0, 1, 2]
    err = capsys.readouterr().err
    assert str(logs / "metrics.jsonl") in " ".join(err.split()) and "3 unreadable" in err
    (aside,) = [p for p in logs.iterdir() if p.name.startswith("metrics.") and p.name != "metrics.jsonl"]
    assert aside.read_bytes() == b"".join(odd) + _metrics_lines([3])  # dropped lines are kept, byte for byte
    assert (tmp_path / "ckpt" / "step_2" / STATE_FILE).is_file()
