"""Decode attention over the stored KV cache: bf16 cache (Triton) vs e4m3 cache (Triton, and the hand-written CUDA
kernel), side by side, each timed inside a CUDA graph as the rollout's decode step runs it, the variants' graphs
replayed in alternating rounds (GPU only).

    python3 -m benchmarks.bench_decode_attention --out decode_attention.json
    python3 -m benchmarks.bench_decode_attention --heads 16 8 --batch 32 --keys 4096 8192 --page 16 \\
        --splits 1 2 4 8 --cuda-configs 4,4 4,3,2 8,2    # the 1.7B shape's 8K rollout, paged as the engine holds it

Default heads are Qwen3-8B's (32 query / 8 KV heads of 128), one layer; bandwidth counts the K and V bytes
actually read. `--page N` reads a block pool of N-key pages through a shuffled block table (the native engine's
layout); 0 a contiguous cache. `--splits` / `--cuda-configs` add CUDA-kernel variants with a fixed split count or
another (warps, CTAs per SM[, splits]) than the default (`fp8_decode_cuda.default_config`); each is checked against
the reference like the others.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import alternating_graph_times, parse_gpu_bench, print_table, us_range, write_json

VARIANTS = (("bf16", "triton"), ("fp8", "triton"), ("fp8", "cuda"))


def parse_config(text: str) -> tuple[int, ...]:
    """WARPS,CTAS_PER_SM[,SPLITS] -> a tuple of 2 or 3 ints."""
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"expected WARPS,CTAS_PER_SM[,SPLITS], got {text!r}")
    return parts


def paged_pools(k: torch.Tensor, v: torch.Tensor, page: int, seed: int = 0):
    """k/v [B, H_kv, S, D] -> (k_pool, v_pool [B * S / page, H_kv, page, D], table int32 [B, S / page]): every
    row's pages at shuffled places of one pool, as the engine's block scheduler hands them out."""
    bsz, kv_heads, s_max, dim = k.shape
    per_row = s_max // page
    order = torch.randperm(bsz * per_row, generator=torch.Generator().manual_seed(seed)).to(k.device)
    table = order.view(bsz, per_row).to(torch.int32)  # [B, S / page]

    def pool(x):
        out = torch.empty((bsz * per_row, kv_heads, page, dim), dtype=x.dtype, device=x.device)
        out[order] = x.view(bsz, kv_heads, per_row, page, dim).transpose(1, 2).reshape(-1, kv_heads, page, dim)
        return out

    return pool(k), pool(v), table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--keys", type=int, nargs="*", default=[1536])
    p.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("Q", "KV"), help="query and KV heads")
    p.add_argument("--page", type=int, default=0, help="keys per page of a paged pool (0: contiguous cache)")
    p.add_argument("--splits", type=int, nargs="*", default=[], help="CUDA-kernel variants with these split counts")
    p.add_argument(
        "--cuda-configs", type=parse_config, nargs="*", default=[], help="CUDA-kernel WARPS,CTAS_PER_SM[,SPLITS]"
    )
    p.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    p.add_argument("--replays", type=int, default=7, help="timed graph replays per variant (alternating)")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref
    from nemo_jetrl.precision.kv import kv_quant

    heads, kv_heads = args.heads
    dim = 128
    variants = [(cache, impl, {}) for cache, impl in VARIANTS]
    variants += [("fp8", f"cuda s{n}", {"num_splits": n}) for n in args.splits]
    for w, b, *splits in args.cuda_configs:
        name = f"cuda w{w} b{b}" + "".join(f" s{n}" for n in splits)
        variants.append(("fp8", name, {"cuda_config": (w, b), **({"num_splits": splits[0]} if splits else {})}))
    results = []
    for bsz in args.batch:
        for keys in args.keys:
            s_max = keys + 1024  # the cache is allocated for the whole rollout; only [0, keys) is read
            if args.page:
                s_max = -(-s_max // args.page) * args.page
            q = torch.randn(bsz, heads, dim, device=dev, dtype=torch.bfloat16)
            k16 = torch.randn(bsz, kv_heads, s_max, dim, device=dev, dtype=torch.bfloat16)
            v16 = torch.randn_like(k16)
            scale = torch.tensor(4.0 / 448, device=dev)
            caches = {"bf16": (k16, v16, None, None), "fp8": (kv_quant(k16, scale), kv_quant(v16, scale), scale, scale)}
            valid = torch.ones(bsz, s_max, dtype=torch.bool, device=dev)
            kv_len = torch.full((bsz,), keys, dtype=torch.int64, device=dev)
            stored = {}
            for cache, (kb, vb, ks, vs) in caches.items():
                if args.page:
                    kp, vp, table = paged_pools(kb, vb, args.page)
                    stored[cache] = (kp, vp, None, ks, vs, {"block_table": table})
                else:
                    stored[cache] = (kb, vb, valid, ks, vs, {})
            calls, errors = {}, {}
            for cache, impl, extra in variants:
                kb, vb, ks, vs = caches[cache]
                ref = decode_attention_ref(q, kb, vb, valid, keys, dim**-0.5, ks, vs)
                kp, vp, mask, ks, vs, paged = stored[cache]
                kw = {**paged, **extra, "impl": impl.split()[0]}
                out = decode_attention(q, kp, vp, mask, kv_len, dim**-0.5, ks, vs, **kw)
                errors[cache, impl] = float((out.float() - ref.float()).norm() / ref.float().norm())
                call = lambda a=(q, kp, vp, mask, kv_len, dim**-0.5, ks, vs), k=kw: decode_attention(*a, **k)  # noqa: E731
                calls[f"{cache} {impl}"] = [call] * args.calls
            timings = alternating_graph_times(calls, args.replays)
            for cache, impl, _ in variants:
                t = timings[f"{cache} {impl}"]
                moved = 2 * bsz * kv_heads * keys * dim * caches[cache][0].element_size()
                results.append({
                    "cache": cache, "impl": impl, "batch": bsz, "keys": keys, "heads": [heads, kv_heads],
                    "page": args.page, "us": t["us"], "us_range": us_range(t), "tbs": moved / t["us"] / 1e6,
                    "vs_bf16": timings["bf16 triton"]["us"] / t["us"], "rel_err": errors[cache, impl],
                })  # fmt: skip
                print(results[-1], flush=True)
            del caches, stored, k16, v16
    headers = ["cache", "kernel", "batch", "keys", "us (min-max)", "TB/s", "vs bf16", "rel err"]
    keys_ = ["cache", "impl", "batch", "keys", "us_range", "tbs", "vs_bf16", "rel_err"]
    layout = f"pages of {args.page}" if args.page else "contiguous cache"
    title = (
        f"decode attention on {info['device']}, {heads}/{kv_heads} heads, {layout} (per call in a CUDA graph, median "
        f"(min-max) of {args.replays} replays, variants alternating)"
    )
    table = print_table(title, headers, [[r[k] for k in keys_] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
