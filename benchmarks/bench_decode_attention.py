"""Decode attention over the stored KV cache (Triton): bf16 cache vs e4m3 cache, side by side (GPU only).

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--keys", type=int, nargs="*", default=[1024, 2048])
    p.add_argument("--splits", type=int, nargs="*", default=[0, 1, 2, 4], help="0 = the kernel's own choice")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    import triton.testing

    from nemo_jetrl.generation.native.decode_attention import decode_attention, decode_attention_ref

    heads, kv_heads, dim = 32, 8, 128
    results = []
    for bsz in args.batch:
        for keys in args.keys:
            s_max = keys + 512
            q = torch.randn(bsz, heads, dim, device=dev, dtype=torch.bfloat16)
            k16 = torch.randn(bsz, kv_heads, s_max, dim, device=dev, dtype=torch.bfloat16)
            v16 = torch.randn(bsz, kv_heads, s_max, dim, device=dev, dtype=torch.bfloat16)
            scale = torch.tensor(4.0 / 448, device=dev)
            k8 = (k16.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            v8 = (v16.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            valid = torch.ones(bsz, s_max, dtype=torch.bool, device=dev)
            kv_len = torch.tensor(keys, device=dev)
            for name, kb, vb, ks, vs, nbytes in (
                ("bf16", k16, v16, None, None, 2), ("fp8", k8, v8, scale, scale, 1)
            ):  # fmt: skip
                ref = decode_attention_ref(q, kb, vb, valid, keys, dim**-0.5, ks, vs)
                for splits in args.splits:
                    kw = {"num_splits": splits} if splits else {}
                    out = decode_attention(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs, **kw)
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    ms = triton.testing.do_bench(
                        lambda args_=(q, kb, vb, valid, kv_len, dim**-0.5, ks, vs), kw=kw: decode_attention(*args_, **kw),
                        warmup=10, rep=50, return_mode="median",
                    )  # fmt: skip
                    moved = 2 * bsz * kv_heads * keys * dim * nbytes
                    results.append({
                        "cache": name, "batch": bsz, "keys": keys, "splits": splits or "auto", "us": 1e3 * ms,
                        "tbs": moved / ms / 1e9, "rel_err": err,
                    })  # fmt: skip
                    print(results[-1], flush=True)
    headers = ["cache", "batch", "keys", "splits", "us", "TB/s", "rel err"]
    keys_ = ["cache", "batch", "keys", "splits", "us", "tbs", "rel_err"]
    table = print_table(f"decode attention on {info['device']}", headers, [[r[k] for k in keys_] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
