#!/usr/bin/env python
"""Training-inference mismatch per precision recipe on the tiny 2-digit-addition task (docs/mismatch.md).

    uv run examples/mismatch_study.py --mode grpo --steps 3 --out results/mismatch_cpu.json     # CPU, GRPO steps
    PYTHONPATH=. python3 examples/mismatch_study.py --mode rollout --out mismatch_gpu.json       # any device

`grpo`: a few real GRPO steps per variant through `run_grpo` (config system; the rollout's logprobs vs the trainer's
`get_logprobs` each step, with optimizer updates and per-step KV recalibration in between).
`rollout`: no config system (runs on the bare GPU box): one rollout of 256 sequences per variant and the trainer's
scoring of it (micro-batches of `--logprob-batch-size`, K/V fake-quantized where the recipe says so).

Variants: bf16 | fp8-rollout-only (BF16 trainer) | unified fp8 (jetrl) | unified fp8 + fp8 KV (trainer attention
in bf16) | unified fp8 + fp8 KV + trainer K/V fake-quant (jetrl_kv) | the same in deterministic mode.
Metrics (NeMo-RL names, means over generated tokens): token_mult_prob_error = mean(exp|d|), gen_kl_error (k3),
exact_fraction = share of tokens whose two logprobs are bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

# name -> (policy.precision, policy.generation.precision, kv_cache_dtype, train_kv_fake_quant, deterministic)
VARIANTS = {
    "bf16": ("bf16", "bf16", "auto", False, False),
    "fp8-rollout-only": ("bf16", "fp8", "auto", False, False),
    "unified fp8": ("fp8", "fp8", "auto", False, False),
    "unified fp8 + kv": ("fp8", "fp8", "fp8", False, False),
    "unified fp8 + kv + fake-quant": ("fp8", "fp8", "fp8", True, False),
    "unified fp8 + kv + fake-quant, deterministic": ("fp8", "fp8", "fp8", True, True),
}
CONFIG = Path(__file__).resolve().parent / "configs" / "grpo_tiny.yaml"


def run_grpo_variant(name: str, args) -> dict:
    """`args.steps` GRPO steps of grpo_tiny.yaml with the variant's precision; per-step mismatch metrics."""
    from nemo_jetrl.algorithms.grpo import run_grpo
    from nemo_jetrl.config import load_config
    from nemo_jetrl.schema import validate_config

    train, rollout, kv, fake_quant, deterministic = VARIANTS[name]
    overrides = [
        f"policy.precision={train}",
        f"policy.generation.precision={rollout}",
        f"policy.generation.kv_cache_dtype={kv}",
        f"policy.fp8_cfg.train_kv_fake_quant={str(fake_quant).lower()}",
        f"policy.generation.deterministic={str(deterministic).lower()}",
        f"policy.logprob_batch_size={args.logprob_batch_size}",
        f"grpo.max_num_steps={args.steps}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "logger.tensorboard_enabled=false",
        "logger.plot_period=0",
        f"logger.log_dir={args.log_dir}/{name.replace(' ', '_').replace(',', '').replace('+', 'p')}",
    ]
    result = run_grpo(validate_config(load_config(CONFIG, overrides)))
    keys = ("token_mult_prob_error", "gen_kl_error", "reward_mean")
    return {k: [h[k] for h in result["history"] if k in h] for k in keys}


def run_rollout_variant(name: str, args, device: torch.device) -> dict:
    """One rollout of 32 prompts x 8 and the trainer's scoring of it, without the config system."""
    from nemo_jetrl.generation.native.engine import NativeGenerationEngine
    from nemo_jetrl.models.batch_invariant import enable_batch_invariant
    from nemo_jetrl.models.loading import load_model_and_tokenizer
    from nemo_jetrl.models.scoring import sequence_logprobs
    from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8
    from nemo_jetrl.precision.kv import QKVCalibrator, make_attn_hook

    train, rollout, kv, fake_quant, deterministic = VARIANTS[name]
    recipe = PrecisionRecipe(train=train, rollout=rollout, kv_cache_dtype=kv, train_kv_fake_quant=fake_quant)
    model, tok = load_model_and_tokenizer("tiny-arith", device=device)
    if recipe.any_fp8:
        convert_to_fp8(model, recipe)
    if deterministic:  # the exact mode: batch-invariant kernels for rollout and trainer alike
        enable_batch_invariant(model)
    rng = random.Random(0)
    prompts = [tok(f"{rng.randint(0, 99):02d}+{rng.randint(0, 99):02d}=")["input_ids"] for _ in range(32)]
    prompts = [p for p in prompts for _ in range(8)]
    bf16 = torch.bfloat16
    engine = NativeGenerationEngine(
        model,
        max_new_tokens=5,
        stop_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        compute_dtype=bf16,
        kv_cache_dtype=kv,
        cuda_graphs=True,
    )
    scales = None
    if recipe.kv_fp8:  # as grpo.py bootstraps: a high-precision-cache rollout observed by the trainer
        boot = engine.replace(kv_cache_dtype=None).generate(prompts, generator=_gen(device, 1))
        calib = QKVCalibrator(model.config.num_hidden_layers, recipe.kv_calibration)
        with torch.no_grad():
            sequence_logprobs(model, boot.input_ids, boot.attention_mask, compute_dtype=bf16, attn_hook=calib)
        scales = calib.scales()
        engine.update_weights(kv_scales=scales.kv)
    out = engine.generate(prompts, generator=_gen(device, 2))
    hook = make_attn_hook(None, scales if fake_quant else None)
    mbs = args.logprob_batch_size
    with torch.no_grad():  # the trainer's forward in every variant (never a replay of the rollout)
        logp = torch.cat(
            [
                sequence_logprobs(
                    model, out.input_ids[i : i + mbs], out.attention_mask[i : i + mbs], compute_dtype=bf16,
                    attn_hook=hook,
                )
                for i in range(0, len(out), mbs)
            ]
        )  # fmt: skip
    d = (logp - out.generation_logprobs)[out.response_mask.bool()].double()
    return {
        "token_mult_prob_error": [float(d.abs().exp().mean())],
        "gen_kl_error": [float((d.exp() - d - 1).mean())],
        "exact_fraction": [float((d == 0).double().mean())],
    }


def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def markdown_table(results: dict[str, dict]) -> str:
    lines = [
        "| variant | token_mult_prob_error | gen_kl_error | exact tokens |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        tmpe = sum(r["token_mult_prob_error"]) / len(r["token_mult_prob_error"])
        kl = sum(r["gen_kl_error"]) / len(r["gen_kl_error"])
        exact = r.get("exact_fraction")
        exact_s = f"{100 * sum(exact) / len(exact):.1f}%" if exact else "-"
        lines.append(f"| {name} | {tmpe:.7f} | {kl:.3e} | {exact_s} |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    values = [
        max(sum(r["token_mult_prob_error"]) / len(r["token_mult_prob_error"]) - 1, 1e-9) for r in results.values()
    ]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.barh(names[::-1], values[::-1], color="tab:blue")
    ax.set_xscale("log")
    ax.set_xlabel("token_mult_prob_error - 1 (log; 1e-9 = exactly 0)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("grpo", "rollout"), default="grpo")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps per variant (--mode grpo)")
    p.add_argument("--logprob-batch-size", type=int, default=64, help="trainer micro-batch (rollout batch: 256)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), help="subset of: " + ", ".join(VARIANTS))
    p.add_argument("--log-dir", default="logs/mismatch_study")
    p.add_argument("--out", default=None, help="JSON path (a .png plot is written next to it)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    for name in args.variants:
        if name not in VARIANTS:
            p.error(f"unknown variant {name!r}")
        print(f"=== {name}", flush=True)
        results[name] = run_grpo_variant(name, args) if args.mode == "grpo" else run_rollout_variant(name, args, device)
        print(json.dumps(results[name]), flush=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    table = markdown_table(results)
    print(f"\nmismatch ({args.mode}, {device_name}, logprob micro-batch {args.logprob_batch_size}):\n{table}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"mode": args.mode, "device": device_name, "args": vars(args), "results": results, "table": table}
        out.write_text(json.dumps(payload, indent=2))
        try:
            plot(results, out.with_suffix(".png"), f"mismatch on the tiny task ({args.mode}, {device_name})")
        except ImportError:
            print("matplotlib not installed: no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
