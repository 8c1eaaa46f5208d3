"""The files of one checkpoint and how they are read: names, checksums, the weights-only load, temp-dir owners.

`safe_torch_load` reads a state file with `torch.load(weights_only=True)` (tensors and plain data only); anything
its unpickler refuses (a GLOBAL of any module, or opcodes it does not know, e.g. a protocol-0 payload) is
`UnsafeCheckpointError`, raised before anything in the file runs. `first_nonfinite` finds a NaN/Inf in a nested
state (what `CheckpointManager.save` refuses to write). `normalize_metric_name` reads the names the metrics in
meta.json are ranked by (`checkpointing.metric_name`).
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import re
import socket
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp_step_"
_STEP_DIR = re.compile(r"step_(\d+)")
METRIC_SECTIONS = {"val": "validation", "validation": "validation", "train": "train"}


def normalize_metric_name(name: str) -> str:
    """`val:accuracy` (NeMo-RL), `val/accuracy` or `validation/accuracy` -> `validation/accuracy`; `train:x` ->
    `train/x`."""
    found = re.fullmatch(r"(\w+)[:/](.+)", name) if isinstance(name, str) else None
    if found is None or found.group(1) not in METRIC_SECTIONS:
        raise ValueError(
            f"checkpointing.metric_name: {name!r} is not 'val:<metric>' or 'train:<metric>' (or val/..., train/...)"
        )
    return f"{METRIC_SECTIONS[found.group(1)]}/{found.group(2)}"


class UnsafeCheckpointError(ValueError):
    """A state file needs objects other than tensors and plain data unpickled: refused, nothing in it ran."""


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_key(path: Path) -> tuple | None:
    """Identity of a checkpoint's two files as they are now (inode, size, modification and change times); None
    when one is missing. The change time moves on any write or `utime`, so an edit cannot keep the key."""
    try:
        stats = [os.stat(path / name) for name in (STATE_FILE, META_FILE)]
    except OSError:
        return None
    return tuple((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for st in stats)


def dir_step(path: Path) -> int | None:
    found = _STEP_DIR.fullmatch(Path(path).name)
    return int(found.group(1)) if found else None


def one_line(err: BaseException) -> str:
    """`Type: first line of the message` (OSError: its strerror)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def safe_torch_load(path: str | Path, *, mmap: bool = False) -> Any:
    """`torch.load(weights_only=True)` on CPU; `UnsafeCheckpointError` for anything its unpickler refuses."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found is not None:
            what = f"needs {found.group(1)} unpickled (only tensors and plain data are loaded)"
        else:  # e.g. a protocol-0 payload: its opcodes are refused before any global is looked up
            detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(err))
            what = f"holds pickle data the weights-only loader refuses ({detail.group(1) if detail else one_line(err)})"
        raise UnsafeCheckpointError(f"{path} {what}; refused, nothing in it ran") from None


def first_nonfinite(state: Any, prefix: str = "") -> str | None:
    """Key path (`policy.model.<name>.weight`) of the first floating tensor or float holding NaN/Inf in a nested state."""
    named: list[tuple[str, torch.Tensor]] = []

    def walk(obj: Any, path: str) -> str | None:
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() and obj.numel():
                named.append((path, obj if obj.element_size() > 1 else obj.float()))  # fp8: no norm kernel
        elif isinstance(obj, float) and not math.isfinite(obj):
            return path
        elif isinstance(obj, dict):
            for k, v in obj.items():
                found = walk(v, f"{path}.{k}" if path else str(k))
                if found:
                    return found
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                found = walk(v, f"{path}.{i}" if path else str(i))
                if found:
                    return found
        return None

    found = walk(state, prefix)
    if found or not named:
        return found
    amax = torch._foreach_norm([t for _, t in named], float("inf"))  # max |x| per tensor; NaN propagates
    ok = torch.stack([a.float().cpu() for a in amax]).isfinite()
    if bool(ok.all()):
        return None
    return named[int((~ok).nonzero()[0])][0]


def tmp_owner(tmp_name: str) -> tuple[int, str] | None:
    """(pid, host) of a temp dir `.tmp_step_<N>.<pid>@<host>` (or the older `.tmp_step_<N>_<pid>`, this host)."""
    found = re.search(r"\.(\d+)@(.+)$", tmp_name) or re.search(r"_(\d+)()$", tmp_name)
    if found is None:
        return None
    return int(found.group(1)), found.group(2) or socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
