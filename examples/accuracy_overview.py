"""One table of every stage of the long study (docs/accuracy_long.md): its settings, its runs, and the two figures the
study asks about, FP8 rollout only against BF16 and how far the FP8 rollout's sampling lay from the trainer's.

A row per stage (combined views of other stages' runs left out): the length, sampling temperature and learning
rate its name encodes, the starts (SFTs) and runs an arm, the step the arms are compared at, FP8 rollout only minus
BF16 in held-out greedy accuracy after the start and in the BF16 referee's greedy accuracy (`accuracy_study.py
evaluate` on the last checkpoint, else `grpo.val_reference` at every validation; each with the permutation test's
p, accuracy_versus.versus_bf16), and FP8 rollout only's mean `token_mult_prob_error` - 1
and policy entropy over its runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from accuracy_cli import variant_settings
from accuracy_stage import sft_label

ARM = "fp8_rollout_only"  # the arm the study's question is about


def _test_cell(test: dict | None, mark: str = "") -> str:
    if not test or test.get("diff") is None:
        return "-"
    p = test.get("p")
    return f"{test['diff']:+.3f}{mark}" + (f" (p {p:.2f})" if p is not None else "")


def _mean(st: dict[str, Any], key: str) -> float | None:
    values = [st["runs"][run][ARM].get(key) for run in st["seeds"] if ARM in st["runs"][run]]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def overview_row(st: dict[str, Any]) -> dict[str, Any]:
    """A stage summary's overview figures (module docstring)."""
    versus = (st.get("versus_bf16") or {}).get(ARM, {})
    tmpe = _mean(st, "token_mult_prob_error_mean")
    return {
        **variant_settings(st["stage"]),
        "stage": st["stage"],
        "starts": len({sft_label(run) for run in st["seeds"]}),
        "runs_per_arm": len(st["seeds"]),
        "arms": len(st["arms"]),
        "step": st["common_step"],
        "heldout": _test_cell(versus.get("heldout_accuracy_mean")),
        "referee": _test_cell(versus.get("referee_greedy"))  # the last checkpoint's, else every validation's (*)
        if (versus.get("referee_greedy") or {}).get("diff") is not None
        else _test_cell(versus.get("heldout_reference_accuracy_mean"), "*"),
        "tmpe_excess": None if tmpe is None else tmpe - 1.0,
        "entropy": _mean(st, "approx_entropy_mean"),
    }


def overview_lines(stages: list[dict[str, Any]], skip: set[str] | frozenset = frozenset()) -> list[str]:
    """Markdown: the overview table, a row per stage not in `skip`."""
    rows = [overview_row(st) for st in stages if st["stage"] not in skip]
    if not rows:
        return []
    lines = [
        "### every stage at a glance (FP8 rollout only against BF16)",
        "",
        "(referee: the BF16 rollout's greedy accuracy on each run's last checkpoint; * where only "
        "`grpo.val_reference` ran: its mean over the validations after the start)",
        "",
        "| stage | length | T | lr | starts | runs an arm | arms | step | held-out greedy after start: FP8 rollout "
        "only - BF16 (p) | BF16 referee: FP8 rollout only - BF16 (p) | token_mult_prob_error - 1, FP8 rollout only "
        "| entropy, FP8 rollout only |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tmpe = "-" if r["tmpe_excess"] is None else f"{r['tmpe_excess']:.1e}"
        entropy = "-" if r["entropy"] is None else f"{r['entropy']:.1e}"
        lines.append(f"| {r['stage']} | {r['length']} | {r['temperature']:g} | {r['lr']:g} | {r['starts']} | "
                     f"{r['runs_per_arm']} | {r['arms']} | {r['step']} | {r['heldout']} | {r['referee']} | {tmpe} | "
                     f"{entropy} |")  # fmt: skip
    return lines
