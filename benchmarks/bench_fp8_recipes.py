"""The FP8 recipes side by side (blockwise, rowwise, tensorwise) vs BF16 on Qwen3-8B linear shapes (GPU only).

    PYTHONPATH=. python3 benchmarks/bench_fp8_recipes.py --out recipes.json [--tokens 16384] [--steps 7]

Per (N, K) projection shape, three measurements, each with all variants in one process and alternating order
(`common.alternating_timings`), `--steps` timed rounds after warm-up, median and min-max per variant:
  fprop  the FProp GEMM alone on pre-cast operands (BF16 torch.mm vs each recipe's FP8 GEMM);
  cast   the FProp activation cast of X [M, K] (`recipe.layout.input_quant`);
  layer  one Fp8Linear forward + backward (dX and dW) with a BF16 master weight vs a BF16 nn.Linear; the FP8
         weight cast is cached (once per optimizer step in training), so this is the per-micro-batch cost.
A round runs `--reps` calls between two device syncs (launch overhead amortised).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from benchmarks.common import alternating_timings, parse_gpu_bench, print_table, write_json
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe

RECIPES = ("blockwise", "rowwise", "tensorwise")
# (N, K) of Qwen3-8B's trainer GEMMs: q / o, k / v, gate / up, down
SHAPES = [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288)]


def repeated(fn, reps: int):
    def run():
        for _ in range(reps):
            fn()

    return run


def measure_shape(n: int, k: int, m: int, args, device) -> list[dict]:
    torch.manual_seed(0)
    base = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    layers = {r: Fp8Linear.from_linear(base, PrecisionRecipe.preset("jetrl", granularity=r)) for r in RECIPES}

    def fwd_bwd(module):
        def step():
            x.grad, module.weight.grad = None, None
            module(x).backward(dy)

        return step

    w16 = base.weight.detach()
    xd = x.detach()
    fprop = {"bf16": lambda: torch.mm(xd, w16.t())}
    cast = {}
    for r, layer in layers.items():
        qw = layer.quantized_weight()
        xq, xs = layer.recipe.layout.input_quant(xd, layer.recipe)
        fprop[r] = lambda xq=xq, xs=xs, qw=qw: qw.layout.fprop(xq, xs, qw, None, torch.bfloat16, "auto")
        cast[r] = lambda recipe=layer.recipe: recipe.layout.input_quant(xd, recipe)
    layer_fns = {"bf16": fwd_bwd(base), **{r: fwd_bwd(layer) for r, layer in layers.items()}}
    rows = []
    for what, fns in (("fprop", fprop), ("cast", cast), ("layer", layer_fns)):
        fns = {name: repeated(fn, args.reps) for name, fn in fns.items()}
        timings = alternating_timings(fns, args.warmup, args.steps, device)
        bf16 = timings.get("bf16", {}).get("median_s")
        for name, t in timings.items():
            per_call_ms = 1e3 / args.reps
            row = {"what": what, "N": n, "K": k, "M": m, "variant": name,
                   "median_ms": t["median_s"] * per_call_ms,
                   "min_max_ms": f"{t['min_s'] * per_call_ms:.3f}-{t['max_s'] * per_call_ms:.3f}",
                   "times_s": t["times_s"], "x_bf16": bf16 / t["median_s"] if bf16 else None}  # fmt: skip
            if what == "fprop":
                row["tflops"] = 2.0 * m * n * k / (row["median_ms"] * 1e9)
            if what == "cast":
                row["gbs"] = m * k * 3 / (row["median_ms"] * 1e6)  # bf16 read + e4m3 write
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384, help="M: tokens per micro-batch (4 x 4K)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=7, help="timed rounds per variant (>= 5 for quoted figures)")
    p.add_argument("--reps", type=int, default=5, help="calls per round")
    p.add_argument("--quick", action="store_true", help="one shape")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, device, info = parsed
    shapes = SHAPES[:1] if args.quick else SHAPES
    rows = []
    for n, k in shapes:
        rows += measure_shape(n, k, args.tokens, args, device)
        torch.cuda.empty_cache()
    title = (f"FP8 recipes vs BF16 on {info['device']} ({info.get('clocks')}), M = {args.tokens} tokens; "
             f"{args.steps} timed rounds of {args.reps} calls after {args.warmup} warm-up, variants alternating")  # fmt: skip
    keys = ["what", "N", "K", "variant", "median_ms", "min_max_ms", "x_bf16", "tflops", "gbs"]
    table = print_table(title, keys, [["-" if r.get(key) is None else r[key] for key in keys] for r in rows])
    write_json(args.out, {**info, "args": vars(args), "results": rows, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
