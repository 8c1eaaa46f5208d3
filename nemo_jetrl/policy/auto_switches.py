"""The `auto` values of two trainer switches, resolved once at start-up, with one line where `auto` says no:

- `policy.train_cuda_graphs: auto` (the default): the trainer's micro-batches captured in CUDA graphs
  (`policy/train_graphs.py`) wherever they are correct and pay: a CUDA device, the local backend, not the exact
  mode, sequences of at most `LONGEST_CAPTURED_SEQUENCE` tokens. The graphs' pool keeps a captured micro-batch's
  activations reserved while a micro-batch of a shape not captured yet runs eagerly beside it: at long micro-batches
  that is two activation sets (the FP8+KV 1.7B recipe at 8K tokens ran out of memory on an H200 with 87 GiB in the
  pool, docs/long_responses.md), while the kernel launches the graphs save are a small share of such a
  micro-batch's time.
- `policy.generation.matched_kernels: auto`: the batch-invariant attention and log-sum-exp on both sides with the
  FP8 forward GEMMs on cuBLAS at every M (`models.batch_invariant.match_kernels`), kept only where the start-up
  self-check (`models.matched_check`) finds every product row-invariant on this device at this model's shapes,
  so that the rollout's logprobs equal the trainer's bit for bit; never where the config rules it out (the exact
  mode already runs its kernels; another rollout precision; vLLM; tensor-parallel shards; the opt-in causal
  trainer attention; ...). On several ranks (torchrun, or Ray's workers) every rank checks its own device and the
  ranks agree: one rank's difference switches them all back.

`true` and `false` stay what they say (a `true` the config cannot honour is refused by config validation). The default
`matched_kernels: null` is `auto` for FP8 with an FP8 KV cache on a GPU up to 4,608 tokens a sequence, else false
(`matched_by_default`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nemo_jetrl.models.batch_invariant import match_kernels, unmatch_kernels
from nemo_jetrl.precision import PrecisionRecipe
from nemo_jetrl.precision.recipes.base import layouts_with, scale_layout

AUTO = "auto"
LONGEST_CAPTURED_SEQUENCE = 8192  # tokens: `train_cuda_graphs: auto` captures up to this max_total_sequence_length
# tokens: the longest max_total_sequence_length at which matched kernels are on by default (the shipped 8B recipe's:
# its matched step measured within 5% of the fast one's; at 8K tokens the exact decode attention costs more)
LONGEST_MATCHED_BY_DEFAULT = 4608


def announce(line: str | None) -> None:
    """Print a start-up line (stdout, as the config's start-up notes)."""
    if line:
        print(line, flush=True)


def resolve_train_cuda_graphs(
    policy_cfg: Any, device: torch.device, moe: bool = False
) -> tuple[bool, str | None]:
    """The one-process trainer's captured micro-batches under a `PolicyConfig`: (on, the line saying why `auto` is
    off, or None); `true` off CUDA or with an MoE model (its experts' row counts are read on the host) is refused."""
    value = policy_cfg.train_cuda_graphs
    if value != AUTO:
        if value and moe:
            raise ValueError(
                "policy.train_cuda_graphs: true cannot capture an MoE model's micro-batches (its experts' row counts "
                "are read on the host): set it false or auto"
            )
        if value and device.type != "cuda":
            raise ValueError(f"policy.train_cuda_graphs: true needs a CUDA device, the trainer runs on {device}")
        return bool(value), None
    reason = train_graphs_auto_blocker(policy_cfg, device, moe)
    return reason is None, None if reason is None else f"policy.train_cuda_graphs: auto -> off: {reason}"


def train_graphs_auto_blocker(policy_cfg: Any, device: torch.device | str, moe: bool = False) -> str | None:
    """Why `train_cuda_graphs: auto` does not capture under a `PolicyConfig` for a trainer on `device` (None: it
    captures). The memory preflight counts the captured pool by the same rule."""
    longest = policy_cfg.max_total_sequence_length
    if moe:
        return "an MoE model (its experts' row counts are read on the host)"
    if torch.device(device).type != "cuda":
        return f"the trainer runs on {device}"
    if policy_cfg.generation.deterministic:
        return "policy.generation.deterministic: true (the exact mode's trainer runs eagerly)"
    if longest > LONGEST_CAPTURED_SEQUENCE:
        return (
            f"policy.max_total_sequence_length {longest} > {LONGEST_CAPTURED_SEQUENCE}: the captured pool keeps a "
            "micro-batch's activations reserved beside the eager passes' (a captured FP8+KV run at 8K ran out of "
            "memory), and micro-batches this long spend little of their time launching kernels (true forces it)"
        )
    return None


def matched_kernels_blocker(policy_cfg: Any) -> str | None:
    """Why a `PolicyConfig` rules `matched_kernels: auto` out (None: the self-check decides)."""
    gen, fp8, tp = policy_cfg.generation, policy_cfg.fp8_cfg, policy_cfg.dtensor_cfg.tensor_parallel_size
    fp8_anywhere = "fp8" in (policy_cfg.precision, gen.precision)
    reasons = (
        (gen.deterministic, "policy.generation.deterministic: true already runs its kernels"),
        (gen.backend != "native", f"policy.generation.backend: {gen.backend} (the native engine's path)"),
        (tp > 1, f"policy.dtensor_cfg.tensor_parallel_size {tp} (the check does not cover tensor-parallel shards)"),
        (gen.precision != policy_cfg.precision, "the trainer and the rollout run different precisions"),
        (gen.kv_cache_dtype == "fp8" and not fp8.train_kv_fake_quant,
         "an FP8 KV cache without policy.fp8_cfg.train_kv_fake_quant"),
        (policy_cfg.train_causal_attention, "policy.train_causal_attention: true"),
        (not policy_cfg.fused_train_kernels, "policy.fused_train_kernels: false"),
        (fp8_anywhere and not scale_layout(fp8.fp8_recipe).features.exact_gemm,
         f"policy.fp8_cfg.fp8_recipe: {fp8.fp8_recipe} (matched kernels need {layouts_with('exact_gemm')})"),
    )  # fmt: skip
    return next((reason for blocked, reason in reasons if blocked), None)


def matched_by_default(policy_cfg: Any, device: str) -> bool:
    """Whether `policy.generation.matched_kernels: null` (the default) means `auto` (`MasterConfig` resolves it;
    false otherwise): FP8 weights and an FP8 KV cache on both sides, the Jet-RL recipe, at most
    `LONGEST_MATCHED_BY_DEFAULT` tokens a sequence, where the matched step costs at most 5% more than the fast
    path's on an H200 (docs/mismatch.md); on a CUDA device (`cluster.device` cuda, or auto with one visible); nothing
    in the config ruling it out (`matched_kernels_blocker`). Elsewhere it means false (a higher or unmeasured cost:
    auto or true turns them on)."""
    gen = policy_cfg.generation
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return False
    fp8_kv = policy_cfg.precision == gen.precision == "fp8" and gen.kv_cache_dtype == "fp8"
    short = policy_cfg.max_total_sequence_length <= LONGEST_MATCHED_BY_DEFAULT
    return fp8_kv and short and matched_kernels_blocker(policy_cfg) is None


def apply_matched_kernels(
    model: nn.Module,
    policy_cfg: Any,
    recipe: PrecisionRecipe,
    device: torch.device,
    compute_dtype: torch.dtype | None,
    ranks: Any = None,
) -> tuple[bool, str | None]:
    """Switch `model` to the matched kernels as `policy.generation.matched_kernels` says (auto: the config allows
    it and the self-check passes); returns (on, the start-up line of an `auto` or None). `ranks`: the torchrun
    ranks' plan (`ParallelPlan`, its collective `first_of`): each rank checks its own device, the first rank's
    difference decides for all (the model is not sharded yet)."""
    value = policy_cfg.generation.matched_kernels
    if value != AUTO:
        if value:
            match_kernels(model, device)
        return bool(value), None
    key = "policy.generation.matched_kernels: auto"
    blocker = matched_kernels_blocker(policy_cfg)
    if blocker is not None:
        return False, f"{key} -> off: {blocker}"
    from nemo_jetrl.models.matched_check import matched_kernels_problem

    match_kernels(model, device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    problem = matched_kernels_problem(model, compute_dtype, kv_fp8=recipe.kv_fp8)
    if ranks is not None:  # collective: every rank asks, the same verdict everywhere
        problem = ranks.first_of(problem)
        where = f"{where} ({ranks.world_size} ranks)"
    if problem is not None:
        unmatch_kernels(model)
        return False, f"{key} -> off: not row-invariant on {where}: {problem} (true forces it)"
    return True, f"{key} -> on: every product row-invariant on {where} (rollout logprobs == trainer's, bitwise)"


def worker_switch_lines(policy_cfg: Any, backend: str) -> list[str]:
    """The two switches on a multi-worker backend (torchrun, Ray): train graphs' `auto` is off (one line; the
    matched kernels' `auto` is the ranks' self-check, whose line rank 0 gives); `true` train graphs, and matched
    kernels with tensor-parallel shards (whose row invariance the check does not cover), are refused."""
    if policy_cfg.train_cuda_graphs is True:
        raise ValueError(f"policy.train_cuda_graphs needs the local backend (cluster.backend: local, not {backend})")
    gen, tp = policy_cfg.generation, policy_cfg.dtensor_cfg.tensor_parallel_size
    if gen.matched_kernels is True and tp > 1:
        raise ValueError(
            f"policy.generation.matched_kernels: true with policy.dtensor_cfg.tensor_parallel_size {tp}: the row "
            "invariance it rests on is not checked for tensor-parallel shards; set tensor_parallel_size: 1"
        )
    if policy_cfg.train_cuda_graphs != AUTO:
        return []
    return [f"policy.train_cuda_graphs: auto -> off: cluster.backend: {backend} (its workers' trainers run eagerly)"]
