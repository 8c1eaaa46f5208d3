"""One full GRPO step, BF16 vs unified FP8 + FP8 KV (Jet-RL), with the phase breakdown.

    PYTHONPATH=. python3 benchmarks/bench_grpo_step.py --out grpo_step.json         # GPU: Qwen3-8B shape
    PYTHONPATH=. python3 benchmarks/bench_grpo_step.py --quick                      # CPU smoke test

The phases of `algorithms/grpo.py`'s step with the project's own trainer and engine, on one device: rollout
(`NativeGenerationEngine.generate`, CUDA graphs, fixed lengths), trainer logprobs (`NativePolicy.get_logprobs`; in
FP8+KV it also observes Q/K/V for the next KV scales and fake-quantizes K/V like the rollout cache), train
(`NativePolicy.train`: fwd+bwd+AdamW over micro-batches), refit (`prepare_refit`: FP8 weights quantized once, new
KV scales computed and handed to the engine). Rewards are random (the reward function is not what is measured).
The calibration cost is measured on the side: the same logprob pass with and without the observer.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LOSS_FN, QWEN3_8B, TINY, build_model, device_info, policy_config, report, timed  # noqa: E402

from nemo_jetrl.generation.native.engine import NativeGenerationEngine  # noqa: E402
from nemo_jetrl.policy.interfaces import TrainBatch  # noqa: E402
from nemo_jetrl.policy.native import NativePolicy  # noqa: E402
from nemo_jetrl.precision import PrecisionRecipe  # noqa: E402

PHASES = ("rollout", "logprobs", "train", "refit")


def grpo_step(policy: NativePolicy, engine: NativeGenerationEngine, prompts, seed: int, device) -> dict:
    """One step; returns phase times (s) and the step's mismatch (token_mult_prob_error)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out, t_rollout = timed(lambda: engine.generate(prompts, generator=gen), device)
    adv = torch.randn(len(out), generator=torch.Generator().manual_seed(seed))
    batch = TrainBatch(
        out.input_ids.cpu(), out.attention_mask.cpu(), out.response_mask.cpu(), adv, out.generation_logprobs.cpu()
    )
    batch.prev_logprobs, t_logprobs = timed(lambda: policy.get_logprobs(batch), device)
    _, t_train = timed(lambda: policy.train(batch), device)

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
        "batch": batch,
    }


def calibration_overhead(policy: NativePolicy, batch: TrainBatch, device) -> dict:
    """The logprob pass with the fused observer vs the same pass without it, the scale computation, and the
    separate post-step pass (s)."""
    _, t_fused = timed(lambda: policy.get_logprobs(batch), device)
    _, t_scales = timed(lambda: policy.kv_calibrator.scales().metrics(), device)
    plain = policy._attn_hook(calibrate=False)
    _, t_plain = timed(lambda: policy._logprobs(policy.model, batch, plain), device)
    _, t_post = timed(lambda: policy.calibrate_kv_scales(batch), device)  # the separate post-step pass
    return {
        "logprobs_fused_s": t_fused,
        "logprobs_plain_s": t_plain,
        "kv_calibration_s": t_scales,
        "post_step_pass_s": t_post,
    }


def run_variant(name: str, model, recipe: PrecisionRecipe, prompts, args, device) -> dict:
    cfg = policy_config(
        train_causal_attention=args.causal_attention,
        train_micro_batch_size=args.micro_batch,
        logprob_batch_size=args.micro_batch * 2,
        generation={"kv_cache_calibration_pass": "fused"},
    )
    policy = NativePolicy(cfg, LOSS_FN, recipe, device, model=model)
    engine = NativeGenerationEngine(
        policy.model,
        max_new_tokens=args.gen_len,
        stop_token_ids=[],
        pad_token_id=0,
        compute_dtype=policy.compute_dtype,
        kv_cache_dtype=recipe.kv_cache_dtype,
        cuda_graphs=True,
    )
    if recipe.kv_fp8:  # bootstrap scales (grpo.py does it with a high-precision rollout of the first prompts)
        ids = torch.tensor(prompts[: args.micro_batch])
        ones = torch.ones_like(ids)
        boot = TrainBatch(ids, ones, torch.zeros_like(ids), torch.zeros(len(ids)), torch.zeros(ids.shape))
        engine.update_weights(kv_scales=policy.calibrate_kv_scales(boot).kv)
    steps = [grpo_step(policy, engine, prompts, seed, device) for seed in range(args.warmup + args.steps)]
    measured = steps[args.warmup :]
    r = {"variant": name}
    for key in (*PHASES, "total", "token_mult_prob_error"):
        r[key] = sum(s[key] for s in measured) / len(measured)
    if recipe.kv_fp8:
        r.update(calibration_overhead(policy, measured[-1]["batch"], device))
        r["calibration_share_pct"] = (
            100 * (r["logprobs_fused_s"] - r["logprobs_plain_s"] + r["kv_calibration_s"]) / r["total"]
        )
        r["post_step_share_pct"] = 100 * (r["post_step_pass_s"] + r["kv_calibration_s"]) / r["total"]
    r["tokens_per_s"] = len(prompts) * args.gen_len / r["total"]
    del policy, engine, steps, measured
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16, help="decoder layers of the Qwen3-8B shape")
    p.add_argument("--prompts", type=int, default=64, help="sequences per step (prompts x generations)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=768)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument(
        "--causal-attention", action="store_true", help="policy.train_causal_attention: true (faster, not bit-exact)"
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = QWEN3_8B, "Qwen3-8B"
    if args.quick:
        shape, shape_name, args.layers, args.prompts, args.prompt_len, args.gen_len = TINY, "tiny", 2, 8, 8, 8
        args.micro_batch = 4
    info = device_info(device)
    model = build_model(shape, args.layers, device, torch.bfloat16).train()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, shape["vocab_size"], (args.prompts, args.prompt_len), generator=gen).tolist()
    results = [run_variant("bf16", model, PrecisionRecipe.preset("bf16"), prompts, args, device)]
    results.append(run_variant("fp8+kv (jetrl_kv)", model, PrecisionRecipe.preset("jetrl_kv"), prompts, args, device))
    for r in results:
        r["speedup_vs_bf16"] = results[0]["total"] / r["total"]
        for ph in PHASES:
            r[f"{ph}_speedup"] = results[0][ph] / r[ph]
    n_layers = model.config.num_hidden_layers
    title = (
        f"GRPO step on {info['device']}: {shape_name} shape x {n_layers} layers, {args.prompts} sequences, "
        f"{args.prompt_len} -> {args.gen_len} tokens, micro-batch {args.micro_batch}"
    )
    headers = ["variant", "step s", "x bf16", "rollout s", "logprobs s", "train s", "refit s", "calib %", "tmpe"]
    keys = [
        "variant", "total", "speedup_vs_bf16", "rollout", "logprobs", "train", "refit", "calibration_share_pct",
        "token_mult_prob_error",
    ]  # fmt: skip
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
