"""Atomic step checkpoints: `<root>/step_<N>/` written to a temp dir, checksummed, then renamed into place.

A checkpoint counts only if its `meta.json` exists and the state file's SHA-256 matches it; anything else (a run killed
mid-save, a truncated or edited file) is skipped with a warning and never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
META_FILE = "meta.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CheckpointManager:
    """Saves `state` dicts per step under `root`, keeps the newest `keep_top_k`, loads the newest valid one."""

    def __init__(self, root: str | Path, keep_top_k: int | None = 3) -> None:
        self.root = Path(root)
        self.keep_top_k = keep_top_k

    def _step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
                out.append((int(p.name[5:]), p))
        return sorted(out)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write atomically: temp dir -> fsync -> rename. Returns the final directory."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step}"
        tmp = self.root / f".tmp_step_{step}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state_path = tmp / STATE_FILE
        with open(state_path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = {"step": step, "sha256": _sha256(state_path), "bytes": state_path.stat().st_size}
        (tmp / META_FILE).write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._prune()
        return final

    def _prune(self) -> None:
        if not self.keep_top_k:
            return
        for _, path in self._step_dirs()[: -self.keep_top_k]:
            shutil.rmtree(path, ignore_errors=True)

    def is_valid(self, path: Path) -> bool:
        meta_path, state_path = path / META_FILE, path / STATE_FILE
        if not (meta_path.is_file() and state_path.is_file()):
            return False
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return meta.get("sha256") == _sha256(state_path)

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that passes its checksum, or None. Invalid ones are skipped with a warning."""
        for step, path in reversed(self._step_dirs()):
            if self.is_valid(path):
                return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
            warnings.warn(f"skipping corrupt or partial checkpoint {path} (step {step})", stacklevel=2)
        return None
