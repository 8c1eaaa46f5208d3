"""The export directory: export never deletes or replaces a file it did not write.

Every export writes `.nemo_jetrl_export.json` listing the files it wrote. A later export into that directory removes
exactly those files first (stale shards of another shard count), and nothing else. Any other non-empty directory
is refused unless `overwrite=True`, which lets the new export replace same-named files but still removes nothing.
The source model directory and the checkpoint directory are never written to. Files are written into a temp dir
inside the target and moved in once complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from huggingface_hub.serialization._base import parse_size_to_int

EXPORT_MARKER = ".nemo_jetrl_export.json"
_STAGING_PREFIX = ".nemo_jetrl_export_tmp."


def check_shard_size(max_shard_size: str | int) -> int:
    """Bytes of `max_shard_size` ("5GB", "500MB" or an int > 0); ValueError otherwise."""
    try:
        size = max_shard_size if isinstance(max_shard_size, int) else parse_size_to_int(max_shard_size)
    except (ValueError, AttributeError):
        size = 0
    if isinstance(size, bool) or size <= 0:
        raise ValueError(f"max shard size must be like '5GB' or a positive int, got {max_shard_size!r}")
    return size


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def earlier_export_files(out: str | Path, *, overwrite: bool, protected: Iterable[str | Path] = ()) -> list[str]:
    """Check `out` before anything is written; returns the files an earlier export of this tool wrote there.

    ValueError when `out` is (inside) a `protected` directory, is not a directory, or is a non-empty directory
    without an export marker and `overwrite` is False.
    """
    out = Path(out).expanduser().resolve()
    for source in protected:
        if _inside(out, Path(source).expanduser().resolve()):
            raise ValueError(f"export directory {out} is inside the source {source}; pick a directory outside it")
    if out.exists() and not out.is_dir():
        raise ValueError(f"export directory {out} exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return []
    marker = out / EXPORT_MARKER
    if marker.is_file():
        try:
            listed = json.loads(marker.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{marker} is unreadable ({err}); remove it or pick a new directory") from None
        return [f for f in listed if isinstance(f, str) and f == Path(f).name and f not in ("", ".", "..")]
    if overwrite:
        return []
    raise ValueError(
        f"export directory {out} is not empty and holds no earlier export ({EXPORT_MARKER}); pick a new directory "
        "or pass --overwrite (same-named files are replaced, nothing else is removed)"
    )


def write_export(out: str | Path, previous: list[str], overwrite: bool, write: Callable[[Path], None]) -> Path:
    """Run `write(staging_dir)`, then move its files into `out` and record them in the marker.

    Removes the `previous` export's files first; a new file that would replace one that no export wrote needs
    `overwrite`. On any failure the staging dir (ours) is removed and `out` keeps what it had.
    """
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f"{_STAGING_PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        write(staging)
        names = sorted(p.name for p in staging.iterdir())
        foreign = [n for n in names if (out / n).exists() and n not in previous]
        if foreign and not overwrite:
            raise ValueError(
                f"export would replace {foreign} in {out}, not written by an earlier export; pass --overwrite"
            )
        for name in previous:
            if (out / name).is_file() and name not in names:
                (out / name).unlink()
        for name in names:
            os.replace(staging / name, out / name)
        (staging / EXPORT_MARKER).write_text(json.dumps({"files": names}, indent=2) + "\n")
        os.replace(staging / EXPORT_MARKER, out / EXPORT_MARKER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
