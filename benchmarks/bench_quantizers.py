"""The trainer's 1x128 quantizer (`triton_quant.quant_groups`) at the shapes one training micro-batch of the Qwen3-8B
shape feeds it, row-major and through the transposed WGrad view, against a plain e4m3 cast of the same tensor (the
bandwidth reference: the same bytes read and written, no scales) and, on request, its tile / warp alternatives.
GPU only.

    python3 -m benchmarks.bench_quantizers --tokens 10752 --data randn,zeros --out quantizers.json

`--data`: random normal values, or zeros (a zero-advantage sequence's gradient, what the random-weight CLI runs
train on), or "masked" (random, 30% of the rows zero): the quantizer's IEEE division (`div_rn`) is slower on zeros.
Variants: the quantizer's two divisions (`triton_quant.DIVISIONS`, the same bits): "plain" (`div_rn` on every value;
what row-major activations get) and "reciprocal" (one division per group, then products and FMAs; what the
transposed view and gradients get: `triton_quant.division_for`), the cast reference, and with `--tiles` the
(ROWS, num_warps) alternatives. With `--tokens` not a multiple of 128 the transposed view also times the WGrad
operand's padding to the block: in the kernel (`width`) against a zero-padded copy first. `--kv` also times the
trainer's K/V fake-quant on a [1, 8, T, 128] view: the one Triton pass against the torch ops (bits checked equal).
Each call runs inside a CUDA graph over inputs cycled out of L2; the variants alternate over `--rounds` rounds of
7 replays each: median and min-max of the rounds' medians, and the bandwidth (bf16 read + e4m3 write + fp32
scales). Every quantizer variant's bits and scales are checked equal first.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import alternating_cold_times, cold_time_fields, parse_gpu_bench, print_table, write_json

WIDTHS = [("hidden", 4096), ("qkv out", 6144), ("ffn", 12288), ("gate+up out", 24576)]
TILES = [(16, 4), (32, 4), (64, 4), (32, 8), (64, 8), (128, 8)]  # (ROWS, num_warps) alternatives
DATA = ("randn", "zeros", "masked")


def make_input(kind: str, tokens: int, width: int, device: torch.device) -> torch.Tensor:
    """bf16 [tokens, width] of the named kind (`DATA`)."""
    if kind == "zeros":
        return torch.zeros(tokens, width, device=device, dtype=torch.bfloat16)
    x = torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
    if kind == "masked":
        x *= (torch.rand(tokens, 1, device=device) > 0.3).to(x.dtype)
    return x


def quantizer_variants(tiles: bool) -> dict:
    from nemo_jetrl.precision.kernels.triton_quant import quant_groups

    variants = {
        "quant_groups, plain": lambda x: quant_groups(x, 128, False, division="plain"),
        "quant_groups, reciprocal": lambda x: quant_groups(x, 128, False, division="reciprocal"),
    }
    if tiles:
        variants |= {f"rows {rows}, {w} warps": (lambda x, rows=rows, w=w: quant_groups(x, 128, False, rows, w, "plain"))
                     for rows, w in TILES}  # fmt: skip
    return variants


def padding_variants(tokens: int) -> dict:
    """The transposed view's two ways to the WGrad operand of `tokens` (not a multiple of 128) padded to the block:
    zero tokens from the kernel's masked loads (`width`, what `act_quant_dual` does), or a zero-padded copy first."""
    import torch.nn.functional as F

    from nemo_jetrl.precision.kernels.triton_quant import quant_groups

    pad = -tokens % 128
    return {
        "padded in the kernel": lambda xt: quant_groups(xt, 128, False, width=tokens + pad),
        "F.pad copy, then quant_groups": lambda xt: quant_groups(F.pad(xt.t(), (0, 0, 0, pad)).t(), 128, False),
    }


def result_rows(data: str, where: str, times: dict[str, list[float]], moved: int) -> list[dict]:
    """One result row per variant: median and min-max of its rounds' us, and the bandwidth of `moved` bytes."""
    rows = [{"data": data, "input": where, "variant": v, **cold_time_fields(t)} for v, t in times.items()]
    return [{**row, "tb_s": moved / row["us"] / 1e6} for row in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=10752, help="tokens of one micro-batch")
    p.add_argument("--data", default="randn,zeros", help=f"comma-separated, of {', '.join(DATA)}")
    p.add_argument("--tiles", action="store_true", help="also time the (ROWS, num_warps) alternatives")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kv", action="store_true", help="also time the trainer's K/V fake-quant (one pass vs torch ops)")
    parsed = parse_gpu_bench(p, argv)
    if parsed is None:
        return 2
    args, dev, info = parsed
    kinds = args.data.split(",")
    if not set(kinds) <= set(DATA):
        p.error(f"--data: unknown {sorted(set(kinds) - set(DATA))}; choose from {DATA}")
    from nemo_jetrl.precision.kernels.device import cold_copies

    quantizers = quantizer_variants(args.tiles)
    cast = lambda x: x.to(torch.float8_e4m3fn)  # noqa: E731
    results = []
    for kind in kinds:
        for name, width in WIDTHS:
            for layout in ("rows", "transposed"):
                copies = cold_copies(args.tokens * width * 2, dev)
                base = [make_input(kind, args.tokens, width, dev) for _ in range(copies)]
                inputs = base if layout == "rows" else [x.t() for x in base]  # [T, W] or its [W, T] view
                r, c = inputs[0].shape
                padding = padding_variants(args.tokens) if layout == "transposed" and args.tokens % 128 else {}
                for group in (quantizers, padding):
                    want_q, want_s = next(iter(group.values()))(inputs[0]) if group else (None, None)
                    for v, fn in group.items():
                        q, s = fn(inputs[0])
                        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s), v
                variants = {**quantizers, **padding, "e4m3 cast (reference)": cast}
                calls = {v: [lambda x=x, f=f: f(x) for x in inputs] for v, f in variants.items()}
                moved = r * c * 3 + r * (c // 128) * 4  # bf16 read + e4m3 write + scales
                times = alternating_cold_times(calls, args.rounds)
                results += result_rows(kind, f"{name} {layout} [{r}, {c}]", times, moved)
                del base, inputs
    if args.kv:  # the trainer's K/V fake-quant: one Triton pass against the torch round trip, [1, 8, T, 128] views
        from nemo_jetrl.precision.kv import kv_dequant, kv_fake_quant, kv_quant

        scale = torch.tensor(0.01, device=dev)
        copies = cold_copies(args.tokens * 8 * 128 * 2, dev)
        inputs = [torch.randn(1, args.tokens, 8, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
                  for _ in range(copies)]  # fmt: skip
        variants = {"kv fake-quant, one pass": lambda k: kv_fake_quant(k, scale),
                    "kv fake-quant, torch ops": lambda k: kv_dequant(kv_quant(k, scale), scale, k.dtype)}  # fmt: skip
        a, b = (f(inputs[0]) for f in variants.values())
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        calls = {v: [lambda k=k, f=f: f(k) for k in inputs] for v, f in variants.items()}
        times = alternating_cold_times(calls, args.rounds)  # bytes moved: bf16 read + bf16 write
        results += result_rows("randn", f"K [1, 8, {args.tokens}, 128] view", times, inputs[0].numel() * 4)
    title = (f"1x128 quantizer, {args.tokens} tokens, cold in L2, on {info['device']}: {args.rounds} alternating "
             f"rounds, median (min-max)")  # fmt: skip
    keys = ["data", "input", "variant", "us", "min_max_us", "tb_s"]
    header = ["data", "input", "variant", "us", "min-max us", "TB/s"]
    table = print_table(title, header, [[r[k] for k in keys] for r in results])
    write_json(args.out, {**info, "args": vars(args), "results": results, "table": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
