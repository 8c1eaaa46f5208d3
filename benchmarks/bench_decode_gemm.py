"""Decode-sized GEMMs (M = batch rows): BF16 `torch.mm` vs cuBLAS blockwise FP8 `scaled_mm` vs the Triton split-K
FP8 kernel (vs DeepGEMM where it imports), on Qwen3-8B projection shapes, side by side in one run (GPU only).

    python3 -m benchmarks.bench_decode_gemm --out decode_gemm.json

At decode the product reads the whole weight for a few rows, so the figure of merit is weight bytes / time
against the HBM peak. Every figure is GPU time as the rollout's captured decode step sees it: the calls replayed
inside a CUDA graph (no CPU launch overhead) and cycling over enough weight copies that each call reads its
weight from HBM, not L2; the variants' graphs replay in alternating rounds (`common.alternating_graph_times`).
"qkv" and "gate+up" are the grouped projections (one GEMM over the q/k/v or gate/up FP8 weights that
`precision.weight_group` keeps in one buffer). Also times the
activation quantizer, once per input (what q/k/v and gate/up share).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import alternating_graph_times, parse_gpu_bench, print_table, us_range, write_json

# (name, N, K): Qwen3-8B projections, separate and grouped
SHAPES = [
    ("q/o", 4096, 4096), ("k/v", 1024, 4096), ("qkv", 6144, 4096),
    ("gate/up", 12288, 4096), ("gate+up", 24576, 4096), ("down", 4096, 12288),
]  # fmt: skip
ROWS = [16, 64, 128, 256, 512]


def cycled(make_call, weights: list) -> list:
    """One call of make_call(weight) per weight copy: replayed back to back, each reads its weight from HBM."""
    return [lambda w=w: make_call(w) for w in weights]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=ROWS)
    p.add_argument("--replays", type=int, default=7, help="timed graph replays per variant (alternating)")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    from nemo_jetrl.precision import act_quant, deep_gemm_adapter, fp8_blockwise_mm, weight_quant
    from nemo_jetrl.precision.gemm import small_m_config
    from nemo_jetrl.precision.kernels.device import cold_copies

    with_dg = deep_gemm_adapter.usable(dev)  # a DeepGEMM column where deep_gemm imports (use_deep_gemm's kernel)

    results = []
    for name, n, k in SHAPES:
        copies = cold_copies(n * k, dev)  # FP8 bytes; the bf16 copies are twice as large, so colder still
        w16 = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        w8 = [weight_quant(w) for w in w16]
        wq, ws = w8[0]
        for m in args.rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, xs = act_quant(x)
            ref = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="emulated")
            tri = fp8_blockwise_mm(xq, xs, wq, ws, torch.float32, backend="triton")
            variants = {
                "bf16": cycled(lambda w, x=x: torch.mm(x, w.t()), w16),
                "scaled_mm": cycled(lambda w, xq=xq, xs=xs: fp8_blockwise_mm(xq, xs, *w, backend="scaled_mm"), w8),
                "triton": cycled(lambda w, xq=xq, xs=xs: fp8_blockwise_mm(xq, xs, *w, backend="triton"), w8),
                "act_quant": [lambda x=x: act_quant(x)],
            }
            if with_dg:
                variants["deepgemm"] = cycled(lambda w, xq=xq, xs=xs: deep_gemm_adapter.fp8_gemm(xq, xs, *w), w8)
            t = alternating_graph_times(variants, args.replays)
            r = {
                "shape": name, "N": n, "K": k, "M": m, "timings": t,
                **{f"{v}_us": t[v]["us"] for v in t}, **{f"{v}_range": us_range(t[v]) for v in t},
                "triton_rel_err": float((tri - ref).norm() / ref.norm()),
                "triton_config": list(small_m_config(xq, wq, torch.bfloat16, False, library=None)),
                "auto_choice": "triton" if small_m_config(xq, wq, torch.bfloat16, False, library="scaled_mm") else "scaled_mm",
            }  # fmt: skip
            r["bf16_weight_tbs"] = 2 * n * k / r["bf16_us"] / 1e6
            r["triton_weight_tbs"] = n * k / r["triton_us"] / 1e6
            r["scaled_mm_weight_tbs"] = n * k / r["scaled_mm_us"] / 1e6
            r["best_fp8_us"] = min(r["triton_us"], r["scaled_mm_us"])
            r["best_fp8_vs_bf16"] = r["bf16_us"] / r["best_fp8_us"]
            if with_dg:
                r["deepgemm_vs_best"] = r["best_fp8_us"] / r["deepgemm_us"]
                r["deepgemm_weight_tbs"] = n * k / r["deepgemm_us"] / 1e6
            r["triton_vs_scaled_mm"] = r["scaled_mm_us"] / r["triton_us"]
            results.append(r)
            print(f"  {name} {n}x{k} M={m}: bf16 {r['bf16_us']:.1f} us, scaled_mm {r['scaled_mm_us']:.1f} us, "
                  f"triton {r['triton_us']:.1f} us {r['triton_config']}", flush=True)  # fmt: skip
        del w16, w8
    headers = ["shape", "M", "bf16 us (min-max)", "scaled_mm us", "triton us", "best FP8 x bf16", "x scaled_mm", "W TB/s",
               "rel err", "auto"]  # fmt: skip
    keys = [
        "shape", "M", "bf16_range", "scaled_mm_range", "triton_range", "best_fp8_vs_bf16", "triton_vs_scaled_mm",
        "triton_weight_tbs", "triton_rel_err", "auto_choice",
    ]  # fmt: skip
    if with_dg:
        headers += ["DeepGEMM us", "DG x best", "DG W TB/s"]
        keys += ["deepgemm_range", "deepgemm_vs_best", "deepgemm_weight_tbs"]
    title = (
        f"decode GEMMs on {info['device']} (Qwen3-8B shapes; GPU time per call in a CUDA graph, weights cold in L2, "
        f"median (min-max) of {args.replays} replays, variants alternating; W TB/s = FP8 weight bytes / Triton time)"
    )
    table = print_table(title, headers, [[r[key] for key in keys] for r in results])
    write_json(args.out, {**info, "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
