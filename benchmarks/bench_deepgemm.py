"""DeepGEMM's FP8 GEMMs against ours (torch._scaled_mm, cuBLAS blockwise) and BF16 at the Qwen3-8B linears (GPU).

    bash benchmarks/build_deepgemm.sh SRC && PYTHONPATH=SRC python3 -m benchmarks.bench_deepgemm --out dg.json

The gate before DeepGEMM could become a GEMM backend of the recipe: per decoder linear (q/k/v grouped, o, gate/up
grouped, down) and pass, at `--tokens` tokens, the same FP8 operands (the recipe's quantizers: 1x128 activation /
gradient groups, 128x128 weight blocks, FP32 scales) through `fp8_blockwise_mm(backend="scaled_mm")` and
`deep_gemm.fp8_gemm_nt`, and the BF16 product of the unquantized tensors:
- fprop  Y [M, N] = X [M, K] W^T;
- dgrad  dX [M, K] = dY [M, N] W (W^T's FP8 copy, 128x128 blocks);
- wgrad  dW [N, K] = dY^T X, both operands in 1x128 groups along the M tokens, FP32 out (DeepGEMM accumulates).
Each timed step is `--reps` back-to-back products; variants alternate (benchmarks/common.alternating_timings).
`bitwise` says whether DeepGEMM's output equals scaled_mm's bit for bit (`max_abs_diff` otherwise).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import QWEN3_8B, alternating_timings, parse_gpu_bench, report
from nemo_jetrl.precision.gemm import SMALL_M_MAX, fp8_blockwise_mm
from nemo_jetrl.precision.quant import act_quant, act_quant_t, weight_quant


def linears(shape: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of the decoder's GEMMs, the groups that share an input as one GEMM."""
    h, f, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * f, h), "down": (h, f)}


def operands(kind: str, m: int, n: int, k: int, dev: torch.device) -> dict:
    """The pass's BF16 tensors and FP8 operands; every product is A [rows, red] . B [cols, red]^T."""
    a = torch.randn(m, k if kind == "fprop" else n, device=dev, dtype=torch.bfloat16)  # X [M, K] or dY [M, N]
    if kind == "wgrad":
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)  # [M, K]
        (aq, as_), (bq, bs) = act_quant_t(a), act_quant_t(x)  # dY^T [N, M], X^T [K, M]: 1x128 along M
        return {"bf16": (a.t(), x), "fp8": (aq, as_, bq, bs), "out": (n, k), "dtype": torch.float32, "blocks": "1x128"}
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02  # [N, K]
    b = w.t().contiguous() if kind == "dgrad" else w  # dgrad: W^T [K, N]
    (aq, as_), (bq, bs) = act_quant(a), weight_quant(b)
    out = (m, k) if kind == "dgrad" else (m, n)
    return {"bf16": (a, b.t()), "fp8": (aq, as_, bq, bs), "out": out, "dtype": torch.bfloat16, "blocks": "128x128"}


def main(argv: list[str] | None = None) -> int | None:
    parser = argparse.ArgumentParser(prog="bench_deepgemm.py", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384], help="M of each product (several: one table)")
    parser.add_argument("--reps", type=int, default=10, help="products per timed step")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7)
    parsed = parse_gpu_bench(parser, argv)
    if parsed is None:
        return None
    args, dev, info = parsed
    try:
        import deep_gemm
    except ImportError as exc:
        print(
            f"bench_deepgemm.py: deep_gemm is not importable ({exc}); build it: benchmarks/build_deepgemm.sh",
            file=sys.stderr,
        )
        return 2
    torch.manual_seed(0)
    rows = []
    for tokens, name, (n, k), kind in (
        (t, name, nk, kind)
        for t in args.tokens
        for name, nk in linears(QWEN3_8B).items()
        for kind in (("fprop", "dgrad") if t <= SMALL_M_MAX else ("fprop", "dgrad", "wgrad"))
    ):
        ops = operands(kind, tokens, n, k, dev)
        aq, as_, bq, bs = ops["fp8"]
        out = torch.zeros(*ops["out"], device=dev, dtype=ops["dtype"])
        a_sf = deep_gemm.get_mn_major_tma_aligned_tensor(as_)
        b_sf = deep_gemm.get_mn_major_tma_aligned_tensor(bs) if kind == "wgrad" else bs
        extra = {"c": out, "recipe": (1, 1, 128), "compiled_dims": "mn"} if kind == "wgrad" else {}

        def dg_mm(out=out, aq=aq, a_sf=a_sf, bq=bq, b_sf=b_sf, extra=extra):
            deep_gemm.fp8_gemm_nt((aq, a_sf), (bq, b_sf), out, **extra)

        def ours(ops=ops):
            aq, as_, bq, bs = ops["fp8"]
            return fp8_blockwise_mm(aq, as_, bq, bs, ops["dtype"], w_blocks=ops["blocks"], backend="scaled_mm")

        ref = ours()
        out.zero_()
        dg_mm()  # wgrad: 0 + dY^T X
        diff = float((out.float() - ref.float()).abs().max())
        a16, b16 = ops["bf16"]
        variants = {"bf16": lambda a16=a16, b16=b16: a16 @ b16, "scaled_mm": ours, "deepgemm": dg_mm}
        if tokens <= SMALL_M_MAX:  # the dispatcher's pick (the Triton kernel or the library), without and with DG
            for v, backend in (("auto", "auto"), ("auto_deep_gemm", "deep_gemm")):
                variants[v] = lambda ops=ops, backend=backend: fp8_blockwise_mm(*ops["fp8"], backend=backend)
        runs = {v: (lambda fn=fn: [fn() for _ in range(args.reps)]) for v, fn in variants.items()}
        timings = alternating_timings(runs, args.warmup, args.steps, dev)
        flops = 2 * tokens * n * k
        t = {v: timings[v]["median_s"] / args.reps for v in variants}
        reduction = {"fprop": k, "dgrad": n, "wgrad": tokens}[kind]
        row = {"tokens": tokens, "linear": name, "pass": kind, "out": "x".join(map(str, ops["out"])),
               "reduction": reduction}  # fmt: skip
        for v in variants:
            lo, hi = timings[v]["min_s"] / args.reps, timings[v]["max_s"] / args.reps
            row[f"{v}_ms"] = round(t[v] * 1e3, 3)
            row[f"{v}_range_ms"] = f"{lo * 1e3:.3f}-{hi * 1e3:.3f}"
            row[f"{v}_tflops"] = round(flops / t[v] / 1e12)
        if "auto" in t:
            row["auto_dg_vs_auto"] = round(t["auto"] / t["auto_deep_gemm"], 3)
        row.update(dg_vs_scaled_mm=round(t["scaled_mm"] / t["deepgemm"], 3),
                   dg_vs_bf16=round(t["bf16"] / t["deepgemm"], 3), bitwise=diff == 0.0, max_abs_diff=diff)  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    keys = ["tokens", "linear", "pass", "out", "reduction", "bf16_ms", "scaled_mm_ms", "scaled_mm_range_ms", "deepgemm_ms",
            "deepgemm_range_ms", "dg_vs_scaled_mm", "dg_vs_bf16", "auto_ms", "auto_deep_gemm_ms", "auto_dg_vs_auto",
            "bitwise"]  # fmt: skip
    for row in rows:
        for key in keys:
            row.setdefault(key, "")
    title = (f"DeepGEMM {deep_gemm.__version__} vs scaled_mm vs BF16 on {info['device']}: Qwen3-8B linears, "
             f"{'/'.join(map(str, args.tokens))} tokens, median of {args.steps} steps x {args.reps} products, variants alternating")  # fmt: skip
    report(title, keys, keys, rows, args=args, info=info, shape=QWEN3_8B, n_layers=1,
           deep_gemm=deep_gemm.__version__)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
