"""Kernel-time breakdown of one training step, BF16 vs FP8 (torch.profiler), for finding FP8-only costs.

    python3 -m benchmarks.profile_train_step --layers 8 --out prof.json
    python3 -m benchmarks.profile_train_step --layers 4 8 --variants bf16,jetrl,tensorwise  # split

Builds one policy at a time (the same random weights), takes `--warmup` steps, then profiles one step
(`NativePolicy.train` + `prepare_refit`, as bench_train_step.py) and prints the top kernels by device time and a
breakdown by kernel family. Writes the per-kernel table of both variants to `--out` (JSON). With two depths
(`--layers a b`), also each family's time per layer and per step, the step at the shape's full depth and the FP8
step's ceiling (`step_split.py`).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks import step_split, trace_gaps
from benchmarks.bench_train_step import make_batch, train_step_fn
from benchmarks.common import build_model, policy_config
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.utils.phase_profile import family_totals, host_rows, kernel_rows, write_trace_gz


def recipe_from_spec(spec: str) -> PrecisionRecipe:
    """A variant of `--variants`: a preset name, optionally with recipe fields after a colon, joined by '+'
    ('jetrl:wgrad_x_blocks=128x128+cache_dgrad_weight=true'); 'true' / 'false' are booleans."""
    name, _, fields = spec.partition(":")
    overrides = {}
    for item in filter(None, fields.split("+")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {spec!r}: recipe fields are key=value, got {item!r}")
        overrides[key] = {"true": True, "false": False}.get(value.lower(), value)
    return PrecisionRecipe.preset(name, **overrides)


def profile_variant(preset: str, layers: int, args, device) -> tuple[list[dict], float]:
    """(the step's CUDA kernels by device time, the wall time of the same step unprofiled in s)."""
    shape = SHAPES[args.shape]
    model = build_model(shape, layers, device, torch.bfloat16).train()
    config = policy_config(train_causal_attention=args.causal_attention, train_cuda_graphs=args.cuda_graphs)
    policy = NativePolicy(config, recipe_from_spec(preset), device, model=model)
    step = train_step_fn(policy, make_batch(args.batch, args.seq_len, shape["vocab_size"]))
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    if args.cprofile:  # the Python functions of one step by their own time (cProfile inflates, ranks hold)
        import cProfile
        import pstats

        py = cProfile.Profile()
        py.runcall(step)
        torch.cuda.synchronize()
        print(f"\n--- {preset}: Python functions by own time (cProfile, one step) ---")
        pstats.Stats(py).sort_stats("tottime").print_stats(args.cprofile)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.profile_steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    rows = kernel_rows(events, divide=args.profile_steps)  # per step: the profiled steps' totals / their number
    if args.trace:  # the step's timeline, and the device's idle gaps charged to the host ops that ran in them
        gz = write_trace_gz(prof, Path(args.trace) / f"trace_{args.shape}_l{layers}_{preset}.json")
        print(f"\n--- {preset}: device idle gaps (trace {gz}) ---")
        trace_gaps.report(str(gz), top=args.top)
    if args.cpu_top:  # the host side: where the Python of the step spends its time (self CPU time per op)
        print(f"\n--- {preset}: top host ops by self CPU time ---")
        for r in host_rows(events, args.cpu_top):
            print(f"  {r['ms']:8.2f} ms {r['calls']:6d}x  {r['name'][:100]}")
    del policy, model, step
    gc.collect()
    torch.cuda.empty_cache()
    return rows, wall_s


def summarize(name: str, rows: list[dict], wall_s: float, top: int) -> None:
    """Kernel families and the top kernels; kernel time well below the wall time means the host is the bound."""
    total = sum(r["ms"] for r in rows)
    print(f"\n=== {name}: {total:.1f} ms of kernels in a {wall_s * 1e3:.1f} ms step (unprofiled) ===")
    for f, ms in sorted(family_totals(rows).items(), key=lambda kv: -kv[1]):
        print(f"  {f:<16} {ms:8.1f} ms")
    for r in rows[:top]:
        print(f"  {r['ms']:8.2f} ms {r['calls']:5g}x  {r['name'][:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="model shape (random weights)")
    p.add_argument("--layers", type=int, nargs="+", default=[8], help="one depth, or two: the per-layer split")
    p.add_argument("--full-layers", type=int, default=None, help="depth of the split's projection (the shape's)")
    p.add_argument("--causal-attention", action="store_true", help="policy.train_causal_attention: true")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=1, help="steps profiled; kernel times are per step")
    p.add_argument("--cuda-graphs", action="store_true", help="policy.train_cuda_graphs: true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--cpu-top", type=int, default=0, help="also print the N host ops with the most self CPU time")
    p.add_argument("--cprofile", type=int, default=0, help="also print the N Python functions with the most own time")
    p.add_argument("--variants", default="bf16,jetrl", help="presets, optionally 'PRESET:field=value+...'")
    p.add_argument("--trace", default=None, help="folder: write each variant's chrome trace (gz), print idle gaps")
    p.add_argument("--out", default=None)
    p.add_argument("--plot", default=None, help="PNG of the per-layer split (two depths)")
    args = p.parse_args(argv)
    if len(args.layers) > 2:
        p.error("--layers: one depth, or two for the per-layer split")
    device = torch.device("cuda")
    shape = SHAPES[args.shape]
    record: dict = {"args": vars(args), "device": torch.cuda.get_device_name(device), "depths": {}}
    profiles = {}
    for layers in args.layers:
        result = {v: profile_variant(v, layers, args, device) for v in args.variants.split(",")}
        print(f"{record['device']}: {args.shape} x {layers} layers, {args.batch} x {args.seq_len} tokens")
        for v, (rows, wall_s) in result.items():
            summarize(v, rows, wall_s, args.top)
        profiles[layers] = {v: family_totals(rows) for v, (rows, _) in result.items()}
        record["depths"][layers] = {
            "wall_s": {v: wall_s for v, (_, wall_s) in result.items()},
            "kernels": {v: rows for v, (rows, _) in result.items()},
        }
    if len(args.layers) == 2:
        text, record["split"] = step_split.report(profiles, args.full_layers or shape["num_hidden_layers"])
        print(f"\n=== {record['device']}: kernel time per layer and per step ===\n{text}")
        if args.plot:
            step_split.plot(record["split"], args.plot, device=record["device"])
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
