"""DGrad's W^T copy (e4m3 [N, K] -> [K, N]): torch's strided copy vs the tiled Triton kernel (`transpose_fp8`), on
Qwen3-8B weight shapes, side by side in one run (GPU only).

    python3 -m benchmarks.bench_transpose --out transpose.json

This is what `policy.fp8_cfg.cache_dgrad_weight: false` pays per FP8 linear and micro-batch (and, cached, once per
optimizer step). Each call runs inside a CUDA graph over weights cycled out of L2; the two variants alternate over
`--rounds` rounds of 7 replays each: median and min-max of the rounds' medians, and the bandwidth (read + write).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import alternating_cold_times, cold_time_fields, parse_gpu_bench, print_table, write_json

SHAPES = [("q/o", 4096, 4096), ("qkv", 6144, 4096), ("gate+up", 24576, 4096), ("down", 4096, 12288)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.precision.kernels.device import cold_copies
    from nemo_jetrl.precision.transpose import transpose_fp8

    variants = {
        "torch .t().contiguous()": lambda w, out: out.view(torch.uint8).copy_(w.view(torch.uint8).t()),
        "triton transpose_fp8": lambda w, out: transpose_fp8(w, out=out),
    }
    results = []
    for name, n, k in SHAPES:
        copies = cold_copies(n * k, dev)
        weights = [torch.randint(0, 256, (n, k), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
                   for _ in range(copies)]  # fmt: skip
        outs = [torch.empty(k, n, dtype=torch.float8_e4m3fn, device=dev) for _ in range(copies)]
        assert all(torch.equal(transpose_fp8(w).view(torch.uint8), w.view(torch.uint8).t()) for w in weights[:1])
        calls = {v: [lambda w=w, o=o, f=f: f(w, o) for w, o in zip(weights, outs)] for v, f in variants.items()}
        rounds = alternating_cold_times(calls, args.rounds)  # us per call
        for v, times in rounds.items():
            row = {"shape": name, "N": n, "K": k, "variant": v, **cold_time_fields(times)}
            results.append({**row, "tb_s": 2 * n * k / row["us"] / 1e6})
    title = f"W^T copy (e4m3, cold in L2) on {info['device']}: {args.rounds} alternating rounds, median (min-max)"
    keys = ["shape", "variant", "us", "min_max_us", "tb_s"]
    table = print_table(title, ["shape", "variant", "us", "min-max us", "TB/s"], [[r[k] for k in keys] for r in results])
    write_json(args.out, {**info, "args": vars(args), "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
