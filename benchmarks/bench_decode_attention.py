"""Decode attention over the stored KV cache: bf16 cache (Triton) vs e4m3 cache (Triton, and the hand-written CUDA
kernel), side by side, each timed inside a CUDA graph as the rollout's decode step runs it, the variants' graphs
replayed in alternating rounds (GPU only).

    python3 -m benchmarks.bench_decode_attention --out decode_attention.json

Qwen3-8B heads (32 query / 8 KV heads of 128), one layer; bandwidth counts the K and V bytes actually read.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import alternating_graph_times, parse_gpu_bench, print_table, us_range, write_json

VARIANTS = (("bf16", "triton"), ("fp8", "triton"), ("fp8", "cuda"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--keys", type=int, nargs="*", default=[1536])
    p.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    p.add_argument("--replays", type=int, default=7, help="timed graph replays per variant (alternating)")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref
    from nemo_jetrl.precision.kv import kv_quant

    heads, kv_heads, dim = 32, 8, 128
    results = []
    for bsz in args.batch:
        for keys in args.keys:
            s_max = keys + 1024  # the cache is allocated for the whole rollout; only [0, keys) is read
            q = torch.randn(bsz, heads, dim, device=dev, dtype=torch.bfloat16)
            k16 = torch.randn(bsz, kv_heads, s_max, dim, device=dev, dtype=torch.bfloat16)
            v16 = torch.randn_like(k16)
            scale = torch.tensor(4.0 / 448, device=dev)
            caches = {"bf16": (k16, v16, None, None), "fp8": (kv_quant(k16, scale), kv_quant(v16, scale), scale, scale)}
            valid = torch.ones(bsz, s_max, dtype=torch.bool, device=dev)
            kv_len = torch.tensor(keys, device=dev)
            calls, errors = {}, {}
            for cache, impl in VARIANTS:
                kb, vb, ks, vs = caches[cache]
                ref = decode_attention_ref(q, kb, vb, valid, keys, dim**-0.5, ks, vs)
                out = decode_attention(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs, impl=impl)
                errors[cache, impl] = float((out.float() - ref.float()).norm() / ref.float().norm())
                call = lambda a=(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs), i=impl: decode_attention(*a, impl=i)  # noqa: E731
                calls[f"{cache} {impl}"] = [call] * args.calls
            timings = alternating_graph_times(calls, args.replays)
            for cache, impl in VARIANTS:
                t = timings[f"{cache} {impl}"]
                moved = 2 * bsz * kv_heads * keys * dim * caches[cache][0].element_size()
                results.append({
                    "cache": cache, "impl": impl, "batch": bsz, "keys": keys, "us": t["us"],
                    "us_range": us_range(t), "tbs": moved / t["us"] / 1e6,
                    "vs_bf16": timings["bf16 triton"]["us"] / t["us"], "rel_err": errors[cache, impl],
                })  # fmt: skip
                print(results[-1], flush=True)
            del caches, k16, v16
    headers = ["cache", "kernel", "batch", "keys", "us (min-max)", "TB/s", "vs bf16", "rel err"]
    keys_ = ["cache", "impl", "batch", "keys", "us_range", "tbs", "vs_bf16", "rel_err"]
    title = f"decode attention on {info['device']} (per call in a CUDA graph, median (min-max) of {args.replays} replays, variants alternating)"
    table = print_table(title, headers, [[r[k] for k in keys_] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
