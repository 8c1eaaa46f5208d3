"""Twin runs of the long accuracy study: one start and one GRPO config run twice (two stages, e.g. two sessions).

How far do two runs drift apart when nothing differs but the GPU's nondeterminism? A **twin pair** is a run label
(`seed3r1`) and arm that two stages both ran, from the same deterministic SFT (its metadata equal but for
`IGNORED_SFT_KEYS`, `deterministic` set in both) under GRPO configs that are equal once each stage's name is read as
the other's (`IGNORED_CONFIG_KEYS` aside). Anything else is refused by name (`TwinMismatch`): runs that differ in
their start or config are not twins. Per pair, over the steps both reached: the held-out greedy accuracy at the
start (the same weights through each run's rollout), after the start (mean and final) and at each validation, and
the first step whose train reward or gradient norm differs. Beside it, the same figures' mean absolute difference
between runs of one arm and stage that differ in their GRPO seed, over the same steps: twins that differ as much as
those say the seed adds nothing the GPU does not.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
from accuracy_report import ARM_LABELS, metrics_summary
from accuracy_stage import sft_label
from omegaconf import OmegaConf

IGNORED_SFT_KEYS = ("wall_time_s", "calls")  # how long the SFT took and in how many calls: not what it trained
# where a run had to stop and how much memory it could plan for (the other processes on its GPU): not what it ran
IGNORED_CONFIG_KEYS = ("policy.memory_preflight.capacity_gib", "checkpointing.checkpoint_must_save_by")
TWIN_KEYS = ("heldout_accuracy_mean", "heldout_accuracy_final", "reward_last")


class TwinMismatch(ValueError):
    """Two runs named as twins that differ in their start or GRPO config."""


def _base(stage: str) -> str:
    """The stage's SFT directory name: `2k-rep7b_T0.7` -> `2k-rep7b`."""
    return stage.split("_", 1)[0]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def _config(root: Path, stage: str, run: str, arm: str, as_stage: str) -> dict[str, Any]:
    """The run's GRPO config (run_grpo's config.yaml), flattened, with the stage's name read as `as_stage`'s."""
    text = (root / stage / run / "arms" / arm / "config.yaml").read_text()
    text = text.replace(_base(stage), _base(as_stage))
    flat = _flat(OmegaConf.to_container(OmegaConf.create(text)))
    return {k: v for k, v in flat.items() if k not in IGNORED_CONFIG_KEYS}


def twin_mismatch(root: Path, stage_a: str, stage_b: str, run: str, arm: str) -> list[str]:
    """Why `run`/`arm` of the two stages are not twins ([] when they are)."""
    reasons = []
    metas = []
    for stage in (stage_a, stage_b):
        path = root / _base(stage) / sft_label(run) / "sft" / "sft_meta.json"
        meta = json.loads(path.read_text()) if path.is_file() else None
        if meta is None or not meta.get("deterministic"):
            reasons.append(f"{stage}'s SFT of {sft_label(run)} is not a deterministic one (--sft-deterministic)")
        metas.append({k: v for k, v in (meta or {}).items() if k not in IGNORED_SFT_KEYS})
    differing = sorted(k for k in set(metas[0]) | set(metas[1]) if metas[0].get(k) != metas[1].get(k))
    if differing and not reasons:
        reasons.append(f"their SFTs differ in {', '.join(differing)}")
    try:
        a = _config(root, stage_a, run, arm, stage_a)
        b = _config(root, stage_b, run, arm, stage_a)
    except FileNotFoundError as err:
        return [*reasons, f"no config.yaml: {err.filename}"]
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if keys:
        reasons.append("their GRPO configs differ in " + ", ".join(f"{k} ({a.get(k)} vs {b.get(k)})" for k in keys))
    return reasons


def _validations(series: dict, step: int) -> dict[int, float]:
    steps, values = series.get("validation/accuracy", (np.zeros(0), np.zeros(0)))
    return {int(s): float(v) for s, v in zip(steps, values) if s <= step}


def _first_difference(a: dict, b: dict, step: int) -> int | None:
    """The first training step up to `step` whose train reward or gradient norm differs between the two runs."""
    found = []
    for key in ("train/reward_mean", "train/grad_norm"):
        if key in a and key in b:
            va = {int(s): v for s, v in zip(*a[key]) if s <= step}
            vb = {int(s): v for s, v in zip(*b[key]) if s <= step}
            found += [s for s in sorted(set(va) & set(vb)) if va[s] != vb[s]][:1]
    return min(found, default=None)


def twin_pairs(root: Path, st_a: dict[str, Any], st_b: dict[str, Any]) -> list[dict[str, Any]]:
    """Every twin pair of two stage summaries (accuracy_long_report.stage_summary, with their series); raises
    TwinMismatch naming each pair that is not one, or when the stages share no run."""
    runs = [r for r in st_a["seeds"] if r in st_b["seeds"]]
    arms = [a for a in st_a["arms"] if a in st_b["arms"]]
    if not runs or not arms:
        raise TwinMismatch(f"{st_a['stage']} and {st_b['stage']} share no run and arm")
    problems = [f"{run}/{arm}: {'; '.join(why)}" for run in runs for arm in arms
                if (why := twin_mismatch(root, st_a["stage"], st_b["stage"], run, arm))]  # fmt: skip
    if problems:
        raise TwinMismatch(f"{st_a['stage']} and {st_b['stage']} are not twins: " + " | ".join(problems))
    pairs = []
    for run, arm in itertools.product(runs, arms):
        sa, sb = st_a["series"][run][arm], st_b["series"][run][arm]
        step = min(metrics_summary(sa)["steps"], metrics_summary(sb)["steps"])  # each run's last training step
        fa, fb = metrics_summary(sa, max_step=step), metrics_summary(sb, max_step=step)
        va, vb = _validations(sa, step), _validations(sb, step)
        shared = sorted(set(va) & set(vb) - {0})
        pairs.append({
            "run": run, "arm": arm, "step": step, "first_difference": _first_difference(sa, sb, step),
            "start": [fa["heldout_accuracy_start"], fb["heldout_accuracy_start"]],
            **{key: [fa[key], fb[key]] for key in TWIN_KEYS},
            "max_validation_gap": max((abs(va[s] - vb[s]) for s in shared), default=None),
        })  # fmt: skip
    return pairs


def seed_gaps(st: dict[str, Any], arm: str, step: int, starts: set[str]) -> dict[str, float | None]:
    """Per TWIN_KEYS figure, the mean absolute difference between the stage's runs of `arm` from one of `starts`
    (SFT labels) that differ in their GRPO seed, each summarized up to `step`."""
    runs = [run for run in st["seeds"] if sft_label(run) in starts]
    rows = {run: metrics_summary(st["series"][run][arm], max_step=step) for run in runs}
    out = {}
    for key in TWIN_KEYS:
        gaps = [
            abs(rows[x][key] - rows[y][key])
            for x, y in itertools.combinations(rows, 2)
            if sft_label(x) == sft_label(y) and rows[x][key] is not None and rows[y][key] is not None
        ]
        out[key] = float(np.mean(gaps)) if gaps else None
    return out


def twins_summary(root: Path, name: str, st_a: dict[str, Any], st_b: dict[str, Any]) -> dict[str, Any]:
    """The twin pairs of two stages, their mean absolute differences per arm, and the different-seed runs' beside
    them (from each stage, over the steps the twins share)."""
    pairs = twin_pairs(root, st_a, st_b)
    by_arm = {}
    for arm in dict.fromkeys(p["arm"] for p in pairs):
        mine = [p for p in pairs if p["arm"] == arm]
        step = min(p["step"] for p in mine)
        twins = {k: float(np.mean([abs(p[k][0] - p[k][1]) for p in mine if None not in p[k]])) for k in TWIN_KEYS}
        starts = {sft_label(p["run"]) for p in mine}
        seeds = [seed_gaps(st, arm, step, starts) for st in (st_a, st_b)]
        by_arm[arm] = {"step": step, "twins": twins,
                       "seeds": {k: [s[k] for s in seeds] for k in TWIN_KEYS}}  # fmt: skip
    return {"name": name, "stages": [st_a["stage"], st_b["stage"]], "pairs": pairs, "by_arm": by_arm}


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def twins_lines(tw: dict[str, Any]) -> list[str]:
    """The report's section on one twin comparison (markdown)."""
    a, b = tw["stages"]
    lines = [f"### twins {tw['name']}: {a} and {b} (the same start and GRPO config, run twice)", "",
             "| run | arm | steps | first differing step | start | greedy, mean after start | greedy, final | "
             "largest gap at one validation |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in tw["pairs"]:
        pair = {
            k: f"{_f(p[k][0])} / {_f(p[k][1])}" for k in ("start", "heldout_accuracy_mean", "heldout_accuracy_final")
        }
        first = "-" if p["first_difference"] is None else str(p["first_difference"])
        lines.append(f"| {p['run']} | {ARM_LABELS.get(p['arm'], p['arm'])} | {p['step']} | {first} | {pair['start']} | "
                     f"{pair['heldout_accuracy_mean']} | {pair['heldout_accuracy_final']} | "
                     f"{_f(p['max_validation_gap'])} |")  # fmt: skip
    lines.append("")
    for arm, row in tw["by_arm"].items():
        twins = ", ".join(f"{k} {_f(row['twins'][k])}" for k in TWIN_KEYS)
        seeds = ", ".join(f"{k} {' / '.join(_f(v) for v in row['seeds'][k])}" for k in TWIN_KEYS)
        lines.append(f"- {ARM_LABELS.get(arm, arm)} to step {row['step']}, mean |difference| between twins: {twins}; "
                     f"between runs of one start with other GRPO seeds (in {a} / {b}): {seeds}")  # fmt: skip
    return lines
