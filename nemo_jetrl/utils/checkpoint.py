"""Atomic step checkpoints: `<root>/step_<N>/` written to a temp dir, checksummed, then renamed into place.

A checkpoint counts (for resume, `keep_top_k` and rotation) only once its content is verified: `meta.json` exists
and the state file's size and SHA-256 match it (a verification is remembered while the files' inode, size and
change times stay the same, so rotation re-reads a file only when it changed). Anything else (a run killed
mid-save, a truncated or edited file) is skipped with a warning naming the reason, never loaded and never deleted:
a directory at `step_<N>` that this manager did not write (damaged, or another tool's / the user's files) is moved
aside as `step_<N>.aside.<stamp>` with a warning when the run saves its own step N.

The SHA-256 proves integrity, not origin. State files are read with `torch.load(weights_only=True)` (tensors and
plain data only); a file the weights-only unpickler refuses (any pickle protocol) is refused with
`UnsafeCheckpointError` before anything in it runs, and a verified file whose content contradicts its directory
(another step, not a dict, does not load) with `CheckpointMismatchError`: both stop the search and keep the file.

Saves write only finite states (`NonFiniteCheckpointError` otherwise); any failure of a save (a full disk: torch's
writer raises RuntimeError) removes only its own temp dir and raises `CheckpointSaveError` (one line), earlier
checkpoints untouched. A temp dir is named after its owner (`.tmp_step_<N>.<pid>@<host>`) and removed by its owner,
or by a later save once that process is gone. Before each save the run's lock on `root` is verified
(`run_lock.verify_held`). `keep_top_k` keeps the newest K verified checkpoints, or with `metric_name` the best K by
that metric (recorded in meta.json) plus the newest one for resume.

What a GRPO checkpoint holds (see `algorithms/grpo_checkpoint.py`): `policy` (model + optimizer + trainer step),
`rng` (`capture_rng_state()`), `data` (the data position), `step` and the run's `config`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import warnings
from pathlib import Path
from typing import Any

import torch

from nemo_jetrl.utils.aside import move_aside
from nemo_jetrl.utils.checkpoint_files import (
    META_FILE,
    STATE_FILE,
    TMP_PREFIX,
    UnsafeCheckpointError,
    dir_step,
    files_key,
    first_nonfinite,
    fsync_dir,
    normalize_metric_name,
    one_line,
    pid_alive,
    safe_torch_load,
    sha256_file,
    tmp_owner,
)
from nemo_jetrl.utils.rng_state import capture_rng_state, restore_rng_state
from nemo_jetrl.utils.run_lock import verify_held

__all__ = [
    "META_FILE",
    "STATE_FILE",
    "CheckpointManager",
    "UnsafeCheckpointError",
    "capture_rng_state",
    "first_nonfinite",
    "normalize_metric_name",
    "restore_rng_state",
    "safe_torch_load",
]

ASIDE_TAG = "aside"


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint directory failed its checks and was skipped (kept, never deleted)."""


class MovedAsideWarning(UserWarning):
    """A `step_<N>` this manager did not write was renamed out of the way of its own step N (nothing deleted)."""


class CheckpointMismatchError(ValueError):
    """A checkpoint passes its checksum but its content contradicts its directory: refused, kept as it is."""


class NonFiniteCheckpointError(ValueError):
    """A state to save holds a NaN or Inf: nothing was written."""


class CheckpointSaveError(OSError):
    """Writing a checkpoint failed (disk full, unwritable directory); earlier checkpoints are untouched."""


class CheckpointManager:
    """Saves `state` dicts per step under `root`, keeps `keep_top_k` of them, loads the newest valid one.

    `metric_name` (`val:accuracy`, `train/reward_mean`, ...): keep the best `keep_top_k` by that metric
    (`higher_is_better`) and always the newest; None keeps the newest `keep_top_k`.
    """

    def __init__(
        self,
        root: str | Path,
        keep_top_k: int | None = 3,
        *,
        metric_name: str | None = None,
        higher_is_better: bool = True,
    ) -> None:
        if keep_top_k is not None and (isinstance(keep_top_k, bool) or int(keep_top_k) < 1):
            raise ValueError(f"checkpointing.keep_top_k must be >= 1 or null, got {keep_top_k!r}")
        self.root = Path(root)
        self.keep_top_k = keep_top_k
        self.metric_name = normalize_metric_name(metric_name) if metric_name is not None else None
        self.higher_is_better = bool(higher_is_better)
        self._tag = f"{os.getpid()}@{socket.gethostname()}"
        self._verified: dict[Path, tuple] = {}  # step dir -> `_files_key` when its checksum last matched
        self._written: dict[Path, tuple] = {}  # step dirs this manager published -> `_files_key` right after

    def step_dirs(self) -> list[tuple[int, Path]]:
        """(step, path) of every `step_<N>` directory, oldest first (valid or not)."""
        if not self.root.is_dir():
            return []
        out = [(dir_step(p), p) for p in self.root.iterdir() if p.is_dir() and dir_step(p) is not None]
        return sorted(out)

    def save(self, step: int, state: dict[str, Any], metrics: dict[str, float] | None = None) -> Path:
        """Write atomically: temp dir -> fsync -> rename. Returns the final directory.

        `metrics` (e.g. {"validation/accuracy": 0.5}) go to meta.json for `metric_name` ranking.
        """
        bad = first_nonfinite(state)
        if bad is not None:
            raise NonFiniteCheckpointError(
                f"refusing to save checkpoint step_{step}: non-finite {bad}; earlier checkpoints are untouched"
            )
        verify_held(self.root)  # this run still owns the directory (RunDirLockedError otherwise)
        tmp = self.root / f"{TMP_PREFIX}{step}.{self._tag}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temp_dirs()
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            final = self._write_and_publish(step, state, metrics, tmp)
        except BaseException as err:  # a full disk makes torch's writer raise RuntimeError, not OSError
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(err, Exception):
                raise
            free = shutil.disk_usage(self.root).free if self.root.is_dir() else None
            space = f"; {free / 2**20:.0f} MiB free there" if free is not None else ""
            raise CheckpointSaveError(
                f"could not save checkpoint step_{step} in {self.root} ({one_line(err)}{space}); "
                "earlier checkpoints are untouched"
            ) from err
        self._prune()
        return final

    def _write_and_publish(self, step: int, state: dict[str, Any], metrics: dict | None, tmp: Path) -> Path:
        state_path = tmp / STATE_FILE
        with open(state_path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = {"step": step, "sha256": sha256_file(state_path), "bytes": state_path.stat().st_size}
        if metrics:
            meta["metrics"] = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        with open(tmp / META_FILE, "w") as f:
            f.write(json.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        final = self.root / f"step_{step}"
        key = files_key(final)
        ours = key is not None and self._written.get(final) == key
        if ours:  # re-saving a step this manager wrote: the old copy goes only once the new one is in place
            old = self.root / f"{TMP_PREFIX}old{step}.{self._tag}"
            os.replace(final, old)
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(old, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            if os.path.lexists(final):
                self._move_aside(final)
            os.replace(tmp, final)
        fsync_dir(self.root)
        key = files_key(final)
        self._written[final] = self._verified[final] = key
        return final

    def _move_aside(self, path: Path) -> Path:
        """Rename a `step_<N>` this manager did not write (damaged, foreign, the user's) out of the way, with a line."""
        why = self.check(path) if path.is_dir() else "not a directory"
        what = f"is not a checkpoint of this run ({why})" if why else "was written by another run"
        target = move_aside(path, tag=ASIDE_TAG)
        warnings.warn(
            f"{path} {what}: moved aside to {target} before saving this step (kept for inspection, nothing deleted)",
            MovedAsideWarning,
            stacklevel=4,
        )
        return target

    def _remove_stale_temp_dirs(self) -> None:
        """Temp dirs of this process, or of processes of this host that are gone; never another live save's."""
        host = socket.gethostname()
        for p in self.root.iterdir():
            if not (p.is_dir() and p.name.startswith(TMP_PREFIX)):
                continue
            owner = tmp_owner(p.name)
            if owner is not None and owner[1] == host and (owner[0] == os.getpid() or not pid_alive(owner[0])):
                shutil.rmtree(p, ignore_errors=True)

    def _verified_meta(self, path: Path) -> dict[str, Any] | None:
        """meta.json of a checkpoint whose content is verified (checksum now, or unchanged since it matched)."""
        key = files_key(path)
        if key is None or (self._verified.get(path) != key and self.check(path) is not None):
            return None
        try:
            meta = json.loads((path / META_FILE).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        return meta if isinstance(meta, dict) else None

    def _prune(self) -> None:
        """Keep the newest verified checkpoint plus the best (or newest) `keep_top_k` verified ones; a checkpoint
        failing verification neither counts nor is removed (kept for inspection, never chosen over a good one)."""
        if not self.keep_top_k:
            return
        candidates = [(step, path, meta) for step, path in self.step_dirs() if (meta := self._verified_meta(path))]
        if not candidates:
            return
        keep = {candidates[-1][0]}
        if self.metric_name is None:
            ranked = sorted(candidates, key=lambda c: c[0], reverse=True)
        else:
            ranked = sorted(candidates, key=lambda c: (self._score(c[2]), c[0]), reverse=True)
        keep.update(step for step, _, _ in ranked[: self.keep_top_k])
        for step, path, _ in candidates:
            if step not in keep:
                shutil.rmtree(path, ignore_errors=True)
                self._verified.pop(path, None)
                self._written.pop(path, None)

    def _score(self, meta: dict[str, Any]) -> float:
        """Higher is better; a checkpoint without the metric ranks last."""
        value = (meta.get("metrics") or {}).get(self.metric_name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return -math.inf
        return float(value) if self.higher_is_better else -float(value)

    def check(self, path: Path) -> str | None:
        """None when `path` is a complete checkpoint whose state file matches its meta.json, else the reason."""
        path = Path(path)
        meta_path, state_path = path / META_FILE, path / STATE_FILE
        if not meta_path.is_file():
            return f"no {META_FILE} (partial save)"
        if not state_path.is_file():
            return f"no {STATE_FILE}"
        key = files_key(path)
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"unreadable {META_FILE} ({err})"
        if not isinstance(meta, dict) or "sha256" not in meta:
            return f"{META_FILE} has no sha256"
        size = state_path.stat().st_size
        if "bytes" in meta and meta["bytes"] != size:
            return f"{STATE_FILE} has {size} bytes, {META_FILE} says {meta['bytes']} (truncated?)"
        if meta["sha256"] != sha256_file(state_path):
            return f"{STATE_FILE} does not match its sha256 (corrupted)"
        if key is not None and key == files_key(path):  # unchanged while it was read
            self._verified[path] = key
        return None

    def is_valid(self, path: Path) -> bool:
        return self.check(path) is None

    def _try_load(self, path: Path, mmap: bool = False) -> tuple[dict[str, Any] | None, str | None]:
        """(state, None), or (None, reason) for a damaged checkpoint. A verified one whose content cannot be
        trusted raises: UnsafeCheckpointError (refused unpickling) or CheckpointMismatchError."""
        reason = self.check(path)
        if reason is not None:
            return None, reason
        try:
            state = safe_torch_load(path / STATE_FILE, mmap=mmap)
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - verified bytes that do not load: not written by this save
            self._refuse(path, f"its {STATE_FILE} does not load ({one_line(err)})")
        problem = _content_problem(path, state)
        if problem is not None:
            self._refuse(path, problem)
        return state, None

    @staticmethod
    def _refuse(path: Path, problem: str) -> None:
        raise CheckpointMismatchError(
            f"checkpoint {path} passes its checksum but {problem}: copied in or edited? Move it aside (or delete "
            "it) to resume from the checkpoint before it; it is kept as it is"
        )

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

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        """(directory, state) of the newest checkpoint that passes its checks and loads, or None. Damaged ones are
        skipped with a warning; an untrusted verified one (see `_try_load`) stops the search with its error."""
        for _, path in reversed(self.step_dirs()):
            state, reason = self._try_load(path)
            if state is not None:
                return path, state
            self._warn_skip(path, reason)
        return None

    def load_latest(self) -> dict[str, Any] | None:
        """The state of `latest()`, or None."""
        found = self.latest()
        return found[1] if found is not None else None

    @staticmethod
    def _warn_skip(path: Path, reason: str) -> None:
        warnings.warn(f"skipping checkpoint {path}: {reason}", CorruptCheckpointWarning, stacklevel=3)


def checkpoint_root(path: str | Path) -> Path:
    """The checkpoint directory a path belongs to: the parent of a step directory (`step_*`, or one holding a
    meta.json: what export reads as one checkpoint), else the path itself."""
    path = Path(path)
    return path.parent if path.name.startswith("step_") or (path / META_FILE).is_file() else path


def _content_problem(path: Path, state: Any) -> str | None:
    """Why a loaded state contradicts its directory `step_<N>` (not a dict, meta.json or `step` another step)."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a checkpoint dict"
    expected = dir_step(path)
    if expected is None:
        return None
    try:
        meta_step = json.loads((path / META_FILE).read_text()).get("step", expected)
    except (OSError, ValueError, AttributeError):
        meta_step = expected
    if meta_step != expected:
        return f"its {META_FILE} says step {meta_step!r}, not {expected}"
    if "step" in state:
        value = state["step"]
        if isinstance(value, bool) or not isinstance(value, int) or value != expected:
            return f"its 'step' is {value!r}, not {expected}"
    return None
