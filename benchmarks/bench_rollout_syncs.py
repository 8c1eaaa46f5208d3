"""Does the rollout loop keep the GPU fed? Host syncs per decode step and the device's idle time in a graphed
rollout, per precision preset (GPU only).

    python3 -m benchmarks.bench_rollout_syncs --shape qwen3-1.7b --batch 32 --prompt-len 7680 --gen-len 128
    python3 -m benchmarks.bench_rollout_syncs --quick      # CPU smoke test (tiny shapes; no CUDA calls to count)

Per preset (default `jetrl_kv` and `bf16`): random weights of the shape, the native engine as GRPO runs it (CUDA
graphs, device sampling, fixed lengths); one warm-up `generate`, one timed (its decode seconds per step), one
under the profiler, whose chrome trace `trace_gaps` reads: synchronizing runtime calls per decode step (the loop
checks for finished rows once per `sync_every` steps by design: anything more stalls the device until the host has
launched the next step) and the device's idle time, charged to the host ops that ran in it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import trace_gaps
from benchmarks.common import SHAPES, TINY, build_model, device_info, report
from benchmarks.rollout_engines import calibrate
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=0, help="decoder layers of the shape (0: all)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=7680)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--presets", nargs="*", default=["jetrl_kv", "bf16"])
    p.add_argument("--quick", action="store_true", help="tiny shapes on this machine's device (CPU smoke test)")
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    shape = dict(SHAPES[args.shape])
    if args.quick:
        shape, args.layers, args.batch, args.prompt_len, args.gen_len = TINY, 2, 4, 8, 4
    elif not torch.cuda.is_available():
        print(f"{p.prog}: needs a CUDA GPU (or --quick)", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = device_info(dev)
    layers = args.layers or shape["num_hidden_layers"]
    prompt_t = torch.randint(1, shape["vocab_size"], (args.batch, args.prompt_len), generator=torch.Generator())
    prompts = prompt_t.tolist()
    results = []
    for preset in args.presets:
        recipe = PrecisionRecipe.preset(preset)
        model = build_model(shape, layers, dev, torch.bfloat16)
        if recipe.linear_fp8:
            convert_to_fp8(model, recipe)
        engine = NativeGenerationEngine(
            model, max_new_tokens=args.gen_len, stop_token_ids=[], pad_token_id=0,
            kv_cache_dtype=recipe.kv_cache_dtype, cuda_graphs=dev.type == "cuda",
        )  # fmt: skip
        if recipe.kv_fp8:
            engine.update_weights(kv_scales=calibrate(model, prompt_t[:8].to(dev)))

        def rollout(e=engine):
            e.generate(prompts, generator=torch.Generator(device=dev).manual_seed(2))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        rollout()
        rollout()
        decode_s = engine.rollout_timings()["decode"]
        with tempfile.TemporaryDirectory() as tmp:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if dev.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as prof:
                rollout()
            trace = str(Path(tmp) / "rollout.json")
            prof.export_chrome_trace(trace)
            gaps = trace_gaps.report(trace, top=8)
        steps = args.gen_len - 1  # the first token comes from the prefill
        results.append({
            "preset": preset, "decode_ms_per_step": 1e3 * decode_s / steps,
            "syncs_per_step": gaps["sync_calls"] / steps, "busy_ms": gaps["busy_ms"],
            "idle_ms": gaps["idle_ms"], "idle_after_sync_ms": gaps["after_sync_ms"], "top_idle_ops_ms": gaps["top_ops_ms"],
        })  # fmt: skip
        print(results[-1], flush=True)
        del engine, model, prof, rollout
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    title = (
        f"rollout syncs on {info['device']}: {'tiny' if args.quick else args.shape} x {layers} layers, batch {args.batch}, "
        f"{args.prompt_len} -> {args.gen_len} tokens (decode unprofiled; syncs and idle time from the profiled run)"
    )
    headers = ["preset", "decode ms/step", "syncs/step", "device busy ms", "idle ms", "idle after a sync ms"]
    keys = ["preset", "decode_ms_per_step", "syncs_per_step", "busy_ms", "idle_ms", "idle_after_sync_ms"]
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
