"""Run-directory lock: a second writer (another process) is refused with one line naming the holder; the lock goes
with its process (SIGKILL included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from nemo_jetrl.utils.run_lock import LOCK_FILE, RunDirLockedError, lock_run_dirs, release_all

HOLD = """
import sys, time
from nemo_jetrl.utils.run_lock import lock_run_dirs
lock_run_dirs({"checkpointing.checkpoint_dir": sys.argv[1]})
print("locked", flush=True)
time.sleep(120)
"""


def _holder(directory) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_process_is_refused_naming_the_holder_until_it_dies(tmp_path):
    holder = _holder(tmp_path / "ckpt")
    try:
        with pytest.raises(RunDirLockedError) as err:
            lock_run_dirs({"logger.log_dir": tmp_path / "logs", "checkpointing.checkpoint_dir": tmp_path / "ckpt"})
        message = str(err.value)
        assert "\n" not in message and f"pid {holder.pid} on " in message and "checkpoint_dir" in message
        # all or none: the log dir taken first was released again
        release_all(lock_run_dirs({"logger.log_dir": tmp_path / "logs"}))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    locks = lock_run_dirs({"checkpointing.checkpoint_dir": tmp_path / "ckpt"})  # a dead holder's lock is gone
    assert f'"pid": {os.getpid()}' in (tmp_path / "ckpt" / LOCK_FILE).read_text()
    release_all(locks)


def test_one_lock_when_two_roles_share_a_directory_and_release_frees_it(tmp_path):
    locks = lock_run_dirs({"logger.log_dir": tmp_path, "checkpointing.checkpoint_dir": tmp_path})
    assert len(locks) == 1
    with pytest.raises(RunDirLockedError):
        lock_run_dirs({"logger.log_dir": tmp_path})  # a second writer in this very process too
    release_all(locks)
    start = time.monotonic()
    release_all(lock_run_dirs({"logger.log_dir": tmp_path}))
    assert time.monotonic() - start < 5


# ------------------------------------------------------------------------ issue 46: locks that cannot be removed
def test_removing_the_lock_file_does_not_free_a_live_holders_directory(tmp_path):
    holder = _holder(tmp_path / "ckpt")
    try:
        (tmp_path / "ckpt" / LOCK_FILE).unlink()
        with pytest.raises(RunDirLockedError, match="in use by another run"):
            lock_run_dirs({"checkpointing.checkpoint_dir": tmp_path / "ckpt"})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    release_all(lock_run_dirs({"checkpointing.checkpoint_dir": tmp_path / "ckpt"}))  # free once the holder is gone


def test_a_directory_replaced_under_a_live_run_stops_its_next_save(tmp_path):
    import torch

    from nemo_jetrl.utils.checkpoint import CheckpointManager

    locks = lock_run_dirs({"checkpointing.checkpoint_dir": tmp_path / "ckpt"})
    try:
        manager = CheckpointManager(tmp_path / "ckpt")
        manager.save(1, {"step": 1, "w": torch.ones(2)})
        (tmp_path / "ckpt").rename(tmp_path / "moved")
        (tmp_path / "ckpt").mkdir()  # what a second run would now lock and write
        with pytest.raises(RunDirLockedError, match=r"checkpointing\.checkpoint_dir .*ckpt was removed or replaced"):
            manager.save(2, {"step": 2, "w": torch.ones(2)})
        assert list((tmp_path / "ckpt").iterdir()) == []
    finally:
        release_all(locks)


def test_a_removed_lock_file_is_written_again_before_the_next_save(tmp_path):
    from nemo_jetrl.utils.run_lock import verify_held

    locks = lock_run_dirs({"checkpointing.checkpoint_dir": tmp_path})
    try:
        (tmp_path / LOCK_FILE).unlink()
        verify_held(tmp_path)
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()  # a second writer's error names us again
    finally:
        release_all(locks)
