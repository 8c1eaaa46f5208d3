"""Atomic step checkpoints: `<root>/step_<N>/` written to a temp dir, checksummed, then renamed into place.

A checkpoint counts only if its `meta.json` exists, the state file's size and SHA-256 match it and the file loads;
anything else (a run killed mid-save, a truncated or edited file) is skipped with a warning naming the reason and
is never loaded. Leftover temp dirs of a killed save are removed at the next save.

What a GRPO checkpoint holds (see `algorithms/grpo.py`): `policy` (model + optimizer + trainer step), `rng`
(`capture_rng_state()`), `data` (the data position), `step` and the run's `config`. Resume helpers live here too:
`restore_rng_state` and `truncate_metrics_jsonl` (drop lines logged after the resumed step so the file reads as one
run).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "state.pt"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp_step_"


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint directory failed its checks and was skipped."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves `state` dicts per step under `root`, keeps the newest `keep_top_k`, loads the newest valid one."""

    def __init__(self, root: str | Path, keep_top_k: int | None = 3) -> None:
        if keep_top_k is not None and (isinstance(keep_top_k, bool) or int(keep_top_k) < 1):
            raise ValueError(f"checkpointing.keep_top_k must be >= 1 or null, got {keep_top_k!r}")
        self.root = Path(root)
        self.keep_top_k = keep_top_k

    def step_dirs(self) -> list[tuple[int, Path]]:
        """(step, path) of every `step_<N>` directory, oldest first (valid or not)."""
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
        self._remove_stale_temp_dirs()
        final = self.root / f"step_{step}"
        tmp = self.root / f"{TMP_PREFIX}{step}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        state_path = tmp / STATE_FILE
        with open(state_path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = {"step": step, "sha256": _sha256(state_path), "bytes": state_path.stat().st_size}
        with open(tmp / META_FILE, "w") as f:
            f.write(json.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step: move the old one aside first so a valid copy exists at every instant
            old = self.root / f"{TMP_PREFIX}old_{step}_{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        self._prune()
        return final

    def _remove_stale_temp_dirs(self) -> None:
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        if not self.keep_top_k:
            return
        for _, path in self.step_dirs()[: -self.keep_top_k]:
            shutil.rmtree(path, ignore_errors=True)

    def check(self, path: Path) -> str | None:
        """None when `path` is a complete checkpoint whose state file matches its meta.json, else the reason."""
        meta_path, state_path = Path(path) / META_FILE, Path(path) / STATE_FILE
        if not meta_path.is_file():
            return f"no {META_FILE} (partial save)"
        if not state_path.is_file():
            return f"no {STATE_FILE}"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"unreadable {META_FILE} ({err})"
        if not isinstance(meta, dict) or "sha256" not in meta:
            return f"{META_FILE} has no sha256"
        size = state_path.stat().st_size
        if "bytes" in meta and meta["bytes"] != size:
            return f"{STATE_FILE} has {size} bytes, {META_FILE} says {meta['bytes']} (truncated?)"
        if meta["sha256"] != _sha256(state_path):
            return f"{STATE_FILE} does not match its sha256 (corrupted)"
        return None

    def is_valid(self, path: Path) -> bool:
        return self.check(path) is None

    def _try_load(self, path: Path, mmap: bool = False) -> tuple[dict[str, Any] | None, str | None]:
        reason = self.check(path)
        if reason is not None:
            return None, reason
        try:
            return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False, mmap=mmap), None
        except Exception as err:  # noqa: BLE001 - any unpickling failure means "not a usable checkpoint"
            return None, f"{STATE_FILE} does not load ({type(err).__name__}: {err})"

    def load(self, path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
        """Load one checkpoint directory after its checks; ValueError naming the reason when it fails them.

        `mmap=True` maps tensors from the file instead of reading them (export reads the weights, not the optimizer).
        """
        state, reason = self._try_load(Path(path), mmap)
        if state is None:
            raise ValueError(f"checkpoint {path} is not usable: {reason}")
        return state

    def latest_valid(self) -> Path | None:
        """Directory of the newest checkpoint that passes `check` (invalid newer ones skipped with a warning)."""
        for _, path in reversed(self.step_dirs()):
            reason = self.check(path)
            if reason is None:
                return path
            self._warn_skip(path, reason)
        return None

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that passes its checks and loads, or None. Invalid ones are skipped with a warning."""
        for _, path in reversed(self.step_dirs()):
            state, reason = self._try_load(path)
            if state is not None:
                return state
            self._warn_skip(path, reason)
        return None

    @staticmethod
    def _warn_skip(path: Path, reason: str) -> None:
        warnings.warn(f"skipping checkpoint {path}: {reason}", CorruptCheckpointWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------------------------- RNG
def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy (global), torch CPU and every CUDA device's RNG state."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state` (CUDA states only when saved and a GPU is present)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint holds {len(cuda_states)} CUDA RNG states, this machine has {torch.cuda.device_count()} "
                "devices; restoring the common ones",
                stacklevel=2,
            )
        for device, device_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)


# ----------------------------------------------------------------------------------------------------- metrics file
def truncate_metrics_jsonl(path: str | Path, max_step: int) -> int:
    """Drop lines of a metrics.jsonl whose step is > `max_step` (and unreadable lines); returns how many were dropped.

    Rewrites the file atomically (temp file + rename); call it before a Logger opens the file.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
                step = record["step"] if isinstance(record, dict) else None
            except json.JSONDecodeError:
                step = None
            if isinstance(step, int) and not isinstance(step, bool) and step <= max_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if dropped:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped
