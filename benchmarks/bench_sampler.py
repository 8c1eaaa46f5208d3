"""Next-token sampling at decode sizes: the torch sampler (softmax, float64 cumsum, searchsorted) + the fused
logprob kernel vs the fused sampling kernel (`sample_kernel.py`: token and logprob in one kernel), GPU only.

    python3 -m benchmarks.bench_sampler --out sampler.json

Qwen3 vocabulary (151,936), bf16 logits, temperature 1, no top-k / top-p (the torch path is taken by asking for
top_k = V, which filters nothing). Each call runs inside a CUDA graph over logits cycled out of L2; the variants
alternate over `--rounds` rounds: median and min-max of the rounds' medians, in us per call.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import alternating_cold_times, cold_time_fields, parse_gpu_bench, print_table, write_json

VOCAB = 151936


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--rounds", type=int, default=5)
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.generation.native.sampler import SamplingParams, sample, sequence_keys
    from nemo_jetrl.precision.kernels.device import cold_copies

    variants = {"torch sampler + fused logprob": SamplingParams(top_k=VOCAB), "fused sampling kernel": SamplingParams()}
    results = []
    for rows in args.rows:
        copies = cold_copies(rows * VOCAB * 2, dev)
        logits = [torch.randn(rows, VOCAB, device=dev).mul_(3).to(torch.bfloat16) for _ in range(copies)]
        keys = sequence_keys(0, torch.arange(rows, device=dev))
        counters = torch.zeros(rows, dtype=torch.long, device=dev)
        calls = {v: [lambda x=x, sp=sp, k=keys, c=counters: sample(x, sp, keys=k, counters=c) for x in logits]
                 for v, sp in variants.items()}  # fmt: skip
        times = alternating_cold_times(calls, args.rounds)
        results += [{"rows": rows, "variant": v, **cold_time_fields(t)} for v, t in times.items()]
    title = f"sampling, vocab {VOCAB}, bf16 logits cold in L2, on {info['device']}: {args.rounds} alternating rounds"
    keys_ = ["rows", "variant", "us", "min_max_us"]
    table = print_table(title, ["rows", "variant", "us", "min-max us"], [[r[k] for k in keys_] for r in results])
    write_json(args.out, {**info, "args": vars(args), "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
