"""One full GRPO step, BF16 vs unified FP8 + FP8 KV (Jet-RL), with the phase breakdown.

    python3 -m benchmarks.bench_grpo_step --out grpo_step.json         # GPU: Qwen3-8B shape
    python3 -m benchmarks.bench_grpo_step --quick                      # CPU smoke test
    python3 -m benchmarks.bench_grpo_step --shape qwen3-1.7b --layers 0 --packing \
        --train-cuda-graphs --variants "fp8+kv" "fp8+kv matched"      # the matched kernels' cost

The phases of `algorithms/grpo.py`'s step with the project's own trainer and engine, on one device: rollout
(`NativeGenerationEngine.generate`, CUDA graphs, fixed lengths), trainer logprobs (`NativePolicy.get_logprobs`; in
FP8+KV it also observes Q/K/V for the next KV scales and fake-quantizes K/V like the rollout cache), train
(`NativePolicy.train`: fwd+bwd+AdamW over micro-batches), refit (`prepare_refit`: FP8 weights quantized once, new
KV scales computed and handed to the engine). Rewards are random (the reward function is not what is measured).
The variants (`--variants`; `train_forward` ones take prev_logprobs from the training forward, no logprob pass) stay
resident and their steps alternate; at 8 layers two of them fit on an 80 GB H100.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.common import (
    LOSS,
    TINY,
    alternating_timings,
    bootstrapped_engine,
    build_model,
    device_info,
    policy_config,
    report,
    timed,
)
from nemo_jetrl.generation.native.engine import NativeGenerationEngine
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe

PHASES = ("rollout", "logprobs", "train", "refit")


def grpo_step(policy: NativePolicy, engine: NativeGenerationEngine, prompts, seed: int, device) -> dict:
    """One step; returns phase times (s) and the step's mismatch (token_mult_prob_error)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out, t_rollout = timed(lambda: engine.generate(prompts, generator=gen), device)
    adv = torch.randn(len(out), generator=torch.Generator().manual_seed(seed))
    batch = TrainBatch(
        out.input_ids.cpu(), out.attention_mask.cpu(), out.response_mask.cpu(), adv, out.generation_logprobs.cpu()
    )
    if policy.cfg.prev_logprobs_source == "train_forward":  # the training forward yields prev_logprobs
        t_logprobs = 0.0
    else:
        batch.prev_logprobs, t_logprobs = timed(lambda: policy.get_logprobs(batch), device)
    _, t_train = timed(lambda: policy.train([batch], LOSS), device)

    def refit():
        metrics = policy.prepare_refit()
        if policy.kv_scales is not None:
            engine.update_weights(kv_scales=policy.kv_scales.kv)
        return metrics

    _, t_refit = timed(refit, device)
    mask = batch.response_mask.bool()
    d = (batch.prev_logprobs - batch.generation_logprobs)[mask]
    times = {"rollout": t_rollout, "logprobs": t_logprobs, "train": t_train, "refit": t_refit}
    return {
        **times,
        "total": sum(times.values()),
        "token_mult_prob_error": float(d.abs().exp().mean()),
        "exact_token_fraction": float((d == 0).float().mean()),
        "batch": batch,
    }


VARIANTS = {  # name -> (preset, prev_logprobs_source, generation overrides)
    "bf16": ("bf16", "logprob_forward", {}),
    "fp8+kv": ("jetrl_kv", "logprob_forward", {}),
    "bf16 train_forward": ("bf16", "train_forward", {}),
    "fp8+kv train_forward": ("jetrl_kv", "train_forward", {}),
    "fp8+kv matched": ("jetrl_kv", "logprob_forward", {"matched_kernels": True}),
    "fp8+kv exact": ("jetrl_kv", "logprob_forward", {"deterministic": True}),
}


def build_variant(name: str, model, prompts, args, device):
    """(policy, engine) of one variant, KV scales bootstrapped where the cache is FP8."""
    preset, source, generation = VARIANTS[name]
    recipe = PrecisionRecipe.preset(preset)
    tokens = args.micro_batch * (args.prompt_len + args.gen_len)  # a micro-batch's tokens, padded or packed
    cfg = policy_config(
        train_causal_attention=args.causal_attention,
        train_cuda_graphs=args.train_cuda_graphs,
        train_micro_batch_size=args.micro_batch,
        logprob_batch_size=args.micro_batch * 2,
        max_total_sequence_length=args.prompt_len + args.gen_len,
        prev_logprobs_source=source,
        sequence_packing={"enabled": args.packing, "train_mb_tokens": tokens, "logprob_mb_tokens": 2 * tokens},
        generation={"kv_cache_calibration_pass": "fused", **generation},
    )
    policy = NativePolicy(cfg, recipe, device, model=model)
    engine = bootstrapped_engine(policy, recipe, prompts, args.gen_len, args.micro_batch, cuda_graphs=True)
    return policy, engine


def run_alternating(names: list[str], shape: dict, prompts, args, device) -> list[dict]:
    """Every variant resident; GRPO steps alternate between them (A, B, then B, A, ...); per variant the median
    and min-max of the step and the median of each phase over the timed steps."""
    parts = {n: build_variant(n, build_model(shape, args.layers, device, torch.bfloat16).train(), prompts, args, device)
             for n in names}  # fmt: skip
    records: dict[str, list[dict]] = {n: [] for n in names}
    seeds = iter(range(10**6))

    def step_fn(name):
        return lambda: records[name].append(grpo_step(*parts[name], prompts, next(seeds), device))

    timings = alternating_timings({n: step_fn(n) for n in names}, args.warmup, args.steps, device)
    results = []
    for name in names:
        measured = records[name][args.warmup :]
        r = {"variant": name, **{k: v for k, v in timings[name].items() if k != "times_s"}}
        r["min_max_s"] = f"{r['min_s']:.2f}-{r['max_s']:.2f}"
        for key in (*PHASES, "total", "token_mult_prob_error", "exact_token_fraction"):
            r[key] = statistics.median(s[key] for s in measured)
        r["tokens_per_s"] = len(prompts) * args.gen_len / r["total"]
        results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=["qwen3-8b", "qwen3-1.7b"], help="random-weight model shape")
    p.add_argument("--layers", type=int, default=16, help="decoder layers of the shape (0: all of them)")
    p.add_argument("--prompts", type=int, default=64, help="sequences per step (prompts x generations)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=768)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant (>= 5 for quoted figures)")
    p.add_argument("--variants", nargs="+", default=["bf16", "fp8+kv"], choices=list(VARIANTS),
                   help="resident side by side; the first is the reference of the ratio column")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument(
        "--causal-attention", action="store_true", help="policy.train_causal_attention: true (faster, not bit-exact)"
    )
    p.add_argument(
        "--train-cuda-graphs", action="store_true", help="policy.train_cuda_graphs: true for every variant (CUDA)"
    )
    p.add_argument(
        "--packing", action="store_true", help="policy.sequence_packing for every variant (micro-batch token budgets)"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = dict(SHAPES[args.shape]), {"qwen3-8b": "Qwen3-8B", "qwen3-1.7b": "Qwen3-1.7B"}[args.shape]
    if args.quick:
        shape, shape_name, args.layers, args.prompts, args.prompt_len, args.gen_len = TINY, "tiny", 2, 8, 8, 8
        args.micro_batch, args.steps = 4, 2
    info = device_info(device)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, shape["vocab_size"], (args.prompts, args.prompt_len), generator=gen).tolist()
    results = run_alternating(args.variants, shape, prompts, args, device)
    for r in results:
        r["speedup_vs_first"] = results[0]["total"] / r["total"]
        for ph in PHASES:
            r[f"{ph}_speedup"] = results[0][ph] / r[ph] if r[ph] else None
    n_layers = args.layers or shape["num_hidden_layers"]
    title = (
        f"GRPO step on {info['device']} ({info.get('clocks')}): {shape_name} shape x {n_layers} layers, "
        f"{args.prompts} sequences, {args.prompt_len} -> {args.gen_len} tokens, micro-batch {args.micro_batch}; "
        f"{args.steps} timed steps after {args.warmup} warm-up, variants alternating"
        + (", trainer micro-batches in CUDA graphs" if args.train_cuda_graphs else "")
        + (", sequence packing" if args.packing else "")
    )
    headers = ["variant", "median s", "min-max s", f"x {results[0]['variant']}", "rollout s", "logprobs s",
               "train s", "refit s", "tmpe", "exact"]  # fmt: skip
    keys = [
        "variant", "median_s", "min_max_s", "speedup_vs_first", "rollout", "logprobs", "train", "refit",
        "token_mult_prob_error", "exact_token_fraction",
    ]  # fmt: skip
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
