"""Report stage of the accuracy study: per-arm final figures (summary.json), markdown tables and PNG plots.

Reads, for each study directory (one per seed), `DIR/arms/<arm>/metrics.jsonl` (examples/run_grpo.py's logger) and
`DIR/sft/sft_meta.json`; writes into the first one `report/{summary.json, reward.png, heldout.png,
mismatch_position.png, mismatch_steps.png}` (curves: the mean over the directories) and, with `assets`, copies them
there with the raw files: `seed<S>_<arm>_metrics.jsonl.gz` and `seed<S>_sft_meta.json` / `seed<S>_sft_curve.jsonl`.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl

ARM_LABELS = {
    "bf16": "BF16",
    "fp8_rollout_only": "FP8 rollout only",
    "fp8_rollout_only_tis": "FP8 rollout only + TIS",
    "fp8_rollout_only_icepop": "FP8 rollout only + IcePop",
    "fp8_kv_rollout_only": "FP8 rollout + FP8 KV only",
    "fp8": "unified FP8",
    "fp8_kv": "unified FP8 + FP8 KV",
    "fp8_kv_matched": "unified FP8 + FP8 KV, matched kernels",
    "fp8_kv_exact": "unified FP8 + FP8 KV, exact mode",
}
PHASES = ("generation", "training", "logprobs", "refit", "reward", "total_step_time")
MISMATCH_KEYS = ("token_mult_prob_error", "gen_kl_error", "exact_token_fraction", "is_oob_ratio")
TAIL_STEPS = 20  # "last" figures: the mean over this many final steps
TAIL_VALIDATIONS = 3  # final held-out accuracy: the mean of this many last validations after step 0
SMOOTH = 10
MEAN_KEYS = (
    "heldout_accuracy_start", "heldout_accuracy_final", "heldout_accuracy_mean", "heldout_sampled_accuracy_start",
    "heldout_sampled_accuracy_final", "heldout_sampled_accuracy_mean", "reward_first", "reward_last",
    "response_length_last", "token_mult_prob_error_mean", "gen_kl_error_mean", "exact_token_fraction_mean",
    "is_oob_ratio_mean", "token_mult_prob_error_max", "heldout_reference_accuracy_start",
    "heldout_reference_accuracy_final", "heldout_reference_accuracy_mean", "approx_entropy_mean",
)  # fmt: skip


def mean_tail(series: tuple[np.ndarray, np.ndarray] | None, n: int = TAIL_STEPS, head: bool = False) -> float | None:
    if series is None or len(series[1]) == 0:
        return None
    values = series[1][:n] if head else series[1][-n:]
    return float(np.mean(values))


def arm_summary(metrics_path: Path, max_step: int | None = None) -> dict[str, Any]:
    """Final figures of one arm from its metrics.jsonl (`metrics_summary`)."""
    return metrics_summary(read_metrics_jsonl(metrics_path), max_step)


def metrics_summary(s: dict[str, tuple[np.ndarray, np.ndarray]], max_step: int | None = None) -> dict[str, Any]:
    """Final figures of one arm from its parsed metrics (`read_metrics_jsonl`: {key: (steps, values)}; None where a
    metric was never logged), from the steps up to `max_step` when given (arms compared at the steps they all
    reached)."""
    if max_step is not None:
        s = {k: (st[st <= max_step], v[st <= max_step]) for k, (st, v) in s.items()}
        s = {k: series for k, series in s.items() if len(series[0])}
    steps = s.get("train/reward_mean", (np.zeros(0), np.zeros(0)))[0]
    out: dict[str, Any] = {"steps": int(steps[-1]) if len(steps) else 0}
    for name in ("accuracy", "sampled_accuracy", "reference_accuracy"):  # reference: grpo.val_reference's referee
        key = f"validation/{name}"
        out[f"heldout_{name}_start"] = float(s[key][1][0]) if key in s else None
        after = (s[key][0][s[key][0] > 0], s[key][1][s[key][0] > 0]) if key in s else None  # not the start's
        after = after if after is not None and len(after[0]) else None
        out[f"heldout_{name}_final"] = mean_tail(after, TAIL_VALIDATIONS)  # mean of the last validations
        out[f"heldout_{name}_final_steps"] = after[0][-TAIL_VALIDATIONS:].tolist() if after is not None else None
        out[f"heldout_{name}_mean"] = mean_tail(after, len(after[0])) if after is not None else None  # all of them
    reward = s.get("train/reward_mean")
    window = min(TAIL_STEPS, max(1, len(steps) // 2))  # a short run's first and last windows do not overlap
    out["reward_first"] = mean_tail(reward, window, head=True)
    out["reward_last"] = mean_tail(reward, window)
    out["response_length_last"] = mean_tail(s.get("train/mean_response_length"))
    for key in MISMATCH_KEYS:
        series = s.get(f"train/{key}")
        out[f"{key}_mean"] = None if series is None else float(np.mean(series[1]))
    entropy = s.get("train/approx_entropy")  # the trainer's entropy of the sampled tokens (accuracy_entropy.py)
    out["approx_entropy_mean"] = None if entropy is None else float(np.mean(entropy[1]))
    tmpe = s.get("train/token_mult_prob_error")  # its largest step: a burst a mean over steps hides
    out["token_mult_prob_error_max"] = None if tmpe is None else float(np.max(tmpe[1]))
    out["timing_median_s"] = {
        phase: float(statistics.median(s[f"timing/{phase}"][1][1:].tolist() or s[f"timing/{phase}"][1].tolist()))
        for phase in PHASES
        if f"timing/{phase}" in s
    }
    positions = sorted(k for k in s if k.startswith("train/mismatch_pos/"))
    out["mismatch_by_position"] = {k.rsplit("/", 1)[1]: float(np.mean(s[k][1])) for k in positions}
    return out


def smooth(values: np.ndarray, n: int = SMOOTH) -> np.ndarray:
    if len(values) < n:
        return values
    kernel = np.ones(n) / n
    head = np.array([values[: i + 1].mean() for i in range(n - 1)])
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")])


def new_figure(ncols: int = 1, nrows: int = 1) -> Figure:
    fig = Figure(figsize=(6.2 * ncols, 4.0 * nrows), dpi=110, layout="constrained")  # titles clear of the row above
    FigureCanvasAgg(fig)
    return fig


def mean_series(runs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean over runs of `key` at the steps every run logged it (None when no run has it)."""
    found = [r[key] for r in runs if key in r]
    if not found:
        return None
    steps = sorted(set.intersection(*(set(st.tolist()) for st, _ in found)))
    values = [np.array([dict(zip(st.tolist(), v.tolist()))[x] for x in steps]) for st, v in found]
    return np.array(steps), np.mean(values, axis=0)


def save_figure(fig: Figure, ax_list, path: Path) -> Path:
    for ax in ax_list:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")
    return path


def plot_arms(series: dict[str, list[dict]], position: dict[str, dict], out_dir: Path, note: str) -> list[Path]:
    """Reward, held-out accuracy, mismatch vs position and mismatch over steps: one line per arm (mean of runs)."""
    paths = []
    fig = new_figure()
    ax = fig.add_subplot()
    for arm, runs in series.items():
        mean = mean_series(runs, "train/reward_mean")
        if mean is not None:
            ax.plot(mean[0], smooth(mean[1]), label=ARM_LABELS[arm])
    ax.set(xlabel="GRPO step", ylabel=f"train reward (T=1; mean of {SMOOTH} steps)", title=f"train reward, {note}")
    paths.append(save_figure(fig, [ax], out_dir / "reward.png"))

    fig = new_figure(2)
    axes = []
    for i, (name, title) in enumerate((("accuracy", "greedy"), ("sampled_accuracy", "sampled, T=1"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for arm, runs in series.items():
            mean = mean_series(runs, f"validation/{name}")
            if mean is not None:
                ax.plot(mean[0], mean[1], marker="o", markersize=3, label=ARM_LABELS[arm])
        ax.set(xlabel="GRPO step", ylabel="held-out accuracy (256 problems)", title=f"held-out, {title}, {note}")
        axes.append(ax)
    paths.append(save_figure(fig, axes, out_dir / "heldout.png"))

    fig = new_figure()
    ax = fig.add_subplot()
    for arm, by_pos in position.items():
        if by_pos:
            ax.plot([int(k) for k in by_pos], [v - 1.0 for v in by_pos.values()], marker="o", markersize=3,
                    label=ARM_LABELS[arm])  # fmt: skip
    ax.set_yscale("log")
    ax.set(xlabel="response position (start of a 32-token bin)", ylabel="token_mult_prob_error - 1",
           title=f"mismatch vs response position (mean over steps), {note}")  # fmt: skip
    paths.append(save_figure(fig, [ax], out_dir / "mismatch_position.png"))

    fig = new_figure()
    ax = fig.add_subplot()
    for arm, runs in series.items():
        mean = mean_series(runs, "train/token_mult_prob_error")
        if mean is not None:
            ax.plot(mean[0], smooth(mean[1] - 1.0), label=ARM_LABELS[arm])
    ax.set_yscale("log")
    ax.set(xlabel="GRPO step", ylabel="token_mult_prob_error - 1", title=f"mismatch per step, {note}")
    paths.append(save_figure(fig, [ax], out_dir / "mismatch_steps.png"))
    return paths


def mean_of(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def across_seeds(key: str, values: list[float | None]) -> float | None:
    """One figure of several seeds' `key`: the largest of the largest steps, the mean of anything else."""
    kept = [v for v in values if v is not None]
    return (max(kept) if kept else None) if key.endswith("_max") else mean_of(kept)


def write_report(runs: list[Path], assets: Path | None = None) -> dict[str, Any]:
    """Summaries of every arm of every run (study directory), their mean, plots; see the module docstring."""
    arms = [a for a in ARM_LABELS if all((r / "arms" / a / "metrics.jsonl").is_file() for r in runs)]
    if not arms:
        raise FileNotFoundError(f"no arm has metrics in every run of {[str(r) for r in runs]}: run the arms stage")
    series = {a: [read_metrics_jsonl(r / "arms" / a / "metrics.jsonl") for r in runs] for a in arms}  # each run's
    per_run = []
    for i, run in enumerate(runs):
        meta_path = run / "sft" / "sft_meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        arm_rows = {a: metrics_summary(series[a][i]) for a in arms}
        per_run.append({"dir": str(run), "seed": meta.get("seed"), "sft": meta or None, "arms": arm_rows})
    mean = {}
    for arm in arms:
        rows = [r["arms"][arm] for r in per_run]
        mean[arm] = {k: across_seeds(k, [row[k] for row in rows]) for k in MEAN_KEYS}
        mean[arm]["timing_median_s"] = {
            phase: mean_of([row["timing_median_s"].get(phase) for row in rows]) for phase in PHASES
        }
        bins = sorted(set.intersection(*(set(row["mismatch_by_position"]) for row in rows)))
        mean[arm]["mismatch_by_position"] = {b: mean_of([row["mismatch_by_position"][b] for row in rows]) for b in bins}
    summary = {"runs": per_run, "mean": mean, "num_runs": len(runs)}
    report = runs[0] / "report"
    report.mkdir(parents=True, exist_ok=True)
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    note = f"mean of {len(runs)} seeds" if len(runs) > 1 else "one seed"
    position = {a: mean[a]["mismatch_by_position"] for a in arms}
    files = [report / "summary.json", *plot_arms(series, position, report, note)]
    if assets is not None:
        assets.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy(path, assets / path.name)
        for run, row in zip(runs, per_run):
            tag = f"seed{row['seed']}"
            for arm in arms:
                raw = (run / "arms" / arm / "metrics.jsonl").read_bytes()
                (assets / f"{tag}_{arm}_metrics.jsonl.gz").write_bytes(gzip.compress(raw, mtime=0))
            for name in ("sft_meta.json", "sft_curve.jsonl"):
                if (run / "sft" / name).is_file():
                    shutil.copy(run / "sft" / name, assets / f"{tag}_{name}")
    return summary


def fmt(value: float | None, digits: int = 3, signed: bool = False) -> str:
    return "-" if value is None else f"{value:{'+' if signed else ''}.{digits}f}"


def seed_cell(mean: float | None, values: list[float | None], digits: int = 3) -> str:
    """`mean (seed a, seed b)` over the runs, or the one run's value."""
    if len(values) == 1:
        return fmt(values[0], digits)
    return f"{fmt(mean, digits)} ({', '.join(fmt(v, digits) for v in values)})"


def arm_table(arms: list[str], cell: Callable[[str, str, int], str], reward_from_first: bool = False) -> list[str]:
    """The per-arm markdown table of final figures; `cell(arm, summary key, digits)` formats one figure."""
    reward_head = "train reward, first -> last" if reward_from_first else "train reward, last 20 steps"
    lines = [
        f"| arm | held-out greedy: start -> final | greedy, mean after start | held-out sampled: start -> final | "
        f"{reward_head} | token_mult_prob_error, mean of steps | its largest step | gen_kl_error | "
        "exact_token_fraction | IS clip fraction |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        oob = cell(arm, "is_oob_ratio_mean", 6) if arm.endswith(("_tis", "_icepop")) else "-"
        reward = (f"{cell(arm, 'reward_first', 3)} -> " if reward_from_first else "") + cell(arm, "reward_last", 3)
        lines.append(
            f"| {ARM_LABELS[arm]} | {cell(arm, 'heldout_accuracy_start', 3)} -> "
            f"{cell(arm, 'heldout_accuracy_final', 3)} | {cell(arm, 'heldout_accuracy_mean', 3)} | "
            f"{cell(arm, 'heldout_sampled_accuracy_start', 3)} -> "
            f"{cell(arm, 'heldout_sampled_accuracy_final', 3)} | {reward} | "
            f"{cell(arm, 'token_mult_prob_error_mean', 5)} | {cell(arm, 'token_mult_prob_error_max', 4)} | "
            f"{cell(arm, 'gen_kl_error_mean', 6)} | "
            f"{cell(arm, 'exact_token_fraction_mean', 3)} | {oob} |"
        )
    return lines


def position_table(by_arm: dict[str, dict[str, float | None]]) -> list[str]:
    """token_mult_prob_error per response-position bin (columns), one row per arm."""
    bins = sorted(set.union(*(set(by_pos) for by_pos in by_arm.values())))
    lines = ["| arm | " + " | ".join(f"pos {int(b)}+" for b in bins) + " |", "|---|" + "---|" * len(bins)]
    for arm, by_pos in by_arm.items():
        lines.append(f"| {ARM_LABELS[arm]} | " + " | ".join(fmt(by_pos.get(b), 5) for b in bins) + " |")
    return lines


def format_table(summary: dict[str, Any]) -> str:
    """The per-arm tables of docs/accuracy.md (markdown): final figures, mismatch by position, step time by phase."""

    def cell(arm: str, key: str, digits: int) -> str:
        return seed_cell(summary["mean"][arm][key], [r["arms"][arm][key] for r in summary["runs"]], digits)

    lines = arm_table(list(summary["mean"]), cell)
    lines += ["", *position_table({arm: m["mismatch_by_position"] for arm, m in summary["mean"].items()})]
    lines += ["", "| arm | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for arm, m in summary["mean"].items():
        lines.append(f"| {ARM_LABELS[arm]} | " + " | ".join(fmt(m["timing_median_s"][p], 3) for p in PHASES) + " |")
    return "\n".join(lines)
