"""The command line of examples/accuracy_study.py: its arms, lengths and flags (the parser, its argument types)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DESCRIPTION = ("The accuracy studies (docs/accuracy.md, docs/accuracy_long.md): SFT a Qwen3 from scratch on a "
               "scratchpad task, then GRPO in precision arms.")
ARMS = ("bf16", "fp8_rollout_only", "fp8_rollout_only_tis", "fp8", "fp8_kv")
LONG_ARMS = ("bf16", "fp8_rollout_only", "fp8_rollout_only_tis", "fp8_rollout_only_icepop", "fp8_kv_rollout_only",
             "fp8", "fp8_kv", "fp8_kv_matched")  # fmt: skip
LONG_OPTIONAL_ARMS = ("fp8_kv_exact",)  # the exact mode: slower, so only on request (--arms)
LONG_LENGTHS = {"1k": 7, "2k": 10, "4k": 13}  # data.num_digits: responses of 1,086 / 2,151 / 3,576 tokens at most
BASE_TEMPERATURE, BASE_LR = 1.0, 2.0e-5  # accuracy_long_base.yaml's sampling temperature and learning rate
REPEAT_SEED_STRIDE = 1000  # a stage's repeat k of an arm runs with grpo.seed 42 + seed + this * k (--repeats)


# the --sft-* flags -> the run_sft setting each sets; a stage hands them all to each seed's SFT process
SFT_FLAGS = {"--sft-max-time-s": "max_time_s", "--sft-gate": "gate", "--sft-gate-sampled": "gate_sampled",
             "--sft-lr": "lr", "--sft-rows": "batch_size", "--sft-steps": "fixed_steps",
             "--sft-deterministic": "deterministic", "--sft-init-from": "init_from"}  # fmt: skip


def variant_settings(stage: str) -> dict[str, str | float]:
    """The length, sampling temperature and learning rate a stage directory's name encodes (accuracy_study.variants:
    `2k-rep7_T0.7` -> 2k, 0.7, the base lr; no suffix: the base config's)."""
    head, *suffixes = stage.split("_")
    out: dict[str, str | float] = {"length": head.split("-", 1)[0], "temperature": BASE_TEMPERATURE, "lr": BASE_LR}
    for suffix in suffixes:
        for prefix, key in (("T", "temperature"), ("lr", "lr")):
            if suffix.startswith(prefix) and re.fullmatch(r"[0-9.e+-]+", suffix[len(prefix):]):
                out[key] = float(suffix[len(prefix):])
    return out


def flag_value(args: argparse.Namespace, flag: str):
    """The value of `--flag-name` in `args` (argparse's dest: flag_name), None where not given."""
    return getattr(args, flag[2:].replace("-", "_"))


def sft_argv(sub: argparse.Namespace) -> list[str]:
    """This script's command line of one seed's SFT in a stage (`sub`: `seed_args`), the stage's --sft-* flags
    included."""
    argv = ["sft", "--study", "long", "--length", sub.length, "--seed", str(sub.seed), "--out", str(sub.out)]
    argv += ["--quick"] * sub.quick + [f"--device={sub.device}"] * bool(sub.device)
    for flag in SFT_FLAGS:
        value = flag_value(sub, flag)
        if value is not None:  # a bool (BooleanOptionalAction) as --flag / --no-flag
            argv.append((flag if value else f"--no-{flag[2:]}") if isinstance(value, bool) else f"{flag}={value}")
    return argv


def _number_list(text: str, kind: type = float) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    return _number_list(text, int)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number >= 1, got {text!r}")
    return int(text)


def _tag(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9-]+", text):
        raise argparse.ArgumentTypeError(f"letters, digits and '-' only, got {text!r}")
    return text


def _combine(text: str) -> tuple[str, list[str]]:
    """`NAME=STAGE,STAGE,...` (`report --study long --combine` and `--pool`)."""
    name, sep, stages = text.partition("=")
    parts = [p for p in stages.split(",") if p]
    if not sep or not parts or not re.fullmatch(r"[A-Za-z0-9-]+", name) or any("/" in p for p in parts):
        raise argparse.ArgumentTypeError(f"NAME=STAGE,STAGE,... (e.g. 1k-seeds=1k,1k-s0), got {text!r}")
    return name, parts


def _twins(text: str) -> tuple[str, list[str]]:
    """`NAME=STAGE,STAGE` (`report --study long --twins`): exactly two stages."""
    name, parts = _combine(text)
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"NAME=STAGE,STAGE: two stages (e.g. 2k-twins=2k-rep7b_T0.7,2k-rep7c_T0.7), "
                                         f"got {len(parts)} in {text!r}")  # fmt: skip
    return name, parts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="accuracy_study.py", description=DESCRIPTION)
    p.add_argument("stage", choices=("sft", "grpo", "arms", "stage", "evaluate", "report", "all"))
    p.add_argument("--study", choices=("addition", "long"), default="addition", help="which study (docstring)")
    p.add_argument("--length", choices=tuple(LONG_LENGTHS), default="2k", help="long study: the response length")
    p.add_argument("--arm", choices=sorted(set(ARMS + LONG_ARMS + LONG_OPTIONAL_ARMS)), default=None,
                   help="the arm of the grpo stage")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("/tmp/jetrl_accuracy"), help="study directory")
    p.add_argument("--quick", action="store_true", help="CPU smoke form: tiny model, a few steps of each stage")
    p.add_argument("--seed", type=int, default=0, help="SFT init seed; grpo.seed is 42 + seed")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available; cpu with --quick)")
    p.add_argument("--arms", default=None, help="comma-separated arms of the arms / stage / all stages (default: all)")
    p.add_argument("--seeds", type=_int_list, default=[0, 1], help="stage: comma-separated seeds (one SFT each)")
    p.add_argument("--repeats", type=_positive_int, default=1,
                   help=f"stage: GRPO runs per arm from each seed's SFT (repeat k: seed<S>r<k>/, grpo.seed + "
                        f"{REPEAT_SEED_STRIDE} k)")  # fmt: skip
    p.add_argument("--same-grpo-seed", action="store_true",
                   help="stage: --repeats keep the seed's grpo.seed (a control: how far do runs that differ only in "
                        "the GPU's non-deterministic reductions drift apart?)")  # fmt: skip
    p.add_argument("--gpus", default=None, help="stage: comma-separated GPU indices (default: every CUDA device)")
    p.add_argument("--gpu-memory-gib", type=float, default=None, help="stage: one GPU's memory (default: queried)")
    p.add_argument("--inline", action="store_true", help="stage: run every job in this process, one after another")
    p.add_argument("--pack", type=Path, default=None, help="stage: write the stage's small outputs to this tar.gz")
    p.add_argument("--temperature", type=_number_list, default=None, help="stage sweep: temperatures, e.g. 1.0,0.7")
    p.add_argument("--lr", type=_number_list, default=None, help="stage sweep: learning rates, e.g. 2e-5,5e-5")
    p.add_argument("--sweep-arms", default=None, help="stage: the non-base variants' arms (default: --arms)")
    p.add_argument("--tag", type=_tag, default=None, help="stage: a name for this call's directories (4k-<tag>)")
    p.add_argument("--parallel", type=int, default=1, help="arms run at once (> 1: one process each)")
    p.add_argument("--time-limit-s", type=float, default=None, help="arms / stage: stop what still runs then")
    p.add_argument("--assets", type=Path, default=None, help="report stage: also copy plots + raw files here")
    p.add_argument("--also", type=Path, action="append", default=[], help="report stage: another seed's study dir")
    p.add_argument("--combine", type=_combine, action="append", default=[],
                   help="long report: NAME=STAGE,STAGE: one stage of the seeds several calls ran apart")  # fmt: skip
    p.add_argument("--pool", type=_combine, action="append", default=[],
                   help="long report: NAME=STAGE,STAGE: each arm against BF16 over these stages' runs, each "
                        "stage's starts kept apart")  # fmt: skip
    p.add_argument("--twins", type=_twins, action="append", default=[],
                   help="long report: NAME=STAGE,STAGE: the runs two stages ran from one deterministic start under "
                        "one GRPO config, side by side (GPU nondeterminism alone)")  # fmt: skip
    p.add_argument("--variant", default=None, metavar="STAGE",
                   help="evaluate: the stage variant under --out whose arms to evaluate, e.g. 2k-kv7_T0.7")  # fmt: skip
    p.add_argument("--reference-tests", type=_positive_int, default=4,
                   help="evaluate: samples per held-out problem for the referee's pass@1")  # fmt: skip
    p.add_argument("--seed-curves", action="append", default=[], metavar="STAGE",
                   help="long report: also plot this stage's curves per seed (seeds_<STAGE>.png) and every run "
                        "in one row (runs_<STAGE>.png)")  # fmt: skip
    p.add_argument("--sft-max-time-s", type=float, default=None, help="SFT wall-time cap (default per form)")
    p.add_argument("--sft-gate", type=float, default=None, help="SFT held-out greedy accuracy gate")
    p.add_argument("--sft-gate-sampled", type=float, default=None,
                   help="SFT gate: least held-out accuracy sampled at temperature 1 (long: 0.1; 0: none)")  # fmt: skip
    p.add_argument("--sft-lr", type=float, default=None, help="SFT peak learning rate (default per form)")
    p.add_argument("--sft-rows", type=int, default=None, help="SFT rows a step (default per form and length)")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="SFT this many steps, the gate checked once, at the end "
                        "(default: stop at the gate)")  # fmt: skip
    p.add_argument("--sft-deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="SFT training steps under torch's deterministic algorithms (the same start again)")  # fmt: skip
    p.add_argument("--sft-init-from", default=None, metavar="DIR",
                   help="SFT from this finished SFT's weights (a curriculum); {seed} is each seed's, e.g. "
                        "/tmp/acc_long/2k-cur/seed{seed}/sft")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="run_grpo.py overrides for every arm (key=value ...)")
    return p
