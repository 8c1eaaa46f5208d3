"""Decode attention over the stored KV cache: bf16 cache (Triton) vs e4m3 cache (Triton, and the hand-written CUDA
kernel), side by side, each timed inside a CUDA graph as the rollout's decode step runs it (GPU only).

    PYTHONPATH=. python3 benchmarks/bench_decode_attention.py --out decode_attention.json

Qwen3-8B heads (32 query / 8 KV heads of 128), one layer; bandwidth counts the K and V bytes actually read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse_gpu_bench, print_table, write_json  # noqa: E402

VARIANTS = (("bf16", "triton"), ("fp8", "triton"), ("fp8", "cuda"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--keys", type=int, nargs="*", default=[1536])
    p.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref
    from nemo_jetrl.precision.kernels.triton_gemm import time_in_graph
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
            base = {}
            for cache, impl in VARIANTS:
                kb, vb, ks, vs = caches[cache]
                ref = decode_attention_ref(q, kb, vb, valid, keys, dim**-0.5, ks, vs)
                out = decode_attention(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs, impl=impl)
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                call = lambda a=(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs), i=impl: decode_attention(*a, impl=i)  # noqa: E731
                ms = time_in_graph([call] * args.calls)
                base.setdefault(cache, ms)
                moved = 2 * bsz * kv_heads * keys * dim * kb.element_size()
                results.append({
                    "cache": cache, "impl": impl, "batch": bsz, "keys": keys, "us": 1e3 * ms, "tbs": moved / ms / 1e9,
                    "vs_bf16": base["bf16"] / ms, "rel_err": err,
                })  # fmt: skip
                print(results[-1], flush=True)
            del caches, k16, v16
    headers = ["cache", "kernel", "batch", "keys", "us", "TB/s", "vs bf16", "rel err"]
    keys_ = ["cache", "impl", "batch", "keys", "us", "tbs", "vs_bf16", "rel_err"]
    table = print_table(f"decode attention on {info['device']}", headers, [[r[k] for k in keys_] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
