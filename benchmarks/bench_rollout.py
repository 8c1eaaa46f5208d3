"""Rollout throughput: BF16 vs FP8 linears vs FP8 linears + FP8 KV cache, one model, one run, side by side.

    PYTHONPATH=. python3 benchmarks/bench_rollout.py --out rollout.json            # GPU: Qwen3-8B shape
    PYTHONPATH=. python3 benchmarks/bench_rollout.py --quick                        # CPU smoke test

The native engine as GRPO runs it: prefill, then a CUDA-graph-captured static decode step with the Triton decode
attention over the stored cache (bf16 or e4m3 + per-layer scales), sampling on the device, no host sync but an
"all finished?" check every 16 tokens. Fixed lengths: every prompt has `--prompt-len` random tokens and decodes
exactly `--gen-len` tokens (no stop token). The FP8 model is the BF16 one converted in place (`convert_to_fp8`,
recipe `jetrl`); the FP8 KV scales come from the project's QKV calibration over one random batch.

Decode bandwidth = (weight bytes + mean KV bytes read per step) / decode step time, against the HBM peak.
"""

from __future__ import annotations

import argparse
import collections
import gc
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    QWEN3_8B,
    TINY,
    add_deep_gemm_flag,
    build_model,
    check_deep_gemm,
    device_info,
    linear_weight_bytes,
    report,
    timed,
)

from nemo_jetrl.generation.native.engine import NativeGenerationEngine  # noqa: E402
from nemo_jetrl.generation.native.kv_cache import KVCache  # noqa: E402
from nemo_jetrl.models.decoder import decoder_forward, position_ids_from_mask  # noqa: E402
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8, rollout_mode  # noqa: E402
from nemo_jetrl.precision.kv import QKVCalibrator  # noqa: E402


@torch.no_grad()
def calibrate(model, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer (k, v) FP8 scales from one forward over `prompts` [B, S] (the trainer's calibration hook)."""
    calib = QKVCalibrator(model.config.num_hidden_layers)
    mask = torch.ones_like(prompts)
    with rollout_mode(model):
        decoder_forward(model, prompts, position_ids_from_mask(mask), mask, attn_hook=calib)
    return calib.scales().kv


def run_variant(name: str, engine: NativeGenerationEngine, prompts: list[list[int]], args, device) -> dict:
    """Warm-up, then prefill-only and full rollouts (seeded sampling); timings in seconds."""
    gen = torch.Generator(device=device)
    engine.replace(max_new_tokens=4).generate(prompts, generator=gen.manual_seed(0))  # JIT + graph warm-up
    _, t_prefill = timed(
        lambda: engine.replace(max_new_tokens=1).generate(prompts, generator=gen.manual_seed(1)), device
    )
    out, t_total = timed(lambda: engine.generate(prompts, generator=gen.manual_seed(2)), device)
    if out.input_ids.shape[1] != args.prompt_len + args.gen_len:
        raise RuntimeError(
            f"{name}: expected {args.gen_len} new tokens, got {out.input_ids.shape[1] - args.prompt_len}"
        )
    steps = args.gen_len - 1
    t_decode = max(t_total - t_prefill, 1e-9)
    r = {
        "variant": name,
        "total_s": t_total,
        "prefill_s": t_prefill,
        "decode_step_ms": 1e3 * t_decode / steps,
        "output_tokens_per_s": args.batch * args.gen_len / t_total,
        "decode_tokens_per_s": args.batch * steps / t_decode,
    }
    if args.profile_steps and device.type == "cuda":
        context = args.prompt_len + args.gen_len // 2  # the rollout's mean context
        r["profile"] = kernel_profile(engine, args.batch, context, args.profile_steps, device)
        print(f"  {name} kernels, ms per decode step: {r['profile']['categories_ms']}", flush=True)
        for kernel, ms in r["profile"]["top_kernels_ms"]:
            print(f"    {ms:7.3f}  {kernel}", flush=True)
    if args.eager_steps and device.type == "cuda":  # the same decode without CUDA graphs, a few steps
        eager = engine.replace(cuda_graphs=False, static_decode=True, max_new_tokens=args.eager_steps + 1)
        _, t_eager = timed(lambda: eager.generate(prompts, generator=gen.manual_seed(3)), device)
        r["eager_decode_step_ms"] = 1e3 * max(t_eager - t_prefill, 1e-9) / args.eager_steps
    del out
    if device.type == "cuda":  # hand the freed KV cache back: the next variant's must not fit around fragments
        gc.collect()
        torch.cuda.empty_cache()
    return r


# Kernel-name patterns of the decode-step profile (`--profile-steps`), first match wins.
KERNEL_CATEGORIES = (
    ("fp8 gemm (triton)", re.compile(r"_fp8_gemm_kernel|_split_k_reduce")),
    ("attention", re.compile(r"decode_kernel|merge_kernel|attention|fmha|flash")),
    ("fused glue", re.compile(r"_add_rms_norm|_qk_norm_rope|_silu_mul")),
    ("act quant", re.compile(r"quant")),
    ("gemm (cuBLAS)", re.compile(r"gemm|nvjet|xmma|cutlass|sm90_|cublas", re.IGNORECASE)),
)


def kernel_profile(engine: NativeGenerationEngine, batch: int, context: int, steps: int, device) -> dict:
    """GPU time per decode step by kernel category and by kernel, at the rollout's mean context: `steps` eager
    static decode steps + sampling of `batch` sequences attending over `context` cached keys, under the profiler.
    Kernel durations are those of the captured step (only launch gaps differ) and do not depend on the cached
    values, so the cache is left as allocated (zeros) instead of prefilled."""
    from torch.profiler import ProfilerActivity, profile

    from nemo_jetrl.generation.native.sampler import sample

    eager = engine.replace(cuda_graphs=False, static_decode=True, max_new_tokens=steps + 1)
    gen = torch.Generator(device=device).manual_seed(4)
    width = context + steps + 1
    mask = torch.ones((batch, width), dtype=torch.long, device=device)
    with torch.no_grad(), rollout_mode(eager.model):
        cache = eager._new_cache(batch, width)
        logits = torch.randn((batch, engine.vocab_size), generator=gen, device=device)
        decode = eager._decoder(cache, None, mask)
        positions = torch.full((batch,), context, dtype=torch.long, device=device)
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for step in range(steps):
                tokens, _ = sample(logits, eager.sampling, generator=gen)
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
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: all 36 of Qwen3-8B)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=2048)
    p.add_argument("--eager-steps", type=int, default=16, help="also time N eager (non-graph) decode steps; 0 = off")
    p.add_argument(
        "--profile-steps", type=int, default=0, help="GPU: profile N eager decode steps per variant (kernel breakdown)"
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    add_deep_gemm_flag(p, "fp8+kv+deep_gemm")
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = QWEN3_8B, "Qwen3-8B"
    if args.quick:
        shape_name = "tiny"
        shape, args.batch, args.prompt_len, args.gen_len, args.layers = TINY, 4, 16, 8, args.layers or 2
    info = device_info(device)
    check_deep_gemm(p, args, device)
    model = build_model(shape, args.layers, device, torch.bfloat16)
    n_layers = model.config.num_hidden_layers
    gen = torch.Generator().manual_seed(0)
    prompt_t = torch.randint(1, shape["vocab_size"], (args.batch, args.prompt_len), generator=gen)
    prompts = prompt_t.tolist()
    base = dict(max_new_tokens=args.gen_len, stop_token_ids=[], pad_token_id=0, cuda_graphs=True)

    results = [run_variant("bf16", NativeGenerationEngine(model, **base), prompts, args, device)]
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    results.append(run_variant("fp8", NativeGenerationEngine(model, **base), prompts, args, device))
    kv_scales = calibrate(model, prompt_t[: min(8, args.batch)].to(device))
    fp8_kv = NativeGenerationEngine(model, kv_cache_dtype="fp8", **base)
    fp8_kv.update_weights(kv_scales=kv_scales)
    results.append(run_variant("fp8+kv", fp8_kv, prompts, args, device))
    if args.deep_gemm:
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl", use_deep_gemm=True))  # same FP8 bits, DeepGEMM GEMMs
        fp8_kv_dg = NativeGenerationEngine(model, kv_cache_dtype="fp8", **base)
        fp8_kv_dg.update_weights(kv_scales=kv_scales)
        results.append(run_variant("fp8+kv+deep_gemm", fp8_kv_dg, prompts, args, device))

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
        f"fp8 {kv_bytes[torch.float8_e4m3fn]:,}"
    )
    headers = ["variant", "out tok/s", "x bf16", "prefill s", "step ms", "eager ms", "GB/step", "TB/s", "% HBM"]
    keys = [
        "variant", "output_tokens_per_s", "speedup_vs_bf16", "prefill_s", "decode_step_ms", "eager_decode_step_ms",
        "bytes_per_step_gb", "decode_tbs", "hbm_roofline_pct",
    ]  # fmt: skip
    kv_per_token = {"bf16": kv_bytes[torch.bfloat16], "fp8": kv_bytes[torch.float8_e4m3fn]}
    report(
        title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers,
        kv_bytes_per_token=kv_per_token,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
