"""FP8 vs BF16 on Llama-3.1-8B / Qwen3-8B projection shapes: GEMMs, quantizers, Fp8Linear fwd+bwd (GPU only).

    PYTHONPATH=. python3 benchmarks/bench_fp8_linear.py --out bench.json [--quick]

Times are medians of `triton.testing.do_bench` (CUDA events, warm-up first). GEMM ratios are BF16 time / FP8
time (> 1: FP8 faster). Quantizer bandwidth counts bytes read + written (input, e4m3 output, fp32 scales).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

# (N, K) = (out_features, in_features): o_proj, gate/up, down, fused qkv, k/v
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (1024, 4096)]
TOKENS = [4096, 8192, 16384]
HBM_PEAK_TBS = {"H200": 4.8, "H100": 3.35}


def hbm_peak(name: str) -> float | None:
    for key, tbs in HBM_PEAK_TBS.items():
        if key in name:
            return tbs
    return None


def bench(fn, grad_to_none=None) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=80, grad_to_none=grad_to_none, return_mode="median")


def run_shape(n: int, k: int, m: int, peak_tbs: float | None) -> dict:
    from nemo_jetrl.precision import (
        Fp8Linear,
        PrecisionRecipe,
        act_quant,
        act_quant_dual,
        act_quant_t,
        fp8_blockwise_mm,
        weight_quant,
    )

    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    (xq, xs), (wq, ws) = act_quant(x), weight_quant(w)
    r: dict = {"N": n, "K": k, "M": m}
    flops = 2.0 * m * n * k

    # --- GEMM only (operands pre-quantized) --------------------------------------------------------------------
    r["fprop_bf16_ms"] = bench(lambda: torch.mm(x, w.t()))
    r["fprop_fp8_ms"] = bench(lambda: fp8_blockwise_mm(xq, xs, wq, ws, torch.bfloat16))
    r["wgrad_bf16_ms"] = bench(lambda: torch.mm(dy.t(), x))
    dyt = act_quant_t(dy)
    for blocks, xt in (("1x128", act_quant_t(x)), ("128x128", weight_quant(x.t()))):
        r[f"wgrad_fp8_{blocks}_ms"] = bench(
            lambda xt=xt, blocks=blocks: fp8_blockwise_mm(*dyt, *xt, torch.float32, w_blocks=blocks)
        )
    r["fprop_bf16_tflops"] = flops / r["fprop_bf16_ms"] / 1e9
    r["fprop_fp8_tflops"] = flops / r["fprop_fp8_ms"] / 1e9

    # --- quantizers (Triton) -----------------------------------------------------------------------------------
    def gbs(ms: float, numel: int, in_bytes: int, n_scales: int) -> float:
        return (numel * (in_bytes + 1) + 4 * n_scales) / ms / 1e6

    r["act_quant_ms"] = bench(lambda: act_quant(x))
    r["act_quant_gbs"] = gbs(r["act_quant_ms"], x.numel(), 2, x.numel() // 128)
    r["act_quant_t_ms"] = bench(lambda: act_quant_t(x))
    r["act_quant_t_gbs"] = gbs(r["act_quant_t_ms"], x.numel(), 2, x.numel() // 128)
    r["act_quant_dual_ms"] = bench(lambda: act_quant_dual(x))  # both layouts (two kernels)
    r["act_quant_dual_gbs"] = gbs(r["act_quant_dual_ms"], x.numel(), 3, 2 * x.numel() // 128)
    r["weight_quant_ms"] = bench(lambda: weight_quant(w))
    r["weight_quant_gbs"] = gbs(r["weight_quant_ms"], w.numel(), 2, w.numel() // 128**2)
    if peak_tbs:
        for key in ("act_quant", "act_quant_t", "act_quant_dual", "weight_quant"):
            r[f"{key}_pct_hbm"] = 100.0 * r[f"{key}_gbs"] / (peak_tbs * 1000)

    # --- full layers: FP32 master weights under bf16 autocast, fwd + bwd (dX and dW) ---------------------------
    base = nn.Linear(k, n, bias=False, device=dev)
    xi = x.detach().clone().requires_grad_()
    gy = dy

    def step(module):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(xi)
        y.backward(gy)

    r["linear_bf16_ms"] = bench(lambda: step(base), grad_to_none=[xi, base.weight])
    for blocks in ("1x128", "128x128"):
        fp8 = Fp8Linear.from_linear(base, PrecisionRecipe.preset("jetrl", wgrad_x_blocks=blocks))
        fp8.quantized_weight()  # one quantization per optimizer step: cached across these repeats
        r[f"linear_fp8_{blocks}_ms"] = bench(lambda fp8=fp8: step(fp8), grad_to_none=[xi, fp8.weight])
    r["ratio_fprop_gemm"] = r["fprop_bf16_ms"] / r["fprop_fp8_ms"]
    r["ratio_wgrad_gemm_1x128"] = r["wgrad_bf16_ms"] / r["wgrad_fp8_1x128_ms"]
    r["ratio_wgrad_gemm_128x128"] = r["wgrad_bf16_ms"] / r["wgrad_fp8_128x128_ms"]
    r["ratio_linear_1x128"] = r["linear_bf16_ms"] / r["linear_fp8_1x128_ms"]
    r["ratio_linear_128x128"] = r["linear_bf16_ms"] / r["linear_fp8_128x128_ms"]
    return r


def profile_report() -> None:
    """Where the time of one Fp8Linear fwd+bwd goes: host overhead, kernel table, DGrad GEMM, quantizer tiles."""
    from torch.profiler import ProfilerActivity, profile

    from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, act_quant, fp8_blockwise_mm, weight_quant
    from nemo_jetrl.precision.kernels import triton_quant

    dev = torch.device("cuda")

    def layer_pair(n, k):
        base = nn.Linear(k, n, bias=False, device=dev)
        return base, Fp8Linear.from_linear(base, PrecisionRecipe.preset("jetrl"))

    def step(module, xi, gy):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(xi)
        y.backward(gy)

    def host_us(fn, n=200):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        us = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return us

    from nemo_jetrl.precision import act_quant_dual

    xs_ = torch.randn(256, 4096, device=dev, dtype=torch.bfloat16)
    ws_ = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    xq_, wq_ = act_quant(xs_), weight_quant(ws_)
    print("host us per call (M=256):", {
        "torch.mm": round(host_us(lambda: torch.mm(xs_, ws_.t()))),
        "act_quant": round(host_us(lambda: act_quant(xs_))),
        "triton launch only": round(host_us(lambda: triton_quant.quant_groups(xs_, 128, False))),
        "act_quant_dual": round(host_us(lambda: act_quant_dual(xs_))),
        "fp8_blockwise_mm": round(host_us(lambda: fp8_blockwise_mm(*xq_, *wq_))),
        "torch.empty": round(host_us(lambda: torch.empty(256, 4096, device=dev))),
    })  # fmt: skip
    # host time per fwd+bwd: tiny M keeps the GPU ahead of the launches
    for n, k in ((4096, 4096),):
        base, fp8 = layer_pair(n, k)
        xi = torch.randn(256, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(256, n, device=dev, dtype=torch.bfloat16)
        for name, mod in (("bf16", base), ("fp8", fp8)):
            for _ in range(5):
                step(mod, xi, gy)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                step(mod, xi, gy)
            host = (time.perf_counter() - t0) / 50 * 1e6
            torch.cuda.synchronize()
            print(f"host time per fwd+bwd ({name}, {n}x{k}, M=256): {host:.0f} us")
    for n, k, m in ((4096, 4096, 4096), (1024, 4096, 16384)):
        base, fp8 = layer_pair(n, k)
        xi = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            step(fp8, xi, gy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(fp8, xi, gy)
            torch.cuda.synchronize()
        print(f"\n--- Fp8Linear fwd+bwd {n}x{k} M={m}: 5 steps ---")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        dyq, wq = act_quant(gy), weight_quant(base.weight.detach())
        wt = (wq[0].t().contiguous(), wq[1].t().contiguous())
        w16 = base.weight.detach().to(torch.bfloat16)
        t_bf = bench(lambda gy=gy, w16=w16: torch.mm(gy, w16))
        t_fp = bench(lambda dyq=dyq, wt=wt: fp8_blockwise_mm(*dyq, *wt, torch.bfloat16))
        print(f"DGrad GEMM {m}x{n} @ {n}x{k}: bf16 {t_bf * 1e3:.0f} us, fp8 {t_fp * 1e3:.0f} us, x{t_bf / t_fp:.2f}")
    x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16)
    moved = x.numel() * 3 + x.numel() // 128 * 4
    for label, src, rows_opts in (("act_quant", x, (16, 32, 64)), ("act_quant_t", x.t(), (32, 64, 128))):
        for rows in rows_opts:
            for warps in (4, 8):
                ms = bench(
                    lambda src=src, rows=rows, warps=warps: triton_quant.quant_groups(src, 128, False, rows, warps)
                )
                print(f"{label} [16384, 4096] rows={rows} warps={warps}: {moved / ms / 1e6:.0f} GB/s")


def print_table(device: str, rows: list[dict], peak_tbs: float | None) -> None:
    print(f"\nFP8 (blockwise e4m3) vs BF16 on {device}  (ratio = BF16 time / FP8 time; quant GB/s, % of HBM peak)")
    head = (
        f"{'N x K':>12} {'M':>6} | {'FProp TF/s bf16/fp8':>19} {'x':>5} | {'WGrad x 1x128':>13} {'128x128':>8} |"
        f" {'act_q GB/s':>10} {'%HBM':>5} {'act_q_t':>8} {'dual':>6} {'w_q':>6} |"
        f" {'Linear fwd+bwd 1x128':>20} {'128x128':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        pct = f"{r.get('act_quant_pct_hbm', float('nan')):5.0f}"
        print(
            f"{r['N']:>5} x{r['K']:>6} {r['M']:>6} | {r['fprop_bf16_tflops']:>8.0f} / {r['fprop_fp8_tflops']:>8.0f}"
            f" {r['ratio_fprop_gemm']:>5.2f} | {r['ratio_wgrad_gemm_1x128']:>13.2f} {r['ratio_wgrad_gemm_128x128']:>8.2f} |"
            f" {r['act_quant_gbs']:>10.0f} {pct} {r['act_quant_t_gbs']:>8.0f} {r['act_quant_dual_gbs']:>6.0f}"
            f" {r['weight_quant_gbs']:>6.0f} |"
            f" {r['ratio_linear_1x128']:>20.2f} {r['ratio_linear_128x128']:>8.2f}"
        )
    if peak_tbs:
        print(f"HBM peak assumed: {peak_tbs} TB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="write all numbers as JSON here")
    parser.add_argument("--quick", action="store_true", help="one shape, one token count")
    parser.add_argument("--profile", action="store_true", help="print where Fp8Linear's time goes, then exit")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "bench_fp8_linear: needs a CUDA GPU (Hopper for the scaled_mm path); nothing to do on CPU.", file=sys.stderr
        )
        return 2
    from nemo_jetrl.precision import gemm_backend

    device = torch.cuda.get_device_name()
    peak_tbs = hbm_peak(device)
    backend = gemm_backend("cuda")
    print(f"device: {device} (sm{''.join(map(str, torch.cuda.get_device_capability()))}), torch {torch.__version__}, "
          f"gemm backend: {backend}")  # fmt: skip
    if args.profile:
        profile_report()
        return 0
    shapes, tokens = (SHAPES[:1], TOKENS[1:2]) if args.quick else (SHAPES, TOKENS)
    rows, start = [], time.time()
    for n, k in shapes:
        for m in tokens:
            rows.append(run_shape(n, k, m, peak_tbs))
            torch.cuda.empty_cache()
            print(f"  {n}x{k} M={m}: fprop x{rows[-1]['ratio_fprop_gemm']:.2f}, "
                  f"linear x{rows[-1]['ratio_linear_1x128']:.2f} ({time.time() - start:.0f}s)", flush=True)  # fmt: skip
    print_table(device, rows, peak_tbs)
    if args.out:
        meta = {"device": device, "torch": torch.__version__, "gemm_backend": backend, "hbm_peak_tbs": peak_tbs}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
