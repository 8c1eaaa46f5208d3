#!/usr/bin/env python
"""Run GRPO with the Jet-RL unified FP8 precision flow.

    uv run examples/run_grpo.py --config examples/configs/grpo_base.yaml policy.precision=bf16 +logger.tag=x
    uv run torchrun --nproc-per-node 2 examples/run_grpo.py --config examples/configs/grpo_tiny.yaml   # 2 ranks

Overrides follow Hydra: `a.b=c` changes an existing key, `+new.key=v` adds one, `~a.b` deletes one; values are
YAML-like (`x=[1,2]`, `x=null`, `x=1e-5`). User errors exit with status 2 and a one-line `error: ...` on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.config.display import print_config
from nemo_jetrl.precision.config import precision_line
from nemo_jetrl.schema import validate_config

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "grpo_base.yaml"
USER_ERROR = 2

EPILOG = """\
overrides (Hydra syntax, applied after `defaults:` inheritance, before ${...} interpolation):
  a.b=value      change an existing key (unknown keys are an error)
  +a.new=value   add a new key
  ~a.b           delete a key
  values: 3, 1e-5, true, null, abc, '1' (a string), [1,2], {k: v}

example:
  uv run examples/run_grpo.py --config examples/configs/grpo_base.yaml \\
      policy.precision=fp8 policy.generation.kv_cache_dtype=fp8 grpo.max_num_steps=20
  uv run examples/run_grpo.py --config examples/configs/grpo_base.yaml --validate-only
"""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `error: ...` line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="run_grpo.py",
        description="GRPO with one FP8 recipe for training and rollout (Jet-RL unified precision flow).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH", help="YAML config (default: %(default)s)"
    )
    parser.add_argument(
        "--validate-only", action="store_true", help="load and validate, print the resolved config, exit"
    )
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra-style overrides (see below)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    rank = os.environ.get("RANK") if "LOCAL_RANK" in os.environ else None  # started by torchrun (or srun + it)
    if rank not in (None, "0"):  # only rank 0 of a torchrun run prints (errors still reach stderr)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    try:
        resolved = load_config(args.config, args.overrides)
        master_cfg = validate_config(resolved)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    for warning in master_cfg.ignored_key_warnings if rank in (None, "0") else ():
        print(f"warning: {warning}", file=sys.stderr)
    print_config(resolved, title=f"config: {args.config}")
    for note in master_cfg.startup_notes:
        print(note)
    if (line := master_cfg.prev_logprobs_line()) is not None:
        print(line)
    print(precision_line(master_cfg.policy))
    if args.validate_only:
        return 0
    from nemo_jetrl.algorithms.memory_preflight import memory_preflight
    from nemo_jetrl.utils.process_env import apply_trainer_env

    for line in apply_trainer_env(master_cfg.policy.dtensor_cfg):  # before the preflight starts CUDA
        print(line)

    try:  # before the trainer's imports: a config the device cannot run is refused at once (run_grpo reports it)
        memory_preflight(master_cfg.model_copy(deep=True))  # run_grpo derives the budgets into its own
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    from nemo_jetrl.algorithms.grpo import run_grpo
    from nemo_jetrl.distributed.errors import WorkerGroupError
    from nemo_jetrl.policy.nonfinite import NonFiniteError
    from nemo_jetrl.utils.run_lock import RunDirLockedError

    try:
        run_grpo(master_cfg, resolved)
    except (ValueError, OSError, NonFiniteError, WorkerGroupError, RunDirLockedError) as exc:
        # Bad inputs found at run time (model dir, dataset rows, a dead worker, a non-finite step, a locked or
        # unwritable / full output directory, a foreign checkpoint): one line.
        if os.environ.get("NEMO_JETRL_TRACEBACK"):
            raise
        where = f"rank {rank}: " if rank not in (None, "0") else ""
        print(f"error: {where}{exc} (set NEMO_JETRL_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return 1
    finally:
        _stop_process_group()
    return 0


def _stop_process_group() -> None:
    """torchrun: leave the process group before exiting (every rank reaches here after the run)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
