"""Where a long-context decode step's wall time goes: GPU busy vs idle over a profiled generate (graphs on).

The probe as run on 2026-11-30 (reformatted for the linter afterwards); benchmarks/bench_rollout_syncs.py is its
form in the repository.
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import SHAPES, build_model
from benchmarks.rollout_engines import calibrate
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8

dev = torch.device("cuda")
shape = dict(SHAPES["qwen3-1.7b"])
B, P, G = 32, int(sys.argv[1]) if len(sys.argv) > 1 else 7680, 128
prompt_t = torch.randint(1, shape["vocab_size"], (B, P), generator=torch.Generator().manual_seed(0))
prompts = prompt_t.tolist()
for preset in ("jetrl_kv", "bf16"):
    recipe = PrecisionRecipe.preset(preset)
    model = build_model(shape, 0 or shape["num_hidden_layers"], dev, torch.bfloat16)
    if preset != "bf16":
        convert_to_fp8(model, recipe)
    eng = NativeGenerationEngine(
        model,
        max_new_tokens=G,
        stop_token_ids=[],
        pad_token_id=0,
        kv_cache_dtype=recipe.kv_cache_dtype,
        cuda_graphs=True,
    )
    if recipe.kv_fp8:
        eng.update_weights(kv_scales=calibrate(model, prompt_t[:8].to(dev)))

    def run(eng=eng):
        return eng.generate(prompts, generator=torch.Generator(device=dev).manual_seed(2))

    run()
    torch.cuda.synchronize()
    t = time.perf_counter()
    run()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    print(f"{preset}: generate {wall:.3f} s, timings {eng.rollout_timings()}", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    iv = sorted((e.time_range.start, e.time_range.end) for e in ev)
    busy, cur_s, cur_e, gaps = 0.0, None, None, []
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append((s - cur_e, cur_e))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = iv[-1][1] - iv[0][0]
    gaps.sort(reverse=True)
    print(
        f"{preset}: device span {span / 1e3:.1f} ms, busy {busy / 1e3:.1f} ms ({busy / span:.1%}), gaps >= 20us: "
        f"{sum(g for g, _ in gaps if g >= 20) / 1e3:.1f} ms in {sum(1 for g, _ in gaps if g >= 20)}; largest {[round(g) for g, _ in gaps[:8]]} us",
        flush=True,
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), flush=True)
    kt = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12)
    print(kt, flush=True)
    del eng, model, prof
    torch.cuda.empty_cache()
