"""The figure of docs/performance.md from the benchmarks' JSON outputs (CPU is fine).

    python3 -m benchmarks.plot_performance --rollout docs/assets/rollout_l36_b128_g2048_alternating_h200_run1.json \\
        --train docs/assets/train_l36_wgrad_tiles_causal_h200_run1.json \\
        --grpo docs/assets/grpo_step_graphs_l16_h200_run1.json --out docs/assets/performance_h200.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def plot_benchmarks(rollout: dict, train: dict, grpo: dict, path: str | Path) -> None:
    """One figure for docs/performance.md from the three benchmarks' JSON payloads (or dicts of the same shape);
    a fourth panel stacks the decode step's kernel time by category when the rollout ran with --profile-steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rollout["results"]
    profiled = all("profile" in r for r in rows)
    fig, axes = plt.subplots(1, 4 if profiled else 3, figsize=(17 if profiled else 13, 3.8))
    axes[0].bar([_wrap(r["variant"]) for r in rows], [r["output_tokens_per_s"] for r in rows], color="tab:blue")
    axes[0].set_title(f"rollout (batch {rollout.get('args', {}).get('batch', '?')}): output tokens/s")
    axes[0].set_ylim(0, 1.2 * max(r["output_tokens_per_s"] for r in rows))
    for i, r in enumerate(rows):
        label = f"{r['output_tokens_per_s'] / rows[0]['output_tokens_per_s']:.2f}x, {r['decode_step_ms']:.1f} ms/step"
        axes[0].text(i, r["output_tokens_per_s"], label, ha="center", va="bottom", fontsize=8)
    rows = train["results"]
    axes[1].bar([_wrap(r["variant"]) for r in rows], [r["tokens_per_s"] for r in rows], color="tab:green")
    axes[1].set_title("train step: tokens/s")
    axes[1].set_ylim(0, 1.2 * max(r["tokens_per_s"] for r in rows))
    for i, r in enumerate(rows):
        axes[1].text(i, r["tokens_per_s"], f"{r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x", ha="center",
                     va="bottom", fontsize=8)  # fmt: skip
    rows = grpo["results"]
    stacked_bars(axes[2], [r["variant"].split(" ")[0] for r in rows], [{p: r[p] for p in GRPO_PHASES} for r in rows])
    axes[2].set_title("GRPO step: seconds per phase")
    if profiled:
        rows = rollout["results"]
        context = rows[0]["profile"]["context"]
        stacked_bars(axes[3], [r["variant"] for r in rows], [r["profile"]["categories_ms"] for r in rows])
        axes[3].set_title(f"decode step at {context} keys: kernel ms")
    fig.suptitle(rollout.get("device", ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


GRPO_PHASES = ("rollout", "logprobs", "train", "refit")


def _wrap(label: str) -> str:
    """A bar label broken at its spaces and '+' / '_' joins, so that neighbours do not overlap."""
    return label.replace(" ", "\n").replace("_", "\n").replace("+", "+\n")


def stacked_bars(ax, labels: list[str], parts: list[dict[str, float]]) -> None:
    """Stacked bars: one per label, one segment per key (keys in first-seen order), with a legend."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    bottom = [0.0] * len(labels)
    for key in keys:
        values = [p.get(key, 0.0) for p in parts]
        ax.bar(labels, values, bottom=bottom, label=key)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylim(0, 1.45 * max(bottom))  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper center", ncol=3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("rollout", "train", "grpo"):
        p.add_argument(f"--{name}", required=True, type=Path, help=f"JSON written by bench_{name}*.py --out")
    p.add_argument("--out", required=True, type=Path, help="PNG path")
    args = p.parse_args(argv)
    payloads = [json.loads(path.read_text()) for path in (args.rollout, args.train, args.grpo)]
    plot_benchmarks(*payloads, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
