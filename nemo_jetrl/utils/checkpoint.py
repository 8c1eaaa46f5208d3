"""Atomic step checkpoints: `<root>/step_<N>/` written to a temp dir, checksummed, then renamed into place.

A checkpoint counts only if its `meta.json` exists, the state file's size and SHA-256 match it and the file loads;
anything else (a run killed mid-save, a truncated or edited file) is skipped with a warning naming the reason and
is never loaded. The SHA-256 proves integrity, not origin: state files are read with `torch.load(weights_only=True)`
(tensors and plain data only), and a file that needs any other object unpickled is refused (`UnsafeCheckpointError`)
before anything in it runs.

Saves write only finite states (`NonFiniteCheckpointError` otherwise) and never touch earlier checkpoints when
they fail (`CheckpointSaveError`, e.g. a full disk). A temp dir is named after its owner (`.tmp_step_<N>.<pid>@<host>`)
and removed by its owner, or by a later save once that process is gone. `keep_top_k` keeps the newest K checkpoints,
or with `metric_name` the best K by that metric (recorded in meta.json) plus the newest one for resume.

What a GRPO checkpoint holds (see `algorithms/grpo.py`): `policy` (model + optimizer + trainer step), `rng`
(`capture_rng_state()`), `data` (the data position), `step` and the run's `config`. Resume helpers live here too:
`restore_rng_state` and `truncate_metrics_jsonl` (drop lines logged after the resumed step so the file reads as one
run).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from nemo_jetrl.utils.rng_state import capture_rng_state, restore_rng_state

__all__ = ["CheckpointManager", "capture_rng_state", "restore_rng_state", "safe_torch_load", "truncate_metrics_jsonl"]

STATE_FILE = "state.pt"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp_step_"
METRIC_SECTIONS = {"val": "validation", "validation": "validation", "train": "train"}


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint directory failed its checks and was skipped."""


class UnsafeCheckpointError(ValueError):
    """A state file needs objects other than tensors and plain data unpickled: refused, nothing in it ran."""


class NonFiniteCheckpointError(ValueError):
    """A state to save holds a NaN or Inf: nothing was written."""


class CheckpointSaveError(OSError):
    """Writing a checkpoint failed (disk full, unwritable directory); earlier checkpoints are untouched."""


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


def safe_torch_load(path: str | Path, *, mmap: bool = False) -> Any:
    """`torch.load(weights_only=True)` on CPU; `UnsafeCheckpointError` naming the first refused global otherwise."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found is None:
            raise  # not a foreign object: a damaged file (refused all the same, nothing ran)
        what = found.group(1)
        raise UnsafeCheckpointError(
            f"{path} needs {what} unpickled (only tensors and plain data are loaded); refused, nothing in it ran"
        ) from None


def first_nonfinite(state: Any, prefix: str = "") -> str | None:
    """Key path (`policy.model.x.weight`) of the first floating tensor or float holding NaN/Inf in a nested state."""
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


def normalize_metric_name(name: str) -> str:
    """`val:accuracy` (NeMo-RL), `val/accuracy` or `validation/accuracy` -> `validation/accuracy`; `train:x` ->
    `train/x`."""
    found = re.fullmatch(r"(\w+)[:/](.+)", name) if isinstance(name, str) else None
    if found is None or found.group(1) not in METRIC_SECTIONS:
        raise ValueError(
            f"checkpointing.metric_name must be 'val:<metric>' or 'train:<metric>' (or val/..., train/...), got {name!r}"
        )
    return f"{METRIC_SECTIONS[found.group(1)]}/{found.group(2)}"


def _owner(tmp_name: str) -> tuple[int, str] | None:
    """(pid, host) of a temp dir `.tmp_step_<N>.<pid>@<host>` (or the older `.tmp_step_<N>_<pid>`, this host)."""
    found = re.search(r"\.(\d+)@(.+)$", tmp_name) or re.search(r"_(\d+)()$", tmp_name)
    if found is None:
        return None
    return int(found.group(1)), found.group(2) or socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    def step_dirs(self) -> list[tuple[int, Path]]:
        """(step, path) of every `step_<N>` directory, oldest first (valid or not)."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
                out.append((int(p.name[5:]), p))
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
        tmp = self.root / f"{TMP_PREFIX}{step}.{self._tag}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temp_dirs()
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            final = self._write_and_publish(step, state, metrics, tmp)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointSaveError(
                f"could not save checkpoint step_{step} in {self.root} ({err.strerror or err}); "
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
        meta = {"step": step, "sha256": _sha256(state_path), "bytes": state_path.stat().st_size}
        if metrics:
            meta["metrics"] = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        with open(tmp / META_FILE, "w") as f:
            f.write(json.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = self.root / f"step_{step}"
        if final.exists():  # re-saving a step: move the old one aside first so a valid copy exists at every instant
            old = self.root / f"{TMP_PREFIX}old{step}.{self._tag}"
            os.replace(final, old)
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(old, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        return final

    def _remove_stale_temp_dirs(self) -> None:
        """Temp dirs of this process, or of processes of this host that are gone; never another live save's."""
        host = socket.gethostname()
        for p in self.root.iterdir():
            if not (p.is_dir() and p.name.startswith(TMP_PREFIX)):
                continue
            owner = _owner(p.name)
            if owner is not None and owner[1] == host and (owner[0] == os.getpid() or not _pid_alive(owner[0])):
                shutil.rmtree(p, ignore_errors=True)

    def _meta(self, path: Path) -> dict[str, Any] | None:
        """meta.json of a checkpoint whose state file has the recorded size (cheap check), else None."""
        try:
            meta = json.loads((path / META_FILE).read_text())
            size = (path / STATE_FILE).stat().st_size
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        return meta if isinstance(meta, dict) and meta.get("bytes", size) == size else None

    def _prune(self) -> None:
        """Keep the newest checkpoint plus the best (or newest) `keep_top_k`; a checkpoint failing the cheap check
        neither counts nor is removed (kept for inspection, never chosen over a good one)."""
        if not self.keep_top_k:
            return
        candidates = [(step, path, meta) for step, path in self.step_dirs() if (meta := self._meta(path))]
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

    def _score(self, meta: dict[str, Any]) -> float:
        """Higher is better; a checkpoint without the metric ranks last."""
        value = (meta.get("metrics") or {}).get(self.metric_name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return -math.inf
        return float(value) if self.higher_is_better else -float(value)

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
        """(state, None), or (None, reason) for a damaged checkpoint; an unsafe one raises UnsafeCheckpointError."""
        reason = self.check(path)
        if reason is not None:
            return None, reason
        try:
            state = safe_torch_load(path / STATE_FILE, mmap=mmap)
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - any other load failure means "not a usable checkpoint"
            return None, f"{STATE_FILE} does not load ({type(err).__name__}: {str(err).splitlines()[0]})"
        if not isinstance(state, dict):
            return None, f"{STATE_FILE} holds a {type(state).__name__}, not a checkpoint dict"
        return state, None

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
        """The newest checkpoint that passes its checks and loads, or None. Damaged ones are skipped with a warning;
        an unsafe one (see `safe_torch_load`) stops the search with UnsafeCheckpointError."""
        for _, path in reversed(self.step_dirs()):
            state, reason = self._try_load(path)
            if state is not None:
                return state
            self._warn_skip(path, reason)
        return None

    @staticmethod
    def _warn_skip(path: Path, reason: str) -> None:
        warnings.warn(f"skipping checkpoint {path}: {reason}", CorruptCheckpointWarning, stacklevel=3)


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


def rotate_metrics_jsonl(path: str | Path) -> Path | None:
    """Move an earlier run's non-empty metrics.jsonl aside as `metrics.<its mtime>.jsonl` (a fresh run starts a new
    file; nothing is lost); returns the new name, or None when there was nothing to move."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    for n in range(1000):
        target = path.with_name(f"{path.stem}.{stamp}{f'.{n}' if n else ''}{path.suffix}")
        if not target.exists():
            os.replace(path, target)
            return target
    raise FileExistsError(f"{path}: too many rotated copies beside it")
