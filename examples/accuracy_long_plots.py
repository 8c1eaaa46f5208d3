"""Plots of the long-response accuracy study's report (accuracy_long_report.py; docs/accuracy_long.md): a panel per
stage (reward, held-out accuracy, mismatch by position; by_stage.png), a stage's curves per run
(`seeds_<stage>.png`), every run of a stage in one row, colored by arm (`runs_<stage>.png`), and each arm's
difference from BF16 by start with its pooled interval (`versus_<pool>.png`), twin runs (`twins_<name>.png`) and
every run's policy entropy against its mismatch (`mismatch_entropy.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from accuracy_report import ARM_LABELS, SMOOTH, mean_series, new_figure, save_figure, smooth

PANEL_COLUMNS = 3
ARM_COLORS = {arm: f"C{i}" for i, arm in enumerate(ARM_LABELS)}  # one color per arm in every panel and figure


def _panels(count: int):
    fig = new_figure(min(count, PANEL_COLUMNS), -(-count // PANEL_COLUMNS))
    cols = min(count, PANEL_COLUMNS)
    return fig, [fig.add_subplot(-(-count // PANEL_COLUMNS), cols, i + 1) for i in range(count)]


def plot_stages(stages: list[dict], out_dir: Path) -> list[Path]:
    """reward.png, heldout.png, mismatch_position.png (a panel per stage) and by_stage.png."""
    paths = []
    for name, key, ylabel in (("reward", "train/reward_mean", "train reward (T of the stage, smoothed)"),
                              ("heldout", "validation/sampled_accuracy", "held-out sampled accuracy")):  # fmt: skip
        fig, axes = _panels(len(stages))
        for ax, st in zip(axes, stages):
            for arm in st["arms"]:
                curve = mean_series([st["series"][s][arm] for s in st["seeds"]], key)
                if curve is not None:
                    keep = curve[0] <= st["common_step"]
                    y = smooth(curve[1][keep]) if name == "reward" else curve[1][keep]
                    ax.plot(curve[0][keep], y, marker=None if name == "reward" else "o", markersize=3,
                            label=ARM_LABELS[arm], color=ARM_COLORS[arm])  # fmt: skip
            ax.set(xlabel="GRPO step", ylabel=ylabel, title=f"{st['stage']} ({len(st['seeds'])} seeds)")
        paths.append(save_figure(fig, axes, out_dir / f"{name}.png"))
    fig, axes = _panels(len(stages))
    for ax, st in zip(axes, stages):
        for arm in st["arms"]:
            by_pos = st["mean"][arm]["mismatch_by_position"]
            if by_pos:
                excess = [max(v - 1.0, 1e-9) for v in by_pos.values()]
                ax.plot(
                    [int(b) for b in by_pos],
                    excess,
                    marker="o",
                    markersize=2,
                    label=ARM_LABELS[arm],
                    color=ARM_COLORS[arm],
                )
        ax.set_yscale("log")
        ax.set(
            xlabel="response position (bin start)",
            ylabel="token_mult_prob_error - 1 (1e-9: exactly 0)",
            title=st["stage"],
        )
    paths.append(save_figure(fig, axes, out_dir / "mismatch_position.png"))
    fig = new_figure(2)
    ax_m, ax_r = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = [st["stage"] for st in stages]
    for arm in ARM_LABELS:
        tmpe = [st["mean"].get(arm, {}).get("token_mult_prob_error_mean") for st in stages]
        ref = [st["mean"].get("bf16", {}).get("reward_last") for st in stages]
        rew = [st["mean"].get(arm, {}).get("reward_last") for st in stages]
        if any(v is not None for v in tmpe):
            ax_m.plot(names, [np.nan if v is None else max(v - 1.0, 1e-9) for v in tmpe], marker="o",
                      label=ARM_LABELS[arm], color=ARM_COLORS[arm])  # fmt: skip
        delta = [np.nan if r is None or b is None else r - b for r, b in zip(rew, ref)]
        if not np.all(np.isnan(delta)):
            ax_r.plot(names, delta, marker="o", label=ARM_LABELS[arm], color=ARM_COLORS[arm])
    ax_m.set_yscale("log")
    ax_m.set(
        xlabel="stage", ylabel="token_mult_prob_error - 1, mean over steps (1e-9: exactly 0)", title="mismatch by stage"
    )
    ax_r.set(xlabel="stage", ylabel="train reward, last steps: arm - BF16", title="reward vs BF16 by stage")
    paths.append(save_figure(fig, [ax_m, ax_r], out_dir / "by_stage.png"))
    return paths


SEED_PANELS = (
    ("validation/accuracy", "held-out greedy accuracy", False),
    ("train/reward_mean", f"train reward (smoothed over {SMOOTH} steps)", False),
    ("train/token_mult_prob_error", "token_mult_prob_error - 1 (1e-9: exactly 0)", True),
)


def _shown(key: str, log: bool, values: np.ndarray) -> np.ndarray:
    """A SEED_PANELS curve as drawn: the excess over 1 on a log axis, train figures smoothed, validations as logged."""
    if log:
        return np.maximum(values - 1.0, 1e-9)
    return smooth(values) if key.startswith("train/") else values


def plot_seed_curves(st: dict, out_dir: Path) -> Path:
    """`seeds_<stage>.png`: a row per seed, a column per SEED_PANELS figure, every arm to its own last step."""
    seeds = st["seeds"]
    fig = new_figure(len(SEED_PANELS), len(seeds))
    axes = []
    for row, seed in enumerate(seeds):
        for col, (key, ylabel, log) in enumerate(SEED_PANELS):
            ax = fig.add_subplot(len(seeds), len(SEED_PANELS), row * len(SEED_PANELS) + col + 1)
            for arm in st["arms"]:
                if key in st["series"][seed][arm]:
                    steps, values = st["series"][seed][arm][key]  # [steps], [steps]
                    marker = "o" if key.startswith("validation/") else None
                    ax.plot(steps, _shown(key, log, values), marker=marker, markersize=3, label=ARM_LABELS[arm],
                            color=ARM_COLORS[arm])  # fmt: skip
            if log:
                ax.set_yscale("log")
            ax.set(xlabel="GRPO step", ylabel=ylabel, title=f"{st['stage']}, {seed}")
            axes.append(ax)
    return save_figure(fig, axes, out_dir / f"seeds_{st['stage']}.png")


def plot_run_overlay(st: dict, out_dir: Path) -> Path:
    """`runs_<stage>.png`: a column per SEED_PANELS figure, every run of every arm in one panel (thin, to its own
    last step) and each arm's mean over its runs (thick, at the steps every run reached), so the spread of one
    arm's runs shows beside the distance between the arms."""
    fig = new_figure(len(SEED_PANELS), 1)
    axes = []
    for col, (key, ylabel, log) in enumerate(SEED_PANELS):
        ax = fig.add_subplot(1, len(SEED_PANELS), col + 1)
        for arm in st["arms"]:
            runs = [st["series"][run][arm] for run in st["seeds"] if key in st["series"][run][arm]]
            for metrics in runs:
                steps, values = metrics[key]  # [steps], [steps]
                ax.plot(steps, _shown(key, log, values), color=ARM_COLORS[arm], alpha=0.35, linewidth=0.8)
            curve = mean_series(runs, key)
            if curve is not None:
                ax.plot(curve[0], _shown(key, log, curve[1]), color=ARM_COLORS[arm], linewidth=2.2,
                        label=f"{ARM_LABELS[arm]}, mean of {len(runs)} runs")  # fmt: skip
        if log:
            ax.set_yscale("log")
        ax.set(xlabel="GRPO step", ylabel=ylabel, title=f"{st['stage']}: every run (thin) and the arm's mean")
        axes.append(ax)
    return save_figure(fig, axes, out_dir / f"runs_{st['stage']}.png")


VERSUS_PANELS = ("heldout_accuracy_mean", "heldout_accuracy_final", "referee_greedy")
VERSUS_IF_MEASURED = ("heldout_reference_accuracy_mean",)  # grpo.val_reference's referee: stages that logged it
JET_RL_GAP = -0.1  # Jet-RL: FP8 rollout only 9.8-10.3% below BF16 (arXiv 2601.14243)


def versus_rows(versus: dict[str, dict], key: str) -> list[tuple[str, str, float, float | None, float | None]]:
    """Rows of a `versus_<pool>.png` panel: per arm, (start, arm, its difference from BF16 there, None, None) for
    each start, then ("all starts", arm, the difference over every run, the interval's ends)."""
    rows = []
    for arm, by_key in versus.items():
        t = by_key.get(key)
        if t is None or t["diff"] is None:
            continue
        rows += [(start, arm, diff, None, None) for start, diff in t["by_start"].items()]
        rows.append(("all starts", arm, t["diff"], *t["interval"]))
    return rows


def versus_panels(versus: dict[str, dict]) -> list[str]:
    """The figures `versus_<pool>.png` draws: VERSUS_PANELS, and each of VERSUS_IF_MEASURED some run measured."""
    return [*VERSUS_PANELS, *(key for key in VERSUS_IF_MEASURED if versus_rows(versus, key))]


def plot_versus(name: str, versus: dict[str, dict], out_dir: Path) -> Path:
    """`versus_<name>.png`: a panel per `versus_panels` figure, a row per start (each arm's difference from BF16
    there, a dot) and per arm the difference over every run with its 95% interval (a bar; a hollow mark where the
    runs allow none), beside 0 and Jet-RL's gap."""
    panels = versus_panels(versus)
    fig = new_figure(len(panels), 1)
    axes = []
    for col, key in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), col + 1)
        rows = versus_rows(versus, key)
        labels = list(dict.fromkeys(start for start, *_ in rows if start != "all starts"))
        arms = list(dict.fromkeys(arm for _, arm, *_ in rows))
        for i, arm in enumerate(arms):
            offset = 0.25 * (i - (len(arms) - 1) / 2) / max(len(arms), 1)
            mine = [r for r in rows if r[1] == arm]
            starts = [(labels.index(r[0]) + offset, r[2]) for r in mine if r[0] != "all starts"]
            ax.plot([d for _, d in starts], [y for y, _ in starts], "o", color=ARM_COLORS[arm], markersize=4)
            _, _, diff, low, high = mine[-1]
            y = len(labels) + 0.5 + offset
            if low is None or high is None:  # too few runs for any p below 0.05: no interval, a hollow mark
                ax.plot([diff], [y], "D", color=ARM_COLORS[arm], fillstyle="none",
                        label=f"{ARM_LABELS[arm]}: all starts (too few runs for an interval)")  # fmt: skip
            else:
                ax.errorbar([diff], [y], xerr=[[diff - low], [high - diff]], fmt="D", color=ARM_COLORS[arm],
                            capsize=4, label=f"{ARM_LABELS[arm]}: all starts, 95% interval")  # fmt: skip
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.axvline(JET_RL_GAP, color="grey", linestyle="--", linewidth=0.8, label="Jet-RL's gap (about -0.1)")
        ax.set_yticks([*range(len(labels)), len(labels) + 0.5], [*labels, "all starts"], fontsize=7)
        ax.invert_yaxis()
        ax.set(xlabel=f"{key}: arm - BF16", title=f"{name}: each start, and all runs")
        ax.grid(alpha=0.3)
        axes.append(ax)
    return _save_with_one_legend(fig, axes, out_dir / f"versus_{name}.png", ncols=3)


def _save_with_one_legend(fig, axes: list, path: Path, ncols: int) -> Path:
    """Save `fig` with one legend below its panels, an entry per label over all `axes`."""
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}  # one entry a label
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=ncols, fontsize=8)
    fig.savefig(path, bbox_inches="tight")
    return path


def plot_twins(tw: dict, stages: list[dict], out_dir: Path) -> Path:
    """`twins_<name>.png`: a panel per twin pair (accuracy_twins.py), its two runs' held-out greedy accuracy to each
    one's last step (the first stage's solid, the second's dashed) and a dotted line at the last step both reached."""
    fig, axes = _panels(len(tw["pairs"]))
    for ax, pair in zip(axes, tw["pairs"]):
        for st, style in zip(stages, ("-", "--")):
            steps, values = st["series"][pair["run"]][pair["arm"]]["validation/accuracy"]  # [validations] x2
            ax.plot(steps, values, style, marker="o", markersize=3, color=ARM_COLORS[pair["arm"]], label=st["stage"])
        ax.axvline(pair["step"], color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel="GRPO step", ylabel="held-out greedy accuracy", ylim=(0, 1),
               title=f"{pair['run']}, {ARM_LABELS[pair['arm']]}")  # fmt: skip
    return save_figure(fig, axes, out_dir / f"twins_{tw['name']}.png")


LENGTH_MARKERS = {"1k": "o", "2k": "s", "4k": "^"}  # mismatch_entropy.png: a marker per response length


def plot_mismatch_entropy(points: list[dict], fits: dict[str, dict], out_dir: Path) -> Path:
    """`mismatch_entropy.png`: a point per run (accuracy_entropy.entropy_points), its mean policy entropy against
    token_mult_prob_error - 1 (left) and 1 - exact_token_fraction (right), log-log, colored by arm, a marker per
    response length; `fits` (token_mult_prob_error's, per arm) drawn as lines."""
    fig = new_figure(2)
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    for ax, key, ylabel in ((axes[0], "tmpe_excess", "token_mult_prob_error - 1, mean over steps"),
                            (axes[1], "inexact", "1 - exact_token_fraction, mean over steps")):  # fmt: skip
        for arm in dict.fromkeys(p["arm"] for p in points):
            for length, marker in LENGTH_MARKERS.items():
                pts = [p for p in points if p["arm"] == arm and p["length"] == length and (p[key] or 0) > 0]
                if pts:
                    ax.scatter([p["entropy"] for p in pts], [p[key] for p in pts], marker=marker, s=18,
                               color=ARM_COLORS.get(arm, "k"),
                               label=f"{ARM_LABELS.get(arm, arm)}, {length}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="policy entropy, nats a sampled token (train/approx_entropy)",
               ylabel=ylabel, title=ylabel.split(",")[0] + " against entropy, a point per run")  # fmt: skip
    span = np.array([min(p["entropy"] for p in points), max(p["entropy"] for p in points)])  # [2]
    for arm, f in fits.items():
        label = f"{ARM_LABELS.get(arm, arm)}: ~entropy^{f['slope']:.2f}, r {f['r']:.2f}"
        axes[0].plot(span, 10 ** (f["intercept"] + f["slope"] * np.log10(span)), color=ARM_COLORS.get(arm, "k"),
                     linewidth=1, label=label)
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save_with_one_legend(fig, axes, out_dir / "mismatch_entropy.png", ncols=4)
