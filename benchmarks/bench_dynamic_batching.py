"""Trainer passes over long-tailed responses: fixed micro-batches vs dynamic batching (`policy.dynamic_batching`).

    PYTHONPATH=. python3 benchmarks/bench_dynamic_batching.py --layers 8 --out dyn.json     # GPU: Qwen3-8B shape
    PYTHONPATH=. python3 benchmarks/bench_dynamic_batching.py --quick                       # CPU smoke test

A GRPO-shaped batch: `--batch` sequences of a `--prompt-len` prompt (left-padded layout) and a response whose length
is drawn from `--length-dist` (mean `--mean-len`, capped at `--max-len`, the rollout queue benchmark's draw), so the
batch is `--prompt-len + --max-len` wide. One step = the logprob pass (prev_logprobs) + one optimizer step + the FP8
re-quantization. Variants on ONE resident policy (`--preset`), its config switched between steps, alternating
(fixed, dynamic, then dynamic, fixed, ...): `fixed` cuts `--micro-batch` rows at the full width, `dynamic` cuts
length-sorted micro-batches of at most `--micro-batch x width` tokens, each trimmed to its rows' columns. Reports
real-token throughput, the share of computed columns that hold a real token, and how many micro-batches ran.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    LOSS,
    QWEN3_8B,
    TINY,
    alternating_timings,
    build_model,
    device_info,
    draw_lengths,
    policy_config,
    report,
)

from nemo_jetrl.policy.interfaces import TrainBatch  # noqa: E402
from nemo_jetrl.policy.micro_batches import plan_micro_batches  # noqa: E402
from nemo_jetrl.policy.native import NativePolicy  # noqa: E402
from nemo_jetrl.precision import PrecisionRecipe  # noqa: E402


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


def step_fn(policy: NativePolicy, batch: TrainBatch, dynamic: bool):
    def step():
        policy.cfg["dynamic_batching"]["enabled"] = dynamic
        batch.prev_logprobs = policy.get_logprobs(batch)
        policy.train(batch, LOSS)
        return policy.prepare_refit()

    return step


def occupancy(policy_cfg: dict, batch: TrainBatch, dynamic: bool) -> tuple[float, int]:
    """(real tokens / computed positions, micro-batches) of the training pass."""
    cfg = {**policy_cfg, "dynamic_batching": {**policy_cfg["dynamic_batching"], "enabled": dynamic}}
    parts = plan_micro_batches(batch.attention_mask, cfg, "train")
    computed = sum(len(p) * (p.cols.stop - p.cols.start) for p in parts)
    return float(batch.attention_mask.sum()) / computed, len(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--preset", default="jetrl", help="precision recipe preset (jetrl = unified FP8, bf16)")
    p.add_argument("--batch", type=int, default=64, help="sequences per step (one optimizer step)")
    p.add_argument("--micro-batch", type=int, default=4, help="rows per fixed micro-batch (and the token budget)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--length-dist", default="lognormal", choices=["fixed", "lognormal", "geometric"])
    p.add_argument("--mean-len", type=int, default=800)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--round", type=int, default=64, help="policy.dynamic_batching.sequence_length_round")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = QWEN3_8B, "Qwen3-8B"
    if args.quick:
        shape, shape_name = TINY, "tiny"
        args.layers, args.batch, args.micro_batch, args.prompt_len, args.mean_len, args.max_len = None, 16, 4, 8, 12, 48
        args.round, args.warmup, args.steps = 8, 1, 2
    lengths = draw_lengths(args.length_dist, args.batch, args.mean_len, args.max_len, args.sigma, seed=2)
    batch = long_tailed_batch(lengths, args.prompt_len, args.max_len, shape["vocab_size"])
    width = batch.input_ids.shape[1]
    cfg = policy_config(train_micro_batch_size=args.micro_batch, logprob_batch_size=args.micro_batch,
                        max_total_sequence_length=width, dynamic_batching={"sequence_length_round": args.round})  # fmt: skip
    model = build_model(shape, args.layers, device, torch.bfloat16).train()
    policy = NativePolicy(cfg, PrecisionRecipe.preset(args.preset), device, model=model)
    steps = {"fixed": step_fn(policy, batch, False), "dynamic": step_fn(policy, batch, True)}
    info = device_info(device)
    timings = alternating_timings(steps, args.warmup, args.steps, device)
    real_tokens = int(batch.attention_mask.sum())
    results = []
    for name, t in timings.items():
        occ, n_micro = occupancy(cfg, batch, name == "dynamic")
        r = {"variant": name, **t, "real_tokens_per_s": real_tokens / t["median_s"], "occupancy": occ}
        r.update(micro_batches=n_micro, min_max_s=f"{t['min_s']:.3f}-{t['max_s']:.3f}")
        results.append(r)
    for r in results:
        r["speedup_vs_fixed"] = results[0]["median_s"] / r["median_s"]
    n_layers = model.config.num_hidden_layers
    title = (
        f"trainer passes (logprob + train + requant) on {info['device']}: {shape_name} x {n_layers} layers, "
        f"{args.preset}, {args.batch} x ({args.prompt_len} + {args.length_dist} responses, mean "
        f"{sum(lengths) / len(lengths):.0f}, max {max(lengths)}); {args.steps} timed steps after {args.warmup} "
        "warm-up, variants alternating"
    )
    keys = ["variant", "real_tokens_per_s", "speedup_vs_fixed", "median_s", "min_max_s", "occupancy",
            "micro_batches", "step_peak_gb"]  # fmt: skip
    headers = ["variant", "real tok/s", "x fixed", "median s", "min-max s", "real/computed", "micro-batches",
               "step peak GB"]  # fmt: skip
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers, lengths=lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
