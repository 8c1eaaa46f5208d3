#!/usr/bin/env python
"""The accuracy study (docs/accuracy.md): SFT a Qwen3 on long addition, then GRPO in five precision arms.

    python3 examples/accuracy_study.py sft  --out /tmp/jetrl_accuracy                # SFT from scratch, gated
    python3 examples/accuracy_study.py grpo --arm bf16 --out /tmp/jetrl_accuracy           # one arm via run_grpo.py
    python3 examples/accuracy_study.py arms --out /tmp/jetrl_accuracy --parallel 5   # all arms side by side
    python3 examples/accuracy_study.py report --out /tmp/jetrl_accuracy --also /tmp/jetrl_accuracy_seed1 --assets DIR
    python3 examples/accuracy_study.py all --out /tmp/jetrl_accuracy --parallel 5    # sft, arms, report
    uv run examples/accuracy_study.py all --quick --out /tmp/acc_quick                # CPU smoke form (CI)

Arms (`examples/configs/accuracy_<arm>.yaml`, same seeds, same SFT start): bf16, fp8_rollout_only,
fp8_rollout_only_tis, fp8 (unified), fp8_kv (unified + FP8 KV cache). Each arm is `examples/run_grpo.py --config
accuracy_<arm>.yaml policy.model_name=OUT/sft logger.log_dir=OUT/arms/<arm> grpo.seed=SEED [overrides]`; trailing
key=value arguments are more overrides for every arm. `--quick` swaps in a one-layer model, 2-digit problems and a
few steps of each stage. User errors exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accuracy_report  # noqa: E402
import accuracy_sft  # noqa: E402
import run_grpo  # noqa: E402

ARMS = ("bf16", "fp8_rollout_only", "fp8_rollout_only_tis", "fp8", "fp8_kv")
CONFIGS = HERE / "configs"
USER_ERROR = 2
# the study's SFT on the GPU, and the quick CPU form
SFT_SETTINGS = {
    "study": dict(shape="study", num_digits=20, batch_size=128, lr=6e-4, max_steps=4000, warmup=100, eval_every=5,
                  gate=0.3, gate_size=64, max_time_s=150.0),
    "quick": dict(shape="quick", num_digits=2, batch_size=32, lr=3e-3, max_steps=20, warmup=5, eval_every=10,
                  gate=1.01, gate_size=16, max_time_s=60.0),
}  # fmt: skip
QUICK_GRPO_OVERRIDES = (
    "data.num_digits=2", "data.val_size=16", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=2", "grpo.val_period=2", "grpo.val_at_start=false", "grpo.max_val_samples=8",
    "grpo.mismatch_position_bin=8", "policy.max_total_sequence_length=40", "policy.generation.max_new_tokens=28",
    "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16", "cluster.device=cpu",
    "cluster.num_cpu_threads=2", "grpo.drop_zero_advantage_groups=false",  # train even on all-zero rewards
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="accuracy_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=("sft", "grpo", "arms", "report", "all"))
    p.add_argument("--arm", choices=ARMS, default=None, help="the arm of the grpo stage")
    p.add_argument("--out", type=Path, default=Path("/tmp/jetrl_accuracy"), help="study directory")
    p.add_argument("--quick", action="store_true", help="CPU smoke form: tiny model, a few steps of each stage")
    p.add_argument("--seed", type=int, default=0, help="SFT init seed; grpo.seed is 42 + seed")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available; cpu with --quick)")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms of the arms / all stages")
    p.add_argument("--parallel", type=int, default=1, help="arms run at once (> 1: one process each)")
    p.add_argument("--time-limit-s", type=float, default=None, help="arms stage: stop arms still running then")
    p.add_argument("--assets", type=Path, default=None, help="report stage: also copy plots + raw files here")
    p.add_argument("--also", type=Path, action="append", default=[], help="report stage: another seed's study dir")
    p.add_argument("--sft-max-time-s", type=float, default=None, help="SFT wall-time cap (default per form)")
    p.add_argument("--sft-gate", type=float, default=None, help="SFT held-out greedy accuracy gate")
    p.add_argument("overrides", nargs="*", help="run_grpo.py overrides for every arm (key=value ...)")
    return p


def stage_sft(args: argparse.Namespace) -> dict:
    settings = dict(SFT_SETTINGS["quick" if args.quick else "study"])
    if args.sft_max_time_s is not None:
        settings["max_time_s"] = args.sft_max_time_s
    if args.sft_gate is not None:
        settings["gate"] = args.sft_gate
    device = torch.device(args.device or ("cpu" if args.quick or not torch.cuda.is_available() else "cuda"))
    if args.quick:
        torch.set_num_threads(2)
    meta = accuracy_sft.run_sft(args.out / "sft", seed=args.seed, data_seed=1234, device=device, **settings)
    print(f"sft: {meta['steps']} steps, held-out greedy accuracy {meta['gate_greedy_accuracy']:.3f} "
          f"(gate {meta['gate']}), {meta['num_parameters']:,} parameters, {meta['wall_time_s']} s", flush=True)  # fmt: skip
    return meta


def grpo_argv(args: argparse.Namespace, arm: str) -> list[str]:
    """The run_grpo.py command line of one arm."""
    argv = [
        "--config", str(CONFIGS / f"accuracy_{arm}.yaml"),
        f"policy.model_name={args.out / 'sft'}",
        f"logger.log_dir={args.out / 'arms' / arm}",
        f"grpo.seed={42 + args.seed}",
    ]  # fmt: skip
    if args.quick:
        argv += list(QUICK_GRPO_OVERRIDES)
    if args.device:
        argv.append(f"cluster.device={args.device}")
    return argv + list(args.overrides)


def stage_grpo(args: argparse.Namespace, arm: str) -> int:
    if not (args.out / "sft" / "config.json").is_file():
        print(f"error: no SFT checkpoint in {args.out / 'sft'}: run the sft stage first", file=sys.stderr)
        return USER_ERROR
    return run_grpo.main(grpo_argv(args, arm))


def stage_arms(args: argparse.Namespace) -> int:
    """Every arm of `--arms`: in this process one after another (`--parallel 1`), else one process each."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        print(f"error: --arms {args.arms!r}: unknown {unknown}; known: {list(ARMS)}", file=sys.stderr)
        return USER_ERROR
    if args.parallel <= 1:
        return max(stage_grpo(args, arm) for arm in arms)
    (args.out / "arms").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    running: dict[str, tuple[subprocess.Popen, object]] = {}
    pending, codes, start = list(arms), {}, time.monotonic()
    while pending or running:
        while pending and len(running) < args.parallel:
            arm = pending.pop(0)
            log = (args.out / "arms" / f"{arm}.log").open("w")
            cmd = [sys.executable, str(HERE / "run_grpo.py"), *grpo_argv(args, arm)]
            running[arm] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
            print(f"arms: started {arm} (pid {running[arm][0].pid})", flush=True)
        time.sleep(1.0)
        over = args.time_limit_s is not None and time.monotonic() - start > args.time_limit_s
        for arm, (proc, log) in list(running.items()):
            if over and proc.poll() is None:
                proc.terminate()
                print(f"arms: {arm} stopped at the time limit", flush=True)
            if proc.poll() is not None or over:
                codes[arm] = proc.wait()
                log.close()
                del running[arm]
                print(f"arms: {arm} exited {codes[arm]} after {time.monotonic() - start:.0f} s", flush=True)
        if over:
            pending.clear()
    return 0 if all(c == 0 for c in codes.values()) else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.stage == "grpo" and args.arm is None:
        print(f"error: the grpo stage needs --arm: one of {list(ARMS)}", file=sys.stderr)
        return USER_ERROR
    if args.stage != "grpo" and args.arm is not None:
        print(f"error: --arm ({args.arm}) is only for the grpo stage (the arms stage takes --arms)", file=sys.stderr)
        return USER_ERROR
    if args.stage in ("sft", "all"):
        stage_sft(args)
    if args.stage == "grpo":
        return stage_grpo(args, args.arm)
    rc = stage_arms(args) if args.stage in ("arms", "all") else 0
    if args.stage in ("report", "all"):
        summary = accuracy_report.write_report([args.out, *args.also], args.assets)
        print(accuracy_report.format_table(summary))
    return rc


if __name__ == "__main__":
    sys.exit(main())
