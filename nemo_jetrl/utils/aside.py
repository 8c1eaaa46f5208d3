"""Moving a file or directory aside instead of overwriting or deleting it: `metrics.jsonl` ->
`metrics.<stamp>.jsonl`, `plots/` -> `plots.<stamp>/`, `step_3/` -> `step_3.aside.<stamp>/` (a `.1`, `.2`, ...
before the suffix when that name is taken). The stamp is the path's own modification time, so the new name says
when the earlier run wrote it."""

from __future__ import annotations

import os
import time
from pathlib import Path

MAX_COPIES = 1000  # names tried per stamp before giving up


def stamp_of(path: Path) -> str:
    """`YYYYmmdd-HHMMSS` of `path`'s modification time (now when it cannot be read)."""
    try:
        mtime = path.lstat().st_mtime
    except OSError:
        mtime = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(mtime))


def aside_path(path: Path, stamp: str, tag: str = "") -> Path:
    """A free name beside `path`: `<stem>.[<tag>.]<stamp>[.<n>]<suffix>` (directories keep no suffix apart)."""
    path = Path(path)
    stem, suffix = (path.name, "") if path.is_dir() and not path.is_symlink() else (path.stem, path.suffix)
    middle = f"{tag}.{stamp}" if tag else stamp
    for n in range(MAX_COPIES):
        target = path.with_name(f"{stem}.{middle}{f'.{n}' if n else ''}{suffix}")
        if not os.path.lexists(target):
            return target
    raise FileExistsError(f"{path}: too many copies moved aside beside it")


def move_aside(path: Path, stamp: str | None = None, tag: str = "") -> Path:
    """Rename `path` (file, directory or link) to a free name beside it; returns the new path."""
    path = Path(path)
    target = aside_path(path, stamp or stamp_of(path), tag)
    os.replace(path, target)
    return target
