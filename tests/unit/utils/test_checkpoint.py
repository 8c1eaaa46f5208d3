"""CheckpointManager: atomic saves, keep_top_k, corrupt / partial checkpoints skipped with a reason; RNG and
metrics.jsonl resume helpers."""

from __future__ import annotations

import hashlib
import json
import random
import shutil

import numpy as np
import pytest
import torch

from nemo_jetrl.utils.checkpoint import (
    META_FILE,
    STATE_FILE,
    CheckpointManager,
    CheckpointMismatchError,
    CorruptCheckpointWarning,
    capture_rng_state,
    restore_rng_state,
)
from nemo_jetrl.utils.run_outputs import trim_metrics_for_resume


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((4, 4), float(step)), "nested": {"lr": 1e-3 * step}}


def test_save_then_load_round_trips_exactly(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(3, _state(3))
    assert path == tmp_path / "step_3"
    assert sorted(p.name for p in path.iterdir()) == [META_FILE, STATE_FILE]
    meta = json.loads((path / META_FILE).read_text())
    assert meta["step"] == 3 and meta["bytes"] == (path / STATE_FILE).stat().st_size and len(meta["sha256"]) == 64
    loaded = manager.load_latest()
    assert loaded["step"] == 3 and torch.equal(loaded["w"], torch.full((4, 4), 3.0)) and loaded["nested"]["lr"] == 3e-3
    assert not list(tmp_path.glob(".tmp*")), "temp dir left behind"


def test_keep_top_k_keeps_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=2)
    for step in (1, 2, 3, 10):
        manager.save(step, _state(step))
    assert [s for s, _ in manager.step_dirs()] == [3, 10]  # numeric order: step_10 is newer than step_3
    assert manager.load_latest()["step"] == 10


def test_keep_all_with_null_and_resave_same_step(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None)
    for step in (1, 2, 3):
        manager.save(step, _state(step))
    manager.save(3, {"step": 3, "w": torch.zeros(1)})
    assert [s for s, _ in manager.step_dirs()] == [1, 2, 3]
    assert torch.equal(manager.load_latest()["w"], torch.zeros(1))


def _corrupt_flip(path):
    data = bytearray((path / STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / STATE_FILE).write_bytes(bytes(data))


def _corrupt_truncate(path):
    data = (path / STATE_FILE).read_bytes()
    (path / STATE_FILE).write_bytes(data[: len(data) // 2])


def _partial_no_meta(path):
    (path / META_FILE).unlink()


def _garbage_meta(path):
    (path / META_FILE).write_text("{not json")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_corrupt_flip, "does not match its sha256"),
        (_corrupt_truncate, "truncated"),
        (_partial_no_meta, "partial save"),
        (_garbage_meta, "unreadable meta.json"),
    ],
)
def test_damaged_newest_checkpoint_is_skipped_with_its_reason(tmp_path, damage, reason):
    manager = CheckpointManager(tmp_path, keep_top_k=None)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    damage(tmp_path / "step_2")
    with pytest.warns(CorruptCheckpointWarning, match=rf"skipping checkpoint .*step_2: .*{reason}"):
        state = manager.load_latest()
    assert state["step"] == 1
    with pytest.raises(ValueError, match=rf"checkpoint .*step_2 is not usable: .*{reason}"):
        manager.load(tmp_path / "step_2")


def test_verified_bytes_that_do_not_load_stop_the_search_and_are_kept(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    data = (tmp_path / "step_2" / STATE_FILE).read_bytes()[:300]  # a cut zip archive, then signed again
    (tmp_path / "step_2" / STATE_FILE).write_bytes(data)
    (tmp_path / "step_2" / META_FILE).write_text(
        json.dumps({"step": 2, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    )
    with pytest.raises(CheckpointMismatchError, match=r"step_2 passes its checksum but its state\.pt does not load"):
        manager.load_latest()
    assert (tmp_path / "step_2" / STATE_FILE).read_bytes() == data


def test_all_damaged_gives_none_and_nothing_is_deleted(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _state(1))
    _corrupt_flip(tmp_path / "step_1")
    with pytest.warns(CorruptCheckpointWarning):
        assert manager.load_latest() is None
    assert (tmp_path / "step_1" / STATE_FILE).is_file()  # kept for inspection
    assert CheckpointManager(tmp_path / "missing").load_latest() is None


def test_stale_temp_dir_of_a_killed_save_is_ignored_then_removed(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _state(1))
    stale = tmp_path / ".tmp_step_2_99999"
    shutil.copytree(tmp_path / "step_1", stale)
    assert manager.load_latest()["step"] == 1  # never a candidate
    manager.save(2, _state(2))
    assert not stale.exists()


def test_latest_valid_and_mmap_load(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(5, _state(5))
    assert manager.latest_valid() == tmp_path / "step_5"
    assert torch.equal(manager.load(tmp_path / "step_5", mmap=True)["w"], torch.full((4, 4), 5.0))


def test_keep_top_k_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="checkpointing.keep_top_k"):
        CheckpointManager(tmp_path, keep_top_k=0)


def test_rng_state_round_trip_replays_every_stream():
    state = capture_rng_state()
    first = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng_state(state)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


def test_trim_metrics_for_resume_moves_later_and_broken_lines_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "validation/accuracy": 0.5},
        {"step": 1, "train/loss": 0.1},
        {"step": 2, "train/loss": 0.2},
        {"step": 3, "train/loss": 0.3},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "train/lo')  # half-written line
    trim = trim_metrics_for_resume(path, 2)
    assert (trim.after_step, trim.unreadable) == (1, 1)
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:3]
    assert trim.moved_to.read_text() == json.dumps(lines[3]) + '\n{"step": 3, "train/lo\n'
    assert trim_metrics_for_resume(path, 2).moved_to is None
    assert trim_metrics_for_resume(tmp_path / "absent.jsonl", 2).moved_to is None
