"""Shared helpers of the rollout / train-step / GRPO-step benchmarks: model shapes, timing, tables, JSON.

Only torch + transformers + pydantic (the typed `PolicyConfig` and `LossConfig` sections; not the YAML loader,
omegaconf) + nemo_jetrl's packages. Weights are random (speed does not depend on them); the FP8 KV scales come from
the project's own QKV calibration over a short random batch.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from nemo_jetrl.algorithms.config import LossConfig
from nemo_jetrl.algorithms.loss import ClippedPGLossFn
from nemo_jetrl.models.moe import convert_moe_blocks
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.config import PolicyConfig

HBM_PEAK_TBS = {"H200": 4.8, "H100": 3.35}  # dense HBM peaks (DESIGN.md section 4)

QWEN3_8B = dict(SHAPES["qwen3-8b"])  # the published Qwen3-8B config (untied lm_head)
# CPU smoke shape (every linear dim a multiple of 128 for the FP8 blocks).
TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    vocab_size=512,
    tie_word_embeddings=False,
)


LOSS = ClippedPGLossFn(LossConfig())  # what the benchmarks hand to `policy.train(batch, LOSS)`: plain clipped PG

# The benchmarks' `policy` values that differ from the section's defaults (policy/config.py holds every default):
# a random-weight model, BF16 master for the speed runs (the precision comes from the PrecisionRecipe each
# benchmark passes), long rows, eager micro-batches unless a benchmark asks for graphs.
BENCHMARK_POLICY = {
    "model_name": "benchmark-random",
    "master_dtype": "bfloat16",
    "train_micro_batch_size": 1,
    "logprob_batch_size": 8,
    "max_total_sequence_length": 4096,
    "train_cuda_graphs": False,
    "optimizer": {"lr": 1e-6},
}


def policy_config(**overrides) -> PolicyConfig:
    """The benchmarks' `policy` section, typed: `PolicyConfig` from `BENCHMARK_POLICY` with `overrides` merged in
    (a nested section's dict key by key, e.g. `generation={"deterministic": True}`), validated as a config is."""
    return PolicyConfig.model_validate(_merged(BENCHMARK_POLICY, overrides))


def _merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides`; where both hold a dict, merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def device_info(device: torch.device) -> dict:
    """Device name, peak HBM bandwidth (TB/s, None when unknown), SM clocks (nvidia-smi) and software versions."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({_cpu_model()})"
    peak = next((tbs for key, tbs in HBM_PEAK_TBS.items() if key in name), None)
    info = {"device": name, "hbm_peak_tbs": peak, "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        info["clocks"] = _nvidia_smi_clocks(device.index or 0)
    return info


def _cpu_model() -> str:
    """'Intel(R) Xeon(R) Processor' from /proc/cpuinfo where it exists, else platform.processor()."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "cpu"


def _nvidia_smi_clocks(index: int) -> str | None:
    """'sm 1980 MHz (max 1980), mem 2619 MHz' from nvidia-smi, None where it is absent."""
    query = "clocks.sm,clocks.max.sm,clocks.mem"
    cmd = ["nvidia-smi", "-i", str(index), f"--query-gpu={query}", "--format=csv,noheader,nounits"]
    try:
        sm, sm_max, mem = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip().split(", ")
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return f"sm {sm} MHz (max {sm_max}), mem {mem} MHz"


def alternating_rounds(names: list[str], rounds: int):
    """(round index, the variants' order in it): as given in even rounds, reversed in odd ones (A, B, then B, A)."""
    for i in range(rounds):
        yield i, names if i % 2 == 0 else names[::-1]


def alternating_timings(
    variants: dict[str, Callable[[], object]], warmup: int, steps: int, device: torch.device,
    intervals: dict[str, list[tuple[float, float]]] | None = None,
) -> dict[str, dict]:
    """Run every variant's step `warmup + steps` times in rounds whose order alternates (A, B, then B, A, ...), so
    clock and thermal drift fall on all variants alike; per variant: the timed steps' median, min and max (s) and,
    on CUDA, the step's peak memory above what was allocated before it (GB). `intervals`: each timed step's (start,
    end) on the host's monotonic clock is appended under its variant (for `gpu_clocks.per_variant`)."""  # fmt: skip
    names = list(variants)
    out = {n: {"times_s": [], "step_peak_gb": 0.0} for n in names}
    for i, order in alternating_rounds(names, warmup + steps):
        for name in order:
            base = 0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            start = time.monotonic()
            _, seconds = timed(variants[name], device)
            if intervals is not None and i >= warmup:
                intervals.setdefault(name, []).append((start, time.monotonic()))
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - base) / 1e9
                out[name]["step_peak_gb"] = max(out[name]["step_peak_gb"], peak)
            if i >= warmup:
                out[name]["times_s"].append(seconds)
    for r in out.values():
        summarize_times(r)
    return out


def alternating_graph_times(variants: dict[str, list[Callable[[], object]]], replays: int = 7) -> dict[str, dict]:
    """Kernel timing as a captured decode step sees it: each variant's calls run once eagerly (JIT, allocations),
    are captured back to back in one CUDA graph, and the graphs are replayed in `replays` rounds after one warm-up
    round, the order alternating (A, B, then B, A, ...). Per variant: microseconds per call, median, min and max
    over the rounds (CUDA events around each replay)."""
    from nemo_jetrl.precision.kernels.device import capture_graph, replay_ms

    graphs = {name: capture_graph(calls) for name, calls in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for i, order in alternating_rounds(list(graphs), replays + 1):
        for name in order:
            us = 1e3 * replay_ms(graphs[name]) / len(variants[name])
            if i:  # round 0 warms up
                times[name].append(us)
    return {
        name: {"us": statistics.median(t), "min_us": min(t), "max_us": max(t), "replays": len(t)}
        for name, t in times.items()
    }


def alternating_cold_times(variants: dict[str, list[Callable[[], object]]], rounds: int) -> dict[str, list[float]]:
    """Microseconds per call of each variant's calls (one per input copy, cycled out of L2 in a CUDA graph:
    `kernels.device.time_in_graph`), one figure per round over `rounds` rounds whose order alternates (A, B, then
    B, A, ...)."""
    from nemo_jetrl.precision.kernels.device import time_in_graph

    times: dict[str, list[float]] = {name: [] for name in variants}
    for _, order in alternating_rounds(list(variants), rounds):
        for name in order:
            times[name].append(1e3 * time_in_graph(variants[name]))
    return times


def cold_time_fields(times: list[float]) -> dict:
    """A result row's timing fields from one variant's per-round figures in us (`alternating_cold_times`, or rounds
    of `do_bench`): "us" (the median) and "min_max_us" ("min-max")."""
    return {"us": statistics.median(times), "min_max_us": f"{min(times):.1f}-{max(times):.1f}"}


def us_range(t: dict) -> str:
    """'median (min-max)' of an `alternating_graph_times` entry, in us."""
    return f"{t['us']:.1f} ({t['min_us']:.1f}-{t['max_us']:.1f})"


def summarize_times(record: dict) -> None:
    """Add the median, min and max (s) of `record["times_s"]`."""
    times = sorted(record["times_s"])
    record.update(median_s=statistics.median(times), min_s=times[0], max_s=times[-1])


def parse_gpu_bench(parser, argv: list[str] | None):
    """Add --out, parse; (args, cuda device, device_info) on a CUDA machine, None (after a message) elsewhere."""
    parser.add_argument("--out", default=None, help="JSON output path")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{parser.prog}: needs a CUDA GPU", file=sys.stderr)
        return None
    device = torch.device("cuda")
    return args, device, device_info(device)


def build_model(shape: dict, num_layers: int | None, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """A random-weight Qwen3ForCausalLM of `shape` (a Qwen3MoeForCausalLM with its MoE blocks converted where the shape
    has experts; optionally fewer layers), built directly on `device` in `dtype` (no FP32 copy of a 30B model)."""
    fields = {**shape, **({"num_hidden_layers": num_layers} if num_layers else {})}
    moe = bool(fields.get("num_experts"))
    cfg = (Qwen3MoeConfig if moe else Qwen3Config)(**fields)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(cfg)
    finally:
        torch.set_default_dtype(previous)
    convert_moe_blocks(model)
    return model.to(dtype).eval()


def linear_weight_bytes(model: torch.nn.Module, fp8: bool) -> int:
    """Bytes one decode step reads for the decoder linears (e4m3 + fp32 128x128 scales, or bf16) and the lm_head;
    an MoE's every expert (a decode batch of 128 x 8 choices reaches nearly all of them) and its routers (FP32)."""
    total = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() not in (2, 3) or "embed_tokens" in name or "norm" in name:
            continue
        experts, (n, k) = (weight.shape[0] if weight.dim() == 3 else 1), weight.shape[-2:]
        if fp8 and "lm_head" not in name and not name.endswith(".gate"):
            total += experts * (n * k + 4 * -(-n // 128) * -(-k // 128))
        else:
            total += experts * n * k * 2
    return total


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """(fn(), wall seconds) with device syncs around it."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def print_table(title: str, headers: list[str], rows: list[list]) -> str:
    """A fixed-width table (printed and returned)."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def write_json(path: str | Path | None, payload: dict) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}", flush=True)


def report(
    title: str,
    headers: list[str],
    keys: list[str],
    results: list[dict],
    *,
    args,
    info: dict,
    shape: dict,
    n_layers: int,
    **extra,
) -> str:
    """Print the ratio table (one row per variant, columns `keys`) and write the run's JSON to `args.out`."""
    table = print_table(title, headers, [[r.get(k, "-") for k in keys] for r in results])
    payload = {**info, "shape": {**shape, "num_hidden_layers": n_layers}, "args": vars(args), **extra}
    write_json(args.out, {**payload, "results": results, "table": table})
    return table


def bootstrapped_engine(policy, recipe, prompts: list[list[int]], gen_len: int, boot_rows: int, **engine_kwargs):
    """The policy's rollout engine (fixed lengths: no stop tokens) with FP8 KV scales bootstrapped from the first
    `boot_rows` prompts where the cache is FP8, as grpo.py does before the first rollout."""
    from nemo_jetrl.generation.native.engine import NativeGenerationEngine
    from nemo_jetrl.policy.interfaces import TrainBatch

    engine = NativeGenerationEngine(
        policy.model,
        max_new_tokens=gen_len,
        stop_token_ids=[],
        pad_token_id=0,
        compute_dtype=policy.compute_dtype,
        kv_cache_dtype=recipe.kv_cache_dtype,
        **engine_kwargs,
    )
    if recipe.kv_fp8:
        ids = torch.tensor(prompts[:boot_rows])  # ids: [b, P]
        ones = torch.ones_like(ids)
        boot = TrainBatch(ids, ones, torch.zeros_like(ids), torch.zeros(len(ids)), torch.zeros(ids.shape))
        engine.update_weights(kv_scales=policy.calibrate_kv_scales(boot).kv)
    return engine


def draw_lengths(dist: str, n: int, mean: int, max_len: int, sigma: float, seed: int) -> list[int]:
    """n response lengths in [1, max_len] with mean ~`mean` (before the cap)."""
    gen = torch.Generator().manual_seed(seed)
    if dist == "fixed":
        lengths = torch.full((n,), float(mean))
    elif dist == "lognormal":  # E[exp(N(mu, s^2))] = exp(mu + s^2 / 2)
        lengths = torch.exp(math.log(mean) - sigma**2 / 2 + sigma * torch.randn(n, generator=gen))
    elif dist == "geometric":  # number of trials to the first success, p = 1 / mean
        u = torch.rand(n, generator=gen).clamp_min(1e-12)
        lengths = torch.ceil(torch.log(u) / math.log1p(-1.0 / mean))
    else:
        raise ValueError(f"--length-dist must be fixed, lognormal or geometric, got {dist!r}")
    return lengths.round().clamp(1, max_len).long().tolist()


def add_deep_gemm_flag(parser, variant: str) -> None:
    """`--deep-gemm`: also run `variant` with policy.fp8_cfg.use_deep_gemm (`check_deep_gemm` refuses it where
    DeepGEMM cannot run)."""
    parser.add_argument(
        "--deep-gemm", action="store_true",
        help=f"also '{variant}': policy.fp8_cfg.use_deep_gemm (needs deep_gemm on an sm90 GPU)",
    )  # fmt: skip


def check_deep_gemm(parser, args, device: torch.device) -> None:
    """Exit with the reason when `--deep-gemm` was asked for where DeepGEMM cannot run on `device`."""
    from nemo_jetrl.precision import deep_gemm_adapter

    if args.deep_gemm and (reason := deep_gemm_adapter.unusable_reason(device)) is not None:
        parser.error(f"--deep-gemm: {reason}")
