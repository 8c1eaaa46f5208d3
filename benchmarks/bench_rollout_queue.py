"""Rollout of a queue of sequences with long-tailed response lengths: continuous batching vs one static batch at a
time, BF16 vs FP8 vs FP8 + FP8 KV, one run, side by side (the bench_rollout.py model and engines).

    python3 -m benchmarks.bench_rollout_queue --layers 8 --out queue.json     # GPU: Qwen3-8B shape
    python3 -m benchmarks.bench_rollout_queue --quick                          # CPU smoke test

Each sequence gets a response length drawn from `--length-dist` (fixed: all `--mean-len`; lognormal with sigma
`--sigma`, or geometric, both with mean `--mean-len`, capped at `--max-len`); the engine is forced to stop there
(no stop tokens, a per-sequence cap). Useful output tokens/s = generated tokens / wall time. Cases:
- `cb fixed`: continuous batching at `--concurrency` on fixed lengths (the reference figure);
- `cb <dist>`: continuous batching at `--concurrency` on the drawn lengths;
- `static <dist>`: the queue cut into batches of `--concurrency`, each decoded until its longest row (no refill);
- `budget <dist>` (with `--kv-budget-gb`): continuous batching under a KV byte budget instead of a sequence cap
  (rows up to `--concurrency * 2`), so an FP8 pool admits about twice the sequences of a BF16 one (`peak live`);
  when the pool runs dry sequences are preempted and recomputed (`preempt`).
The KV cache of the continuous cases is paged (`--block-size` tokens per block): `blocks` is the peak number of
blocks in use, `buckets` the CUDA-graph batch sizes the decode ran at. `decode s` / `admit s`: the rollout's device
time in decode steps and in admissions (prefills; graph captures excluded from both), medians over the timed runs;
`decode TB/s` and `% HBM`: the decode's bytes (every linear weight once per step, in the variant's dtype, plus the
keys the running rows read) over its time, against the device's HBM peak. `--generations G`: each prompt appears G
times in a row (a GRPO group), and `shared` counts the prompt tokens group members took from their owner's blocks
instead of prefilling them. `FCFS steps` (continuous cases): the fewest decode steps any first-come-first-served
schedule takes on the case's lengths at this concurrency and the engine's sync interval (`schedule_bound.py`);
`steps` equal to it means the engine's own schedule wastes nothing, and occupancy then bounds `vs fixed`.
Every case's rollouts run `--warmup` + `--repeats` times in rounds of alternating variant order; median and min-max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import (
    QWEN3_8B,
    TINY,
    add_deep_gemm_flag,
    alternating_timings,
    build_model,
    check_deep_gemm,
    device_info,
    draw_lengths,
    linear_weight_bytes,
    report,
)
from benchmarks.rollout_engines import VARIANTS, build_engines, wrap_variant  # noqa: F401
from benchmarks.schedule_bound import fcfs_decode_steps
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.generation.native.kv_cache import KVCache


def build_queue_engines(args, device) -> tuple[dict, torch.nn.Module]:
    """The benchmark's engines (`rollout_engines.build_engines`) with a paged KV cache of `--block-size` tokens."""
    shape = TINY if args.quick else QWEN3_8B
    bf16_model = build_model(shape, args.layers, device, torch.bfloat16)
    calib = torch.randint(1, shape["vocab_size"], (4, args.prompt_len), generator=torch.Generator().manual_seed(1))
    engines = build_engines(
        bf16_model, calib, deep_gemm=args.deep_gemm, torch_sampler=args.torch_sampler, max_new_tokens=args.max_len,
        stop_token_ids=[], pad_token_id=0, cuda_graphs=True, kv_block_size=args.block_size,
    )  # fmt: skip
    return engines, bf16_model


def rollout_fn(engine: NativeGenerationEngine, prompts, lengths, mode: str, args, record: dict):
    """One timed rollout of the whole queue in `mode` (cb / static / budget); fills `record` with its stats."""
    gen = torch.Generator(device=engine.device)

    def run():
        gen.manual_seed(0)
        if mode == "static":  # the queue in batches of `concurrency`, each decoded to its longest row
            tokens = 0
            for i in range(0, len(prompts), args.concurrency):
                out = engine.generate(
                    prompts[i : i + args.concurrency], generator=gen, max_new_tokens=lengths[i : i + args.concurrency]
                )
                tokens += int(out.response_lengths.sum())
            record.update(tokens=tokens, slots=args.concurrency)
            return
        out = engine.generate(prompts, generator=gen, max_new_tokens=lengths)
        stats = engine.last_rollout_stats
        record.update(tokens=int(out.response_lengths.sum()), slots=stats.num_rows, peak_live=stats.peak_live)
        record.update(occupancy=stats.occupancy, decode_steps=stats.decode_steps, kv_gb=stats.kv_cache_bytes / 1e9)
        record.update(blocks=stats.peak_blocks_used, pool=stats.num_blocks, preempt=stats.preemptions)
        record.update(buckets=len(stats.bucket_steps))
        record.update(key_reads=stats.key_reads, prefill_shared=stats.prefill_tokens_shared)
        parts = stats.timings()  # per run; the table takes the median
        for key, part in (("decode_s", "decode"), ("admission_s", "admission"), ("capture_s", "cuda_graph_capture")):
            record.setdefault(key + "_runs", []).append(parts[part])

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: all 36 of Qwen3-8B)")
    p.add_argument("--queue", type=int, default=512, help="sequences in the queue")
    p.add_argument("--concurrency", type=int, default=128, help="sequences decoded at once (max_num_seqs)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--generations", type=int, default=1, help="consecutive copies of each prompt (a GRPO group)")
    p.add_argument("--length-dist", default="lognormal", choices=["fixed", "lognormal", "geometric"])
    p.add_argument("--mean-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    p.add_argument("--kv-budget-gb", type=float, default=None, help="also run under this KV byte budget")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (tokens) of the paged cache")
    p.add_argument("--skip-static", action="store_true", help="leave out the static-batches case (device time)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    add_deep_gemm_flag(p, "fp8+kv+deep_gemm")
    p.add_argument("--torch-sampler", action="store_true", help="also 'fp8+kv torch sampler' (the unfused sampler)")
    p.add_argument("--fixed-only", action="store_true", help="only the fixed-length case (device time)")
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.queue, args.concurrency, args.prompt_len = args.layers or 2, 12, 4, 8
        args.mean_len, args.max_len, args.warmup, args.repeats = 6, 16, 0, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = device_info(device)
    check_deep_gemm(p, args, device)
    engines, model = build_queue_engines(args, device)
    gen = torch.Generator().manual_seed(0)
    if args.generations < 1 or args.queue % args.generations:
        p.error(f"--generations must divide --queue ({args.queue}), got {args.generations}")
    unique = torch.randint(1, model.config.vocab_size, (args.queue // args.generations, args.prompt_len), generator=gen)
    prompts = unique.repeat_interleave(args.generations, dim=0).tolist()  # [queue, prompt_len]
    dist = args.length_dist
    drawn = draw_lengths(dist, args.queue, args.mean_len, args.max_len, args.sigma, seed=2)
    cases = [("cb", "fixed", [args.mean_len] * args.queue)] + ([] if args.fixed_only else [("cb", dist, drawn)])
    if not args.skip_static:
        cases.append(("static", dist, drawn))
    if args.kv_budget_gb:
        cases.append(("budget", dist, drawn))
    results = []
    for mode, dist_name, lengths in cases:
        records, fns = {}, {}
        for name, base in engines.items():
            if mode == "static":
                engine = base  # one static batch per call
            elif mode == "budget":
                engine = base.replace(
                    kv_cache_memory_bytes=int(args.kv_budget_gb * 1e9), max_num_seqs=2 * args.concurrency,
                    continuous_batching=True,
                )  # fmt: skip
            else:
                engine = base.replace(max_num_seqs=args.concurrency, continuous_batching=True)
            records[name] = {}
            if mode == "cb":  # the fewest decode steps any first-come-first-served schedule takes (not timed)
                records[name]["fcfs_steps"] = fcfs_decode_steps(lengths, args.concurrency, engine.sync_every)
            fns[name] = wrap_variant(name, rollout_fn(engine, prompts, lengths, mode, args, records[name]), engine)
        timings = alternating_timings(fns, args.warmup, args.repeats, device)
        for name in engines:
            t, rec = timings[name], records[name]
            results.append(
                {
                    "case": f"{mode} {dist_name}",
                    "variant": name,
                    "tokens_per_s": rec["tokens"] / t["median_s"],
                    "range": f"{rec['tokens'] / t['max_s']:,.0f}-{rec['tokens'] / t['min_s']:,.0f}",
                    "median_s": t["median_s"],
                    **rec,
                }
            )
            r = results[-1]
            extra = {k: r[k] for k in ("slots", "peak_live", "blocks", "preempt") if k in r}
            print(f"  {mode} {dist_name} {name}: {r['tokens_per_s']:,.0f} tok/s ({r['range']}) {extra}", flush=True)
        if args.out:  # what a run cut short by a time limit still leaves
            Path(args.out + ".partial").write_text(json.dumps({"device": info["device"], "results": results}))
    kv_bytes = {
        name: KVCache.for_model(model, 1, 1, dtype=torch.float8_e4m3fn if name.startswith("fp8+kv") else torch.bfloat16,
                                device="meta").bytes_per_token
        for name in engines
    }  # fmt: skip
    for r in results:  # decode bandwidth: weights once per step + the keys the running rows read, over decode time
        if "decode_s_runs" not in r:
            continue  # static batches: one-batch engine, no rollout stats
        r["decode_s"] = statistics.median(r["decode_s_runs"])
        r["admission_s"] = statistics.median(r["admission_s_runs"])
        step_bytes = linear_weight_bytes(model, r["variant"] != "bf16") * r["decode_steps"]
        r["decode_tbs"] = (step_bytes + r["key_reads"] * kv_bytes[r["variant"]]) / r["decode_s"] / 1e12
        r["hbm_pct"] = 100 * r["decode_tbs"] / info["hbm_peak_tbs"] if info["hbm_peak_tbs"] else None
    for r in results:  # ratios: vs BF16 in the same case, vs the same variant's fixed-length figure
        same_case = {x["variant"]: x for x in results if x["case"] == r["case"]}
        fixed = next(x for x in results if x["case"] == "cb fixed" and x["variant"] == r["variant"])
        r["x_bf16"] = r["tokens_per_s"] / same_case["bf16"]["tokens_per_s"]
        r["vs_fixed"] = r["tokens_per_s"] / fixed["tokens_per_s"]
    lengths_said = (
        f"fixed lengths {args.mean_len}" if args.fixed_only
        else f"{dist} lengths mean {sum(drawn) / len(drawn):.0f} (max {max(drawn)})"
    )  # fmt: skip
    title = (
        f"rollout queue on {info['device']}: {'tiny' if args.quick else 'Qwen3-8B'} shape x "
        f"{model.config.num_hidden_layers} layers, {args.queue} sequences, prompt {args.prompt_len}, {lengths_said}, "
        f"concurrency {args.concurrency}"
    )
    headers = [
        "case",
        "variant",
        "useful tok/s",
        "min-max",
        "x bf16",
        "vs fixed",
        "rows",
        "peak live",
        "blocks",
        "preempt",
        "buckets",
        "occupancy",
        "steps",
        "FCFS steps",
        "KV GB",
        "shared",
        "decode s",
        "admit s",
        "decode TB/s",
        "% HBM",
    ]
    keys = [
        "case",
        "variant",
        "tokens_per_s",
        "range",
        "x_bf16",
        "vs_fixed",
        "slots",
        "peak_live",
        "blocks",
        "preempt",
        "buckets",
        "occupancy",
        "decode_steps",
        "fcfs_steps",
        "kv_gb",
        "prefill_shared",
        "decode_s",
        "admission_s",
        "decode_tbs",
        "hbm_pct",
    ]
    report(title, headers, keys, results, args=args, info=info, shape={}, n_layers=model.config.num_hidden_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
