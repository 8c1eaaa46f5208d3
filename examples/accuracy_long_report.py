"""Report of the long-response accuracy study (docs/accuracy_long.md): every stage under a root, tables and plots.

A root holds stage directories (`<length>[-<tag>][_T<temperature>][_lr<lr>]/seed<S>/arms/<arm>`, the SFT in
`<length>[-<tag>]/seed<S>/sft`; accuracy_stage.py) or the stages' packed `*.tar.gz`, which are unpacked next to them
first. Per stage, every arm of every seed is summarized (accuracy_report.arm_summary) up to the stage's **common
step**, the last training step that every arm of every seed reached (a stage's arms are stopped at one deadline and
run at different speeds), so arms are compared over the same steps. Per stage and figure it also states whether the
seeds disagree more than the arms: the largest spread between the two seeds of one arm against the spread between
the arms' seed means, and per arm against BF16 the difference of means over the runs with a permutation test within
starts and the interval of shifts it does not reject (accuracy_stats.py: repeats of one start make it able to tell
an arm from chance), and where
`accuracy_study.py evaluate` ran, each arm's last checkpoint through one BF16 referee (accuracy_eval.py) beside its
own rollout's validation. A seed whose arms all went further than the common step (the seeds of one call run at
different speeds) is also summarized up to its own common step (`runs_own_step`), so the steps it ran past the
slowest seed are not left out.

Writes `ROOT/report/{summary.json, reward.png, heldout.png, mismatch_position.png, by_stage.png}` (one panel per
stage; curves are the mean over seeds), `seeds_<stage>.png` for each stage named in `seed_curves` (a row per seed,
every arm to its last step: held-out greedy accuracy, train reward, mismatch per step) with `runs_<stage>.png`
(every run in one row, and each arm's mean over its runs; accuracy_long_plots.py), `versus_<pool>.png` for each
`pool` (each arm's difference from BF16 by start, and over all runs with its interval), `twins_<name>.png` for each
`twins` pair of stages (one start and GRPO config run twice; accuracy_twins.py), `mismatch_entropy.png` (every run's
policy entropy against its mismatch; accuracy_entropy.py) and, with `assets`, copies them there with the packed
stages.

`combine` ({name: [stage, ...]}) makes one stage of the seeds that several calls ran apart (one GPU runs a stage
once per seed, each call with its own `--tag`): `ROOT/<name>/seed<S>` links to the listed stage whose seed S passed
its SFT gate (the last such; else the first that has seed S), and the report compares its seeds as one stage's.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import accuracy_long_plots as plots
from accuracy_entropy import entropy_fit, entropy_lines, entropy_points
from accuracy_eval import reference_rows, reference_table
from accuracy_overview import overview_lines
from accuracy_report import (
    ARM_LABELS,
    MEAN_KEYS,
    across_seeds,
    arm_table,
    fmt,
    mean_of,
    metrics_summary,
    position_table,
    seed_cell,
)
from accuracy_stage import sft_label
from accuracy_twins import twins_lines, twins_summary
from accuracy_versus import pooled_versus, power_lines, start_table, tested_rows, versus_bf16, versus_lines

from nemo_jetrl.utils.metrics_jsonl import read_metrics_jsonl

# seeds vs arms
COMPARED = ("reward_last", "heldout_sampled_accuracy_final", "heldout_accuracy_final", "heldout_accuracy_mean")
FALLEN_FRACTION = 0.5  # a run "ended below half its start" (fallen_line): a count, not a test
LENGTH_ORDER = {"quick": 0, "1k": 1, "2k": 2, "4k": 3}


def unpack_stages(root: Path) -> None:
    """Extract every `*.tar.gz` under `root` whose stage directory is not there yet."""
    for archive in sorted(root.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tops = {Path(name).parts[0] for name in tar.getnames()}
            if not all((root / top).is_dir() for top in tops):
                tar.extractall(root, filter="data")


def combine_stages(root: Path, name: str, stages: list[str]) -> Path:
    """`root/name`: one stage of the seeds of `stages` (module docstring); its seed directories link to theirs."""
    combined = root / name
    if combined.exists() and not combined.is_dir():
        raise ValueError(f"--combine {name}: {combined} exists and is not a directory")
    chosen: dict[str, Path] = {}
    for stage in stages:
        if not (root / stage).is_dir():
            raise FileNotFoundError(f"--combine {name}: no stage {stage!r} under {root}")
        for seed_dir in sorted((root / stage).glob("seed*")):
            passed = (sft_meta(root / stage, seed_dir.name) or {}).get("gate_passed", True)
            if passed or seed_dir.name not in chosen:
                chosen[seed_dir.name] = seed_dir
    combined.mkdir(exist_ok=True)
    for seed, target in chosen.items():
        link = combined / seed
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            raise ValueError(f"--combine {name}: {link} exists and is not a link of an earlier --combine")
        link.symlink_to(target.resolve(), target_is_directory=True)
    return combined


def stage_sort_key(name: str) -> tuple:
    length = name.split("_", 1)[0].split("-", 1)[0]  # 4k-temp_T0.7 -> 4k
    return (LENGTH_ORDER.get(length, 99), name)


def find_stages(root: Path) -> list[Path]:
    """The stage directories under `root` (those with a `seed<S>/arms/`), by length, then name."""
    stages = {p.parent.parent for p in root.glob("*/seed*/arms") if p.is_dir()}
    return sorted(stages, key=lambda p: stage_sort_key(p.name))


def sft_meta(stage: Path, seed: str) -> dict | None:
    """The SFT metadata a stage's seed (or repeat: `seed1r2` starts from `seed1`'s) started from (a sweep variant
    `2k-t_T0.7` starts from `2k-t`'s SFT)."""
    path = stage.parent / stage.name.split("_", 1)[0] / sft_label(seed) / "sft" / "sft_meta.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _seeds_and_arms(stage: Path, sft: dict[str, dict | None]) -> tuple[list[str], list[str]]:
    """Of the seeds with arms (`sft`: each one's SFT metadata), those whose SFT passed its gate (arms started from a
    failed SFT measure nothing), and the arms every one of them ran."""
    seeds = [s for s, meta in sft.items() if (meta or {}).get("gate_passed", True)]
    arms = [a for a in ARM_LABELS if all((stage / s / "arms" / a / "metrics.jsonl").is_file() for s in seeds)]
    return seeds, arms


def spread(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(max(kept) - min(kept)) if len(kept) > 1 else None


def seeds_vs_arms(rows: dict[str, dict[str, dict]], arms: list[str]) -> dict[str, dict]:
    """Per compared figure: the arms' range of seed means, the largest seed spread of one arm, and which is larger."""
    out = {}
    for key in COMPARED:
        means = [mean_of([rows[seed][arm][key] for seed in rows]) for arm in arms]
        seed_spreads = {arm: spread([rows[seed][arm][key] for seed in rows]) for arm in arms}
        arm_range, worst = spread(means), max((v for v in seed_spreads.values() if v is not None), default=None)
        more = None if arm_range is None or worst is None else worst > arm_range
        out[key] = {"arm_range": arm_range, "max_seed_spread": worst, "seed_spread": seed_spreads,
                    "seeds_disagree_more": more}  # fmt: skip
    return out


def stage_summary(stage: Path) -> dict[str, Any] | None:
    """The stage's per-seed and mean figures at its common step (module docstring); None without arms."""
    sft = {p.name: sft_meta(stage, p.name) for p in sorted(stage.glob("seed*")) if (p / "arms").is_dir()}
    seeds, arms = _seeds_and_arms(stage, sft)
    if not seeds or not arms:
        return None
    series = {s: {a: read_metrics_jsonl(stage / s / "arms" / a / "metrics.jsonl") for a in arms} for s in seeds}
    last_of = {s: [int(series[s][a]["train/reward_mean"][0][-1]) if "train/reward_mean" in series[s][a] else 0
                   for a in arms] for s in seeds}  # fmt: skip
    last = [step for s in seeds for step in last_of[s]]
    common = min(last)
    rows = {s: {a: metrics_summary(series[s][a], max_step=common) for a in arms} for s in seeds}
    own = {s: min(steps) for s, steps in last_of.items()}  # each seed's own common step
    runs_own_step = {s: {a: metrics_summary(series[s][a], max_step=own[s]) for a in arms}
                     for s in seeds if own[s] > common}  # fmt: skip
    mean = {}
    for arm in arms:
        mean[arm] = {k: across_seeds(k, [rows[s][arm].get(k) for s in seeds]) for k in MEAN_KEYS}
        bins = sorted(set.intersection(*(set(rows[s][arm]["mismatch_by_position"]) for s in seeds)))
        mean[arm]["mismatch_by_position"] = {b: mean_of([rows[s][arm]["mismatch_by_position"][b] for s in seeds])
                                             for b in bins}  # fmt: skip
    status_path = stage / "stage.json"
    status = json.loads(status_path.read_text()) if status_path.is_file() else None
    st = {"stage": stage.name, "seeds": seeds, "arms": arms, "common_step": common, "last_steps": last,
          "runs": rows, "mean": mean, "seeds_vs_arms": seeds_vs_arms(rows, arms), "sft": sft, "status": status,
          "seed_common_steps": own, "runs_own_step": runs_own_step, "reference": reference_rows(stage, series),
          "series": series}  # fmt: skip
    return {**st, "versus_bf16": versus_bf16(tested_rows(st), arms)}


def write_long_report(
    root: Path,
    assets: Path | None = None,
    combine: dict[str, list[str]] | None = None,
    seed_curves: list[str] | None = None,
    pool: dict[str, list[str]] | None = None,
    twins: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Summaries and plots of every stage under `root` and of the `combine` stages, with per-seed curves of the
    `seed_curves` stages, the `pool` tests and the `twins` comparisons ({name: [stage, stage]}; accuracy_twins.py)
    (module docstring); returns the summary."""
    unpack_stages(root)
    for name, stages in (combine or {}).items():
        combine_stages(root, name, stages)
    stages = [st for st in (stage_summary(p) for p in find_stages(root)) if st is not None]
    if not stages:
        raise FileNotFoundError(f"no stage with arm metrics under {root}: run `accuracy_study.py stage --study long`")
    by_name = {st["stage"]: st for st in stages}
    pooled_names = [name for names in (pool or {}).values() for name in names]
    twin_names = [name for names in (twins or {}).values() for name in names]
    for flag, names in (("--seed-curves", seed_curves or []), ("--pool", pooled_names), ("--twins", twin_names)):
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise FileNotFoundError(f"{flag} {', '.join(unknown)}: no such stage with arms (stages: "
                                    f"{', '.join(by_name)})")  # fmt: skip
    report = root / "report"
    report.mkdir(parents=True, exist_ok=True)
    summary = {"stages": [{k: v for k, v in st.items() if k != "series"} for st in stages],
               "pools": {name: pooled_versus([by_name[n] for n in names]) for name, names in (pool or {}).items()},
               "twins": {name: twins_summary(root, name, *(by_name[n] for n in names))
                         for name, names in (twins or {}).items()},
               "combined": sorted(combine or {}),
               "entropy_points": entropy_points(stages, skip=set(combine or {}))}  # fmt: skip
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    files = [report / "summary.json", *plots.plot_stages(stages, report)]
    for name in seed_curves or []:
        files += [plots.plot_seed_curves(by_name[name], report), plots.plot_run_overlay(by_name[name], report)]
    files += [plots.plot_versus(name, pooled["versus_bf16"], report) for name, pooled in summary["pools"].items()]
    files += [plots.plot_twins(tw, [by_name[n] for n in tw["stages"]], report) for tw in summary["twins"].values()]
    if points := summary["entropy_points"]:
        files.append(plots.plot_mismatch_entropy(points, entropy_fit(points), report))
    if assets is not None:
        assets.mkdir(parents=True, exist_ok=True)
        for path in files + sorted(root.glob("*.tar.gz")):
            shutil.copy(path, assets / path.name)
    return summary


def fallen_line(st: dict[str, Any], fraction: float = FALLEN_FRACTION) -> list[str]:
    """One markdown bullet: per arm, how many of its runs ended (final held-out greedy, at the common step) below
    `fraction` of their start; [] without validations."""
    counts = []
    for arm in st["arms"]:
        pairs = [(r[arm]["heldout_accuracy_start"], r[arm]["heldout_accuracy_final"]) for r in st["runs"].values()]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if pairs:
            counts.append(f"{ARM_LABELS[arm]} {sum(b < fraction * a for a, b in pairs)}/{len(pairs)}")
    if not counts:
        return []
    return [f"- runs that ended below {fraction:g} x their start (held-out greedy): {', '.join(counts)}"]


OWN_STEP_KEYS = (("heldout_accuracy_final", 3), ("heldout_accuracy_mean", 3), ("reward_last", 3),
                 ("token_mult_prob_error_mean", 5))  # fmt: skip


def own_step_table(st: dict[str, Any]) -> list[str]:
    """Markdown: the seeds that ran past the stage's common step, each to its own (`runs_own_step`); [] if none."""
    own = st.get("runs_own_step") or {}
    if not own:
        return []
    heads = [f"{seed} to step {st['seed_common_steps'][seed]}: greedy final / mean after start / reward last / "
             "token_mult_prob_error" for seed in own]  # fmt: skip
    lines = ["| arm | " + " | ".join(heads) + " |", "|---|" + "---|" * len(own)]
    for arm in st["arms"]:
        cells = [" / ".join(fmt(own[seed][arm][key], digits) for key, digits in OWN_STEP_KEYS) for seed in own]
        lines.append(f"| {ARM_LABELS[arm]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def format_long_tables(summary: dict[str, Any]) -> str:
    """Markdown: every stage at a glance (accuracy_overview.py); per stage SFT starts, final figures per arm,
    mismatch by position, seeds vs arms, arms against BF16; then each pooled test, the twins, entropy."""
    lines = overview_lines(summary["stages"], skip=set(summary.get("combined") or ()))
    for st in summary["stages"]:
        lines += ["", f"### {st['stage']}: common step {st['common_step']} (last steps {st['last_steps']})", ""]
        repeats = [seed for seed in st["sft"] if sft_label(seed) != seed]  # their SFT is listed once, as its seed's
        for seed, meta in st["sft"].items():
            if meta and seed not in repeats:
                source = meta.get("init_from")  # a curriculum: the SFT it started from
                lines.append(f"- SFT {seed}: {meta['steps']} steps, gate greedy {fmt(meta['gate_greedy_accuracy'])} "
                             f"(passed: {meta['gate_passed']}), {meta['wall_time_s']} s"
                             + (f", from {source['path']} ({source['steps']} steps)" if source else "")
                             + ("" if seed in st["seeds"] else ": its arms are left out"))  # fmt: skip
        if repeats:
            lines.append(f"- GRPO repeats from their seed's SFT (other GRPO seeds): {', '.join(repeats)}")

        def cell(arm: str, key: str, digits: int, st: dict = st) -> str:
            return seed_cell(st["mean"][arm][key], [st["runs"][s][arm].get(key) for s in st["seeds"]], digits)

        lines += ["", *arm_table(st["arms"], cell, reward_from_first=True), ""]
        lines += own_step_table(st)
        lines += reference_table(st)
        lines += position_table({arm: st["mean"][arm]["mismatch_by_position"] for arm in st["arms"]})
        lines.append("")
        for key, r in st["seeds_vs_arms"].items():
            verdict = {True: "seeds disagree MORE than the arms", False: "arms differ more than the seeds",
                       None: "one seed or one arm: no comparison"}[r["seeds_disagree_more"]]  # fmt: skip
            lines.append(f"- {key}: arm range {fmt(r['arm_range'])}, largest seed spread "
                         f"{fmt(r['max_seed_spread'])}: {verdict}")  # fmt: skip
        lines += fallen_line(st)
        lines += versus_lines(st.get("versus_bf16") or {})
        lines += start_table(st.get("versus_bf16") or {})
    for name, pooled in (summary.get("pools") or {}).items():
        head = f"### pooled {name}: {', '.join(pooled['stages'])} (each start's runs relabeled among themselves)"
        lines += ["", head, "", *versus_lines(pooled["versus_bf16"]), *power_lines(pooled.get("power") or {}),
                  *start_table(pooled["versus_bf16"])]  # fmt: skip
    for tw in (summary.get("twins") or {}).values():
        lines += ["", *twins_lines(tw)]
    lines += entropy_lines(summary.get("entropy_points") or [])
    return "\n".join(lines)
