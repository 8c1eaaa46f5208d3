"""Policy entropy against the rollout's mismatch, over every run of the long study (docs/accuracy_long.md).

The mismatch an FP8 rollout adds is a per-token figure: how far its sampling distribution lies from the trainer's.
Where the policy is nearly certain of each token, rounding the GEMMs moves little probability mass, whatever the
response length. Each run gives one point: its mean `train/approx_entropy` (the trainer's entropy estimate of the
sampled tokens, nats a token) against its mean `token_mult_prob_error` - 1 and 1 - `exact_token_fraction`, over the
steps its stage compares (the common step). Per arm a least-squares line through log10 of both (a power law) with
its correlation says how closely the mismatch follows the entropy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from accuracy_cli import variant_settings
from accuracy_report import ARM_LABELS, fmt

MIN_FIT_RUNS = 3  # fewer points than this: no line


def entropy_points(stages: list[dict[str, Any]], skip: set[str] | frozenset = frozenset()) -> list[dict[str, Any]]:
    """One point per run (stage, seed or repeat, arm) that logged both figures; stages named in `skip` (combined
    views of other stages' runs) are left out so that no run counts twice."""
    points = []
    for st in stages:
        if st["stage"] in skip:
            continue
        length = variant_settings(st["stage"])["length"]
        for run in st["seeds"]:
            for arm in st["arms"]:
                row = st["runs"][run][arm]
                entropy, tmpe = row.get("approx_entropy_mean"), row.get("token_mult_prob_error_mean")
                if entropy is None or tmpe is None:
                    continue
                exact = row.get("exact_token_fraction_mean")
                points.append({"stage": st["stage"], "run": run, "arm": arm, "length": length, "entropy": entropy,
                               "tmpe_excess": tmpe - 1.0,
                               "inexact": None if exact is None else 1.0 - exact})  # fmt: skip
    return points


def entropy_fit(points: list[dict[str, Any]], key: str = "tmpe_excess") -> dict[str, dict[str, Any]]:
    """Per arm with at least MIN_FIT_RUNS positive points that spread in both: log10(`key`) = slope *
    log10(entropy) + intercept, the correlation of the two logs and the number of runs."""
    fits = {}
    for arm in dict.fromkeys(p["arm"] for p in points):
        pts = [(p["entropy"], p[key]) for p in points if p["arm"] == arm and p[key] and p[key] > 0 and p["entropy"] > 0]
        if len(pts) < MIN_FIT_RUNS:
            continue
        x, y = np.log10([e for e, _ in pts]), np.log10([v for _, v in pts])  # [runs]
        if np.ptp(x) == 0 or np.ptp(y) == 0:  # one entropy or one mismatch: no slope, no correlation
            continue
        slope, intercept = np.polyfit(x, y, 1)
        fits[arm] = {"runs": len(pts), "slope": float(slope), "intercept": float(intercept),
                     "r": float(np.corrcoef(x, y)[0, 1])}  # fmt: skip
    return fits


def entropy_lines(points: list[dict[str, Any]], arm: str = "fp8_rollout_only") -> list[str]:
    """Markdown: the fit per arm, then per stage the mean entropy and mismatch of `arm` beside BF16's."""
    if not points:
        return []
    lines = ["", "### policy entropy and rollout mismatch (every run; mismatch_entropy.png)", ""]
    for name, key in (("token_mult_prob_error - 1", "tmpe_excess"), ("1 - exact_token_fraction", "inexact")):
        for a, f in entropy_fit(points, key).items():
            lines.append(f"- {ARM_LABELS.get(a, a)}: {name} ~ entropy^{f['slope']:.2f} over {f['runs']} runs "
                         f"(log-log r = {f['r']:.2f})")  # fmt: skip
    lines += [
        "",
        f"| stage | runs | entropy, BF16 | entropy, {ARM_LABELS[arm]} | token_mult_prob_error - 1, "
        f"{ARM_LABELS[arm]} | 1 - exact_token_fraction, {ARM_LABELS[arm]} |",
        "|---|---|---|---|---|---|",
    ]
    for stage in dict.fromkeys(p["stage"] for p in points):

        def mean(a: str, key: str, stage: str = stage) -> float | None:
            values = [p[key] for p in points if p["stage"] == stage and p["arm"] == a and p[key] is not None]
            return float(np.mean(values)) if values else None

        runs = sum(p["stage"] == stage and p["arm"] == arm for p in points)
        if runs:
            lines.append(f"| {stage} | {runs} | {_sci(mean('bf16', 'entropy'))} | {_sci(mean(arm, 'entropy'))} | "
                         f"{_sci(mean(arm, 'tmpe_excess'))} | {fmt(mean(arm, 'inexact'))} |")  # fmt: skip
    return lines


def _sci(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2e}"
