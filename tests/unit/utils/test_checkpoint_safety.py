"""Checkpoint hardening (issue 14): code in a state file never runs, only finite states are saved, a failed save
loses nothing, temp dirs are removed only by their owner, best-K by a metric keeps the newest too."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

import nemo_jetrl.utils.checkpoint as checkpoint_module
from nemo_jetrl.utils.checkpoint import (
    META_FILE,
    STATE_FILE,
    CheckpointManager,
    CheckpointSaveError,
    NonFiniteCheckpointError,
    UnsafeCheckpointError,
    capture_rng_state,
    normalize_metric_name,
)


class WritesMarker:
    """Unpickling this runs `os.system` (what a crafted checkpoint would do)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant_malicious_checkpoint(root, step: int, marker) -> None:
    """A step dir whose state.pt runs code when unpickled, with a matching meta.json (sha256 proves nothing)."""
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    torch.save({"step": step, "policy": {"payload": WritesMarker(marker)}}, path / STATE_FILE)
    data = (path / STATE_FILE).read_bytes()
    meta = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / META_FILE).write_text(json.dumps(meta))


def _state(step: int, value: float | None = None) -> dict:
    return {"step": step, "w": torch.full((4, 4), float(step) if value is None else value)}


def test_crafted_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    plant_malicious_checkpoint(tmp_path / "ckpt", 3, marker)
    manager = CheckpointManager(tmp_path / "ckpt")
    with pytest.raises(UnsafeCheckpointError, match=r"needs posix\.system unpickled .* refused, nothing in it ran"):
        manager.load_latest()
    with pytest.raises(UnsafeCheckpointError):
        manager.load(tmp_path / "ckpt" / "step_3")
    assert not marker.exists()


def test_checkpoint_with_rng_state_loads_with_weights_only(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"step": 1, "rng": capture_rng_state(), "config": {"a": [1, 2.5, None, "x"]}})
    raw = torch.load(tmp_path / "step_1" / STATE_FILE, weights_only=True)  # raises on any pickled object
    assert raw["rng"]["python"]["internal"].shape == (625,) and raw["rng"]["numpy"]["keys"].shape == (624,)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_state_is_never_saved_and_the_good_one_survives_rotation(tmp_path, bad):
    manager = CheckpointManager(tmp_path, keep_top_k=1)
    manager.save(1, _state(1))
    state = _state(2)
    state["w"][2, 3] = bad
    with pytest.raises(NonFiniteCheckpointError, match=r"refusing to save checkpoint step_2: non-finite w"):
        manager.save(2, state)
    assert [p.name for p in tmp_path.iterdir()] == ["step_1"]
    assert manager.load_latest()["step"] == 1


def test_disk_full_mid_save_loses_nothing(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path, keep_top_k=1)
    manager.save(1, _state(1))

    def full_disk(obj, f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", full_disk)
    with pytest.raises(CheckpointSaveError, match=r"could not save checkpoint step_2 .*No space left on device"):
        manager.save(2, _state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # own temp dir gone, step_1 intact
    monkeypatch.undo()
    assert torch.equal(manager.load_latest()["w"], torch.full((4, 4), 1.0))


def test_a_live_writers_temp_dir_is_left_alone(tmp_path):
    """Another process mid-save owns `.tmp_step_<N>.<pid>@<host>`: a second manager's save must not delete it."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        live = tmp_path / f".tmp_step_7.{other.pid}@{socket.gethostname()}"
        live.mkdir(parents=True)
        (live / STATE_FILE).write_bytes(b"in flight")
        dead = tmp_path / f".tmp_step_6.{2**22 + 12345}@{socket.gethostname()}"
        dead.mkdir()
        CheckpointManager(tmp_path).save(1, _state(1))
        assert (live / STATE_FILE).read_bytes() == b"in flight"
        assert not dead.exists()  # a gone process's leftovers are still cleaned
    finally:
        other.kill()
        other.wait()


def _save_with_metric(manager, step: int, acc: float | None) -> None:
    metrics = {"validation/accuracy": acc} if acc is not None else {}
    manager.save(step, _state(step), metrics=metrics)


@pytest.mark.parametrize("spelling", ["val:accuracy", "val/accuracy", "validation/accuracy"])
def test_keep_top_k_by_metric_keeps_the_best_and_the_newest(tmp_path, spelling):
    manager = CheckpointManager(tmp_path, keep_top_k=2, metric_name=spelling)
    for step, acc in [(1, 0.2), (2, 0.9), (3, 0.1), (4, 0.7), (5, 0.3), (6, float("nan"))]:
        _save_with_metric(manager, step, acc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_4", "step_6"]  # best 2 + newest
    lower = CheckpointManager(tmp_path / "low", keep_top_k=1, metric_name="train:loss", higher_is_better=False)
    for step, loss in [(1, 0.5), (2, 0.1), (3, 0.4)]:
        lower.save(step, _state(step), metrics={"train/loss": loss})
    assert sorted(p.name for p in (tmp_path / "low").iterdir()) == ["step_2", "step_3"]


def test_damaged_checkpoint_neither_counts_nor_pushes_a_good_one_out(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=1)
    manager.save(1, _state(1))
    damaged = tmp_path / "step_5"
    damaged.mkdir()
    (damaged / STATE_FILE).write_bytes(b"half")  # no meta.json
    manager.save(2, _state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_5"]


def test_metric_name_spellings():
    assert normalize_metric_name("val:accuracy") == "validation/accuracy"
    assert normalize_metric_name("train/reward_mean") == "train/reward_mean"
    with pytest.raises(ValueError, match="checkpointing.metric_name"):
        normalize_metric_name("accuracy")
