#!/usr/bin/env python
"""The accuracy studies (docs/accuracy.md, docs/accuracy_long.md): SFT a Qwen3 from scratch on a scratchpad task,
then GRPO in precision arms.

Study `addition` (the default: long addition, ~220-token responses, 50M model, five arms):

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

Study `long` (long multiplication, 1K-4K-token responses, 104M model, `LONG_ARMS`; `accuracy_long_<arm>.yaml`):
one device call per stage, a stage being one response length (`--length` 1k / 2k / 4k: 7 / 10 / 13 digits) with
optional sweep values (`--temperature`, `--lr`), for every seed of `--seeds` (accuracy_stage.py: SFT per seed, then
all arms at once over `--gpus`, stopped at `--time-limit-s`, resumable, packed into one small tar.gz;
`--repeats R` runs each arm R times from each SFT start, with other GRPO seeds; `evaluate --variant STAGE` puts
each arm's last checkpoint through one BF16 referee, accuracy_eval.py):

    python3 examples/accuracy_study.py stage --study long --length 2k --out /tmp/acc_long --pack $OUT/2k.tar.gz
    python3 examples/accuracy_study.py report --study long --out /tmp/acc_long --assets docs/assets/accuracy_long
    uv run examples/accuracy_study.py stage --study long --quick --inline --out /tmp/acc_long_quick  # CPU smoke form
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from nemo_jetrl.utils.save_deadline import process_age_s

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accuracy_eval  # noqa: E402
import accuracy_long_report  # noqa: E402
import accuracy_report  # noqa: E402
import accuracy_sft  # noqa: E402
import accuracy_stage  # noqa: E402
import run_grpo  # noqa: E402
from accuracy_cli import (  # noqa: E402
    ARMS,
    BASE_LR,
    BASE_TEMPERATURE,
    LONG_ARMS,
    LONG_LENGTHS,
    LONG_OPTIONAL_ARMS,
    REPEAT_SEED_STRIDE,
    SFT_FLAGS,
    build_parser,
    flag_value,
    sft_argv,
)
from accuracy_twins import TwinMismatch  # noqa: E402

CONFIGS = HERE / "configs"
USER_ERROR = 2
GRPO_MICRO_BATCH_TOKENS = 10240  # GRPO rows per micro-batch: the power of two whose rows fit in this
SFT_STEP_TOKENS = 65536  # SFT rows per step: the power of two nearest this many tokens, in two micro-batches
# the study's SFT on the GPU, and the quick CPU form
SFT_SETTINGS = {
    "study": dict(shape="study", num_digits=20, batch_size=128, lr=6e-4, max_steps=4000, warmup=100, eval_every=5,
                  gate=0.3, gate_size=64, max_time_s=150.0),
    "quick": dict(shape="quick", num_digits=2, batch_size=32, lr=3e-3, max_steps=20, warmup=5, eval_every=10,
                  gate=1.01, gate_size=16, max_time_s=60.0),
}  # fmt: skip
LONG_SFT = dict(shape="long", task_name="long_multiplication", lr=5e-4, max_steps=5000, warmup=100, eval_every=25,
                gate=0.3, gate_sampled=0.1, gate_size=64, max_time_s=240.0, precheck=True)  # fmt: skip
QUICK_LONG_SFT = dict(shape="quick", task_name="long_multiplication", num_digits=2, batch_size=8, micro_batch_size=4,
                      lr=3e-3, max_steps=2, warmup=1, eval_every=2, gate=0.0, gate_size=4, max_time_s=60.0,
                      precheck=True)  # fmt: skip
QUICK_GRPO_OVERRIDES = (
    "data.num_digits=2", "data.val_size=16", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=2", "grpo.val_period=2", "grpo.val_at_start=false", "grpo.max_val_samples=8",
    "grpo.mismatch_position_bin=8", "policy.max_total_sequence_length=40", "policy.generation.max_new_tokens=28",
    "policy.train_micro_batch_size=16", "policy.logprob_batch_size=16", "cluster.device=cpu",
    "cluster.num_cpu_threads=2", "grpo.drop_zero_advantage_groups=false",  # train even on all-zero rewards
)  # fmt: skip


QUICK_LONG_GRPO_OVERRIDES = (
    "data.num_digits=2", "data.val_size=16", "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=1", "grpo.val_period=1", "grpo.val_at_start=false", "grpo.max_val_samples=4",
    "grpo.mismatch_position_bin=16", "policy.max_total_sequence_length=64", "policy.generation.max_new_tokens=48",
    "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8", "cluster.device=cpu",
    "cluster.num_cpu_threads=2", "grpo.drop_zero_advantage_groups=false",
)  # fmt: skip


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def long_lengths(num_digits: int) -> dict[str, int]:
    """The sequence limits and batch rows of the long study at `num_digits`: max_new_tokens (the longest worked
    solution + eos + 64, rounded up to 128), max_total (+ bos and prompt, rounded up to 128), GRPO micro-batch rows,
    SFT rows per step and per micro-batch."""
    task = accuracy_sft.make_scratchpad_task("long_multiplication", num_digits=num_digits, val_size=0)
    max_new = _round_up(task.max_response_chars + 1 + 64, 128)
    total = _round_up(1 + task.prompt_chars + max_new, 128)
    sft_len = 1 + task.prompt_chars + task.max_response_chars + 1
    sft_batch = 2 ** round(math.log2(SFT_STEP_TOKENS / sft_len))
    micro_rows = 2 ** int(math.log2(GRPO_MICRO_BATCH_TOKENS // total))
    return dict(max_new_tokens=max_new, max_total=total, micro_rows=micro_rows, sft_batch=sft_batch,
                sft_micro=sft_batch // 2)  # fmt: skip


def long_grpo_overrides(num_digits: int) -> list[str]:
    lengths = long_lengths(num_digits)
    return [
        f"data.num_digits={num_digits}",
        f"policy.generation.max_new_tokens={lengths['max_new_tokens']}",
        f"policy.max_total_sequence_length={lengths['max_total']}",
        f"policy.train_micro_batch_size={lengths['micro_rows']}",
        f"policy.logprob_batch_size={lengths['micro_rows']}",
    ]


def stage_root_name(args: argparse.Namespace) -> str:
    """The directory of a stage's SFT and base variant: the length (or `quick`) and the --tag, e.g. `4k-temp`."""
    return ("quick" if args.quick else args.length) + (f"-{args.tag}" if args.tag else "")


def variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(directory name, run_grpo.py overrides) of every sweep variant of a stage: the product of the --temperature
    and --lr values, e.g. `4k_T0.7_lr5e-05`; a value equal to the base config's (BASE_TEMPERATURE, BASE_LR) is the
    base variant's (no suffix, no override)."""
    out = {}
    for t in args.temperature or [None]:
        for lr in args.lr or [None]:
            name, overrides = stage_root_name(args), []
            if t is not None and t != BASE_TEMPERATURE:
                name, overrides = name + f"_T{t:g}", overrides + [f"policy.generation.temperature={t:g}"]
            if lr is not None and lr != BASE_LR:
                name, overrides = name + f"_lr{lr:g}", overrides + [f"policy.optimizer.lr={lr:g}"]
            out[name] = overrides
    return list(out.items())


def study_arms(args: argparse.Namespace, flag: str = "arms") -> list[str] | None:
    """The arms of `--arms` (or `--sweep-arms`; default: the study's), or None after printing the error line."""
    default = LONG_ARMS if args.study == "long" else ARMS
    known = LONG_ARMS + LONG_OPTIONAL_ARMS if args.study == "long" else ARMS
    text = getattr(args, flag.replace("-", "_")) or args.arms or ",".join(default)
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in known]
    if unknown or not arms:
        print(f"error: --{flag} {text!r}: unknown {unknown}; known for --study {args.study}: {list(known)}",
              file=sys.stderr)  # fmt: skip
        return None
    return arms


def sft_settings(args: argparse.Namespace) -> dict:
    """The run_sft settings of the study, length and form, with the --sft-* flags applied."""
    if args.study == "long":
        settings = dict(QUICK_LONG_SFT)
        if not args.quick:
            n = LONG_LENGTHS[args.length]
            lengths = long_lengths(n)
            settings = dict(LONG_SFT, num_digits=n, batch_size=lengths["sft_batch"],
                            micro_batch_size=lengths["sft_micro"], max_positions=lengths["max_total"])  # fmt: skip
    else:
        settings = dict(SFT_SETTINGS["quick" if args.quick else "study"])
    given = {key: flag_value(args, flag) for flag, key in SFT_FLAGS.items()}
    return settings | {key: value for key, value in given.items() if value is not None}


def stage_sft(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cpu" if args.quick or not torch.cuda.is_available() else "cuda"))
    if args.quick:
        torch.set_num_threads(2)
    settings = sft_settings(args)
    settings["init_from"] = accuracy_sft.init_path(settings.get("init_from"), args.seed)
    meta = accuracy_sft.run_sft(args.out / "sft", seed=args.seed, data_seed=1234, device=device, **settings)
    greedy, sampled = meta["gate_greedy_accuracy"], meta.get("gate_sampled_accuracy")
    print(f"sft: {meta['steps']} steps, held-out greedy accuracy {'-' if greedy is None else f'{greedy:.3f}'} "
          f"(gate {meta['gate']}), sampled {'-' if sampled is None else f'{sampled:.3f}'} "
          f"(gate {meta.get('gate_sampled', 0.0)}), {meta['num_parameters']:,} parameters, {meta['wall_time_s']} s",
          flush=True)  # fmt: skip
    return meta


def grpo_argv(
    args: argparse.Namespace, arm: str, log_root: Path | None = None, variant: list[str] = (),
    capacity_gib: float | None = None,
) -> list[str]:  # fmt: skip
    """The run_grpo.py command line of one arm: the SFT checkpoint of `args.out`, logs under `log_root` (default
    `args.out`), a sweep variant's overrides, the memory preflight's capacity."""
    prefix = "accuracy_long_" if args.study == "long" else "accuracy_"
    argv = [
        "--config", str(CONFIGS / f"{prefix}{arm}.yaml"),
        f"policy.model_name={args.out / 'sft'}",
        f"logger.log_dir={(log_root or args.out) / 'arms' / arm}",
        f"grpo.seed={grpo_seed(args)}",
    ]  # fmt: skip
    if args.study == "long":
        argv += list(QUICK_LONG_GRPO_OVERRIDES) if args.quick else long_grpo_overrides(LONG_LENGTHS[args.length])
    elif args.quick:
        argv += list(QUICK_GRPO_OVERRIDES)
    argv += list(variant)
    if capacity_gib is not None:
        argv.append(f"policy.memory_preflight.capacity_gib={capacity_gib:.1f}")
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
    arms = study_arms(args)
    if arms is None:
        return USER_ERROR
    if args.parallel <= 1:
        return max(stage_grpo(args, arm) for arm in arms)
    jobs = [accuracy_stage.Job(arm, HERE / "run_grpo.py", grpo_argv(args, arm), args.out / "arms" / f"{arm}.log")
            for arm in arms]  # fmt: skip
    limit = math.inf if args.time_limit_s is None else args.time_limit_s
    accuracy_stage.run_jobs(jobs, time.monotonic() + limit, parallel=args.parallel)
    return 0 if all(job.result["rc"] == 0 for job in jobs) else 1


def grpo_seed(args: argparse.Namespace) -> int:
    """42 + the SFT seed, + REPEAT_SEED_STRIDE x the repeat unless `--same-grpo-seed` (a repeat then differs from
    its seed's first run only where the GPU's reductions are not deterministic)."""
    repeat = 0 if getattr(args, "same_grpo_seed", False) else getattr(args, "repeat", 0)
    return 42 + args.seed + REPEAT_SEED_STRIDE * repeat


def seed_args(args: argparse.Namespace, stage_dir: Path, seed: int, repeat: int = 0) -> argparse.Namespace:
    """`args` for one seed of a stage: its directory (its SFT's), seed and GRPO repeat."""
    return argparse.Namespace(**{**vars(args), "out": stage_dir / f"seed{seed}", "seed": seed, "repeat": repeat})


def visible_gpus(args: argparse.Namespace) -> list[str]:
    if args.gpus is not None:
        return [g.strip() for g in args.gpus.split(",") if g.strip()]
    if args.device == "cpu" or (args.quick and args.device != "cuda") or not torch.cuda.is_available():
        return []  # the quick form runs on the CPU unless --device cuda
    return [str(i) for i in range(torch.cuda.device_count())]


def stage_stage(args: argparse.Namespace) -> int:
    """One stage of the long study (accuracy_stage.py): SFT per seed, then every arm of every sweep variant and
    seed at once."""
    if args.study != "long":
        print("error: the stage command is for --study long (the addition study: sft, arms)", file=sys.stderr)
        return USER_ERROR
    arms, sweep_arms = study_arms(args), study_arms(args, "sweep-arms")
    if arms is None or sweep_arms is None:
        return USER_ERROR
    seeds = args.seeds
    sft = sft_settings(args)
    try:  # an --sft-init-from SFT that is missing or unfit: one line before any SFT starts
        for seed in seeds if sft.get("init_from") else []:
            accuracy_sft.init_source(accuracy_sft.init_path(sft["init_from"], seed), sft["task_name"], sft["shape"])
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return USER_ERROR
    gpus = visible_gpus(args)
    gib = args.gpu_memory_gib
    if gpus and gib is None:
        gib = torch.cuda.get_device_properties(int(gpus[0])).total_memory / 2**30
    sft_root = args.out / stage_root_name(args)
    overrides_of = {args.out / name: overrides for name, overrides in variants(args)}
    arms_of = {d: sweep_arms if overrides else arms for d, overrides in overrides_of.items()}
    deadline = time.monotonic() + (math.inf if args.time_limit_s is None else args.time_limit_s)
    print(f"stage {sft_root}: seeds {seeds}, variants {[d.name for d in arms_of]}, gpus {gpus or 'none (cpu)'}")

    def sft_job(seed: int, gpu: str | None) -> accuracy_stage.Job:
        sub = seed_args(args, sft_root, seed)
        argv = sft_argv(sub)

        def inline() -> int:
            stage_sft(sub)
            return 0

        log = sub.out / "sft.log"
        return accuracy_stage.Job(f"sft/seed{seed}", HERE / "accuracy_study.py", argv, log, gpu, inline=inline)

    def arm_job(variant: Path, seed: int, arm: str, gpu: str | None, per_gpu: int, repeat: int) -> accuracy_stage.Job:
        label = accuracy_stage.run_label(seed, repeat)
        log_root = variant / label
        capacity = None if gib is None else gib / per_gpu
        argv = grpo_argv(seed_args(args, sft_root, seed, repeat), arm, log_root, overrides_of[variant], capacity)
        directory = accuracy_stage.arm_dir(variant, seed, arm, repeat)

        def with_budget(age_s: float) -> list[str]:  # the arm saves and stops before the deadline; its budget counts
            budget = deadline - time.monotonic() - accuracy_stage.ARM_SAVE_MARGIN_S + age_s  # from its process's start
            return argv + accuracy_stage.arm_checkpoint_overrides(directory, budget)

        return accuracy_stage.Job(f"{variant.name}/{label}/{arm}", HERE / "run_grpo.py", with_budget(0.0),
                                  log_root / "arms" / f"{arm}.log", gpu,
                                  inline=lambda: run_grpo.main(with_budget(process_age_s())))  # fmt: skip

    status = accuracy_stage.run_stage(sft_root, arms_of, seeds, gpus, deadline, sft_job, arm_job, args.inline,
                                      sft_fixed_steps=args.sft_steps, repeats=args.repeats)  # fmt: skip
    for d, st in status.items():
        print(f"stage {d.name}:\n{accuracy_stage.status_table(st)}", flush=True)
    if args.pack is not None:
        path = accuracy_stage.pack(list(status), args.pack)
        print(f"stage: packed {path} ({path.stat().st_size / 2**20:.2f} MiB)", flush=True)
    labels = [accuracy_stage.run_label(s, r) for s in seeds for r in range(args.repeats)]
    jobs = [(d, f"{label}/{a}") for d, arms in arms_of.items() for label in labels for a in arms]
    reasons = [status[d]["jobs"][name]["reason"] for d, name in jobs]
    return 0 if all(r in accuracy_stage.DONE_REASONS for r in reasons) else 1


def stage_evaluate(args: argparse.Namespace) -> int:
    """Every arm of `--variant` with a checkpoint, evaluated through one BF16 referee (accuracy_eval.py)."""
    variant, wanted = args.out / (args.variant or ""), None
    if args.arms:  # only these arms
        wanted = study_arms(args)
        if wanted is None:
            return USER_ERROR
    arms = accuracy_eval.arms_with_checkpoints(variant, wanted) if args.variant else []
    if not arms:
        print(f"error: evaluate needs --variant: a stage variant under {args.out} whose arms saved a checkpoint "
              f"(none in {variant})", file=sys.stderr)  # fmt: skip
        return USER_ERROR
    deadline = time.monotonic() + (math.inf if args.time_limit_s is None else args.time_limit_s)
    status = accuracy_eval.run_reference(variant, arms, visible_gpus(args), deadline, args.reference_tests, args.inline)
    for name, entry in status.items():
        res = entry["results"] or {}
        print(f"  {name:28s} {entry['reason']!s:12s} step {res.get('checkpoint_step', '-')!s:5s} greedy "
              f"{res.get('accuracy', '-')!s:8.8s} pass@1 {res.get('pass@1', '-')!s:8.8s}", flush=True)
    if args.pack is not None:
        path = accuracy_stage.pack([variant], args.pack)
        print(f"evaluate: packed {path} ({path.stat().st_size / 2**20:.2f} MiB)", flush=True)
    return 0 if all(entry["results"] is not None for entry in status.values()) else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.stage == "grpo" and args.arm is None:
        print(f"error: the grpo stage needs --arm: one of {list(LONG_ARMS if args.study == 'long' else ARMS)}",
              file=sys.stderr)  # fmt: skip
        return USER_ERROR
    if args.stage != "grpo" and args.arm is not None:
        print(f"error: --arm ({args.arm}) is only for the grpo stage (the arms stage takes --arms)", file=sys.stderr)
        return USER_ERROR
    cap = sft_settings(args)["max_steps"] if args.sft_steps is not None else None
    if cap is not None and not 0 < args.sft_steps <= cap:
        print(f"error: --sft-steps {args.sft_steps}: must be 1 to the SFT's max_steps ({cap})", file=sys.stderr)
        return USER_ERROR
    if args.stage == "grpo":
        return stage_grpo(args, args.arm)
    if args.stage == "evaluate":
        return stage_evaluate(args)
    if args.study == "long" and args.stage in ("stage", "all"):  # all: the stage, then the report
        rc = stage_stage(args)
    else:
        if args.stage == "stage":
            return stage_stage(args)  # refuses the addition study with one line
        if args.stage in ("sft", "all"):
            stage_sft(args)
        rc = stage_arms(args) if args.stage in ("arms", "all") else 0
    if args.stage in ("report", "all"):
        if args.study == "long":  # every stage directory under --out
            try:  # a --combine, --seed-curves, --pool or --twins stage that is not there, or no twins: one line
                summary = accuracy_long_report.write_long_report(
                    args.out, args.assets, dict(args.combine), args.seed_curves, dict(args.pool), dict(args.twins)
                )
            except (FileNotFoundError, TwinMismatch) as err:
                print(f"error: {err}", file=sys.stderr)
                return USER_ERROR
            print(accuracy_long_report.format_long_tables(summary))
        else:
            summary = accuracy_report.write_report([args.out, *args.also], args.assets)
            print(accuracy_report.format_table(summary))
    return rc


if __name__ == "__main__":
    sys.exit(main())
