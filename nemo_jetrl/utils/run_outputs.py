"""A log directory across runs: nothing an earlier run wrote there is overwritten or deleted.

- A fresh start (no checkpoint loaded) moves the earlier run's outputs aside before the Logger opens its files
  (`move_earlier_outputs`): `metrics.jsonl` -> `metrics.<stamp>.jsonl`, `config.yaml` -> `config.<stamp>.yaml`, the
  PNGs of `plots/` -> `plots.<stamp>/`, TensorBoard event files of `tensorboard/` -> `tensorboard.<stamp>/`; the
  stamp is the earlier metrics file's modification time. Other files in the directory are left alone.
- A resume trims metrics.jsonl to the checkpoint's step (`trim_metrics_for_resume`) so the file reads as one run;
  the lines it drops (logged after that step, or unreadable: see `metrics_jsonl.parse_metrics_line`) are first
  written, byte for byte, to `metrics.dropped.<stamp>.jsonl` beside it.
- `Logger.log_config` moves an earlier `config.yaml` aside when the new one differs (a resume with other settings).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nemo_jetrl.utils.aside import aside_path, move_aside, stamp_of
from nemo_jetrl.utils.logger import PLOTS_DIRNAME
from nemo_jetrl.utils.logger_backends import CONFIG_FILENAME, METRICS_FILENAME, TENSORBOARD_DIRNAME
from nemo_jetrl.utils.metrics_jsonl import parse_metrics_line

# directory of an earlier run's outputs -> the file names in it this project writes
_OUTPUT_DIRS = {PLOTS_DIRNAME: "*.png", TENSORBOARD_DIRNAME: "events.out.tfevents.*"}


def move_earlier_outputs(log_dir: str | Path) -> list[tuple[Path, Path]]:
    """Move an earlier run's outputs in `log_dir` aside (see the module docstring); returns (old, new) paths."""
    log_dir = Path(log_dir)
    metrics, config = log_dir / METRICS_FILENAME, log_dir / CONFIG_FILENAME
    files = [p for p in (metrics, config) if p.is_file() and not (p == metrics and p.stat().st_size == 0)]
    groups = {
        log_dir / name: sorted(p for p in (log_dir / name).glob(pattern) if p.is_file())
        for name, pattern in _OUTPUT_DIRS.items()
        if (log_dir / name).is_dir()
    }
    groups = {d: found for d, found in groups.items() if found}
    if not files and not groups:
        return []
    stamp = stamp_of(metrics if metrics.is_file() else (files or list(groups))[0])
    moved = [(p, move_aside(p, stamp)) for p in files]
    for directory, found in groups.items():
        target = aside_path(directory, stamp)
        target.mkdir()
        for p in found:
            os.replace(p, target / p.name)
        moved.append((directory, target))
    return moved


@dataclass(frozen=True)
class MetricsTrim:
    """What `trim_metrics_for_resume` did: lines logged after the step, unreadable lines, where they went."""

    after_step: int = 0
    unreadable: int = 0
    moved_to: Path | None = None

    def line(self, path: Path, step: int) -> str | None:
        """One console line naming the file and the counts; None when nothing was dropped."""
        if self.moved_to is None:
            return None
        parts = [f"{self.after_step} line(s) logged after step {step}"] if self.after_step else []
        parts += [f"{self.unreadable} unreadable line(s)"] if self.unreadable else []
        return f"{path}: {' and '.join(parts)} moved to {self.moved_to} (resuming from step {step})"


def trim_metrics_for_resume(path: str | Path, step: int) -> MetricsTrim:
    """Keep the lines of metrics.jsonl at steps <= `step`; move the others (and unreadable ones) aside first."""
    path = Path(path)
    if not path.is_file():
        return MetricsTrim()
    kept: list[bytes] = []
    dropped: list[bytes] = []
    after = unreadable = 0
    for raw in path.read_bytes().splitlines(keepends=True):
        if not raw.strip():
            continue
        record = parse_metrics_line(raw)
        if record is not None and record["step"] <= step:
            kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
            continue
        after, unreadable = (after + 1, unreadable) if record is not None else (after, unreadable + 1)
        dropped.append(raw if raw.endswith(b"\n") else raw + b"\n")
    if not dropped:
        return MetricsTrim()
    target = aside_path(path.with_name(f"{path.stem}.dropped{path.suffix}"), stamp_of(path))
    _write_synced(target, b"".join(dropped))  # the dropped lines exist on disk before the file loses them
    tmp = path.with_suffix(path.suffix + ".tmp")
    _write_synced(tmp, b"".join(kept))
    os.replace(tmp, path)
    return MetricsTrim(after, unreadable, target)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
