"""Checkpoint integrity (issue 46): rotation counts only content-verified checkpoints, a step directory this run did
not write is moved aside and never deleted, a state whose fields contradict its directory stops the load, a real
full disk (torch's writer raises RuntimeError) is one error and leaves no temp dir, a protocol-0 pickle is refused."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import nemo_jetrl.utils.checkpoint as checkpoint_module
from nemo_jetrl.utils.checkpoint import (
    META_FILE,
    STATE_FILE,
    CheckpointManager,
    CheckpointMismatchError,
    UnsafeCheckpointError,
)


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((4, 4), float(step))}


def _names(root) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _aside(root, step: int) -> list:
    return sorted(root.glob(f"step_{step}.aside.*"))


def _flip_one_byte(path) -> None:
    """Same size, other content (what a size check cannot see)."""
    data = bytearray((path / STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / STATE_FILE).write_bytes(bytes(data))


# ------------------------------------------------------------------------------------ 1: rotation trusts content
def test_rotation_counts_only_checkpoints_whose_content_verifies(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=2)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    _flip_one_byte(tmp_path / "step_2")
    damaged = (tmp_path / "step_2" / STATE_FILE).read_bytes()
    manager.save(3, _state(3))  # top-2 among verified ones: step_1 and step_3; step_2 neither counts nor goes
    assert _names(tmp_path) == ["step_1", "step_2", "step_3"]
    assert torch.equal(manager.load(tmp_path / "step_1")["w"], torch.full((4, 4), 1.0))
    assert (tmp_path / "step_2" / STATE_FILE).read_bytes() == damaged


def test_a_damaged_checkpoint_is_moved_aside_when_its_step_is_saved_again(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    data = (tmp_path / "step_2" / STATE_FILE).read_bytes()
    (tmp_path / "step_2" / STATE_FILE).write_bytes(data[: len(data) // 2])  # truncated
    fresh = CheckpointManager(tmp_path, keep_top_k=None)  # a resumed run: it did not write step_2
    with pytest.warns(UserWarning, match=r"step_2 .*moved aside to .*step_2\.aside\."):
        fresh.save(2, _state(2))
    (moved,) = _aside(tmp_path, 2)
    assert (moved / STATE_FILE).read_bytes() == data[: len(data) // 2]
    assert fresh.load(tmp_path / "step_2")["step"] == 2


# ------------------------------------------------------------------------------ 2: directories it did not write
def test_a_foreign_step_directory_is_moved_aside_never_deleted(tmp_path):
    foreign = tmp_path / "step_2"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("the user's files")
    (foreign / "model.safetensors").write_bytes(b"another tool's checkpoint")
    manager = CheckpointManager(tmp_path, keep_top_k=1)
    manager.save(1, _state(1))
    with pytest.warns(UserWarning, match="moved aside"):
        manager.save(2, _state(2))
    manager.save(3, _state(3))  # rotation deletes only verified checkpoints of this format
    (moved,) = _aside(tmp_path, 2)
    assert (moved / "notes.txt").read_text() == "the user's files"
    assert (moved / "model.safetensors").read_bytes() == b"another tool's checkpoint"
    assert [p.name for p in tmp_path.glob("step_*") if p.name[5:].isdigit()] == ["step_3"]


# ------------------------------------------------------------------------------ 3: fields of a signed state
@pytest.mark.parametrize("inner_step", [-1, 5, True, "3"])
def test_a_state_whose_step_contradicts_its_directory_stops_the_load(tmp_path, inner_step):
    manager = CheckpointManager(tmp_path, keep_top_k=None)
    manager.save(1, _state(1))
    manager.save(3, {**_state(3), "step": inner_step})  # correctly checksummed, copied in / edited
    before = (tmp_path / "step_3" / STATE_FILE).read_bytes()
    with pytest.raises(
        CheckpointMismatchError, match=r"step_3 passes its checksum but its 'step' is .+, not 3: copied in or edited"
    ):
        manager.load_latest()
    assert (tmp_path / "step_3" / STATE_FILE).read_bytes() == before  # kept as it was


# ------------------------------------------------------------------------------ 4: a real full disk
FULL_DISK = textwrap.dedent(
    """
    import json, resource, signal, sys, torch
    from nemo_jetrl.utils.checkpoint import CheckpointManager, CheckpointSaveError
    manager = CheckpointManager(sys.argv[1], keep_top_k=1)
    manager.save(1, {"step": 1, "w": torch.ones(4)})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        manager.save(2, {"step": 2, "w": torch.ones(1_000_000)})
    except CheckpointSaveError as err:
        print(json.dumps({"kind": "CheckpointSaveError", "message": str(err)}))
    except BaseException as err:
        print(json.dumps({"kind": type(err).__name__, "message": str(err)}))
    """
)


def test_a_real_full_disk_is_one_error_and_removes_only_its_temp_dir(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["kind"] == "CheckpointSaveError", result
    assert "\n" not in result["message"] and "could not save checkpoint step_2" in result["message"]
    assert _names(tmp_path) == ["step_1"]  # the partial temp dir is gone, step_1 untouched
    assert CheckpointManager(tmp_path).load_latest()["step"] == 1


# ------------------------------------------------------------------------------ 5: a protocol-0 pickle payload
class RunsCode:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2])
def test_a_pickle_payload_of_any_protocol_is_refused_and_kept(tmp_path, protocol):
    marker = tmp_path / "pwned"
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, keep_top_k=None)
    manager.save(1, _state(1))
    path = root / "step_2"
    path.mkdir()
    torch.save({"step": 2, "policy": RunsCode(marker)}, path / STATE_FILE, pickle_protocol=protocol)
    data = (path / STATE_FILE).read_bytes()
    (path / META_FILE).write_text(
        json.dumps({"step": 2, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    )
    with pytest.raises(UnsafeCheckpointError, match=r"step_2.*refused, nothing in it ran"):
        manager.load_latest()
    assert not marker.exists() and (path / STATE_FILE).read_bytes() == data


def test_verification_reads_each_checkpoint_once_per_process(tmp_path, monkeypatch):
    """Rotation verifies content without re-reading files that did not change: a run's own saves are hashed once,
    when written (as before issue 46); a resumed run reads each earlier checkpoint once."""
    hashed = []
    sha256_file = checkpoint_module.sha256_file
    monkeypatch.setattr(checkpoint_module, "sha256_file", lambda p: hashed.append(p.parent.name) or sha256_file(p))
    manager = CheckpointManager(tmp_path, keep_top_k=3)
    for step in range(1, 11):
        manager.save(step, _state(step))
    assert len(hashed) == 10 and _names(tmp_path) == ["step_10", "step_8", "step_9"]
    hashed.clear()
    resumed = CheckpointManager(tmp_path, keep_top_k=3)
    for step in range(11, 14):
        resumed.save(step, _state(step))
    assert sorted(name.split(".")[1] if name.startswith(".") else name for name in hashed) == sorted(
        ["tmp_step_11", "tmp_step_12", "tmp_step_13", "step_8", "step_9", "step_10"]
    )
