"""Trainer passes over long-tailed responses: fixed micro-batches vs dynamic batching (`policy.dynamic_batching`) vs
sequence packing (`policy.sequence_packing`), per precision preset.

    python3 -m benchmarks.bench_dynamic_batching --layers 8 --out dyn.json     # GPU: Qwen3-8B shape
    python3 -m benchmarks.bench_dynamic_batching --quick                       # CPU smoke test

A GRPO-shaped batch: `--batch` sequences of a `--prompt-len` prompt (left-padded layout) and a response whose length
is drawn from `--length-dist` (mean `--mean-len`, capped at `--max-len`, the rollout queue benchmark's draw), so the
batch is `--prompt-len + --max-len` wide. One step = the logprob pass (prev_logprobs) + one optimizer step + the FP8
re-quantization. Per preset (`--presets`, one after the other in this process), the variants run on ONE resident
policy, its config switched between steps, alternating (fixed, dynamic, packed, then packed, dynamic, fixed, ...):
`fixed` cuts `--micro-batch` rows at the full width, `dynamic` cuts length-sorted micro-batches of at most
`--micro-batch x width` tokens, each trimmed to its rows' columns, `packed` bins sequences of at most as many real
tokens into one packed row each (varlen attention). Reports real-token throughput, the share of computed positions
that hold a real token, how many micro-batches ran and the step's peak memory. `--variants` picks among fixed,
dynamic, packed and packed+graphs (`policy.train_cuda_graphs` with packing: each bin replayed in one of a few fixed
layouts, its packed row padded to a multiple of 1/8 of the budget; on a second resident policy of the same weights).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.common import (
    LOSS,
    SHAPES,
    TINY,
    alternating_timings,
    build_model,
    device_info,
    draw_lengths,
    policy_config,
    report,
)
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.micro_batches import plan_micro_batches, token_budget
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.policy.sequence_packing import captured_row_slots
from nemo_jetrl.policy.trainer_setup import trainer_kernels
from nemo_jetrl.precision import PrecisionRecipe


def long_tailed_batch(lengths: list[int], prompt_len: int, max_len: int, vocab: int) -> TrainBatch:
    """[B, prompt_len + max_len]: full prompts, response i of lengths[i] tokens, right padding after it."""
    gen = torch.Generator().manual_seed(0)
    b, width = len(lengths), prompt_len + max_len
    ids = torch.randint(1, vocab, (b, width), generator=gen)
    cols = torch.arange(width)[None, :]
    ends = prompt_len + torch.tensor(lengths)[:, None]  # [B, 1]
    attention = (cols < ends).long()
    response = attention * (cols >= prompt_len).long()
    logp = -12.0 * response.float()  # ~ random-weight logprobs: ratios stay finite
    return TrainBatch(ids, attention, response, torch.randn(b, generator=gen), logp)


VARIANTS = ("fixed", "dynamic", "packed", "packed+graphs")


def switch(policy_cfg: PolicyConfig, variant: str) -> PolicyConfig:
    """`policy_cfg` with dynamic batching / sequence packing switched on for `variant` (both off for fixed)."""
    dyn = policy_cfg.dynamic_batching.model_copy(update={"enabled": variant == "dynamic"})
    pack = policy_cfg.sequence_packing.model_copy(update={"enabled": variant.startswith("packed")})
    return policy_cfg.model_copy(update={"dynamic_batching": dyn, "sequence_packing": pack})


def step_fn(policy: NativePolicy, batch: TrainBatch, variant: str):
    cfg = switch(policy.cfg, variant)

    def step():
        policy.cfg, policy.kernels = cfg, trainer_kernels(cfg)
        batch.prev_logprobs = policy.get_logprobs(batch)
        policy.train(batch, LOSS)
        return policy.prepare_refit()

    return step


def occupancy(policy_cfg: PolicyConfig, batch: TrainBatch, variant: str) -> tuple[float, int]:
    """(real tokens / computed positions, micro-batches) of the training pass."""
    cfg = switch(policy_cfg, variant)
    parts = plan_micro_batches(batch.attention_mask, cfg, "train")
    round_to = cfg.sequence_packing.sequence_length_round
    if variant == "packed+graphs":  # bins padded to eighths of the budget
        budget = token_budget(cfg, "train")
        computed = sum(captured_row_slots(int(batch.attention_mask[p.rows].sum()), budget, round_to) for p in parts)
    elif variant == "packed":
        computed = sum(-(-int(batch.attention_mask[p.rows].sum()) // round_to) * round_to for p in parts)
    else:
        computed = sum(len(p) * (p.cols.stop - p.cols.start) for p in parts)
    return float(batch.attention_mask.sum()) / computed, len(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="model shape (random weights)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--presets", default="jetrl,bf16", help="precision recipe presets, comma-separated")
    p.add_argument("--variants", default="fixed,dynamic,packed", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--batch", type=int, default=64, help="sequences per step (one optimizer step)")
    p.add_argument("--micro-batch", type=int, default=4, help="rows per fixed micro-batch (and the token budget)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--length-dist", default="lognormal", choices=["fixed", "lognormal", "geometric"])
    p.add_argument("--mean-len", type=int, default=800)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--round", type=int, default=64, help="sequence_length_round (dynamic batching and packing)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if "packed+graphs" in variants and not torch.cuda.is_available():
        p.error("--variants packed+graphs needs a CUDA device (policy.train_cuda_graphs)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = SHAPES[args.shape], args.shape
    if args.quick:
        shape, shape_name = TINY, "tiny"
        args.layers, args.batch, args.micro_batch, args.prompt_len, args.mean_len, args.max_len = None, 16, 4, 8, 12, 48
        args.round, args.warmup, args.steps, args.presets = 8, 1, 2, "bf16"
    lengths = draw_lengths(args.length_dist, args.batch, args.mean_len, args.max_len, args.sigma, seed=2)
    batch = long_tailed_batch(lengths, args.prompt_len, args.max_len, shape["vocab_size"])
    width = batch.input_ids.shape[1]
    cfg = policy_config(train_micro_batch_size=args.micro_batch, logprob_batch_size=args.micro_batch,
                        max_total_sequence_length=width, dynamic_batching={"sequence_length_round": args.round},
                        sequence_packing={"sequence_length_round": args.round})  # fmt: skip
    info = device_info(device)
    real_tokens = int(batch.attention_mask.sum())
    results = []
    for preset in args.presets.split(","):
        policies = {}  # captured or not: one resident policy each, on the same weights
        for graphs in sorted({v.endswith("+graphs") for v in variants}):
            model = build_model(shape, args.layers, device, torch.bfloat16).train()
            recipe = PrecisionRecipe.preset(preset)
            graphs_cfg = cfg.model_copy(update={"train_cuda_graphs": graphs})
            policies[graphs] = NativePolicy(graphs_cfg, recipe, device, model=model)
        steps = {v: step_fn(policies[v.endswith("+graphs")], batch, v) for v in variants}
        timings = alternating_timings(steps, args.warmup, args.steps, device)
        for name, t in timings.items():
            occ, n_micro = occupancy(cfg, batch, name)
            r = {"preset": preset, "variant": name, **t, "real_tokens_per_s": real_tokens / t["median_s"]}
            r.update(occupancy=occ, micro_batches=n_micro, min_max_s=f"{t['min_s']:.3f}-{t['max_s']:.3f}")
            r["speedup_vs_first"] = timings[variants[0]]["median_s"] / t["median_s"]
            results.append(r)
        n_layers = model.config.num_hidden_layers
        del policies, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    title = (
        f"trainer passes (logprob + train + requant) on {info['device']}: {shape_name} x {n_layers} layers, "
        f"{args.batch} x ({args.prompt_len} + {args.length_dist} responses, mean "
        f"{sum(lengths) / len(lengths):.0f}, max {max(lengths)}); {args.steps} timed steps after {args.warmup} "
        "warm-up, variants alternating within each preset"
    )
    keys = ["preset", "variant", "real_tokens_per_s", "speedup_vs_first", "median_s", "min_max_s", "occupancy",
            "micro_batches", "step_peak_gb"]  # fmt: skip
    headers = ["preset", "variant", "real tok/s", f"x {variants[0]}", "median s", "min-max s", "real/computed",
               "micro-batches", "step peak GB"]  # fmt: skip
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers, lengths=lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
