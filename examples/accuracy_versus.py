"""An arm against BF16 over the long study's runs (docs/accuracy_long.md): per stage or pooled over stages, each
figure's difference of means with the permutation test within starts and the interval of shifts it does not reject
(accuracy_stats.py), how many runs a gap would need, and their markdown (bullets, a table by start)."""

from __future__ import annotations

from typing import Any

from accuracy_eval import referee_figures
from accuracy_report import ARM_LABELS, fmt
from accuracy_stage import sft_label
from accuracy_stats import ALPHA, POWER, permutation_test, runs_needed, within_start_sd

# arm against BF16 over runs: own validations at the common step, and the BF16 referee at each run's last checkpoint
VERSUS_KEYS = (
    "heldout_accuracy_mean",
    "heldout_accuracy_final",
    "reward_last",
    "referee_greedy",
    "referee_pass@1",
    "heldout_reference_accuracy_mean",
)  # the last: the BF16 referee at every validation (val_reference)
POWER_KEY, POWER_GAPS = "heldout_accuracy_mean", (0.1, 0.05)  # Jet-RL's gap (about 0.1) and half of it


def versus_bf16(rows: dict[str, dict[str, dict]], arms: list[str]) -> dict[str, dict]:
    """Per arm other than BF16 and VERSUS_KEYS figure: accuracy_stats.permutation_test of its runs against BF16's,
    grouped by start (a repeat's start is its seed's); {} without a BF16 arm."""
    if "bf16" not in arms:
        return {}
    return {arm: {key: permutation_test(by_start(rows, arm, key), by_start(rows, "bf16", key)) for key in VERSUS_KEYS}
            for arm in arms if arm != "bf16"}  # fmt: skip


def by_start(rows: dict[str, dict[str, dict]], arm: str, key: str) -> dict[str, list[float]]:
    """`arm`'s `key` of every run in `rows` that has it, grouped by start (a repeat's start is its seed's)."""
    out: dict[str, list[float]] = {}
    for run, row in rows.items():
        if row.get(arm, {}).get(key) is not None:  # a pooled stage may lack the arm
            out.setdefault(sft_label(run), []).append(row[arm][key])
    return out


def power_of(rows: dict[str, dict[str, dict]], arms: list[str], key: str = POWER_KEY) -> dict[str, dict]:
    """Per arm other than BF16: how far its and BF16's runs scatter within their starts (`key`, pooled SD) and the
    runs per arm a test would need to find each of POWER_GAPS (accuracy_stats.runs_needed)."""
    out = {}
    for arm in (a for a in arms if a != "bf16"):
        mine = by_start(rows, arm, key)
        sd, dof = within_start_sd([mine, by_start(rows, "bf16", key)])
        if sd is not None:
            out[arm] = {"key": key, "sd": sd, "dof": dof, "runs": sum(len(v) for v in mine.values()),
                        "runs_needed": {f"{gap:g}": runs_needed(sd, gap) for gap in POWER_GAPS}}  # fmt: skip
    return out


def tested_rows(st: dict[str, Any], prefix: str = "") -> dict[str, dict[str, dict]]:
    """A stage summary's per-run figures at its common step with its BF16 referee's where it ran (versus_bf16's
    rows), each run named `prefix` + its label."""
    ref = st["reference"]
    return {prefix + run: {a: {**st["runs"][run][a], **referee_figures(ref[run][a])} for a in st["arms"]}
            for run in st["seeds"]}  # fmt: skip


def pooled_versus(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """versus_bf16 over the runs of several stages, each stage's starts kept apart (a start is `<stage>/<seed>`):
    the stratified test of every run so far that shares a start with a BF16 run."""
    rows = {k: v for st in stages for k, v in tested_rows(st, f"{st['stage']}/").items()}
    arms = list(dict.fromkeys(a for st in stages for a in st["arms"]))
    return {"stages": [st["stage"] for st in stages], "versus_bf16": versus_bf16(rows, arms),
            "power": power_of(rows, arms)}  # fmt: skip


def interval_text(interval: list[float | None]) -> str:
    """accuracy_stats' interval of the shift, e.g. `95%: -0.116 to +0.032`, or `95%: unbounded`."""
    if interval[0] is None and interval[1] is None:
        return f"{1 - ALPHA:.0%}: unbounded"
    ends = ["unbounded" if end is None else f"{end:+.3f}" for end in interval]
    return f"{1 - ALPHA:.0%}: {ends[0]} to {ends[1]}"


def versus_lines(versus: dict[str, dict], alpha: float = ALPHA) -> list[str]:
    """Markdown bullets: each arm minus BF16 over the runs with the permutation test's p and the interval of the
    shift it does not reject (accuracy_stats.py); one line instead when the runs are too few for any p below
    `alpha`."""
    tests = [t for by_key in versus.values() for t in by_key.values() if t["diff"] is not None]
    if not tests:
        return []
    floor = min(2 / t["relabelings"] if t["exact"] else 0.0 for t in tests)  # the smallest p the runs allow
    if floor >= alpha:
        return [f"- arms against BF16: {tests[0]['runs'][0]} run(s) per arm from {tests[0]['starts']} start(s): a "
                f"permutation test cannot go below p = {floor:.2f}, so no arm can be told from chance here "
                "(`--repeats` runs more from each start)"]  # fmt: skip
    lines = []
    for arm, by_key in versus.items():
        cells = [f"{key} {t['diff']:+.3f} (p = {t['p']:.3f}; {interval_text(t['interval'])})"
                 for key, t in by_key.items() if t["diff"] is not None]  # fmt: skip
        t = next(iter(by_key.values()))
        lines.append(f"- {ARM_LABELS[arm]} - BF16 over {t['runs'][0]} and {t['runs'][1]} runs from {t['starts']} "
                     f"start(s): {', '.join(cells)}; p: permutation test within starts, "
                     f"{'exact' if t['exact'] else 'sampled'}, {t['relabelings']} relabelings")  # fmt: skip
    return lines


def power_lines(power: dict[str, dict]) -> list[str]:
    """Markdown bullets: per arm, the runs' spread within their starts and the runs a test would need (power_of)."""
    lines = []
    for arm, p in power.items():
        gaps = " / ".join(p["runs_needed"])
        lines.append(f"- {ARM_LABELS[arm]} and BF16: runs of one start scatter by SD {p['sd']:.3f} in {p['key']} "
                     f"({p['dof']} degrees of freedom); to find a gap of {gaps} with power {POWER:.0%} at p < "
                     f"{ALPHA} a test needs about {' / '.join(str(n) for n in p['runs_needed'].values())} runs an "
                     f"arm (normal approximation; here {p['runs']})")  # fmt: skip
    return lines


def start_table(versus: dict[str, dict]) -> list[str]:
    """Markdown table: each arm minus BF16 within each start (the mean of its runs there against BF16's), one row a
    start, so that starts that disagree show; [] with fewer than two starts."""
    rows = []
    for arm, by_key in versus.items():
        starts = list(dict.fromkeys(s for t in by_key.values() for s in t["by_start"]))
        for start in starts if len(starts) > 1 else []:
            cells = [fmt(t["by_start"].get(start), 3, signed=True) for t in by_key.values()]
            rows.append(f"| {ARM_LABELS[arm]} | {start} | {' | '.join(cells)} |")
    if not rows:
        return []
    keys = list(next(iter(versus.values())))
    return ["", f"| arm - BF16 | start | {' | '.join(keys)} |", "|---|---|" + "---|" * len(keys), *rows]
