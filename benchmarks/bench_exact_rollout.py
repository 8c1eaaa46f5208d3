"""Rollout speed of the exact mode against the fast path: same weights, same prompts, alternating timed rollouts.

    python3 -m benchmarks.bench_exact_rollout --out exact_rollout.json      # GPU: Qwen3-8B shape, 16 layers
    python3 -m benchmarks.bench_exact_rollout --shape qwen3-1.7b --layers 0  # all 28 layers of Qwen3-1.7B
    python3 -m benchmarks.bench_exact_rollout --quick                        # CPU smoke test

Per preset (`jetrl`, `jetrl_kv`) two copies of one random-weight model: the fast path (cuBLAS / split-K Triton
GEMMs, fused FP8 decode attention) and the exact mode (`enable_batch_invariant`: batch-invariant GEMMs, attention
and log-softmax; what `policy.generation.deterministic: true` runs). The engine as GRPO runs it (prefill, CUDA-graph
decode, device sampling, fixed lengths). Full rollouts and prefill-only rollouts alternate between the two
(`common.alternating_timings`: warm-up, then >= 5 timed rounds, order flipped every round); reported: median and
min-max seconds, and exact / fast. `--modes` adds `matched` (`policy.generation.matched_kernels: true`, as the
policy switches it on this device) and partial modes (`attention`: only the batch-invariant attention,
`models.batch_invariant.ExactParts`); `--profile-steps N` adds a kernel breakdown of N eager decode steps per mode
(`bench_rollout.kernel_profile`, over the static batch's cache); `--continuous-batching` decodes from the paged KV
pool, as the engine does where its memory caps cannot hold the whole batch.
"""

from __future__ import annotations

import argparse
import gc
import sys

import torch

from benchmarks.common import SHAPES, TINY, alternating_timings, build_model, device_info, report
from benchmarks.rollout_engines import calibrate
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.batch_invariant import ExactParts, enable_batch_invariant, match_kernels
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
from nemo_jetrl.precision.convert import use_cublas_fprop


def mode_parts(mode: str) -> tuple[ExactParts | None, bool]:
    """`--modes` entry other than "matched" (`match_kernels`, the user's switch) -> (exact parts it switches on,
    cuBLAS FP8 forward at every M): "fast" none, "exact" all, "exact-a-b" all but parts a and b, else "+"-joined
    part names and/or "cublas"."""
    if mode == "fast":
        return None, False
    if mode.startswith("exact"):
        return ExactParts().without(*mode.split("-")[1:]), False
    names = [n for n in mode.split("+") if n != "cublas"]
    return (ExactParts.only(*names) if names else None), "cublas" in mode.split("+")


def engines(preset: str, shape: dict, args, prompt_t: torch.Tensor, device) -> dict[str, NativeGenerationEngine]:
    """{mode: engine} for "fast" and every `args.modes` entry, over copies of the same random weights, converted to
    `preset`."""
    recipe = PrecisionRecipe.preset(preset)
    out, scales = {}, None
    for mode in dict.fromkeys(["fast", *args.modes]):
        model = build_model(shape, args.layers, device, torch.bfloat16)
        convert_to_fp8(model, recipe)
        if mode == "matched":  # what `policy.generation.matched_kernels: true` runs on this device
            match_kernels(model, device)
        else:
            parts, cublas = mode_parts(mode)
            if parts is not None:
                enable_batch_invariant(model, parts)
            if cublas:
                use_cublas_fprop(model)
        engine = NativeGenerationEngine(
            model, max_new_tokens=args.gen_len, stop_token_ids=[], pad_token_id=0, kv_cache_dtype=recipe.kv_cache_dtype,
            cuda_graphs=device.type == "cuda", continuous_batching=args.continuous_batching or None,
        )  # fmt: skip
        if recipe.kv_fp8:  # one set of scales for both (calibrated on the fast copy: same weights)
            scales = scales if scales is not None else calibrate(model, prompt_t[: min(8, len(prompt_t))].to(device))
            engine.update_weights(kv_scales=scales)
        out[mode] = engine
    return out


def rollout(engine: NativeGenerationEngine, prompts: list[list[int]], device) -> None:
    engine.generate(prompts, generator=torch.Generator(device=device).manual_seed(2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="published model shape (random weights)")
    p.add_argument("--layers", type=int, default=16, help="decoder layers of the shape (0: all)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--presets", nargs="*", default=["jetrl", "jetrl_kv"])
    p.add_argument(
        "--modes",
        nargs="*",
        default=["exact"],
        help="matched (the user's switch), exact, exact-PART, or PART+PART(+cublas)",
    )
    p.add_argument("--profile-steps", type=int, default=0, help="GPU: kernel breakdown of N eager decode steps")
    p.add_argument(
        "--continuous-batching", action="store_true", help="decode from the paged KV pool (as a capped batch does)"
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="timed rounds per variant")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--out", default=None, help="JSON path")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = dict(SHAPES[args.shape]), args.shape
    args.layers = args.layers or shape["num_hidden_layers"]
    if args.quick:
        shape, shape_name, args.layers, args.batch, args.prompt_len, args.gen_len = TINY, "tiny", 2, 4, 8, 4
        args.steps = 2
    info = device_info(device)
    gen = torch.Generator().manual_seed(0)
    prompt_t = torch.randint(1, shape["vocab_size"], (args.batch, args.prompt_len), generator=gen)
    prompts = prompt_t.tolist()
    results = []
    for preset in args.presets:
        pair = engines(preset, shape, args, prompt_t, device)
        variants = {}
        for mode, engine in pair.items():
            prefill_only = engine.replace(max_new_tokens=1)
            variants[f"{preset} {mode}"] = lambda e=engine: rollout(e, prompts, device)
            variants[f"{preset} {mode} prefill"] = lambda e=prefill_only: rollout(e, prompts, device)
        timings = alternating_timings(variants, args.warmup, args.steps, device)
        for name, t in timings.items():
            mode = name.split()[1]
            base = timings[name.replace(f" {mode}", " fast", 1)]["median_s"]
            results.append({"variant": name, **t, "exact_over_fast": t["median_s"] / base})
            if args.profile_steps and device.type == "cuda" and not name.endswith("prefill"):
                from benchmarks.bench_rollout import kernel_profile

                results[-1]["profile"] = profile = kernel_profile(
                    pair[mode], args.batch, args.prompt_len + args.gen_len // 2, args.profile_steps, device
                )  # fmt: skip
                print(f"  {name} kernels, ms per decode step: {profile['categories_ms']}", flush=True)
                for kernel, ms in profile["top_kernels_ms"]:
                    print(f"    {ms:8.4f}  {kernel}", flush=True)
        del pair, variants
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for r in results:
        r["min_max_s"] = f"{r['min_s']:.3f}-{r['max_s']:.3f}"
    title = (
        f"exact-mode rollout on {info['device']}: {shape_name} shape x {args.layers} layers, batch {args.batch}, "
        f"{args.prompt_len} -> {args.gen_len} tokens, {args.steps} timed rounds (variants alternating)"
        + (", paged KV pool (continuous batching)" if args.continuous_batching else "")
    )
    headers = ["variant", "median s", "min-max s", "mode / fast"]
    keys = ["variant", "median_s", "min_max_s", "exact_over_fast"]
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
