"""Timed kernel picks shared on disk: one choice per machine, not one per process.

The fast FP8 path runs each decode-sized product with the fastest of several kernels, timed once per shape
(`triton_gemm.tuned_config`). The candidates sum in different orders, so two processes that time differently (four
arms sharing a GPU, a second run a day later) round the same weights differently and sample differently. With the
picks in one file, every process on a machine takes the first process's pick for a shape: the first to need it
times it under an exclusive lock, the others wait and read it.

`NEMO_JETRL_TUNE_CACHE` names the file (default `~/.cache/nemo_jetrl/kernel_picks.json`; `off`: time in every
process, as before). A key holds the device name, torch and Triton versions and the candidate list, so another GPU,
library or kernel set times afresh. `used_picks()` lists the picks this process took; `record_used_picks` appends
them to a run's `kernel_picks.jsonl` (a line per process and growth: host, pid, every pick so far), so a run that
resumed on another machine keeps both machines' picks.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "NEMO_JETRL_TUNE_CACHE"
DEFAULT_PATH = Path("~/.cache/nemo_jetrl/kernel_picks.json")
PICKS_FILENAME = "kernel_picks.jsonl"  # a run's picks, in its log directory

_used: dict[str, Any] = {}  # key -> pick taken by this process (JSON values), for the run's record
_recorded: dict[str, int] = {}  # log file -> how many of `_used` it holds


def cache_path() -> Path | None:
    """The shared file, or None where `NEMO_JETRL_TUNE_CACHE=off`."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "0", "false", "none"):
        return None
    return Path(value or DEFAULT_PATH).expanduser()


def _read(path: Path) -> dict[str, Any]:
    try:
        picks = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # a torn or foreign file: timed afresh and rewritten
        print(f"kernel picks: {path} unreadable ({err.__class__.__name__}); timing afresh", flush=True)
        return {}
    return picks if isinstance(picks, dict) else {}


def shared_pick(key: str, tune: Callable[[], Any]) -> Any:
    """The pick stored under `key`, else `tune()`'s (JSON-able) result, stored for every later process. Concurrent
    callers serialize on the file's lock, so a key is timed once per machine."""
    path = cache_path()
    value = _MISSING if path is None or str(path) in _unusable else _from_file(path, key, tune)
    if value is _MISSING:
        value = tune()
    _used[key] = value
    return value


_MISSING = object()
_unusable: set[str] = set()  # files this process could not use (said once each); it times for itself there


def _from_file(path: Path, key: str, tune: Callable[[], Any]) -> Any:
    """`key`'s pick from `path`, timed and stored there when absent; _MISSING (after one line) where the file cannot
    be locked or written (a read-only home, a filesystem without locks): the caller times for itself."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            picks = _read(path)
            if key not in picks:
                picks[key] = tune()
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(picks, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, path)  # readers never see half a file
            return picks[key]
    except OSError as err:
        _unusable.add(str(path))
        print(f"kernel picks: {path} not usable ({err.__class__.__name__}: {err.strerror or err}); each process "
              f"times its own (set {ENV} to a writable file, or off)", flush=True)  # fmt: skip
        return _MISSING


def used_picks() -> dict[str, Any]:
    """The picks this process has taken, by key."""
    return dict(_used)


def record_used_picks(log_dir: str | Path) -> Path | None:
    """Append this process's picks to `<log_dir>/kernel_picks.jsonl` when it took any since its last line there;
    returns the file when it wrote, else None."""
    path = Path(log_dir) / PICKS_FILENAME
    if len(_used) == _recorded.get(str(path), 0):
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"host": os.uname().nodename, "pid": os.getpid(), "picks": dict(sorted(_used.items()))}
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    _recorded[str(path)] = len(_used)
    return path
