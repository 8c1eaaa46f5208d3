#!/usr/bin/env python
"""Export a GRPO checkpoint as a HF safetensors directory (loadable with `AutoModelForCausalLM.from_pretrained`).

    uv run examples/export_hf.py --checkpoint results/grpo/step_100 --out exported/qwen3-8b-grpo
    uv run examples/export_hf.py --checkpoint results/grpo --out exported/latest            # newest valid step
    uv run examples/export_hf.py --config examples/configs/grpo_math_8B_fp8.yaml --out exported/fp8 --fp8

`--config` (+ Hydra-style overrides) exports the newest valid checkpoint in that config's
`checkpointing.checkpoint_dir`. `--fp8` writes vLLM's blockwise FP8 layout (`weight` e4m3 + `weight_scale_inv`,
`quantization_config.weight_block_size: [128, 128]`) for the layers the recipe's layer map puts in FP8.
User errors exit with status 2 and one `error: ...` line on stderr. A non-empty `--out` must hold an earlier export
of this tool (`.nemo_jetrl_export.json` lists its files; only those are replaced) unless `--overwrite` is given;
the checkpoint directory (the whole `checkpointing.checkpoint_dir`, also when `--checkpoint` names one step) and the
base model directory are never written to.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

USER_ERROR = 2
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="export_hf.py", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, metavar="DIR", help="a step_<N> directory or a checkpoint_dir")
    source.add_argument("--config", type=Path, metavar="PATH", help="GRPO config: export its newest checkpoint")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument("--fp8", action="store_true", help="blockwise FP8 weights (vLLM / DeepSeek-V3 layout)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of non-FP8 tensors")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="allow a non-empty --out that holds no earlier export (same-named files replaced, nothing removed)",
    )
    parser.add_argument("--max-shard-size", default="5GB", help="safetensors shard size (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="config overrides (with --config)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    from nemo_jetrl.algorithms.grpo_checkpoint import export_checkpoint
    from nemo_jetrl.config import ConfigError, load_config
    from nemo_jetrl.models.export_dir import earlier_export_files
    from nemo_jetrl.schema import validate_config
    from nemo_jetrl.utils.checkpoint import checkpoint_root

    try:
        if args.config is not None:
            checkpoint = Path(validate_config(load_config(args.config, args.overrides)).checkpointing.checkpoint_dir)
        elif args.overrides:
            raise ValueError(f"overrides {args.overrides} need --config")
        else:
            checkpoint = args.checkpoint
        # the run's whole checkpoint dir, not only the step exported: its other steps and lock live there
        earlier_export_files(args.out, overwrite=args.overwrite, protected=[checkpoint_root(checkpoint)])
        out = export_checkpoint(
            checkpoint,
            args.out,
            fp8=args.fp8,
            dtype=DTYPES[args.dtype],
            max_shard_size=args.max_shard_size,
            overwrite=args.overwrite,
        )
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    except OSError as exc:  # unwritable / full --out: nothing of an earlier export was removed
        print(f"error: export to {args.out} failed ({exc})", file=sys.stderr)
        return 1
    print(f"exported {'FP8 ' if args.fp8 else ''}policy of {checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
