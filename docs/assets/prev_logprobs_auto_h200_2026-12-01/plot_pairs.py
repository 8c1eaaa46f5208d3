"""The four BF16 / FP8+KV pairs of this folder (two machines x two shapes) as one figure: median GRPO step by
phase, each pair's ratio. Run from the repo root: python docs/assets/prev_logprobs_auto_h200_2026-12-01/plot_pairs.py
(writes pairs.png here; the medians are `benchmarks.gpu_cli_report.summarize`'s)."""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repo root: benchmarks/
from benchmarks.gpu_cli_report import summarize  # noqa: E402

PHASES = [("generation/decode", "decode"), ("training", "training")]


fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
for ax, shape, title in zip(axes, ["1p7b", "8b"], ["Qwen3-1.7B shape, 512 tokens", "Qwen3-8B shape, 4,096 tokens"]):
    x = 0
    for machine in "ab":
        med = {v: summarize(HERE / f"machine_{machine}" / shape / v)["median_s"] for v in ("bf16", "fp8_kv")}
        for i, v in enumerate(("bf16", "fp8_kv")):
            bottom = 0.0
            for j, (key, label) in enumerate(PHASES):
                ax.bar(x + i, med[v][key], bottom=bottom, color=f"C{j}", label=label if x == 0 and i == 0 else None)
                bottom += med[v][key]
            rest = med[v]["total_step_time"] - bottom
            ax.bar(x + i, rest, bottom=bottom, color="C7", label="rest" if x == 0 and i == 0 else None)
            ax.text(
                x + i, med[v]["total_step_time"] * 1.01, f"{med[v]['total_step_time']:.2f} s", ha="center", fontsize=8
            )
        ratio = med["bf16"]["total_step_time"] / med["fp8_kv"]["total_step_time"]
        ax.text(x + 0.5, med["bf16"]["total_step_time"] * 1.09, f"machine {machine.upper()}: {ratio:.3f}x", ha="center")
        x += 3
    ax.set_xticks([0, 1, 3, 4], ["BF16", "FP8+KV", "BF16", "FP8+KV"])
    ax.set_title(title)
    ax.set_ylabel("median GRPO step, s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
axes[0].legend(loc="lower left", fontsize=8)
fig.suptitle("Shipped recipes through run_grpo.py, prev_logprobs from the training forward (H200, 2026-12-01)")
fig.tight_layout()
fig.savefig(HERE / "pairs.png", dpi=110)
