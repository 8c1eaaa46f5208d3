"""One writer per run directory: an exclusive `fcntl.flock` on the directory itself and on `<dir>/.nemo_jetrl.lock`.

The lock on the directory's own file descriptor holds while its process lives, whatever happens to the files in it
(deleting the lock file frees nothing); the lock file holds the holder's pid, host and start time (JSON) so a
second writer's error names it, and keeps excluding older versions of this tool, which lock only that file. The
kernel drops both when the process dies (SIGKILL included), so a dead run's lock never blocks the next one.

`verify_held(directory)` (called before each checkpoint save) stops a run whose directory was removed or replaced
under it (another run could have locked the new one), and puts a removed lock file back.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".nemo_jetrl.lock"
_HELD: dict[Path, RunDirLock] = {}  # this process's locks by resolved directory


class RunDirLockedError(RuntimeError):
    """Another live process writes to this directory (or it was replaced under this run)."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class RunDirLock:
    """Exclusive lock on one directory (created when missing); `release()` or a `with` block frees it."""

    def __init__(self, directory: str | Path, role: str) -> None:
        self.directory, self.role = Path(directory), role
        self._fd: int | None = None  # the lock file
        self._dir_fd: int | None = None  # the directory itself

    def acquire(self) -> RunDirLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not _try_flock(dir_fd):
                self._refuse(_read_holder_at(self.directory / LOCK_FILE))
            self._fd = self._lock_file()
        except BaseException:
            os.close(dir_fd)
            raise
        self._dir_fd = dir_fd
        _HELD[self.directory.resolve()] = self
        return self

    def _lock_file(self) -> int:
        """Open, lock and fill `<dir>/.nemo_jetrl.lock`; returns its descriptor."""
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _try_flock(fd):
                self._refuse(_read_holder(fd))
            info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _refuse(self, holder: str) -> None:
        raise RunDirLockedError(
            f"{self.role} {self.directory} is in use by another run ({holder}); wait for it to end or pick "
            "another directory"
        )

    def verify(self) -> None:
        """RunDirLockedError when the directory at this path is no longer the one locked; a lock file removed or
        replaced since is written again (the directory lock is what excludes)."""
        if self._dir_fd is None or self._fd is None:
            raise RunDirLockedError(f"{self.role} {self.directory} is not locked by this run")
        try:
            now = _identity(os.stat(self.directory))
        except OSError:
            now = None
        if now != _identity(os.fstat(self._dir_fd)):
            raise RunDirLockedError(
                f"{self.role} {self.directory} was removed or replaced while this run held it; the run stops "
                "before writing there (another run may use the new directory)"
            )
        try:
            lock_file = _identity(os.stat(self.directory / LOCK_FILE))
        except OSError:
            lock_file = None
        if lock_file != _identity(os.fstat(self._fd)):
            fd = self._lock_file()
            os.close(self._fd)
            self._fd = fd

    def release(self) -> None:
        if _HELD.get(self.directory.resolve()) is self:
            del _HELD[self.directory.resolve()]
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        self._fd = self._dir_fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _try_flock(fd: int) -> bool:
    """Take an exclusive flock without waiting: False when another holder has it. A filesystem that cannot flock a
    directory (EBADF / EINVAL / ENOLCK / EOPNOTSUPP, e.g. some network mounts) counts as taken by us: the lock file
    still excludes there."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno not in (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP):
            raise
    return True


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _read_holder_at(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return "holder unknown"
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def verify_held(directory: str | Path) -> None:
    """`RunDirLock.verify` of this process's lock on `directory`; nothing when it holds none there."""
    lock = _HELD.get(Path(directory).expanduser().resolve())
    if lock is not None:
        lock.verify()


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
