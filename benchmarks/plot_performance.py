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

from benchmarks.common import plot_benchmarks


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
