"""Decode-sized GEMMs (M = batch rows): BF16 `torch.mm` vs cuBLAS blockwise FP8 `scaled_mm` vs the Triton split-K
FP8 kernel, on Qwen3-8B projection shapes, side by side in one run (GPU only).

    PYTHONPATH=. python3 benchmarks/bench_decode_gemm.py --out decode_gemm.json

At decode the product reads the whole weight for a few rows, so the figure of merit is weight bytes / time
against the HBM peak. Also times the activation quantizer, once per input (what q/k/v and gate/up now share).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse_gpu_bench, print_table, write_json  # noqa: E402

# (name, N, K): Qwen3-8B projections
SHAPES = [("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 12288, 4096), ("down", 4096, 12288)]
ROWS = [16, 64, 128, 256, 512]


def bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=ROWS)
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.precision import act_quant, fp8_blockwise_mm, weight_quant
    from nemo_jetrl.precision.kernels.triton_gemm import best_config

    results = []
    for name, n, k in SHAPES:
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        wq, ws = weight_quant(w)
        for m in args.rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, xs = act_quant(x)
            ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="emulated")
            tri = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="triton")
            r = {
                "shape": name, "N": n, "K": k, "M": m,
                "bf16_us": 1e3 * bench(lambda x=x, w=w: torch.mm(x, w.t())),
                "scaled_mm_us": 1e3 * bench(lambda xq=xq, xs=xs, wq=wq, ws=ws: fp8_blockwise_mm(xq, xs, wq, ws, backend="scaled_mm")),
                "triton_us": 1e3 * bench(lambda xq=xq, xs=xs, wq=wq, ws=ws: fp8_blockwise_mm(xq, xs, wq, ws, backend="triton")),
                "act_quant_us": 1e3 * bench(lambda x=x: act_quant(x)),
                "triton_rel_err": float((tri - ref).norm() / ref.norm()),
                "triton_config": list(best_config(xq, wq, torch.bfloat16, False, with_scaled_mm=False)),
                "auto_choice": "triton" if best_config(xq, wq, torch.bfloat16, False, with_scaled_mm=True) else "scaled_mm",
            }  # fmt: skip
            r["bf16_weight_tbs"] = 2 * n * k / r["bf16_us"] / 1e6
            r["triton_weight_tbs"] = n * k / r["triton_us"] / 1e6
            r["scaled_mm_weight_tbs"] = n * k / r["scaled_mm_us"] / 1e6
            r["triton_vs_bf16"] = r["bf16_us"] / r["triton_us"]
            r["triton_vs_scaled_mm"] = r["scaled_mm_us"] / r["triton_us"]
            results.append(r)
            print(f"  {name} {n}x{k} M={m}: bf16 {r['bf16_us']:.1f} us, scaled_mm {r['scaled_mm_us']:.1f} us, "
                  f"triton {r['triton_us']:.1f} us {r['triton_config']}", flush=True)  # fmt: skip
    headers = [
        "shape",
        "M",
        "bf16 us",
        "scaled_mm us",
        "triton us",
        "x bf16",
        "x scaled_mm",
        "W TB/s",
        "rel err",
        "auto",
    ]
    keys = [
        "shape", "M", "bf16_us", "scaled_mm_us", "triton_us", "triton_vs_bf16", "triton_vs_scaled_mm",
        "triton_weight_tbs", "triton_rel_err", "auto_choice",
    ]  # fmt: skip
    title = f"decode GEMMs on {info['device']} (Qwen3-8B shapes; W TB/s = FP8 weight bytes / Triton time)"
    table = print_table(title, headers, [[r[key] for key in keys] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
