"""Start-up memory preflight of a GRPO run (`policy.memory_preflight`): micro-batches that fit by construction.

Before the model is loaded, `memory_preflight(cfg)` estimates each phase's peak device memory from config.json and
the config (policy/memory_estimate.py) and compares the largest with the device's capacity (or
`memory_preflight.capacity_gib`) times `usable_fraction`:

- a null token budget of sequence packing / dynamic batching (`train_mb_tokens`, `logprob_mb_tokens`) becomes the
  largest that fits, capped at its usual default (rows per micro-batch x `max_total_sequence_length`), rounded down
  to `sequence_length_round`, and written into the config the run then uses;
- a config whose step cannot fit (the resident state alone, the rollout's KV cache, a fixed micro-batch, a set budget,
  or a single sequence) raises `MemoryPreflightError`: one line naming the keys to change (exit 2, before any
  rollout), instead of a CUDA out-of-memory error after one;
- one line reports the estimate (`line`). On a CPU with no capacity given it only reports.
Several torchrun ranks (plan "fsdp"): every rank estimates one rank's peak (its 1/D of the master state, the FSDP2
root unsharded, its rollout replica and its 1/D of the rollout's sequences; `memory_estimate.estimate(ranks=D)`) on
the smallest device of the run, so every rank derives the same budget and the ranks cut every pass alike. Not
estimated (one line says so): Ray workers (the driver sees no device) and tensor parallelism (activations split).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nemo_jetrl.config.errors import ConfigError
from nemo_jetrl.distributed.launch import torchrun_env
from nemo_jetrl.policy.memory_estimate import GIB, MemoryEstimate, ModelShape, TrainerMemorySettings, estimate
from nemo_jetrl.policy.memory_estimate import kv_cache_bytes as kv_bytes_of

if TYPE_CHECKING:
    from nemo_jetrl.algorithms.run_config import RunConfig
    from nemo_jetrl.policy.config import PolicyConfig

PASSES = {"train": ("train_mb_tokens", "train_micro_batch_size"), "logprob": ("logprob_mb_tokens", "logprob_batch_size")}


class MemoryPreflightError(ConfigError):
    """A config whose GRPO step cannot fit the device; the message names the keys to change."""


@dataclass(frozen=True)
class PreflightResult:
    line: str  # the report, one line
    derived: dict[str, Any]  # config key -> the value written in (token budgets; train_cuda_graphs: auto -> false)
    estimate: MemoryEstimate | None = None
    peaks: dict[str, int] | None = None  # phase -> estimated peak bytes


def memory_estimates(result: PreflightResult) -> dict[str, float]:
    """The metrics a run logs at step 0 beside its measured `memory/<phase>_peak_gib`: each phase's estimated peak
    and the optimizer state in it (AdamW allocates it at the first optimizer step, so step 1's earlier phases run
    without it), in GiB; {} when nothing was estimated."""
    if not result.peaks or result.estimate is None:
        return {}
    out = {f"memory/estimate_{phase}_peak_gib": peak / GIB for phase, peak in result.peaks.items()}
    return out | {"memory/estimate_optimizer_state_gib": result.estimate.resident.get("adam", 0) / GIB}


def model_shape(policy: PolicyConfig) -> ModelShape:
    """The shape of `policy.model_name` from its config.json (checked as the loader checks it)."""
    from nemo_jetrl.models.loading import check_model_dir, resolve_model_dir

    return ModelShape.from_config(check_model_dir(resolve_model_dir(policy.model_name)))


def torchrun_ranks() -> int:
    """WORLD_SIZE of the torchrun this process belongs to (1 outside torchrun)."""
    env = torchrun_env()
    return 1 if env is None else env["world_size"]


def device_capacity(cfg: RunConfig) -> int | None:
    """Bytes the run may plan for: `policy.memory_preflight.capacity_gib`, else the CUDA device's total memory,
    else None (a CPU run: nothing to refuse against)."""
    given = cfg.policy.memory_preflight.capacity_gib
    if given is not None:
        return int(float(given) * GIB)
    from nemo_jetrl.policy.trainer_setup import resolve_device

    try:
        device = resolve_device(cfg.cluster.device)
    except ValueError:  # e.g. cuda asked for and none visible: the run's own device check says so
        return None
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def memory_preflight(
    cfg: RunConfig, *, shape: ModelShape | None = None, capacity: int | None = None
) -> PreflightResult:
    """Estimate, derive null token budgets into `cfg` (the validated `MasterConfig`), or refuse (module
    docstring). `shape` / `capacity`: given instead of read from the model directory / the device."""
    policy = cfg.policy
    if not policy.memory_preflight.enabled:
        return PreflightResult("memory preflight: off (policy.memory_preflight.enabled: false)", {})
    backend = cfg.cluster.backend
    if backend == "ray":
        return PreflightResult("memory preflight: not estimated for cluster.backend: ray (sharded trainer)", {})
    ranks = torchrun_ranks() if backend == "torchrun" else 1
    tp = policy.dtensor_cfg.tensor_parallel_size
    if ranks > 1 and tp > 1:
        return PreflightResult(
            f"memory preflight: not estimated for {ranks} torchrun ranks with policy.dtensor_cfg.tensor_parallel_size "
            f"{tp} (tensor-parallel activations)", {}
        )  # fmt: skip
    if shape is None:
        try:
            shape = model_shape(policy)
        except ValueError as exc:  # the model directory's own error comes when the run loads it
            return PreflightResult(f"memory preflight: skipped ({exc})", {})
    capacity = capacity if capacity is not None else _smallest_over_ranks(device_capacity(cfg))
    usable = None if capacity is None else int(capacity * policy.memory_preflight.usable_fraction)
    reference = cfg.loss_fn.reference_policy_kl_penalty > 0
    settings = TrainerMemorySettings.from_policy(policy, reference, cuda=capacity is not None and ranks == 1)
    try:
        planned = _plan(cfg, shape, settings, capacity, usable, ranks)
    except MemoryPreflightError:
        if not (settings.graphs and policy.train_cuda_graphs == "auto"):
            raise
        # `auto` captures only where the captured micro-batch's reserved activations leave room for the step
        settings = dataclasses.replace(settings, graphs=False)
        planned = _plan(cfg, shape, settings, capacity, usable, ranks)
        planned[-1]["policy.train_cuda_graphs"] = False
    est, tokens, peaks, derived = planned
    for key, value in derived.items():  # written into the config the run uses
        section, _, leaf = key.removeprefix("policy.").rpartition(".")
        setattr(getattr(policy, section) if section else policy, leaf, value)
    return PreflightResult(_line(est, peaks, tokens, capacity, usable, derived, settings, ranks), derived, est, peaks)


def _smallest_over_ranks(capacity: int | None) -> int | None:
    """The smallest of every torchrun rank's `capacity` (collective where a process group runs), so that every
    rank derives the same token budgets; `capacity` itself in one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return capacity
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, capacity)
    known = [c for c in everyone if c is not None]
    return min(known) if known else None


def _plan(
    cfg: RunConfig, shape: ModelShape, settings: TrainerMemorySettings, capacity: int | None, usable: int | None,
    ranks: int = 1,
) -> tuple[MemoryEstimate, dict[str, int], dict[str, int], dict[str, Any]]:  # fmt: skip
    """(estimate, tokens per pass, peaks per phase, derived keys) under `settings` for one of `ranks` FSDP2 ranks,
    on a copy of `cfg`; raises MemoryPreflightError where the step cannot fit."""
    cfg = copy.deepcopy(cfg)
    est = _estimate(cfg, shape, settings, capacity, ranks)
    derived: dict[str, Any] = {}
    tokens = {kind: _pass_tokens(cfg, kind, est, usable, derived) for kind in PASSES}
    peaks = _peaks(est, tokens, settings)
    if usable is not None:
        _refuse_if_over(cfg, est, peaks, usable, capacity, settings)
    return est, tokens, peaks, derived


def _estimate(
    cfg: RunConfig, shape: ModelShape, s: TrainerMemorySettings, capacity: int | None, ranks: int = 1
) -> MemoryEstimate:
    """The estimate with the rollout's KV cache as the engine sizes it (generation/native/scheduler.py): the
    `kv_cache_memory_bytes` pool, the `gpu_memory_utilization` share of what the trainer leaves free, `max_num_seqs`
    sequences at their caps, or the whole batch at its caps; never more than the whole batch needs. On one of
    `ranks` ranks: its engine decodes its share of the rows (each rank's engine its block of the seed shards)."""
    from nemo_jetrl.generation.interfaces import max_prompt_length

    policy, g, gen = cfg.policy, cfg.grpo, cfg.policy.generation
    rows = g.num_prompts_per_step * g.num_generations_per_prompt
    if g.use_dynamic_sampling:
        rows = int(rows * g.batch_multiplier)
    rows = -(-rows // ranks)
    total = policy.max_total_sequence_length
    prompt = max_prompt_length(total, gen.max_new_tokens, cfg.data.max_input_seq_length)
    per_row = min(total, prompt + gen.max_new_tokens)
    if gen.max_model_len is not None:
        per_row = min(per_row, gen.max_model_len)
    live = rows if gen.max_num_seqs is None else min(rows, gen.max_num_seqs)
    whole = kv_bytes_of(shape, s, rows * per_row)
    if gen.kv_cache_memory_bytes is not None:
        kv = min(whole, gen.kv_cache_memory_bytes)
    elif gen.gpu_memory_utilization is not None and capacity is not None:
        free = capacity - estimate(shape, s, 0, live, ranks).peak("rollout")
        kv = min(whole, max(0, int(gen.gpu_memory_utilization * free)))
    else:
        kv = kv_bytes_of(shape, s, live * per_row)
    return estimate(shape, s, kv, live, ranks)


def _pass_tokens(cfg: RunConfig, kind: str, est: MemoryEstimate, usable: int | None, derived: dict) -> int:
    """Tokens of the pass's largest micro-batch; a null packing / dynamic-batching budget becomes the largest that
    fits `usable` (at most its default), written into `cfg` and `derived`; where not even one sequence fits, the
    default (refused after)."""
    policy = cfg.policy
    budget_key, rows_key = PASSES[kind]
    width = policy.max_total_sequence_length
    default = getattr(policy, rows_key) * width
    section = _budget_section(policy)
    if section is None:
        return default
    given = getattr(getattr(policy, section), budget_key)
    if given is not None or usable is None:
        return int(given or default)
    round_to = getattr(policy, section).sequence_length_round
    fits = est.tokens_within(usable, kind) - (round_to if section == "sequence_packing" else 0)  # the row's rounding
    budget = min(default, fits // round_to * round_to)
    if budget < width:
        return default
    if budget < default:
        setattr(getattr(policy, section), budget_key, budget)
        derived[f"policy.{section}.{budget_key}"] = budget
    return budget


def _budget_section(policy: PolicyConfig) -> str | None:
    """The enabled section that cuts micro-batches by a token budget (`sequence_packing`, `dynamic_batching`)."""
    return next((n for n in ("sequence_packing", "dynamic_batching") if getattr(policy, n).enabled), None)


def _peaks(est: MemoryEstimate, tokens: dict[str, int], s: TrainerMemorySettings) -> dict[str, int]:
    """Estimated peak bytes per phase. Captured micro-batches keep a training micro-batch's activations reserved in
    the graphs' pool, beside every other phase and beside the training pass itself: a micro-batch of a shape not
    captured yet runs eagerly, outside the pool (measured: FP8+KV at 8K tokens, 1.7B shape, ran out of memory there
    with 87 GiB in the pool, where the estimate without this term had it fit)."""
    pool = int(est.train_per_token * tokens["train"]) if s.graphs else 0
    return {
        "train": est.peak("train", tokens["train"]) + pool,
        "logprob": est.peak("logprob", tokens["logprob"]) + pool,
        "rollout": est.peak("rollout") + pool,
    }


def _refuse_if_over(
    cfg: RunConfig, est: MemoryEstimate, peaks: dict[str, int], usable: int, capacity: int,
    s: TrainerMemorySettings,
) -> None:  # fmt: skip
    """MemoryPreflightError naming the keys of the first phase over `usable` (the resident state first; a rollout
    whose KV pool is a `gpu_memory_utilization` share of the free memory against the whole capacity)."""
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    policy = cfg.policy
    resident = est.resident_total("train")
    if resident > usable:
        fix = "policy.master_dtype=bfloat16" if s.master_bytes == 4 else "more GPUs (cluster.gpus_per_node)"
        raise MemoryPreflightError(
            f"memory preflight: weights, gradients and optimizer state alone take {gib(resident)} of {gib(usable)} "
            f"usable; set {fix} (or a smaller policy.model_name)"
        )
    pooled = policy.generation.gpu_memory_utilization is not None
    limits = {"rollout": capacity if pooled else usable, "train": usable, "logprob": usable}
    over = next((phase for phase in ("rollout", "train", "logprob") if peaks[phase] > limits[phase]), None)
    if over is None:
        return
    head = f"memory preflight: the {over} phase needs about {gib(peaks[over])} of {gib(usable)} usable"
    if over == "rollout":
        raise MemoryPreflightError(
            f"{head} (its KV cache {gib(est.rollout_kv)}); set policy.generation.gpu_memory_utilization (e.g. 0.8: "
            "a KV pool, sequences queue for it) or policy.generation.max_num_seqs, or "
            "policy.generation.kv_cache_dtype=fp8"
        )
    budget_key, rows_key = PASSES[over]
    section = _budget_section(policy)
    width = policy.max_total_sequence_length
    fits = est.tokens_within(usable, over)
    keys = [f"policy.{section}.{budget_key} (at most {fits} tokens fit)" if section else
            f"policy.{rows_key} (at most {fits // width} rows of {width} tokens fit)"]  # fmt: skip
    if fits < width:
        keys = [f"policy.max_total_sequence_length ({width}: one sequence needs {gib(est.peak(over, width))})"]
    if over == "train" and not s.checkpointing:
        keys.insert(0, "policy.dtensor_cfg.activation_checkpointing=true")
    if s.master_bytes == 4:
        keys.append("policy.master_dtype=bfloat16")
    raise MemoryPreflightError(f"{head}; change {', or '.join(keys)}")


def _line(
    est: MemoryEstimate, peaks: dict[str, int], tokens: dict[str, int], capacity: int | None, usable: int | None,
    derived: dict[str, int], s: TrainerMemorySettings, ranks: int = 1,
) -> str:  # fmt: skip
    """The report: `memory preflight: peak ~X GiB of C GiB (usable U) | train ... | logprob ... | rollout ...`;
    on several ranks, each rank's (`per rank of D`)."""
    gib = lambda b: f"{b / GIB:.1f}"  # noqa: E731
    device = "no capacity known (report only)" if capacity is None else f"of {gib(capacity)} GiB (usable {gib(usable)})"
    per_rank = f" per rank of {ranks} (FSDP2 shard + rollout replica)" if ranks > 1 else ""
    parts = [
        f"memory preflight: step peak ~{gib(max(peaks.values()))} GiB{per_rank} {device}",
        f"resident {gib(est.resident_total())}",
        f"train {gib(peaks['train'])} at {tokens['train']} tokens/micro-batch",
        f"logprob {gib(peaks['logprob'])} at {tokens['logprob']}",
        f"rollout {gib(peaks['rollout'])} (KV {gib(est.rollout_kv)})",
        f"activation_checkpointing {'on' if s.checkpointing else 'off'}",
    ]
    if derived:
        parts.append("derived " + ", ".join(f"{k}={v}" for k, v in derived.items()))
    return " | ".join(parts)
