#!/usr/bin/env python
"""Evaluate a model (policy.model_name: builtin tiny model or HF directory) or a GRPO checkpoint: pass@k and greedy
accuracy on the task's held-out prompts (NeMo-RL's run_eval.py; nemo_jetrl/evals/eval.py).

    uv run examples/run_eval.py --config examples/configs/evals/eval_tiny.yaml eval.checkpoint_dir=results/grpo

Overrides as in run_grpo.py. User errors: one line `error: ...` on stderr, exit 2 (config) or 1 (run time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from omegaconf import OmegaConf

from nemo_jetrl.config import ConfigError, load_config
from nemo_jetrl.schema import validate_config

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "evals" / "eval_tiny.yaml"
USER_ERROR, RUN_ERROR = 2, 1


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USER_ERROR, f"error: {message} (see --help)\n")


def _configs(path: Path, overrides: list[str]):
    """(EvalConfig, validated MasterConfig) from the eval YAML: the `eval:` section and the GRPO sections."""
    from pydantic import ValidationError

    from nemo_jetrl.config.errors import format_validation_error
    from nemo_jetrl.evals.eval import EvalConfig

    resolved = load_config(path, overrides)
    plain = OmegaConf.to_container(resolved, resolve=True)
    eval_section = plain.pop("eval", None) or {}
    try:
        eval_cfg = EvalConfig.model_validate(eval_section)
    except ValidationError as exc:
        message = format_validation_error(exc, EvalConfig)
        raise ConfigError(message if message.startswith("eval.") else f"eval.{message}") from None
    return eval_cfg, validate_config(plain)


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="run_eval.py", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE")
    args = parser.parse_intermixed_args(argv)
    try:
        eval_cfg, master = _configs(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    from nemo_jetrl.algorithms.grpo import setup
    from nemo_jetrl.evals.eval import evaluate, load_checkpoint_policy, save_results
    from nemo_jetrl.utils.progress import RunProgress

    try:
        run = setup(master)
        step = load_checkpoint_policy(run, eval_cfg.checkpoint_dir) if eval_cfg.checkpoint_dir else None
        with RunProgress(eval_cfg.max_samples, description="eval", metric_keys={}) as progress:
            results = evaluate(run, eval_cfg, progress)
    except (ValueError, FileNotFoundError) as exc:
        if os.environ.get("NEMO_JETRL_TRACEBACK"):
            raise
        print(f"error: {exc} (set NEMO_JETRL_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return RUN_ERROR
    run.logger.close()
    results.update(model=master.policy.model_name, checkpoint_dir=eval_cfg.checkpoint_dir, checkpoint_step=step)
    if eval_cfg.save_path:
        print(f"results: {save_results(results, eval_cfg.save_path)}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
