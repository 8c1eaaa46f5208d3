"""Training-inference mismatch at a real model shape: every precision preset side by side, by response position.

    python3 -m benchmarks.bench_mismatch --out mismatch_8b.json --plot mismatch_8b.png   # GPU
    python3 -m benchmarks.bench_mismatch --quick                                         # CPU
    python3 -m benchmarks.bench_mismatch --shape qwen3-30b-a3b --layers 8 --steps 1                   # the MoE

Each variant runs `--steps` GRPO steps on the same random-weight model (Qwen3-8B shape, `--layers` deep): rollout
(`NativeGenerationEngine.generate`, CUDA graphs) -> prev_logprobs from the trainer's own forward
(`NativePolicy.get_logprobs`, the forward whose gradient is taken next) -> train (random advantages) -> refit.
Mismatch is always rollout logprobs vs that trainer forward (never a replay of the rollout). Reported per variant:
token_mult_prob_error, gen_kl_error, exact_token_fraction over all steps, and mean exp|d| per response-position bin;
for an MoE shape also routing_agreement (the share of (scored token, MoE layer) pairs whose experts the rollout and
the trainer's forward chose alike, `train/routing_agreement`).
Modes: "fast" (the default kernels), "sdpa_decode" (SDPA instead of the fused decode attention), "matched" (the
fast path with its two cheap mismatch sources matched: batch-invariant attention and log-sum-exp on both sides, FP8
forward GEMMs on cuBLAS at every M on CUDA), "exact" (`policy.generation.deterministic: true`: batch-invariant
kernels in the rollout and the trainer).

`--ablate` attributes the fast path's mismatch: per preset the fast path, the exact mode, the exact mode with ONE part
back on the fast path ("exact - attention": everything exact but the attention) and ONE part alone exact ("only
fp8_gemm"); the parts are `models.batch_invariant.ExactParts`, handed to `enable_batch_invariant(model, parts)`. On
CUDA also the FP8 forward GEMMs on cuBLAS at every M (`precision.convert.use_cublas_fprop`), alone and with the
cheap exact parts.
Default there: one step per variant (the mismatch is measured before the update, so no training step runs).
"""

from __future__ import annotations

import argparse
import gc
import sys
import textwrap
import time

import torch

from benchmarks.common import (
    LOSS,
    TINY,
    bootstrapped_engine,
    build_model,
    device_info,
    policy_config,
    report,
    write_json,
)
from nemo_jetrl.algorithms.mismatch import mismatch_metrics
from nemo_jetrl.models.batch_invariant import MATCHED_PARTS, ExactParts, enable_batch_invariant
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.convert import use_cublas_fprop

# (label, preset, mode: fast | sdpa_decode | matched | exact)
VARIANTS = (
    ("bf16", "bf16", "fast"),
    ("fp8 rollout only", "fp8_rollout_only", "fast"),
    ("unified fp8 (jetrl)", "jetrl", "fast"),
    ("unified fp8 + kv (jetrl_kv)", "jetrl_kv", "fast"),
    ("unified fp8 rowwise", "rowwise", "fast"),
    ("unified fp8 tensorwise", "tensorwise", "fast"),
    ("jetrl_kv, SDPA decode", "jetrl_kv", "sdpa_decode"),
    ("jetrl, matched", "jetrl", "matched"),
    ("jetrl_kv, matched", "jetrl_kv", "matched"),
    ("bf16, exact", "bf16", "exact"),
    ("jetrl, exact", "jetrl", "exact"),
    ("jetrl_kv, exact", "jetrl_kv", "exact"),
)


# --ablate: per preset, (label suffix, ExactParts or None = the fast path); parts one at a time, both directions.
ABLATION_PRESETS = ("bf16", "jetrl", "jetrl_kv")
FP8_ONLY_PARTS = ("fp8_gemm",)  # parts that change nothing without FP8 linears
ONLY_PARTS = ("fp8_gemm", "attention")  # the two large sources, each alone exact
CHEAP_PARTS = tuple(n for n in ExactParts.names() if getattr(MATCHED_PARTS, n))  # what `matched_kernels` switches


def ablation_variants(presets=ABLATION_PRESETS, cuda: bool = False) -> list[tuple[str, str, str, ExactParts | None]]:
    """(label, preset, mode, parts) rows of `--ablate`: fast, exact, exact minus each part, each large part only;
    on CUDA also the FP8 forward GEMMs on cuBLAS at every M (mode "cublas"), alone and with the cheap parts."""
    rows = []
    for preset in presets:
        fp8 = preset != "bf16"
        names = [n for n in ExactParts.names() if fp8 or n not in FP8_ONLY_PARTS]
        rows += [(f"{preset} fast", preset, "fast", None), (f"{preset} exact", preset, "exact", ExactParts())]
        rows += [(f"{preset} exact - {n}", preset, "ablate", ExactParts().without(n)) for n in names]
        rows += [(f"{preset} only {n}", preset, "ablate", ExactParts.only(n)) for n in ONLY_PARTS if n in names]
        if cuda and fp8:
            rows += [(f"{preset} cuBLAS GEMMs", preset, "cublas", None)]
            rows += [
                (f"{preset} cuBLAS GEMMs + {'+'.join(CHEAP_PARTS)}", preset, "cublas", ExactParts.only(*CHEAP_PARTS))
            ]
    return rows


def run_variant(label: str, preset: str, mode: str, model, prompts, args, device, parts: ExactParts | None = None):
    recipe = PrecisionRecipe.preset(preset)
    cfg = policy_config(
        train_micro_batch_size=args.micro_batch,
        logprob_batch_size=args.micro_batch,
        # the exact mode / matched kernels: NativePolicy switches the model's kernels (both sides share the model)
        generation={"deterministic": mode == "exact", "matched_kernels": mode == "matched"},
    )
    started = time.perf_counter()
    policy = NativePolicy(cfg, recipe, device, model=model)
    if mode in ("ablate", "cublas") and parts is not None:  # a subset of the exact mode's parts
        enable_batch_invariant(policy.model, parts)
    if mode == "cublas":
        use_cublas_fprop(policy.model)
    engine = bootstrapped_engine(
        policy, recipe, prompts, args.gen_len, args.micro_batch, cuda_graphs=device.type == "cuda",
        fused_decode=False if mode == "sdpa_decode" else None,
    )  # fmt: skip
    train_lp, gen_lp, masks, routing = [], [], [], []
    for seed in range(args.steps):
        out = engine.generate(prompts, generator=torch.Generator(device=device).manual_seed(seed))
        adv = torch.randn(len(out), generator=torch.Generator().manual_seed(seed))
        batch = TrainBatch(
            out.input_ids.cpu(), out.attention_mask.cpu(), out.response_mask.cpu(), adv,
            out.generation_logprobs.float().cpu(),
            generation_routing=None if out.routed_experts is None else out.routed_experts.cpu(),
        )  # fmt: skip
        batch.prev_logprobs = policy.get_logprobs(batch)
        routing.append(policy.routing.pop_metrics().get("routing_agreement"))  # None: a dense model
        start = out.prompt_length  # response columns [start, start + gen_len)
        train_lp.append(batch.prev_logprobs[:, start:])
        gen_lp.append(batch.generation_logprobs[:, start:])
        masks.append(batch.response_mask[:, start:])
        if seed == args.steps - 1:  # the last update would change nothing measured
            break
        policy.train(batch, LOSS)
        policy.prepare_refit()
        if policy.kv_scales is not None:
            engine.update_weights(kv_scales=policy.kv_scales.kv)
    width = min(t.shape[1] for t in train_lp)
    train, gen, mask = (torch.cat([t[:, :width] for t in ts]) for ts in (train_lp, gen_lp, masks))  # [steps*B, R]
    result = {"variant": label, "preset": preset, "mode": mode, **mismatch_metrics(train, gen, mask)}
    if routing[0] is not None:  # the mean over the steps (equal token counts per step: one rollout shape)
        result["routing_agreement"] = sum(routing) / len(routing)
    if parts is not None:
        result["exact_parts"] = [n for n in ExactParts.names() if getattr(parts, n)]
    result["by_position"] = by_position(train, gen, mask, args.bins)
    result["wall_s"] = time.perf_counter() - started
    del policy, engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def by_position(train: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor, bins: int) -> list[dict]:
    """mean exp|d| and the exact share per bin of response positions ([N, R] inputs, R positions)."""
    width = train.shape[1]
    edges = torch.linspace(0, width, bins + 1).round().long().tolist()
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        if hi <= lo:
            continue
        m = mask[:, lo:hi].bool()
        d = (train[:, lo:hi] - gen[:, lo:hi])[m]
        rows.append(
            {
                "positions": [lo, hi],
                "token_mult_prob_error": float(d.abs().exp().mean()) if d.numel() else 1.0,
                "exact_token_fraction": float((d == 0).float().mean()) if d.numel() else 1.0,
            }
        )
    return rows


def plot(results: list[dict], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        mids = [(b["positions"][0] + b["positions"][1]) / 2 for b in r["by_position"]]
        ax.plot(mids, [b["token_mult_prob_error"] - 1 for b in r["by_position"]], marker="o", label=r["variant"])
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_xlabel("response position")
    ax.set_ylabel("token_mult_prob_error - 1")
    ax.set_title(textwrap.fill(title, 100), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="model shape (random weights)")
    p.add_argument("--layers", type=int, default=16, help="decoder layers of the shape")
    p.add_argument("--prompts", type=int, default=64, help="sequences per step")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=8, help="trainer micro-batch (logprob and train)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per variant (default 3; --ablate: 1)")
    p.add_argument("--bins", type=int, default=8, help="response-position bins")
    p.add_argument("--variants", nargs="*", default=None, help="a subset of the variant labels (default: all)")
    p.add_argument("--ablate", action="store_true", help="attribute the fast path's mismatch part by part")
    p.add_argument("--presets", nargs="*", default=list(ABLATION_PRESETS), help="--ablate: presets to ablate")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--out", default=None, help="JSON path")
    p.add_argument("--plot", default=None, help="PNG path: mismatch by response position")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = SHAPES[args.shape], args.shape
    if args.steps is None:
        args.steps = 1 if args.ablate else 3
    if args.quick:
        shape, shape_name = (SHAPES["tiny-moe"], "tiny-moe") if "num_experts" in shape else (TINY, "tiny")
        args.layers, args.prompts, args.prompt_len, args.gen_len = 2, 8, 8, 8
        args.micro_batch, args.steps, args.bins = 4, min(args.steps, 2), 4
    info = device_info(device)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, shape["vocab_size"], (args.prompts, args.prompt_len), generator=gen).tolist()
    results = []
    rows = ablation_variants(args.presets, device.type == "cuda") if args.ablate else [(*v, None) for v in VARIANTS]
    unknown = set(args.variants or ()) - {v[0] for v in rows}
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; known: {[v[0] for v in rows]}")
    headers = ["variant", "token_mult_prob_error", "gen_kl_error", "exact tokens", "tokens"]
    keys = ["variant", "token_mult_prob_error", "gen_kl_error", "exact_token_fraction", "num_valid_tokens"]
    if "num_experts" in shape:
        headers, keys = headers + ["routing agreement"], keys + ["routing_agreement"]
    title = (
        f"mismatch on {info['device']}: {shape_name} shape x {args.layers} layers, {args.prompts} sequences, "
        f"{args.prompt_len} -> {args.gen_len} tokens, {args.steps} steps, trainer micro-batch {args.micro_batch}"
    )
    for label, preset, mode, parts in rows:  # a fresh copy of the same random weights per variant
        if args.variants and label not in args.variants:
            continue
        model = build_model(shape, args.layers, device, torch.bfloat16).train()
        results.append(run_variant(label, preset, mode, model, prompts, args, device, parts))
        r = results[-1]
        print(f"{label}: tmpe {r['token_mult_prob_error']:.4f}, exact {r['exact_token_fraction']:.4f}", flush=True)
        write_json(args.out, {**info, "args": vars(args), "partial": True, "results": results})
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=args.layers)
    if args.plot:
        plot(results, title, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
