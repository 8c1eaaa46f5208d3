"""One writer per run directory: an exclusive `fcntl.flock` on `<dir>/.nemo_jetrl.lock`.

The lock file holds the holder's pid, host and start time (JSON) so a second writer's error names it. The kernel
drops a flock when its process dies (SIGKILL included), so a dead run's lock never blocks the next one; the file
itself stays (deleting it would let two processes lock two different files of one name).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".nemo_jetrl.lock"


class RunDirLockedError(RuntimeError):
    """Another live process writes to this directory."""


class RunDirLock:
    """Exclusive lock on one directory (created when missing); `release()` or a `with` block frees it."""

    def __init__(self, directory: str | Path, role: str) -> None:
        self.directory, self.role = Path(directory), role
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirLockedError(
                f"{self.role} {self.directory} is in use by another run ({holder}); wait for it to end or pick "
                "another directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def lock_run_dirs(dirs: dict[str, str | Path]) -> list[RunDirLock]:
    """Lock each distinct directory of `{role: dir}` (one lock when two roles share a directory); all or none."""
    locks: list[RunDirLock] = []
    seen: set[Path] = set()
    try:
        for role, directory in dirs.items():
            resolved = Path(directory).expanduser().resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            locks.append(RunDirLock(resolved, role).acquire())
    except BaseException:
        release_all(locks)
        raise
    return locks


def release_all(locks: list[RunDirLock]) -> None:
    for lock in reversed(locks):
        lock.release()
