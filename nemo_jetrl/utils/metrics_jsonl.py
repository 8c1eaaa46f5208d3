"""The `metrics.jsonl` format: one JSON object per `Logger.log_metrics` call.

Each line is `{"step": <int>, "<key>": <value>, ...}` and is strict JSON (no bare `NaN` tokens): non-finite floats
are written as the strings `"nan"`, `"inf"` and `"-inf"` (Python's `float()` reads them back), so any JSON reader
can parse the file and no value is lost. Readers here also accept `null` (as NaN) and skip lines they cannot read
(`parse_metrics_line`: a truncated last line of a killed run, invalid UTF-8, a record without an integer "step").
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path

import numpy as np

NON_FINITE_SPELLINGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def to_scalar(key: str, value: object) -> int | float:
    """A plain Python int/float from a number, bool, numpy scalar or one-element tensor; ValueError otherwise."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    # 0-d numpy arrays and one-element torch tensors (`.numel()` for tensors, `.size` for arrays)
    numel = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", None)
    if numel == 1 and callable(getattr(value, "item", None)):
        return to_scalar(key, value.item())
    raise ValueError(f"metric {key!r} must be a real number (int, float, bool, or a one-element tensor), got {value!r}")


def json_safe(value: int | float) -> int | float | str:
    """`value` unchanged when finite, else its spelling in `NON_FINITE_SPELLINGS`."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def encode_metrics_line(metrics: Mapping[str, int | float], step: int) -> str:
    """One strict-JSON line (no trailing newline) for `metrics` at `step`; `metrics` must not contain "step"."""
    if "step" in metrics:
        raise ValueError("metric name 'step' is reserved for the step counter in metrics.jsonl")
    record: dict[str, int | float | str] = {"step": int(step)}
    for key, value in metrics.items():
        record[key] = json_safe(value)
    return json.dumps(record, allow_nan=False)


def decode_value(value: object) -> float | None:
    """A float from a stored value: numbers, `null` (NaN) and the non-finite spellings; None for anything else."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # accepts "nan", "inf", "-inf", "NaN", "Infinity", ...
        except ValueError:
            return None
    return None


def parse_metrics_line(raw: bytes | str) -> dict | None:
    """The record of one metrics.jsonl line: a JSON object with an integer "step"; None for anything else (invalid
    UTF-8, not JSON, not an object, no step or one that is not an int64, a number JSON cannot hold)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        record = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    ok = isinstance(step, int) and not isinstance(step, bool) and -(2**63) <= step < 2**63  # an int64 step
    return record if ok else None


def read_metrics_jsonl(path: Path | str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Series per key from a metrics.jsonl: `{key: (steps [n] int64, values [n] float64)}`, sorted by step.

    Lines `parse_metrics_line` cannot read are skipped; values that are not numbers (after decoding the non-finite
    spellings) are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metrics file not found: {path}")
    steps: dict[str, list[int]] = {}
    values: dict[str, list[float]] = {}
    with path.open("rb") as f:
        for line in f:
            record = parse_metrics_line(line)
            if record is None:
                continue
            step = record["step"]
            for key, raw in record.items():
                if key == "step":
                    continue
                value = decode_value(raw)
                if value is None:
                    continue
                steps.setdefault(key, []).append(step)
                values.setdefault(key, []).append(value)
    series = {}
    for key in steps:
        s = np.asarray(steps[key], dtype=np.int64)
        v = np.asarray(values[key], dtype=np.float64)
        order = np.argsort(s, kind="stable")
        series[key] = (s[order], v[order])
    return series


POSITION_PREFIX = "train/mismatch_pos/"  # grpo.mismatch_position_bin's metrics: one per bin of response positions


def position_curve(series: dict[str, tuple[np.ndarray, np.ndarray]], skip: int = 0) -> dict[int, float]:
    """{bin start: mean over the steps after `skip` of train/mismatch_pos/<start>} from `read_metrics_jsonl`'s
    series, by bin start."""
    out = {}
    for key, (steps, values) in series.items():
        kept = values[(steps > skip) & np.isfinite(values)] if key.startswith(POSITION_PREFIX) else ()
        if len(kept):
            out[int(key.removeprefix(POSITION_PREFIX))] = float(np.mean(kept))
    return dict(sorted(out.items()))
