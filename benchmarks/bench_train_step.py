"""Training step throughput, BF16 vs FP8 (FProp/DGrad/WGrad): the project's trainer (`NativePolicy.train`).

    python3 -m benchmarks.bench_train_step --out train_step.json      # GPU: Qwen3-8B shape
    python3 -m benchmarks.bench_train_step --quick                     # CPU smoke test
    python3 -m benchmarks.bench_train_step --fp8-recipe rowwise        # other FP8 recipes
    python3 -m benchmarks.bench_train_step --shape qwen3-30b-a3b --layers 4  # the MoE, 4 of 48 layers
    python3 -m benchmarks.bench_train_step --memory --layers 16        # each variant's own peak
    python3 -m benchmarks.bench_train_step --layers 36 --rounds 3 --steps 2  # one resident at a time

One optimizer step = forward + backward of the clipped-PG loss over `--batch` packed sequences of `--seq-len`
tokens (micro-batches of `--micro-batch` sequences, default 1; every token a response token), grad-norm clip and AdamW, then the FP8 weight
re-quantization for the next step (`prepare_refit`). Random weights and tokens; BF16 master weights (both variants).
All policies (BF16, and one per FP8 recipe of `--fp8-recipe`, default blockwise = `jetrl`, each on a copy of the
same weights) stay resident and their steps alternate (BF16, FP8, then FP8, BF16, ...): median and min-max over `--steps` timed steps, device, the SM clock and
power during each variant's timed steps (nvidia-smi, `gpu_clocks.py`), each step's peak
memory above what was resident, each policy's weights + optimizer state and its FP8 weight caches. Two resident
copies of the Qwen3-8B shape fit at `--layers 8` on an 80 GB H100 and `--layers 16` on an H200; deeper, `--rounds`
builds and frees one variant at a time, rounds alternating (`rebuilt_timings`).

`--memory`: no timing; each variant alone on the device (built, stepped, freed, in turn), its peak allocated
memory over its steps above what was allocated before it was built: the figure a run of that variant needs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys

import torch

from benchmarks.common import (
    LOSS,
    TINY,
    add_deep_gemm_flag,
    alternating_timings,
    build_model,
    check_deep_gemm,
    device_info,
    policy_config,
    report,
    summarize_times,
)
from benchmarks.gpu_clocks import ClockSampler, per_variant
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.interfaces import TrainBatch
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe


def make_batch(batch: int, seq_len: int, vocab: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, seq_len), generator=gen)
    ones = torch.ones_like(ids)
    response = ones.clone()
    response[:, 0] = 0
    logp = torch.full((batch, seq_len), -12.0) * response  # ~ random-weight logprobs: ratios stay finite
    adv = torch.randn(batch, generator=gen)
    return TrainBatch(ids, ones, response, adv, logp, prev_logprobs=logp.clone())


def state_gb(policy: NativePolicy) -> float:
    """Master weights + optimizer state (GB) of a policy that has taken a step."""
    tensors = [p for p in policy.model.parameters()]
    tensors += [t for st in policy.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors) / 1e9


def fp8_cache_gb(policy: NativePolicy) -> float:
    """The FP8 weight caches a policy holds (e4m3 weights, scales, held DGrad copies), each storage counted once."""
    storages = {}
    for m in policy.model.modules():
        if not isinstance(m, Fp8Linear):
            continue
        group = m.weight_group
        for qw in filter(None, [m.cached_quantized_weight, group and group.cached_quantized_weight]):
            for t in filter(torch.is_tensor, qw.held_tensors()):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values()) / 1e9


def variant_peaks(make_policy, names: list[str], batch: TrainBatch, steps: int, device: torch.device) -> dict:
    """Per variant, alone on the device: its peak allocated memory over `steps` steps above what was allocated
    before it was built (GB), its weights + optimizer state and FP8 caches after them."""
    out = {}
    for name in names:
        base = _allocated_baseline(device)
        torch.cuda.reset_peak_memory_stats(device)
        policy = make_policy(name)
        step = train_step_fn(policy, batch)
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 1e9
        out[name] = {"variant": name, "policy_peak_gb": peak, "state_gb": state_gb(policy),
                     "fp8_cache_gb": fp8_cache_gb(policy)}  # fmt: skip
        del policy, step
    for r in out.values():
        r["peak_vs_bf16_gb"] = r["policy_peak_gb"] - out["bf16"]["policy_peak_gb"]
    return out


def rebuilt_timings(
    make_policy, names: list[str], batch: TrainBatch, rounds: int, warmup: int, steps: int, device, intervals=None
):
    """For shapes too large to keep every variant resident (`--rounds`): in each round every variant in turn is
    built, stepped `warmup` untimed and `steps` timed times, and freed; the order alternates between rounds (A, B,
    then B, A, ...). Per variant: `alternating_timings`' record over all its timed steps, plus its peak allocated
    memory above what was allocated before it was built (GB), weights + optimizer state, FP8 caches, graph pool.
    `intervals`: as `alternating_timings`'."""
    out = {n: {"times_s": [], "step_peak_gb": 0.0, "policy_peak_gb": 0.0} for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            base = _allocated_baseline(device)
            policy = make_policy(name)
            step = {name: train_step_fn(policy, batch)}
            timing = alternating_timings(step, warmup, steps, device, intervals)[name]
            rec = out[name]
            rec["times_s"] += timing["times_s"]
            rec["step_peak_gb"] = max(rec["step_peak_gb"], timing["step_peak_gb"])
            if device.type == "cuda":  # the counter is reset before each step: the last step's peak above `base`
                rec["policy_peak_gb"] = max(rec["policy_peak_gb"], (torch.cuda.max_memory_allocated(device) - base) / 1e9)
            rec.update(state_gb=state_gb(policy), fp8_cache_gb=fp8_cache_gb(policy), graph_pool_gb=_pool_gb(policy))
            del policy, step
    for rec in out.values():
        summarize_times(rec)
    return out


def _allocated_baseline(device: torch.device) -> int:
    """Bytes allocated on `device` once the previous variant (its graphs, closures) is gone; 0 off CUDA."""
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device)


def _pool_gb(policy: NativePolicy) -> float:
    return policy.train_graphs.pool_bytes() / 1e9 if policy.train_graphs is not None else 0.0


def train_step_fn(policy: NativePolicy, batch: TrainBatch):
    def step():
        policy.train(batch, LOSS)
        return policy.prepare_refit()

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES), help="model shape (random weights)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: all of the shape's)")
    p.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (policy.train_micro_batch_size)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant (>= 5 for quoted figures)")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument(
        "--causal-attention", action="store_true", help="policy.train_causal_attention: true (faster, not bit-exact)"
    )
    p.add_argument(
        "--activation-checkpointing", action="store_true",
        help="policy.dtensor_cfg.activation_checkpointing: true, FP8 weights transient where eager "
        "(fp8_cfg.transient_train_weights; adds the variant 'fp8 cached weights' that keeps them through the step)",
    )  # fmt: skip
    p.add_argument(
        "--fp8-recipe", nargs="+", default=["blockwise"], choices=["blockwise", "rowwise", "tensorwise"],
        help="FP8 variants (policy.fp8_cfg.fp8_recipe); variant 'fp8' for blockwise, 'fp8_<recipe>' otherwise",
    )  # fmt: skip
    p.add_argument(
        "--cuda-graphs", default="off", choices=["off", "on", "both"],
        help="policy.train_cuda_graphs for every variant (on), or each variant eager and '+graphs' (both)",
    )  # fmt: skip
    p.add_argument(
        "--per-linear", action="store_true",
        help="also 'fp8 per-linear': blockwise FP8 with q/k/v and gate/up as separate GEMMs (the grouping's ablation)",
    )  # fmt: skip
    add_deep_gemm_flag(p, "fp8+deep_gemm")
    p.add_argument(
        "--cached-dgrad-weight", action="store_true",
        help="also 'fp8 W^T cached': blockwise FP8 with policy.fp8_cfg.cache_dgrad_weight: true",
    )  # fmt: skip
    p.add_argument(
        "--wgrad-tiles", action="store_true",
        help="also 'fp8 wgrad 128x128': blockwise FP8 with policy.fp8_cfg.wgrad_x_blocks: 128x128 (faster WGrad GEMM)",
    )  # fmt: skip
    p.add_argument(
        "--rounds", type=int, default=0,
        help="build one variant at a time (shapes too large for all to be resident): N rounds, alternating order, "
        "--warmup + --steps steps per visit (the timed steps add up over the rounds)",
    )  # fmt: skip
    p.add_argument("--memory", action="store_true", help="each variant's own peak memory, one at a time (no timing)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, shape_name = SHAPES[args.shape], args.shape
    if args.quick:  # the tiny dense shape, or tiny-moe for an MoE shape
        moe = "num_experts" in shape
        shape, shape_name = (SHAPES["tiny-moe"], "tiny-moe") if moe else (TINY, "tiny")
        args.batch, args.seq_len, args.warmup, args.steps = 2, 128, 1, 2
    info = device_info(device)
    batch = make_batch(args.batch, args.seq_len, shape["vocab_size"])
    if args.cuda_graphs != "off" and device.type != "cuda":
        p.error("--cuda-graphs needs a CUDA device")
    variants = [("bf16", PrecisionRecipe.preset("bf16"))] + [
        ("fp8" if name == "blockwise" else f"fp8_{name}", PrecisionRecipe.preset("jetrl", granularity=name))
        for name in args.fp8_recipe
    ]
    if args.per_linear:
        variants.append(("fp8 per-linear", PrecisionRecipe.preset("jetrl")))
    check_deep_gemm(p, args, device)
    if args.deep_gemm:
        variants.append(("fp8+deep_gemm", PrecisionRecipe.preset("jetrl", use_deep_gemm=True)))
    if args.cached_dgrad_weight:
        variants.append(("fp8 W^T cached", PrecisionRecipe.preset("jetrl", cache_dgrad_weight=True)))
    if args.activation_checkpointing and args.cuda_graphs != "on":
        variants.append(("fp8 cached weights", PrecisionRecipe.preset("jetrl")))
    if args.wgrad_tiles:
        variants.append(("fp8 wgrad 128x128", PrecisionRecipe.preset("jetrl", wgrad_x_blocks="128x128")))
    graph_modes = {"off": [False], "on": [True], "both": [False, True]}[args.cuda_graphs]
    recipes = {
        name + ("+graphs" if graphs and args.cuda_graphs == "both" else ""): (recipe, graphs)
        for graphs in graph_modes
        for name, recipe in variants
    }

    def make_policy(name: str) -> NativePolicy:  # the same random weights (build_model seeds) for every variant
        recipe, graphs = recipes[name]
        cfg = policy_config(
            train_causal_attention=args.causal_attention, train_cuda_graphs=graphs, train_micro_batch_size=args.micro_batch,
            dtensor_cfg={"activation_checkpointing": args.activation_checkpointing},
            fp8_cfg={"transient_train_weights": not name.startswith("fp8 cached weights")},  # the ablation: kept
        )  # fmt: skip
        policy = NativePolicy(cfg, recipe, device, model=build_model(shape, args.layers, device, torch.bfloat16).train())
        if "per-linear" in name:
            for group in {id(m.weight_group): m.weight_group for m in policy.model.modules()
                          if getattr(m, "weight_group", None) is not None}.values():  # fmt: skip
                group.train_grouped = False
        return policy

    n_layers = args.layers or shape["num_hidden_layers"]
    if args.memory:
        if device.type != "cuda":
            p.error("--memory needs a CUDA device")
        peaks = variant_peaks(make_policy, list(recipes), batch, args.warmup + args.steps, device)
        title = (
            f"train step peak memory on {info['device']}: {shape_name} shape x {n_layers} layers, {args.batch} x "
            f"{args.seq_len} tokens in micro-batches of {args.micro_batch}, each variant alone for {args.warmup + args.steps} steps, CUDA graphs "
            f"{args.cuda_graphs}"
        )
        keys = ["variant", "policy_peak_gb", "peak_vs_bf16_gb", "state_gb", "fp8_cache_gb"]
        headers = ["variant", "peak GB", "vs BF16 GB", "weights + AdamW GB", "FP8 caches GB"]
        report(title, headers, keys, list(peaks.values()), args=args, info=info, shape=shape, n_layers=n_layers)
        return 0
    tokens = batch.input_ids.numel()
    intervals: dict[str, list[tuple[float, float]]] = {}  # each timed step's span, for the GPU clock samples
    with ClockSampler(device.index or 0) if device.type == "cuda" else contextlib.nullcontext() as sampler:
        if args.rounds:
            timings = rebuilt_timings(
                make_policy, list(recipes), batch, args.rounds, args.warmup, args.steps, device, intervals
            )
        else:
            policies = {name: make_policy(name) for name in recipes}  # all resident
            steps = {name: train_step_fn(policy, batch) for name, policy in policies.items()}
            timings = alternating_timings(steps, args.warmup, args.steps, device, intervals)
            for name, t in timings.items():
                t.update(state_gb=state_gb(policies[name]), fp8_cache_gb=fp8_cache_gb(policies[name]),
                         graph_pool_gb=_pool_gb(policies[name]))  # fmt: skip
    clocks = per_variant(sampler.samples, intervals) if sampler is not None else {}
    results = []
    for name, t in timings.items():
        r = {"variant": name, **t, **clocks.get(name, {}), "tokens_per_s": tokens / t["median_s"]}
        r["min_max_s"] = f"{t['min_s']:.3f}-{t['max_s']:.3f}"
        results.append(r)
    for r in results:
        r["speedup_vs_bf16"] = results[0]["median_s"] / r["median_s"]
    title = (
        f"train step on {info['device']} ({info.get('clocks')}): {shape_name} shape x {n_layers} layers, "
        f"{args.batch} x {args.seq_len} tokens (micro-batches of {args.micro_batch}), fwd+bwd+AdamW+requant; {args.steps} timed steps after "
        f"{args.warmup} warm-up, variants alternating, CUDA graphs {args.cuda_graphs}"
        + (f"; one variant resident at a time, {args.rounds} rounds of {args.steps} timed steps" if args.rounds else "")
    )
    keys = ["variant", "tokens_per_s", "speedup_vs_bf16", "median_s", "min_max_s", "step_peak_gb", "graph_pool_gb",
            "state_gb", "fp8_cache_gb"] + (["policy_peak_gb"] if args.rounds else [])
    headers = ["variant", "tok/s", "x bf16", "median s", "min-max s", "step peak GB", "graph pool GB", "state GB",
               "FP8 caches GB"] + (["policy peak GB"] if args.rounds else [])
    if clocks:  # SM clock and power during each variant's timed steps (nvidia-smi)
        keys += ["sm_mhz_median", "power_w_median"]
        headers += ["SM MHz", "W"]
    report(title, headers, keys, results, args=args, info=info, shape=shape, n_layers=n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
