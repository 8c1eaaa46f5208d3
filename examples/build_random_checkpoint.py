#!/usr/bin/env python
"""Write a random-init Qwen3 checkpoint (Qwen3-1.7B / Qwen3-8B shape) + an offline tokenizer + a math jsonl set.

    uv run examples/build_random_checkpoint.py --out /tmp/jetrl_random_1p7B                   # Qwen3-1.7B, bf16
    python3 examples/build_random_checkpoint.py --out /tmp/q8b --shape qwen3-8b --layers 8 --device cuda
    uv run examples/build_random_checkpoint.py --out /tmp/tiny --shape tiny-test               # 2-core CPU check

Layout: OUT/model (HF directory: policy.model_name), OUT/data/{train,val}.jsonl (data.dataset_name /
data.val_dataset_name), OUT/build_info.json. Nothing is downloaded. User errors exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from nemo_jetrl.models.random_checkpoint import DTYPES, SHAPES, build_random_checkpoint, resolve_shape

USER_ERROR = 2
NUM_STAGES = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="build_random_checkpoint.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory (OUT/model must be new or empty)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b", help="default: %(default)s")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="weights and dataset seed (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="where to initialize: cpu | cuda (default: %(default)s)")
    parser.add_argument("--train-rows", type=int, default=256, help="default: %(default)s")
    parser.add_argument("--val-rows", type=int, default=32, help="default: %(default)s")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        resolve_shape(args.shape, args.layers)  # bad --layers fails before any work
        with tqdm(total=NUM_STAGES, unit="stage", dynamic_ncols=True) as bar:
            started = []

            def stage(name: str) -> None:  # close the previous stage, open this one
                if started:
                    bar.update(1)
                started.append(name)
                bar.set_description(name)

            info = build_random_checkpoint(
                args.out,
                args.shape,
                num_layers=args.layers,
                dtype=args.dtype,
                seed=args.seed,
                device=args.device,
                num_train=args.train_rows,
                num_val=args.val_rows,
                stage=stage,
            )
            bar.update(1)
            bar.set_description("done")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR
    layers = info["num_hidden_layers"]
    print(f"shape {info['shape']} ({layers} layers, {info['dtype']}): {info['num_parameters']:,} parameters")
    print(f"model:      {info['model_dir']}")
    print(f"train data: {info['train_jsonl']}")
    print(f"val data:   {info['val_jsonl']}")
    print(f"build info: {Path(args.out).resolve() / 'build_info.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
