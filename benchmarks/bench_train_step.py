"""Training step throughput, BF16 vs FP8 (FProp/DGrad/WGrad): the project's trainer (`NativePolicy.train`).

    PYTHONPATH=. python3 benchmarks/bench_train_step.py --out train_step.json      # GPU: Qwen3-8B shape
    PYTHONPATH=. python3 benchmarks/bench_train_step.py --quick                     # CPU smoke test

One optimizer step = forward + backward of the clipped-PG loss over `--batch` packed sequences of `--seq-len`
tokens (micro-batch 1 sequence, every token a response token), grad-norm clip and AdamW, then the FP8 weight
re-quantization for the next step (`prepare_refit`). Random weights and tokens; BF16 master weights (both variants).
The FP8 run converts the same model in place (`convert_to_fp8`, recipe `jetrl`) after the BF16 run.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LOSS_FN, QWEN3_8B, TINY, build_model, device_info, policy_config, report, timed  # noqa: E402

from nemo_jetrl.policy.interfaces import TrainBatch  # noqa: E402
from nemo_jetrl.policy.native import NativePolicy  # noqa: E402
from nemo_jetrl.precision import PrecisionRecipe  # noqa: E402


def make_batch(batch: int, seq_len: int, vocab: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, seq_len), generator=gen)
    ones = torch.ones_like(ids)
    response = ones.clone()
    response[:, 0] = 0
    logp = torch.full((batch, seq_len), -12.0) * response  # ~ random-weight logprobs: ratios stay finite
    adv = torch.randn(batch, generator=gen)
    return TrainBatch(ids, ones, response, adv, logp, prev_logprobs=logp.clone())


def run_variant(name: str, model, recipe: PrecisionRecipe, batch: TrainBatch, args, device) -> dict:
    policy = NativePolicy(
        policy_config(train_causal_attention=args.causal_attention), LOSS_FN, recipe, device, model=model
    )

    def step():
        policy.train(batch)
        return policy.prepare_refit()

    times = [timed(step, device)[1] for _ in range(args.warmup + args.steps)][args.warmup :]
    t = sorted(times)[len(times) // 2]
    tokens = batch.input_ids.numel()
    r = {"variant": name, "step_s": t, "tokens_per_s": tokens / t}
    if device.type == "cuda":
        r["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: all 36 of Qwen3-8B)")
    p.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument(
        "--causal-attention", action="store_true", help="policy.train_causal_attention: true (faster, not bit-exact)"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = QWEN3_8B, "Qwen3-8B"
    if args.quick:
        shape, shape_name, args.batch, args.seq_len, args.warmup, args.steps = TINY, "tiny", 2, 128, 1, 1
    info = device_info(device)
    model = build_model(shape, args.layers, device, torch.bfloat16).train()
    batch = make_batch(args.batch, args.seq_len, shape["vocab_size"])
    results = [run_variant("bf16", model, PrecisionRecipe.preset("bf16"), batch, args, device)]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    results.append(run_variant("fp8", model, PrecisionRecipe.preset("jetrl"), batch, args, device))
    for r in results:
        r["speedup_vs_bf16"] = results[0]["step_s"] / r["step_s"]
    n_layers = model.config.num_hidden_layers
    title = (
        f"train step on {info['device']}: {shape_name} shape x {n_layers} layers, {args.batch} x {args.seq_len} "
        "tokens, fwd+bwd+AdamW+requant"
    )
    keys = ["variant", "tokens_per_s", "speedup_vs_bf16", "step_s", "peak_mem_gb"]
    headers = ["variant", "tok/s", "x bf16", "step s", "peak GB"]
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
