"""Rollout throughput: BF16 vs FP8 linears vs FP8 linears + FP8 KV cache, side by side in one process.

    python3 -m benchmarks.bench_rollout --out rollout.json            # GPU: Qwen3-8B shape
    python3 -m benchmarks.bench_rollout --shape qwen3-30b-a3b          # GPU: the MoE, all 48 layers
    python3 -m benchmarks.bench_rollout --quick                        # CPU smoke test

The native engine as GRPO runs it: prefill, then a CUDA-graph-captured static decode step with the decode
attention over the stored cache (bf16 or e4m3 + per-layer scales), sampling on the device, no host sync but an
"all finished?" check every 16 tokens. Fixed lengths: every prompt has `--prompt-len` random tokens and decodes
exactly `--gen-len` tokens (no stop token). Two resident models: the BF16 one and a copy converted to FP8 (recipe
`jetrl`, `rollout_engines.py`); the FP8 KV scales come from the project's QKV calibration over one random batch.

Protocol: each variant first runs a short rollout (kernel compilation, autotuning), then `--repeats` whole rollouts
per variant and `--repeats` prefill-only rollouts, the variants alternating round by round (A, B, C, then C, B, A);
median and min-max per variant, with the SM clock and power during its timed rollouts. Decode step = (median
rollout - median prefill) / (gen_len - 1). Decode bandwidth = (weight bytes + mean KV bytes read per step) / decode
step time, against the HBM peak.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import sys

import torch

from benchmarks.common import (
    TINY,
    add_deep_gemm_flag,
    alternating_timings,
    build_model,
    check_deep_gemm,
    device_info,
    linear_weight_bytes,
    report,
    timed,
)
from benchmarks.gpu_clocks import ClockSampler, per_variant
from benchmarks.rollout_engines import build_engines, wrap_variant
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.precision import rollout_mode


def rollout_fn(engine: NativeGenerationEngine, prompts: list[list[int]], gen_len: int, seed: int, check: bool = True):
    """One seeded rollout of `prompts` to `gen_len` new tokens; with `check`, every row must have generated them all."""
    gen = torch.Generator(device=engine.device)
    run = engine.replace(max_new_tokens=gen_len)

    def step():
        out = run.generate(prompts, generator=gen.manual_seed(seed))
        if check and out.input_ids.shape[1] != len(prompts[0]) + gen_len:
            raise RuntimeError(f"expected {gen_len} new tokens, got {out.input_ids.shape[1] - len(prompts[0])}")

    return step


def timed_variants(engines: dict, prompts: list[list[int]], args, device, intervals: dict) -> dict[str, dict]:
    """Warm-up, then whole and prefill-only rollouts of every variant, alternating (`alternating_timings`)."""
    full, prefill = {}, {}
    for name, engine in engines.items():
        wrap_variant(name, rollout_fn(engine, prompts, 4, 0), engine)()  # compilation, autotuning, captures
        full[name] = wrap_variant(name, rollout_fn(engine, prompts, args.gen_len, 2), engine)
        prefill[name] = wrap_variant(name, rollout_fn(engine, prompts, 1, 1), engine)
    totals = alternating_timings(full, 0, args.repeats, device, intervals)
    prefills = alternating_timings(prefill, 0, args.repeats, device)
    steps = args.gen_len - 1
    out = {}
    for name, t in totals.items():
        t_prefill = prefills[name]["median_s"]
        t_decode = max(t["median_s"] - t_prefill, 1e-9)
        out[name] = {
            "variant": name,
            "total_s": t["median_s"],
            "total_min_max_s": f"{t['min_s']:.2f}-{t['max_s']:.2f}",
            "total_times_s": t["times_s"],
            "prefill_s": t_prefill,
            "prefill_times_s": prefills[name]["times_s"],
            "decode_step_ms": 1e3 * t_decode / steps,
            "output_tokens_per_s": args.batch * args.gen_len / t["median_s"],
            "output_tokens_per_s_range": f"{args.batch * args.gen_len / t['max_s']:,.0f}-"
            f"{args.batch * args.gen_len / t['min_s']:,.0f}",
            "decode_tokens_per_s": args.batch * steps / t_decode,
            "step_peak_gb": t["step_peak_gb"],
        }
    return out


def diagnostics(name: str, engine: NativeGenerationEngine, prompts, args, device) -> dict:
    """Untimed extras of one variant: the kernel profile of its decode step and eager (uncaptured) decode steps."""
    r = {}
    if args.profile_steps and device.type == "cuda":
        context = args.prompt_len + args.gen_len // 2  # the rollout's mean context
        profile_fn = wrap_variant(name, lambda: kernel_profile(engine, args.batch, context, args.profile_steps, device), engine)
        r["profile"] = profile_fn()
        print(f"  {name} kernels, ms per decode step: {r['profile']['categories_ms']}", flush=True)
        for kernel, ms in r["profile"]["top_kernels_ms"]:
            print(f"    {ms:7.3f}  {kernel}", flush=True)
    if args.eager_steps and device.type == "cuda":  # the same decode without CUDA graphs, a few steps
        eager = engine.replace(cuda_graphs=False, static_decode=True)
        prefill = wrap_variant(name, rollout_fn(eager, prompts, 1, 1, check=False), engine)
        decode = wrap_variant(name, rollout_fn(eager, prompts, args.eager_steps + 1, 3, check=False), engine)
        (_, t_prefill), (_, t_eager) = timed(prefill, device), timed(decode, device)
        r["eager_decode_step_ms"] = 1e3 * max(t_eager - t_prefill, 1e-9) / args.eager_steps
    return r


# Kernel-name patterns of the decode-step profile (`--profile-steps`), first match wins.
KERNEL_CATEGORIES = (
    ("fp8 gemm (triton)", re.compile(r"_fp8_gemm_kernel|_split_k_reduce|_grouped_fp8_kernel")),
    ("attention", re.compile(r"decode_kernel|merge_kernel|attention|fmha|flash")),
    ("fused glue", re.compile(r"_add_rms_norm|_qk_norm_rope|_silu_mul")),
    ("act quant", re.compile(r"quant")),
    ("gemm (cuBLAS)", re.compile(r"gemm|nvjet|xmma|cutlass|sm90_|cublas", re.IGNORECASE)),
)


def kernel_profile(engine: NativeGenerationEngine, batch: int, context: int, steps: int, device) -> dict:
    """GPU time per decode step by kernel category and by kernel, at the rollout's mean context: `steps` eager
    static decode steps + sampling (the engine's sampler) of `batch` sequences attending over `context` cached keys,
    under the profiler. Kernel durations are those of the captured step (only launch gaps differ) and do not depend
    on the cached values, so the cache is left as allocated (zeros) instead of prefilled."""
    from torch.profiler import ProfilerActivity, profile

    from nemo_jetrl.generation.native.sampler import sample

    eager = engine.replace(cuda_graphs=False, static_decode=True, max_new_tokens=steps + 1)
    gen = torch.Generator(device=device).manual_seed(4)
    width = context + steps + 1
    mask = torch.ones((batch, width), dtype=torch.long, device=device)
    with torch.no_grad(), rollout_mode(eager.model):
        cache = eager.new_kv_cache(batch, width)
        logits = torch.randn((batch, engine.vocab_size), generator=gen, device=device)
        decode = eager.decoder(cache, mask)
        positions = torch.full((batch,), context, dtype=torch.long, device=device)
        exact_logsumexp = eager.forward_plan.exact.logsumexp  # the engine's sampler (`NativeGenerationEngine`)
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for step in range(steps):
                tokens, _ = sample(logits, eager.sampling, generator=gen, batch_invariant=exact_logsumexp)
                logits = decode(tokens, positions + step, context + step)
            torch.cuda.synchronize(device)
    per_step = collections.Counter()  # ms per decode step by kernel name
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_step[evt.name] += evt.time_range.elapsed_us() / steps / 1e3
    categories = collections.Counter()
    for name, ms in per_step.items():
        label = next((label for label, pattern in KERNEL_CATEGORIES if pattern.search(name)), "other")
        categories[label] += ms
    del cache
    return {
        "context": context,
        "ms_per_step": sum(per_step.values()),
        "categories_ms": dict(categories.most_common()),
        "top_kernels_ms": [[name[:160], ms] for name, ms in per_step.most_common(12)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="model shape (random weights)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: all of the shape's)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5, help="timed rollouts per variant (>= 5 for quoted figures)")
    p.add_argument("--eager-steps", type=int, default=16, help="also time N eager (non-graph) decode steps; 0 = off")
    p.add_argument(
        "--profile-steps", type=int, default=0, help="GPU: profile N eager decode steps per variant (kernel breakdown)"
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    add_deep_gemm_flag(p, "fp8+kv+deep_gemm")
    p.add_argument(
        "--variants", default=None, help="comma-separated subset to time (default: all; bf16 first, the reference)"
    )
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = SHAPES[args.shape], args.shape
    if args.quick:
        moe = SHAPES["tiny-moe"] if "num_experts" in shape else TINY
        shape_name = "tiny-moe" if "num_experts" in shape else "tiny"
        shape, args.batch, args.prompt_len, args.gen_len, args.layers = moe, 4, 16, 8, args.layers or 2
        args.repeats = 2
    info = device_info(device)
    check_deep_gemm(p, args, device)
    model = build_model(shape, args.layers, device, torch.bfloat16)
    n_layers = model.config.num_hidden_layers
    gen = torch.Generator().manual_seed(0)
    prompt_t = torch.randint(1, shape["vocab_size"], (args.batch, args.prompt_len), generator=gen)
    prompts = prompt_t.tolist()
    engines = build_engines(
        model, prompt_t[: min(8, args.batch)], deep_gemm=args.deep_gemm, max_new_tokens=args.gen_len,
        stop_token_ids=[], pad_token_id=0, cuda_graphs=True,
    )  # fmt: skip
    if args.variants:
        keep = args.variants.split(",")
        if keep[0] != "bf16" or set(keep) - set(engines):
            p.error(f"--variants: bf16 first, then any of {', '.join(list(engines)[1:])}; got {args.variants!r}")
        engines = {name: engines[name] for name in keep}
    intervals: dict[str, list[tuple[float, float]]] = {}  # each timed rollout's span, for the GPU clock samples
    with ClockSampler(device.index or 0) if device.type == "cuda" else contextlib.nullcontext() as sampler:
        timings = timed_variants(engines, prompts, args, device, intervals)
    clocks = per_variant(sampler.samples, intervals) if sampler is not None else {}
    results = [
        {**timings[name], **clocks.get(name, {}), **diagnostics(name, engine, prompts, args, device)}
        for name, engine in engines.items()
    ]

    kv_bytes = {
        dt: KVCache.for_model(model, 1, 1, dtype=dt, device="meta").bytes_per_token
        for dt in (torch.bfloat16, torch.float8_e4m3fn)
    }
    mean_kv_len = args.prompt_len + args.gen_len / 2
    for r in results:
        fp8 = r["variant"] != "bf16"
        kv = kv_bytes[torch.float8_e4m3fn if r["variant"].startswith("fp8+kv") else torch.bfloat16]
        step_bytes = linear_weight_bytes(model, fp8) + args.batch * mean_kv_len * kv
        r["bytes_per_step_gb"] = step_bytes / 1e9
        r["decode_tbs"] = step_bytes / (r["decode_step_ms"] * 1e-3) / 1e12
        r["hbm_roofline_pct"] = 100 * r["decode_tbs"] / info["hbm_peak_tbs"] if info["hbm_peak_tbs"] else None
        r["speedup_vs_bf16"] = results[0]["total_s"] / r["total_s"]
    title = (
        f"rollout on {info['device']}: {shape_name} shape x {n_layers} layers, batch {args.batch}, "
        f"{args.prompt_len} -> {args.gen_len} tokens | KV bytes/token bf16 {kv_bytes[torch.bfloat16]:,} "
        f"fp8 {kv_bytes[torch.float8_e4m3fn]:,} | {args.repeats} timed rollouts per variant, variants alternating"
    )
    headers = ["variant", "out tok/s", "min-max", "x bf16", "rollout s", "prefill s", "step ms", "eager ms", "GB/step",
               "TB/s", "% HBM"]  # fmt: skip
    keys = [
        "variant", "output_tokens_per_s", "output_tokens_per_s_range", "speedup_vs_bf16", "total_s", "prefill_s",
        "decode_step_ms", "eager_decode_step_ms", "bytes_per_step_gb", "decode_tbs", "hbm_roofline_pct",
    ]  # fmt: skip
    if clocks:  # SM clock and power during each variant's timed rollouts (nvidia-smi)
        keys += ["sm_mhz_median", "power_w_median"]
        headers += ["SM MHz", "W"]
    kv_per_token = {"bf16": kv_bytes[torch.bfloat16], "fp8": kv_bytes[torch.float8_e4m3fn]}
    report(
        title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers,
        kv_bytes_per_token=kv_per_token,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
