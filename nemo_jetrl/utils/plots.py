"""PNG plots of a run's metrics.jsonl (matplotlib Agg canvas: no display, no pyplot global state).

`plot_run(metrics_jsonl, out_dir)` draws up to three figures, each skipped when none of its keys were logged:
- `reward_accuracy.png`: train/reward_mean (faint raw + smoothed) and validation/accuracy per step;
- `mismatch.png`: the rollout-vs-trainer mismatch metrics (train/token_mult_prob_error, KL / JS estimates on a log
  scale, sampling_importance_ratio, is_oob_ratio);
- `mismatch_position.png`: token_mult_prob_error - 1 per bin of response positions (`grpo.mismatch_position_bin`);
- `timing.png`: timing/* phases stacked per step, with the step total as a line and sub-phases ("a/b") apart.
`plot_comparison(runs, out)` overlays several runs (e.g. bf16 / fp8 / fp8 rollout only) key by key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from nemo_jetrl.utils.metrics_jsonl import position_curve, read_metrics_jsonl

Series = tuple[np.ndarray, np.ndarray]  # (steps [n] int64, values [n] float64)

REWARD_KEY = "train/reward_mean"
ACCURACY_KEY = "validation/accuracy"
TOKEN_MULT_PROB_ERROR = "token_mult_prob_error"
KL_LIKE_METRICS = ("gen_kl_error", "policy_kl_error", "js_divergence_error")
IMPORTANCE_RATIO = "sampling_importance_ratio"
OOB_RATIO = "is_oob_ratio"
TOKEN_MULT_PROB_ACCEPTABLE = 1.05  # NeMo-RL's rule of thumb for a healthy rollout/trainer match
TOTAL_TIMING_NAMES = ("total_step_time", "total", "step", "step_time")
DEFAULT_COMPARISON_KEYS = (REWARD_KEY, ACCURACY_KEY, f"train/{TOKEN_MULT_PROB_ERROR}", "timing/total_step_time")
PANEL_SIZE = (5.6, 3.6)  # inches per subplot
DPI = 110
MAX_BARS = 80  # more steps than this: stacked areas instead of bars


def ema_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard-style debiased exponential moving average; NaN/inf inputs are skipped (output stays NaN there)."""
    # values: [n] -> [n]
    out = np.full_like(values, np.nan, dtype=np.float64)
    last, norm = 0.0, 0.0
    for i, v in enumerate(values):
        if not math.isfinite(v):
            continue
        last = weight * last + (1.0 - weight) * v
        norm = weight * norm + (1.0 - weight)
        out[i] = last / norm
    return out


def auto_smoothing_weight(n: int) -> float:
    """EMA weight with a span of ~n/15 points (1..50): 0 (no smoothing) for short runs."""
    span = min(max(n / 15.0, 1.0), 50.0)
    return 1.0 - 2.0 / (span + 1.0)


def _new_figure(num_panels: int, title: str, max_cols: int = 2, width: float = 1.0) -> tuple[Figure, list[Axes]]:
    cols = min(num_panels, max_cols)
    rows = math.ceil(num_panels / cols)
    size = (PANEL_SIZE[0] * cols * width, PANEL_SIZE[1] * rows + 0.4)
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel())
    for ax in axes[num_panels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    return fig, axes[:num_panels]


def _style(ax: Axes, title: str, ylabel: str, legend_outside: bool = False) -> None:
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not ax.get_legend_handles_labels()[0]:
        return
    if legend_outside:  # many stacked phases: keep the bars visible
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8, framealpha=0.8)


def _save(fig: Figure, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, format="png")
    tmp.replace(path)  # atomic: an image viewer never sees half a PNG while training refreshes it
    return path


def _plot_noisy(ax: Axes, series: Series, label: str, color: str | None, smoothing: float | None) -> float:
    """Faint raw line + smoothed line (just the raw line, solid, when there is nothing to smooth); the EMA weight."""
    steps, values = series
    weight = auto_smoothing_weight(len(values)) if smoothing is None else smoothing
    if weight <= 0.0 or len(values) < 3:
        ax.plot(steps, values, color=color, marker="o" if len(values) < 30 else None, ms=3, label=label)
        return 0.0
    (raw,) = ax.plot(steps, values, color=color, alpha=0.25, lw=1.0)
    ax.plot(steps, ema_smooth(values, weight), color=raw.get_color(), lw=2.0, label=label)
    return weight


def _smoothing_note(weight: float) -> str:
    return f"  (faint: raw, solid: EMA {weight:.2f})" if weight > 0 else ""


def _lookup(series: Mapping[str, Series], name: str) -> tuple[str, Series] | None:
    """A mismatch metric is logged as "train/<name>" by the GRPO loop; accept the bare name too."""
    for key in (f"train/{name}", name):
        if key in series:
            return key, series[key]
    return None


def _set_log_or_symlog(ax: Axes, values: Sequence[np.ndarray]) -> None:
    """Log y when every finite value is > 0, symlog when some are <= 0 (KL estimates can dip below 0)."""
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    if finite.size == 0:
        return
    if np.all(finite > 0):
        ax.set_yscale("log")
    else:
        positive = np.abs(finite[finite != 0])
        ax.set_yscale("symlog", linthresh=float(positive.min()) if positive.size else 1e-6)


def plot_reward_accuracy(series: Mapping[str, Series], path: Path, smoothing: float | None = None) -> Path | None:
    panels = [key for key in (REWARD_KEY, ACCURACY_KEY) if key in series]
    if not panels:
        return None
    fig, axes = _new_figure(len(panels), "Reward and accuracy")
    for ax, key in zip(axes, panels):
        if key == REWARD_KEY:
            weight = _plot_noisy(ax, series[key], "reward mean", "tab:blue", smoothing)
            _style(ax, "Training reward" + _smoothing_note(weight), "mean reward per rollout")
        else:
            steps, values = series[key]
            ax.plot(steps, values, color="tab:green", marker="o", ms=4, label="validation accuracy")
            _style(ax, "Validation accuracy", "accuracy")
    return _save(fig, path)


def plot_mismatch(series: Mapping[str, Series], path: Path) -> Path | None:
    token = _lookup(series, TOKEN_MULT_PROB_ERROR)
    kls = [found for name in KL_LIKE_METRICS if (found := _lookup(series, name))]
    ratio = _lookup(series, IMPORTANCE_RATIO)
    oob = _lookup(series, OOB_RATIO)
    panels = [p for p in (("token", token), ("kl", kls), ("ratio", ratio), ("oob", oob)) if p[1]]
    if not panels:
        return None
    fig, axes = _new_figure(len(panels), "Rollout vs trainer mismatch")
    for ax, (kind, found) in zip(axes, panels):
        if kind == "token":
            key, (steps, values) = found
            ax.plot(steps, values, color="tab:red", marker=".", label=key)
            ax.axhline(1.0, color="gray", lw=0.8, ls=":")
            if np.nanmax(np.where(np.isfinite(values), values, np.nan), initial=1.0) > 1.02:
                ax.axhline(TOKEN_MULT_PROB_ACCEPTABLE, color="tab:orange", ls="--", lw=1, label="1.05 guidance")
            _style(ax, "Token multiplicative prob. error  mean(exp|Δlogp|)", "error (1 = identical)")
        elif kind == "kl":
            for key, (steps, values) in found:
                ax.plot(steps, values, marker=".", label=key)
            _set_log_or_symlog(ax, [values for _, (_, values) in found])
            _style(ax, "KL / JS divergence estimates", "nats")
        elif kind == "ratio":
            key, (steps, values) = found
            ax.plot(steps, values, color="tab:purple", marker=".", label=key)
            ax.axhline(1.0, color="gray", lw=0.8, ls=":")
            _style(ax, "Sampling importance ratio  mean(w)", "ratio (1 = on-policy)")
        else:
            key, (steps, values) = found
            ax.plot(steps, values, color="tab:brown", marker=".", label=key)
            _style(ax, "IS out-of-bounds fraction", "fraction of tokens")
    return _save(fig, path)


def plot_mismatch_position(runs: Mapping[str, Mapping[str, Series]], path: Path, skip: int = 0) -> Path | None:
    """token_mult_prob_error - 1 per bin of response positions (mean over the steps after `skip`), one line per
    run, on a log axis; None when no run logged any bin."""
    curves = {label: position_curve(series, skip) for label, series in runs.items()}
    curves = {label: curve for label, curve in curves.items() if curve}
    if not curves:
        return None
    fig, axes = _new_figure(1, "Mismatch along the response")
    for label, curve in curves.items():
        excess = np.maximum(np.array(list(curve.values())) - 1.0, 1e-9)  # exact bins (1.0) at the floor
        axes[0].plot(list(curve), excess, marker=".", label=label)
    axes[0].set_yscale("log")
    _style(axes[0], "token_mult_prob_error - 1 per position bin", "excess over 1")
    axes[0].set_xlabel("response position (start of the bin)")
    return _save(fig, path)


def _by_step(series: Series, steps: np.ndarray) -> np.ndarray:
    """Values on the `steps` grid (last value per step wins; 0 where absent or non-finite)."""
    # -> [len(steps)]
    lookup = {int(s): float(v) for s, v in zip(*series)}
    return np.array([v if math.isfinite(v := lookup.get(int(s), 0.0)) else 0.0 for s in steps])


def split_timing_names(names: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(stacked, nested, totals): totals are TOTAL_TIMING_NAMES; a phase is stacked unless an ancestor
    ("train" for "train/optimizer") is also logged, so stacked bars never count time twice."""
    totals = [n for n in names if n in TOTAL_TIMING_NAMES]
    phases = [n for n in names if n not in totals]
    stacked = [n for n in phases if not any(n.startswith(f"{other}/") for other in phases if other != n)]
    nested = [n for n in phases if n not in stacked]
    return stacked, nested, totals


def plot_timing(series: Mapping[str, Series], path: Path) -> Path | None:
    names = [key.removeprefix("timing/") for key in series if key.startswith("timing/")]
    if not names:
        return None
    stacked, nested, totals = split_timing_names(names)
    fig, axes = _new_figure(1 + bool(nested), "Time per step", max_cols=1, width=1.6)
    ax = axes[0]
    steps = np.unique(np.concatenate([series[f"timing/{n}"][0] for n in stacked + totals]))
    colors = [f"C{i % 10}" for i in range(len(stacked))]
    layers = np.stack([_by_step(series[f"timing/{n}"], steps) for n in stacked]) if stacked else None  # [P, n]
    if layers is not None and len(steps) <= MAX_BARS:
        width = 0.8 * (float(np.min(np.diff(steps))) if len(steps) > 1 else 1.0)
        bottom = np.zeros(len(steps))
        for name, layer, color in zip(stacked, layers, colors):
            ax.bar(steps, layer, width=width, bottom=bottom, color=color, label=name)
            bottom += layer
    elif layers is not None:
        ax.stackplot(steps, layers, labels=stacked, colors=colors, alpha=0.85)
    for name in totals:
        total_steps, total_values = series[f"timing/{name}"]
        ax.plot(total_steps, total_values, color="black", lw=1.5, marker=".", label=name)
    _style(ax, "Phases (stacked)", "seconds", legend_outside=True)
    if nested:
        for name in nested:
            sub_steps, sub_values = series[f"timing/{name}"]
            axes[1].plot(sub_steps, sub_values, marker=".", label=name)
        axes[1].set_ylim(bottom=0.0)
        _style(axes[1], "Sub-phases", "seconds", legend_outside=True)
    return _save(fig, path)


def plot_run(metrics_jsonl: Path | str, out_dir: Path | str, smoothing: float | None = None) -> list[Path]:
    """Write reward_accuracy.png, mismatch.png, mismatch_position.png and timing.png into `out_dir` (each only if it
    has data).

    `smoothing` is the reward EMA weight in [0, 1); None picks one from the run length.
    """
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    series = read_metrics_jsonl(metrics_jsonl)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        plot_reward_accuracy(series, out_dir / "reward_accuracy.png", smoothing),
        plot_mismatch(series, out_dir / "mismatch.png"),
        plot_mismatch_position({"run": series}, out_dir / "mismatch_position.png"),
        plot_timing(series, out_dir / "timing.png"),
    ]
    return [path for path in written if path is not None]


def plot_comparison(
    runs: Mapping[str, Path | str],
    out: Path | str,
    keys: Sequence[str] = DEFAULT_COMPARISON_KEYS,
    smoothing: float | None = None,
    title: str = "Run comparison",
) -> Path:
    """One panel per key (keys no run logged are skipped), one colour per run: `{label: metrics_jsonl}` -> `out`."""
    if not runs:
        raise ValueError("plot_comparison needs at least one run ({label: metrics.jsonl path})")
    loaded = {label: read_metrics_jsonl(path) for label, path in runs.items()}
    present = [key for key in keys if any(key in s for s in loaded.values())]
    if not present:
        raise ValueError(f"none of the keys {list(keys)} appear in any of the runs {list(runs)}")
    fig, axes = _new_figure(len(present), title)
    for ax, key in zip(axes, present):
        weight = 0.0
        for i, (label, series) in enumerate(loaded.items()):
            if key not in series:
                continue
            if key.startswith("validation/"):  # sparse points: markers, no smoothing
                ax.plot(*series[key], color=f"C{i % 10}", marker="o", ms=3, label=label)
            else:
                weight = max(weight, _plot_noisy(ax, series[key], label, f"C{i % 10}", smoothing))
        ylabel = "seconds" if key.startswith("timing/") else key.rsplit("/", 1)[-1]
        _style(ax, key + _smoothing_note(weight), ylabel)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out)
